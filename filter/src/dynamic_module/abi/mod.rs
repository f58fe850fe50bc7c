//! The part of Envoy's dynamic-module ABI (`source/extensions/dynamic_modules/abi/abi.h`,
//! Envoy 1.40) this module uses, written from the header's definitions: the types that
//! cross the boundary and the callbacks Envoy exports (here), the hooks Envoy calls
//! ([`http_hooks`], [`network_hooks`]) and what the module hands Envoy to keep ([`owned`]).
//! The hooks are the only code that receives Envoy's pointers: each turns them into a safe
//! handle ([`super::host`]) and the module's own state, and calls safe code with those.
//!
//! The callbacks are looked up in the running process (`dlsym(RTLD_DEFAULT, ...)`) when the
//! module is loaded instead of being linked as undefined symbols: the crate's rlib is also
//! linked into ordinary executables (its tests, the harness), where no Envoy provides them,
//! and a module loaded into an Envoy that lacks one of them refuses to start with the name
//! of what is missing instead of failing at its first call.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

/// The ABI version Envoy 1.40 was built with (`ENVOY_DYNAMIC_MODULES_ABI_VERSION`); Envoy
/// logs a warning when a module reports another.
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// A view of bytes Envoy owns, valid until the current hook returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const NULL: Self = Self {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes; empty for a null buffer.
    ///
    /// # Safety
    /// `ptr` must point at `length` readable bytes for the lifetime the caller picks (Envoy
    /// guarantees it until the hook returns or the buffer is modified).
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length) }
    }
}

/// A view of bytes the module owns, valid for the duration of the call it is passed to.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl ModuleBuffer {
    pub const NULL: Self = Self {
        ptr: std::ptr::null(),
        length: 0,
    };

    pub fn of(bytes: &[u8]) -> Self {
        Self {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }
}

/// A header the module hands Envoy (a local reply's).
#[repr(C)]
pub struct ModuleHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_http_header_type`.
pub const REQUEST_HEADER: u32 = 0;
pub const RESPONSE_HEADER: u32 = 2;

/// `envoy_dynamic_module_type_http_body_type`.
pub const RECEIVED_REQUEST_BODY: u32 = 0;
pub const BUFFERED_REQUEST_BODY: u32 = 1;
pub const RECEIVED_RESPONSE_BODY: u32 = 2;
pub const BUFFERED_RESPONSE_BODY: u32 = 3;

/// `envoy_dynamic_module_type_attribute_id_SourceAddress` (`source.address`, with the port).
pub const ATTRIBUTE_SOURCE_ADDRESS: usize = 24;

/// `envoy_dynamic_module_type_http_filter_stream_reset_reason_LocalReset`.
pub const RESET_LOCAL: u32 = 0;

/// The statuses the event hooks return (one numbering serves headers, body and trailers:
/// `Continue` is 0 in each, and the stops the glue uses share their numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Continue = 0,
    /// Headers and trailers: `StopIteration`; bodies: `StopIterationAndBuffer`.
    Stop = 1,
    /// Bodies only: `StopIterationNoBuffer`.
    StopNoBuffer = 3,
}

/// `envoy_dynamic_module_type_metrics_result_Success`.
pub const METRICS_SUCCESS: u32 = 0;

/// `envoy_dynamic_module_type_network_connection_event`: the two that end a connection.
pub const EVENT_REMOTE_CLOSE: u32 = 0;
pub const EVENT_LOCAL_CLOSE: u32 = 1;

/// `envoy_dynamic_module_type_network_connection_close_type_FlushWrite`.
pub const CLOSE_FLUSH_WRITE: u32 = 0;

/// `envoy_dynamic_module_type_on_network_filter_data_status`: what the network hooks return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum NetworkStatus {
    Continue = 0,
    /// `StopIteration`: the data goes no further down the filter chain.
    Stop = 1,
}

type Filter = *mut c_void;

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// `RTLD_DEFAULT`: the global scope, where Envoy's exported symbols are.
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

/// Declares [`Host`], one field per callback with its abi.h signature, and [`resolve`],
/// which looks each one up by its name.
macro_rules! callbacks {
    ($($field:ident: $ty:ty = $symbol:literal,)*) => {
        /// The callbacks, resolved once when Envoy loads the module. (Reading a
        /// connection's data is for the tests' fault injection only.)
        #[cfg_attr(not(feature = "fault"), allow(dead_code))]
        pub struct Host {
            $(pub $field: $ty,)*
        }

        /// Every callback, or the name of the first one the process does not export.
        fn resolve() -> Result<Host, &'static str> {
            Ok(Host {
                $($field: {
                    let name = concat!("envoy_dynamic_module_callback_", $symbol, "\0");
                    // SAFETY: a NUL-terminated name; dlsym only reads it.
                    let found = unsafe { dlsym(RTLD_DEFAULT, name.as_ptr().cast()) };
                    if found.is_null() {
                        return Err(name.trim_end_matches('\0'));
                    }
                    // SAFETY: Envoy exports the symbol with the signature abi.h declares,
                    // which the field's type spells out.
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(found) }
                },)*
            })
        }
    };
}

callbacks! {
    log: unsafe extern "C" fn(u32, ModuleBuffer) = "log",
    log_enabled: unsafe extern "C" fn(u32) -> bool = "log_enabled",
    get_header: unsafe extern "C" fn(Filter, u32, ModuleBuffer, *mut EnvoyBuffer, usize, *mut usize) -> bool
        = "http_get_header",
    set_header: unsafe extern "C" fn(Filter, u32, ModuleBuffer, ModuleBuffer) -> bool = "http_set_header",
    add_header: unsafe extern "C" fn(Filter, u32, ModuleBuffer, ModuleBuffer) -> bool = "http_add_header",
    send_response: unsafe extern "C" fn(Filter, u32, *const ModuleHeader, usize, ModuleBuffer, ModuleBuffer)
        = "http_send_response",
    get_body_size: unsafe extern "C" fn(Filter, u32) -> usize = "http_get_body_size",
    get_body_chunks_size: unsafe extern "C" fn(Filter, u32) -> usize = "http_get_body_chunks_size",
    get_body_chunks: unsafe extern "C" fn(Filter, u32, *mut EnvoyBuffer) -> bool = "http_get_body_chunks",
    drain_body: unsafe extern "C" fn(Filter, u32, usize) -> bool = "http_drain_body",
    append_body: unsafe extern "C" fn(Filter, u32, ModuleBuffer) -> bool = "http_append_body",
    received_buffered_request_body: unsafe extern "C" fn(Filter) -> bool
        = "http_received_buffered_request_body",
    received_buffered_response_body: unsafe extern "C" fn(Filter) -> bool
        = "http_received_buffered_response_body",
    clear_route_cache: unsafe extern "C" fn(Filter) = "http_clear_route_cache",
    get_attribute_string: unsafe extern "C" fn(Filter, usize, *mut EnvoyBuffer) -> bool
        = "http_filter_get_attribute_string",
    reset_stream: unsafe extern "C" fn(Filter, u32, ModuleBuffer) = "http_filter_reset_stream",
    // The HTTP filter's counters take label names and values; the module passes none (its
    // names carry the plugin and the role, as the Wasm module's do).
    http_define_counter: unsafe extern "C" fn(Filter, ModuleBuffer, *const ModuleBuffer, usize, *mut usize) -> u32
        = "http_filter_config_define_counter",
    http_increment_counter: unsafe extern "C" fn(Filter, usize, *const ModuleBuffer, usize, u64) -> u32
        = "http_filter_increment_counter",
    network_define_counter: unsafe extern "C" fn(Filter, ModuleBuffer, *mut usize) -> u32
        = "network_filter_config_define_counter",
    network_read_chunks_size: unsafe extern "C" fn(Filter) -> usize
        = "network_filter_get_read_buffer_chunks_size",
    network_read_chunks: unsafe extern "C" fn(Filter, *mut EnvoyBuffer) -> bool
        = "network_filter_get_read_buffer_chunks",
    network_increment_counter: unsafe extern "C" fn(Filter, usize, u64) -> u32
        = "network_filter_increment_counter",
    network_close: unsafe extern "C" fn(Filter, u32) = "network_filter_close",
}

static HOST: OnceLock<Host> = OnceLock::new();

/// Resolves every callback; the error names the first one Envoy does not export.
pub fn init() -> Result<(), &'static str> {
    if HOST.get().is_none() {
        let _ = HOST.set(resolve()?);
    }
    Ok(())
}

/// The callbacks; `None` before a successful [`init`] (never, once Envoy has loaded us).
pub fn host() -> Option<&'static Host> {
    HOST.get()
}

mod http_hooks;
mod network_hooks;
mod owned;
