//! `tcp-total-data-size-counter` as an Envoy network filter
//! (`envoy.filters.network.dynamic_modules`): bytes each way as they pass, then, once the
//! connection closes, the Wasm module's log line and the totals updated. The totals live in
//! process memory behind one mutex, which every worker adds its closed connections to (the
//! Wasm module's compare-and-swap on shared data, without retries); the per-role counters
//! are Envoy stats, process-wide as Envoy's counters are, named as the Wasm module's
//! (`<metrics_namespace>.wasm_filter.plugin.<plugin>.role.<role>.<metric>`).
//!
//! A panic in a hook closes its connection (fail closed): data it was reading goes no
//! further, and the connection's later hooks only continue; Envoy and every other
//! connection go on.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use super::abi::{self, EnvoyBuffer};
use super::host::log;
use super::metrics::{Counter, Metrics};
use super::{config_pointer, drop_config, guard, plugin_config, share_config};
use crate::config::PluginConfig;
use crate::tcp_count::{TcpCounter, Totals};

/// The role's name in the plugin configuration and in its stats.
pub const ROLE: &str = "tcp-total-data-size-counter";

/// Every connection's totals since the module was loaded, across listeners and workers.
static TOTALS: Mutex<Totals> = Mutex::new(Totals {
    bytes_in: 0,
    bytes_out: 0,
    connections: 0,
});

struct Counters {
    bytes_in: Counter,
    bytes_out: Counter,
    connections: Counter,
}

struct TcpConfig {
    counter: TcpCounter,
    counters: Counters,
}

struct Connection {
    config: Arc<TcpConfig>,
    bytes_in: u64,
    bytes_out: u64,
    /// Counted into the totals already (a close event came, or a hook panicked).
    done: bool,
}

/// The role's configuration and the plugin's name.
fn parse(name: &[u8], config: &[u8]) -> Result<(String, TcpCounter), String> {
    match plugin_config(name, config)? {
        (plugin, PluginConfig::TcpTotalDataSizeCounter(c)) => Ok((plugin, c)),
        (_, other) => Err(format!(
            "role: {:?} is an HTTP role: configure it in envoy.filters.http.dynamic_modules; \
             the network filter's role is {ROLE:?}",
            other.role()
        )),
    }
}

/// Whether the data being read starts with [`super::FAULT_MARKER`] (only asked when the
/// tests inject faults).
///
/// # Safety
/// `envoy` is the connection pointer Envoy passed to the running read hook.
#[cfg(feature = "fault")]
unsafe fn fault_requested(envoy: *mut c_void) -> bool {
    use super::FAULT_MARKER;
    let Some(host) = abi::host() else {
        return false;
    };
    // SAFETY: Envoy's filter pointer, valid during the read hook.
    let n = unsafe { (host.network_read_chunks_size)(envoy) };
    if n == 0 || n > 1024 {
        return false;
    }
    let mut chunks = vec![EnvoyBuffer::NULL; n];
    // SAFETY: `chunks` has room for the `n` buffers Envoy reported.
    if !unsafe { (host.network_read_chunks)(envoy, chunks.as_mut_ptr()) } {
        return false;
    }
    let mut head = Vec::with_capacity(FAULT_MARKER.len());
    for c in chunks {
        // SAFETY: Envoy's buffers, valid during the hook; copied out here.
        let bytes = unsafe { c.bytes() };
        let room = FAULT_MARKER.len() - head.len();
        head.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
    head == FAULT_MARKER
}

/// The fault the tests inject (see [`super::FAULT_MARKER`]).
///
/// # Safety
/// As [`fault_requested`].
#[cfg(feature = "fault")]
#[allow(clippy::panic)]
unsafe fn injected_fault(envoy: *mut c_void) {
    // SAFETY: the caller's contract.
    if unsafe { fault_requested(envoy) } {
        panic!(
            "wasm-filter: injected fault (connection data starts with x-wasm-filter-fault: panic)"
        );
    }
}

/// # Safety
/// Nothing: it does nothing (the contract is the fault build's).
#[cfg(not(feature = "fault"))]
unsafe fn injected_fault(_: *mut c_void) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_new(
    config_envoy_ptr: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    let made = guard(|| {
        // SAFETY: Envoy's buffers, valid for this hook; parsed into owned values here.
        let (name, config) = unsafe { (name.bytes(), config.bytes()) };
        let (plugin, counter) = parse(name, config)?;
        // SAFETY: Envoy's configuration pointer for this hook.
        let m = unsafe { Metrics::network(config_envoy_ptr, &plugin, ROLE) };
        let counters = Counters {
            bytes_in: m.counter("bytes_in_total"),
            bytes_out: m.counter("bytes_out_total"),
            connections: m.counter("connections_total"),
        };
        Ok::<_, String>(TcpConfig { counter, counters })
    });
    config_pointer(made, |config| {
        format!(
            "configured role {ROLE} (network filter, log_connections: {})",
            config.counter.log_connections
        )
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_destroy(config: *const c_void) {
    // SAFETY: the pointer config_new made; Envoy destroys it once.
    unsafe { drop_config::<TcpConfig>(config) };
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new(
    config: *const c_void,
    _filter_envoy_ptr: *mut c_void,
) -> *const c_void {
    // SAFETY: config_new's pointer, alive until config_destroy, which Envoy calls only after
    // its last connection.
    let Some(config) = (unsafe { share_config::<TcpConfig>(config) }) else {
        return std::ptr::null();
    };
    let connection = Connection {
        config,
        bytes_in: 0,
        bytes_out: 0,
        done: false,
    };
    Box::into_raw(Box::new(connection)).cast_const().cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_destroy(filter: *const c_void) {
    if !filter.is_null() {
        // SAFETY: the Box filter_new made; Envoy destroys each filter once.
        drop(unsafe { Box::from_raw(filter.cast::<Connection>().cast_mut()) });
    }
}

/// Runs one hook of a connection under [`guard`]; `false` when it panicked. A panic closes
/// the connection (what a counter that cannot count does to the Wasm module's connection: it
/// fails closed), and the connection's later hooks only continue.
///
/// # Safety
/// `envoy` and `filter` are the pointers Envoy passed to the running hook.
unsafe fn run(
    envoy: *mut c_void,
    filter: *const c_void,
    hook: &str,
    f: impl FnOnce(&mut Connection),
) -> bool {
    if filter.is_null() {
        return true;
    }
    // SAFETY: the Box filter_new made; Envoy runs one connection's hooks on one thread, one
    // at a time, and never after destroy.
    let connection = unsafe { &mut *filter.cast::<Connection>().cast_mut() };
    if connection.done {
        return true;
    }
    if guard(|| f(connection)).is_some() {
        return true;
    }
    connection.done = true;
    log!(
        Error,
        "panicked in the network {hook} hook: the connection is closed"
    );
    if let Some(host) = abi::host() {
        // SAFETY: Envoy's filter pointer, valid during this hook.
        unsafe { (host.network_close)(envoy, abi::CLOSE_FLUSH_WRITE) };
    }
    false
}

/// What a data hook answers: the data goes on, unless the hook panicked.
fn data_status(ran: bool) -> u32 {
    if ran {
        abi::NETWORK_CONTINUE
    } else {
        abi::NETWORK_STOP
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new_connection(
    _envoy: *mut c_void,
    _filter: *const c_void,
) -> u32 {
    abi::NETWORK_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_read(
    envoy: *mut c_void,
    filter: *const c_void,
    data_length: usize,
    _end_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook, used during it.
    let ran = unsafe {
        run(envoy, filter, "read", |c| {
            injected_fault(envoy);
            let n = data_length as u64;
            c.bytes_in = c.bytes_in.saturating_add(n);
            c.config.counters.bytes_in.add(envoy, n);
        })
    };
    data_status(ran)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_write(
    envoy: *mut c_void,
    filter: *const c_void,
    data_length: usize,
    _end_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook, used during it.
    let ran = unsafe {
        run(envoy, filter, "write", |c| {
            let n = data_length as u64;
            c.bytes_out = c.bytes_out.saturating_add(n);
            c.config.counters.bytes_out.add(envoy, n);
        })
    };
    data_status(ran)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_event(
    envoy: *mut c_void,
    filter: *const c_void,
    event: u32,
) {
    if !matches!(event, abi::EVENT_REMOTE_CLOSE | abi::EVENT_LOCAL_CLOSE) {
        return;
    }
    // SAFETY: the pointers Envoy passed to this hook, used during it.
    unsafe {
        run(envoy, filter, "close event", |c| {
            c.done = true;
            let (bytes_in, bytes_out) = (c.bytes_in, c.bytes_out);
            if c.config.counter.log_connections {
                log!(Info, "tcp connection closed: in={bytes_in} out={bytes_out}");
            }
            c.config.counters.connections.add(envoy, 1);
            let totals = {
                // A panic elsewhere while holding the lock leaves plain numbers: still usable.
                let mut t = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
                *t = t.add_connection(bytes_in, bytes_out);
                *t
            };
            log!(Debug, "tcp totals: {}", totals.encode());
        })
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tcp_role_is_a_network_filter() {
        let (plugin, c) = parse(
            b"wasm-filter/tcp-counter",
            br#"{"role":"tcp-total-data-size-counter"}"#,
        )
        .unwrap();
        assert_eq!(plugin, "tcp-counter");
        assert!(c.log_connections);
        let e = parse(
            b"wasm-filter",
            br#"{"role":"tcp-total-data-size-counter","log":true}"#,
        )
        .unwrap_err();
        assert!(e.contains("unknown field `log`"), "{e}");
        let e = parse(
            b"wasm-filter",
            br#"{"role":"http-header-operation","request":{}}"#,
        )
        .unwrap_err();
        assert!(
            e.starts_with("role: \"http-header-operation\" is an HTTP role"),
            "{e}"
        );
        let e = parse(b"other", br#"{"role":"tcp-total-data-size-counter"}"#).unwrap_err();
        assert!(e.contains("filter_name \"other\""), "{e}");
    }
}
