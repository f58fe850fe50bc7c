//! Safe calls into Envoy over [`super::abi`]'s callbacks: on the filter configuration Envoy
//! is creating ([`ConfigScope`]), on one HTTP stream ([`Stream`]) and on one connection
//! ([`Connection`]). Each handle wraps the pointer Envoy passed to the running hook; only
//! `abi`'s hooks make one (the constructors are `unsafe`), so no safe code ever holds a raw
//! Envoy pointer. Each call returns what Envoy answered (a bool, an `Option`) so the roles
//! decide what a failure means; nothing here panics.

use std::ffi::c_void;

use super::abi::{self, EnvoyBuffer, ModuleBuffer, ModuleHeader};
use super::metrics::Counter;
use crate::body_flow::Side;
use crate::config::LogLevel;

/// Logs `wasm-filter: <message>` through Envoy's `dynamic_modules` logger, formatting only
/// when Envoy's level lets the line through.
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        $crate::dynamic_module::host::log_with(
            $crate::config::LogLevel::$level,
            || format!("wasm-filter: {}", format_args!($($arg)*)),
        )
    };
}
pub(crate) use log;

pub fn log_with(level: LogLevel, message: impl FnOnce() -> String) {
    let Some(host) = abi::host() else { return };
    // SAFETY: plain values; Envoy only reads the level.
    if !unsafe { (host.log_enabled)(level as u32) } {
        return;
    }
    let text = message();
    // SAFETY: the buffer points at `text`, alive for the call.
    unsafe { (host.log)(level as u32, ModuleBuffer::of(text.as_bytes())) }
}

fn headers(side: Side) -> u32 {
    match side {
        Side::Request => abi::REQUEST_HEADER,
        Side::Response => abi::RESPONSE_HEADER,
    }
}

fn received(side: Side) -> u32 {
    match side {
        Side::Request => abi::RECEIVED_REQUEST_BODY,
        Side::Response => abi::RECEIVED_RESPONSE_BODY,
    }
}

/// Values of one header read at most: past it, the header is described, not read.
pub const MAX_HEADER_VALUES: usize = 16;

/// Which of Envoy's filter kinds a configuration is for.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Http,
    Network,
}

/// The filter configuration Envoy is creating, valid during its config_new hook: where the
/// roles' counters are defined.
pub struct ConfigScope {
    ptr: Option<*mut c_void>,
    kind: Kind,
}

impl ConfigScope {
    /// An HTTP filter configuration.
    ///
    /// # Safety
    /// `ptr` is the configuration pointer Envoy passed to the running config_new hook, and
    /// the scope is used only during it.
    pub unsafe fn http(ptr: *mut c_void) -> Self {
        Self {
            ptr: Some(ptr),
            kind: Kind::Http,
        }
    }

    /// A network filter configuration.
    ///
    /// # Safety
    /// As [`ConfigScope::http`].
    pub unsafe fn network(ptr: *mut c_void) -> Self {
        Self {
            ptr: Some(ptr),
            kind: Kind::Network,
        }
    }

    /// A scope that defines nothing (the unit tests': no Envoy).
    #[cfg(test)]
    pub fn none() -> Self {
        Self {
            ptr: None,
            kind: Kind::Http,
        }
    }

    /// Defines a counter with no labels: its id, or what Envoy answered instead of
    /// success (`None`: no Envoy to ask).
    pub fn define_counter(&self, name: &str) -> Result<usize, Option<u32>> {
        let (Some(ptr), Some(host)) = (self.ptr, abi::host()) else {
            return Err(None);
        };
        let buffer = ModuleBuffer::of(name.as_bytes());
        let mut id = 0usize;
        // SAFETY: Envoy's configuration pointer during config_new (`ConfigScope::http`,
        // `ConfigScope::network`); the name is alive for the call, `id` is writable, no
        // labels (a null array of length 0).
        let result = unsafe {
            match self.kind {
                Kind::Http => (host.http_define_counter)(ptr, buffer, std::ptr::null(), 0, &mut id),
                Kind::Network => (host.network_define_counter)(ptr, buffer, &mut id),
            }
        };
        if result == abi::METRICS_SUCCESS {
            Ok(id)
        } else {
            Err(Some(result))
        }
    }
}

/// Envoy's filter for one stream, valid for the hook being run.
#[derive(Clone, Copy)]
pub struct Stream {
    ptr: *mut c_void,
    host: &'static abi::Host,
}

impl Stream {
    /// `None` before the callbacks are resolved (Envoy calls no hook before that).
    ///
    /// # Safety
    /// `ptr` is the filter pointer Envoy passed to the hook that is running; the `Stream`
    /// is used only during that hook.
    pub unsafe fn new(ptr: *mut c_void) -> Option<Self> {
        Some(Self {
            ptr,
            host: abi::host()?,
        })
    }

    /// A header's first value, when it is there and is UTF-8.
    pub fn header(&self, side: Side, name: &str) -> Option<String> {
        let mut count = 0usize;
        let bytes = self.header_at(side, name, 0, &mut count)?;
        std::str::from_utf8(&bytes).ok().map(str::to_string)
    }

    /// Every value of a header (one per header of that name, in order, at most
    /// [`MAX_HEADER_VALUES`] read); a value that is not UTF-8 is read as `(not UTF-8)`.
    pub fn header_values(&self, side: Side, name: &str) -> Vec<String> {
        let mut values = Vec::new();
        let mut count = 0usize;
        let mut index = 0usize;
        while let Some(bytes) = self.header_at(side, name, index, &mut count) {
            values.push(String::from_utf8(bytes).unwrap_or_else(|_| "(not UTF-8)".to_string()));
            index += 1;
            if index >= count.min(MAX_HEADER_VALUES) {
                break;
            }
        }
        if count > values.len() && values.len() == MAX_HEADER_VALUES {
            values.push(format!("({} more)", count - values.len()));
        }
        values
    }

    /// The `index`th value of a header, copied out of Envoy's buffer; `count` gets how many
    /// values the header has.
    fn header_at(
        &self,
        side: Side,
        name: &str,
        index: usize,
        count: &mut usize,
    ) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: `out` and `count` are writable; the key is alive for the call.
        let found = unsafe {
            (self.host.get_header)(
                self.ptr,
                headers(side),
                ModuleBuffer::of(name.as_bytes()),
                &mut out,
                index,
                count,
            )
        };
        if !found || out.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy's buffer, valid until the hook returns; copied out here.
        Some(unsafe { out.bytes() }.to_vec())
    }

    pub fn set_header(&self, side: Side, name: &str, value: &str) -> bool {
        // SAFETY: both buffers are alive for the call.
        unsafe {
            (self.host.set_header)(
                self.ptr,
                headers(side),
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    pub fn add_header(&self, side: Side, name: &str, value: &str) -> bool {
        // SAFETY: both buffers are alive for the call.
        unsafe {
            (self.host.add_header)(
                self.ptr,
                headers(side),
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    /// A null value removes the header (abi.h's `set_header`).
    pub fn remove_header(&self, side: Side, name: &str) -> bool {
        // SAFETY: the key is alive for the call; the null value is what removal takes.
        unsafe {
            (self.host.set_header)(
                self.ptr,
                headers(side),
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::NULL,
            )
        }
    }

    /// Answers the client locally; Envoy stops the stream's filter chain.
    pub fn send_response(&self, status: u32, details: &str, body: &[u8], headers: &[(&str, &str)]) {
        let headers: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader {
                key_ptr: k.as_ptr().cast(),
                key_length: k.len(),
                value_ptr: v.as_ptr().cast(),
                value_length: v.len(),
            })
            .collect();
        // SAFETY: the header array and the buffers it and the call point at are alive for
        // the call.
        unsafe {
            (self.host.send_response)(
                self.ptr,
                status,
                headers.as_ptr(),
                headers.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            )
        }
    }

    pub fn count(&self, counter: Counter, by: u64) {
        let (Some(id), true) = (counter.id(), by > 0) else {
            return;
        };
        // SAFETY: the stream's filter pointer, valid during the hook (`Stream::new`); an id
        // the stream's configuration defined; no labels (a null array of length 0).
        unsafe { (self.host.http_increment_counter)(self.ptr, id, std::ptr::null(), 0, by) };
    }

    /// The route is chosen again (after `:path` or another header it matches on changed).
    pub fn clear_route_cache(&self) {
        // SAFETY: the stream's filter pointer.
        unsafe { (self.host.clear_route_cache)(self.ptr) }
    }

    pub fn reset(&self, details: &str) {
        // SAFETY: the details are alive for the call.
        unsafe {
            (self.host.reset_stream)(
                self.ptr,
                abi::RESET_LOCAL,
                ModuleBuffer::of(details.as_bytes()),
            )
        }
    }

    /// The client's address as Envoy's `source.address` attribute has it (with the port).
    pub fn source_address(&self) -> Option<String> {
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: `out` is writable.
        let found = unsafe {
            (self.host.get_attribute_string)(self.ptr, abi::ATTRIBUTE_SOURCE_ADDRESS, &mut out)
        };
        if !found {
            return None;
        }
        // SAFETY: Envoy's buffer, valid until the hook returns; copied out here.
        std::str::from_utf8(unsafe { out.bytes() })
            .ok()
            .map(str::to_string)
    }

    /// Whether the chunk this body hook received is the body Envoy buffered (a filter
    /// before this one buffered it): then the two must not be counted twice.
    fn received_is_buffered(&self, side: Side) -> bool {
        // SAFETY: the stream's filter pointer.
        unsafe {
            match side {
                Side::Request => (self.host.received_buffered_request_body)(self.ptr),
                Side::Response => (self.host.received_buffered_response_body)(self.ptr),
            }
        }
    }

    /// The body types holding the side's bytes so far, in order: what Envoy buffered
    /// for this filter, then the chunk the hook received.
    fn body_parts(&self, side: Side) -> &'static [u32] {
        const REQUEST: [u32; 2] = [abi::BUFFERED_REQUEST_BODY, abi::RECEIVED_REQUEST_BODY];
        const RESPONSE: [u32; 2] = [abi::BUFFERED_RESPONSE_BODY, abi::RECEIVED_RESPONSE_BODY];
        let all: &'static [u32] = match side {
            Side::Request => &REQUEST,
            Side::Response => &RESPONSE,
        };
        if self.received_is_buffered(side) {
            &all[1..]
        } else {
            all
        }
    }

    /// The size of the side's body so far (buffered and just received), as proxy-wasm's
    /// body callbacks report it.
    pub fn body_size(&self, side: Side) -> usize {
        self.body_parts(side)
            .iter()
            // SAFETY: the stream's filter pointer and a body type of abi.h.
            .map(|&t| unsafe { (self.host.get_body_size)(self.ptr, t) })
            .sum()
    }

    /// The side's whole body so far, copied out; `None` when it is over `limit` bytes.
    pub fn body(&self, side: Side, limit: usize) -> Option<Vec<u8>> {
        let size = self.body_size(side);
        if size > limit {
            return None;
        }
        let mut out = Vec::with_capacity(size);
        for &t in self.body_parts(side) {
            // SAFETY: the stream's filter pointer and a body type of abi.h.
            let n = unsafe { (self.host.get_body_chunks_size)(self.ptr, t) };
            if n == 0 {
                continue;
            }
            let mut chunks = vec![EnvoyBuffer::NULL; n];
            // SAFETY: `chunks` has room for the `n` buffers Envoy reported.
            if !unsafe { (self.host.get_body_chunks)(self.ptr, t, chunks.as_mut_ptr()) } {
                continue;
            }
            for c in chunks {
                // SAFETY: Envoy's buffers, valid until the hook returns; copied out here.
                let bytes = unsafe { c.bytes() };
                if out.len() + bytes.len() > limit {
                    return None;
                }
                out.extend_from_slice(bytes);
            }
        }
        Some(out)
    }

    /// Replaces the side's whole body so far (buffered and received) with `new`.
    pub fn replace_body(&self, side: Side, new: &[u8]) -> bool {
        for &t in self.body_parts(side) {
            // SAFETY: the stream's filter pointer and a body type of abi.h.
            unsafe { (self.host.drain_body)(self.ptr, t, usize::MAX) };
        }
        // SAFETY: `new` is alive for the call.
        unsafe { (self.host.append_body)(self.ptr, received(side), ModuleBuffer::of(new)) }
    }
}

/// Envoy's network filter for one connection, valid for the hook being run.
#[derive(Clone, Copy)]
pub struct Connection {
    ptr: *mut c_void,
    host: &'static abi::Host,
}

impl Connection {
    /// `None` before the callbacks are resolved (Envoy calls no hook before that).
    ///
    /// # Safety
    /// `ptr` is the filter pointer Envoy passed to the network hook that is running; the
    /// `Connection` is used only during that hook.
    pub unsafe fn new(ptr: *mut c_void) -> Option<Self> {
        Some(Self {
            ptr,
            host: abi::host()?,
        })
    }

    pub fn count(&self, counter: Counter, by: u64) {
        let (Some(id), true) = (counter.id(), by > 0) else {
            return;
        };
        // SAFETY: the connection's filter pointer, valid during the hook
        // (`Connection::new`); an id its configuration defined.
        unsafe { (self.host.network_increment_counter)(self.ptr, id, by) };
    }

    /// Closes the connection once what was written is flushed.
    pub fn close(&self) {
        // SAFETY: the connection's filter pointer, valid during the hook.
        unsafe { (self.host.network_close)(self.ptr, abi::CLOSE_FLUSH_WRITE) };
    }

    /// The first bytes (at most `max`) of the data the read hook is handling, copied out;
    /// empty when Envoy holds more than 1024 chunks of it.
    #[cfg(feature = "fault")]
    pub fn read_head(&self, max: usize) -> Vec<u8> {
        // SAFETY: the connection's filter pointer, valid during the read hook.
        let n = unsafe { (self.host.network_read_chunks_size)(self.ptr) };
        if n == 0 || n > 1024 {
            return Vec::new();
        }
        let mut chunks = vec![EnvoyBuffer::NULL; n];
        // SAFETY: `chunks` has room for the `n` buffers Envoy reported.
        if !unsafe { (self.host.network_read_chunks)(self.ptr, chunks.as_mut_ptr()) } {
            return Vec::new();
        }
        let mut head = Vec::with_capacity(max);
        for c in chunks {
            // SAFETY: Envoy's buffers, valid during the hook; copied out here.
            let bytes = unsafe { c.bytes() };
            let room = max - head.len();
            head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        head
    }
}
