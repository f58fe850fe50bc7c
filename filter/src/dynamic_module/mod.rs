//! The filter as an Envoy dynamic module (`envoy.filters.http.dynamic_modules`, Envoy 1.40):
//! the same plugin configuration JSON, parsed and validated by [`crate::config`], and the same
//! role logic as the Wasm module, behind Envoy's native C ABI instead of proxy-wasm. Built
//! natively, the crate's cdylib is `libwasm_filter.so`, which Envoy finds by the name
//! `wasm_filter` in `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`.
//!
//! The roles that fit an HTTP filter run here: `http-header-operation`,
//! `http-body-operation` and `rate-limit` (its table in process memory, shared by every
//! worker); `tcp-total-data-size-counter` runs as a network filter
//! (`envoy.filters.network.dynamic_modules`, [`tcp`]). The stats aggregator is refused by
//! name when the configuration is loaded.
//!
//! Nothing unwinds into Envoy: every hook runs under `catch_unwind`, and a panic fails its
//! request closed (a 500 local reply, or a reset once the response has started) while Envoy
//! and every other stream go on. The configuration hook refuses a bad configuration by
//! returning null after logging the reason, which names the field; Envoy then rejects the
//! filter.

// The foreign edge (`unsafe` allowed, each block with its `SAFETY:`): the ABI, the calls
// into Envoy, the counters' calls, and the hooks Envoy calls (here and in `tcp`). The roles'
// glue is safe Rust.
mod abi;
#[deny(unsafe_code)]
mod body;
#[deny(unsafe_code)]
mod headers;
mod host;
mod metrics;
#[deny(unsafe_code)]
mod rate_limit;
mod tcp;

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use abi::{EnvoyBuffer, Status as Outcome};
use body::{BodyRole, Event};
use host::{log, Stream};
use metrics::Metrics;

use crate::body_flow::Side;
use crate::body_ops::BodyOperation;
use crate::config::PluginConfig;
use crate::header_ops::HeaderOperation;

/// The `filter_name` the module answers to, alone or as `wasm-filter/<plugin>`.
const FILTER_NAME: &str = "wasm-filter";

/// A plugin's name in `filter_name` is at most this long (its metric names cut it shorter).
const MAX_PLUGIN_NAME: usize = 256;

/// Configurations are read whole, but never more than this (as in the Wasm module).
const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// Fault injection for the fail-closed tests, compiled in only with the `fault` cargo
/// feature (the tests' build; never the `.so` `make build` ships): a request carrying
/// `x-wasm-filter-fault: panic` panics inside the request headers hook, and a connection
/// whose data starts with [`FAULT_MARKER`] panics inside the network read hook.
#[cfg(feature = "fault")]
const FAULT_MARKER: &[u8] = b"x-wasm-filter-fault: panic";

enum Role {
    Headers(HeaderOperation, headers::Counters),
    Body(BodyOperation, body::Counters),
    RateLimit(rate_limit::Limiter),
}

/// One filter configuration, shared by every stream of every worker.
struct FilterConfig {
    role: Role,
}

/// A stream's role state.
enum State {
    /// Whether `when` matched the request (the response is edited only then).
    Headers {
        matched: bool,
    },
    Body(body::BodyStream),
    RateLimit,
    /// A hook panicked: the request was failed closed; the rest of the stream is left to
    /// Envoy.
    Failed,
}

struct StreamFilter {
    config: Arc<FilterConfig>,
    state: State,
}

/// The plugin's name, from `filter_name`: `wasm-filter/<plugin>` names it (it tags the
/// metrics, as a Wasm plugin's `name` does); plain `wasm-filter` is the plugin `wasm-filter`.
fn plugin_name(name: &[u8]) -> Result<String, String> {
    let unknown = || {
        format!(
            "filter_name {:?} is unknown: this module's filter is {FILTER_NAME:?}, or \
             \"{FILTER_NAME}/<plugin>\" to name the plugin in its metrics",
            String::from_utf8_lossy(&name[..name.len().min(MAX_PLUGIN_NAME)])
        )
    };
    let name = std::str::from_utf8(name).map_err(|_| unknown())?;
    match name.strip_prefix(FILTER_NAME) {
        Some("") => Ok(FILTER_NAME.to_string()),
        Some(rest) => match rest.strip_prefix('/') {
            Some(plugin) if !plugin.is_empty() && plugin.len() <= MAX_PLUGIN_NAME => {
                Ok(plugin.to_string())
            }
            _ => Err(unknown()),
        },
        None => Err(unknown()),
    }
}

/// The plugin configuration Envoy hands a filter, checked as the Wasm module checks it: the
/// filter name, the size bound, then [`PluginConfig::parse`]; with the plugin's name.
fn plugin_config(name: &[u8], config: &[u8]) -> Result<(String, PluginConfig), String> {
    let plugin = plugin_name(name)?;
    if config.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "the plugin configuration is {} bytes, over the {MAX_CONFIG_BYTES}-byte limit",
            config.len()
        ));
    }
    Ok((plugin, PluginConfig::parse(config)?))
}

/// The filter configuration, its counters defined on `envoy` (Envoy's configuration
/// pointer, valid during config_new; never called through before Envoy loads the module).
/// # Safety
/// `envoy` is the configuration pointer Envoy passed to the running config_new hook.
unsafe fn parse(name: &[u8], config: &[u8], envoy: *mut c_void) -> Result<FilterConfig, String> {
    let (plugin, config) = plugin_config(name, config)?;
    // SAFETY: the caller's configuration pointer, during its hook.
    let m = unsafe { Metrics::http(envoy, &plugin, config.role()) };
    let role = match config {
        PluginConfig::HttpHeaderOperation(ops) => Role::Headers(ops, headers::Counters::new(&m)),
        PluginConfig::HttpBodyOperation(ops) => Role::Body(ops, body::Counters::new(&m)),
        PluginConfig::RateLimit(c) => Role::RateLimit(rate_limit::Limiter::new(c, &m)),
        PluginConfig::TcpTotalDataSizeCounter(_) => {
            return Err(format!(
                "role: {:?} is a network filter: configure it in \
                 envoy.filters.network.dynamic_modules, not envoy.filters.http.dynamic_modules",
                tcp::ROLE
            ))
        }
        other => {
            return Err(format!(
                "role: {:?} runs only in the Wasm module; as a dynamic module the roles are \
                 http-header-operation, http-body-operation, rate-limit and (as a network \
                 filter) tcp-total-data-size-counter",
                other.role()
            ))
        }
    };
    Ok(FilterConfig { role })
}

fn summary(role: &Role) -> String {
    match role {
        Role::Headers(ops, _) => {
            let (req, resp) = ops.count();
            format!("http-header-operation (request: {req} ops, response: {resp} ops)")
        }
        Role::Body(ops, _) => format!("http-body-operation ({})", ops.summary()),
        Role::RateLimit(l) => format!("rate-limit ({})", l.summary()),
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    let init = guard(abi::init);
    match init {
        Some(Ok(())) => abi::ABI_VERSION.as_ptr().cast(),
        Some(Err(missing)) => {
            // No logger without the callbacks: Envoy's stderr is the one place left.
            eprintln!("wasm-filter: this Envoy does not export {missing}: the module needs Envoy 1.40's dynamic-module ABI");
            std::ptr::null()
        }
        None => std::ptr::null(),
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy_ptr: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    let made = guard(|| {
        // SAFETY: Envoy's buffers, valid for this hook; parsed into owned values here.
        let (name, config) = unsafe { (name.bytes(), config.bytes()) };
        // SAFETY: Envoy's configuration pointer for this hook.
        unsafe { parse(name, config, config_envoy_ptr) }
    });
    config_pointer(made, |config| {
        format!("configured role {}", summary(&config.role))
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    // SAFETY: the pointer config_new made; Envoy destroys it once.
    unsafe { drop_config::<FilterConfig>(config) };
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy_ptr: *mut c_void,
) -> *const c_void {
    // SAFETY: config_new's pointer, alive until config_destroy, which Envoy calls only after
    // its last stream.
    let Some(config) = (unsafe { share_config::<FilterConfig>(config) }) else {
        return std::ptr::null();
    };
    let state = match &config.role {
        Role::Headers(ops, _) => State::Headers {
            matched: ops.when.is_none(),
        },
        Role::Body(..) => State::Body(body::BodyStream::default()),
        Role::RateLimit(_) => State::RateLimit,
    };
    Box::into_raw(Box::new(StreamFilter { config, state }))
        .cast_const()
        .cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    if !filter.is_null() {
        // SAFETY: the Box filter_new made; Envoy destroys each filter once.
        drop(unsafe { Box::from_raw(filter.cast::<StreamFilter>().cast_mut()) });
    }
}

/// What a `config_new` hook answers: the configuration behind a pointer Envoy keeps until
/// `config_destroy`, or null, which makes Envoy refuse the configuration, with the reason
/// logged.
fn config_pointer<T>(
    made: Option<Result<T, String>>,
    configured: impl FnOnce(&T) -> String,
) -> *const c_void {
    match made {
        Some(Ok(config)) => {
            log!(Info, "{}", configured(&config));
            Arc::into_raw(Arc::new(config)).cast()
        }
        Some(Err(e)) => {
            log!(Error, "invalid plugin configuration: {e}");
            std::ptr::null()
        }
        None => {
            log!(Error, "invalid plugin configuration: the parser panicked");
            std::ptr::null()
        }
    }
}

/// Ends what [`config_pointer`] made.
///
/// # Safety
/// `config` is null or a pointer `config_pointer::<T>` made that has not been dropped yet.
unsafe fn drop_config<T>(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: per the contract, the Arc config_pointer leaked, dropped once.
        drop(unsafe { Arc::from_raw(config.cast::<T>()) });
    }
}

/// One more owner of a configuration, for a new stream or connection; `None` for null.
///
/// # Safety
/// `config` is null or a pointer `config_pointer::<T>` made that is not dropped before the
/// returned `Arc`'s owner.
unsafe fn share_config<T>(config: *const c_void) -> Option<Arc<T>> {
    if config.is_null() {
        return None;
    }
    let config = config.cast::<T>();
    // SAFETY: per the contract, config_pointer's Arc is alive: one more strong count for the
    // new owner.
    unsafe {
        Arc::increment_strong_count(config);
        Some(Arc::from_raw(config))
    }
}

/// Runs `f` so that no panic unwinds into Envoy (undefined behaviour across `extern "C"`):
/// `None` when it panicked. Every hook that can reach the roles' code goes through it; what
/// a panic means is the hook's to say.
fn guard<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Runs one hook of a stream under [`guard`]. A panic fails the request closed: a 500
/// local reply (Envoy resets the stream instead when the response has started), and the
/// stream's later hooks only continue.
///
/// # Safety
/// `envoy` and `filter` are the pointers Envoy passed to the running hook.
unsafe fn run(
    envoy: *mut c_void,
    filter: *const c_void,
    hook: &str,
    f: impl FnOnce(&mut StreamFilter, &Stream) -> Outcome,
) -> u32 {
    // SAFETY: the hook's stream pointer (the caller's contract).
    let (Some(stream), false) = (unsafe { Stream::new(envoy) }, filter.is_null()) else {
        return Outcome::Continue as u32;
    };
    // SAFETY: the Box filter_new made; Envoy runs one stream's hooks on one thread, one at a
    // time, and never after destroy.
    let filter = unsafe { &mut *filter.cast::<StreamFilter>().cast_mut() };
    if matches!(filter.state, State::Failed) {
        return Outcome::Continue as u32;
    }
    match guard(|| f(filter, &stream)) {
        Some(outcome) => outcome as u32,
        None => {
            filter.state = State::Failed;
            log!(
                Error,
                "panicked in the {hook} hook: the request fails closed (500)"
            );
            stream.send_response(500, "wasm_filter_panicked", b"internal error\n", &[]);
            Outcome::Stop as u32
        }
    }
}

/// The fault the tests inject (see [`FAULT_MARKER`]).
#[cfg(feature = "fault")]
#[allow(clippy::panic)]
fn injected_fault(stream: &Stream) {
    if stream
        .header(Side::Request, "x-wasm-filter-fault")
        .as_deref()
        == Some("panic")
    {
        panic!("wasm-filter: injected fault (x-wasm-filter-fault: panic)");
    }
}

#[cfg(not(feature = "fault"))]
fn injected_fault(_: &Stream) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        run(envoy, filter, "request headers", |f, stream| {
            injected_fault(stream);
            match (&f.config.role, &mut f.state) {
                (Role::Headers(ops, counters), State::Headers { matched }) => {
                    *matched = headers::on_request_headers(ops, counters, stream);
                    Outcome::Continue
                }
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Request,
                    Event::Headers { end_of_stream },
                ),
                (Role::RateLimit(l), _) => l.on_request_headers(stream),
                _ => Outcome::Continue,
            }
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        run(envoy, filter, "request body", |f, stream| {
            match (&f.config.role, &mut f.state) {
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Request,
                    Event::Body { end_of_stream },
                ),
                _ => Outcome::Continue,
            }
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    envoy: *mut c_void,
    filter: *const c_void,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        run(envoy, filter, "request trailers", |f, stream| {
            match (&f.config.role, &mut f.state) {
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Request,
                    Event::Trailers,
                ),
                _ => Outcome::Continue,
            }
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        run(envoy, filter, "response headers", |f, stream| {
            match (&f.config.role, &mut f.state) {
                (Role::Headers(ops, _), State::Headers { matched: true }) => {
                    headers::on_response_headers(ops, stream);
                    Outcome::Continue
                }
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Response,
                    Event::Headers { end_of_stream },
                ),
                _ => Outcome::Continue,
            }
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        run(envoy, filter, "response body", |f, stream| {
            match (&f.config.role, &mut f.state) {
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Response,
                    Event::Body { end_of_stream },
                ),
                _ => Outcome::Continue,
            }
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: *mut c_void,
    filter: *const c_void,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        run(envoy, filter, "response trailers", |f, stream| {
            match (&f.config.role, &mut f.state) {
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Response,
                    Event::Trailers,
                ),
                _ => Outcome::Continue,
            }
        })
    }
}

// Hooks Envoy requires every HTTP filter module to export; the roles use none of them
// (no callouts, no scheduling, no watermarks).

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _envoy: *mut c_void,
    _filter: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *const c_void,
    _headers_size: usize,
    _body_chunks: *const c_void,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _headers: *const c_void,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _data: *const c_void,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _trailers: *const c_void,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: *mut c_void,
    _filter: *const c_void,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: *mut c_void,
    _filter: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: *mut c_void,
    _filter: *const c_void,
) {
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_the_wasm_modules_and_refusals_name_the_field() {
        // SAFETY: no Envoy in a unit test (no callbacks resolved): the null configuration
        // pointer is never passed on.
        let parse =
            |name: &[u8], config: &[u8]| unsafe { parse(name, config, std::ptr::null_mut()) };
        let ok = parse(
            b"wasm-filter",
            br#"{"role":"http-header-operation","request":{"remove":["x-a"]}}"#,
        )
        .unwrap();
        assert!(summary(&ok.role).starts_with("http-header-operation"));
        let e = parse(b"wasm-filter", br#"{"role":"rate-limit","burst":1}"#)
            .err()
            .unwrap();
        assert!(e.contains("missing field `key`"), "{e}");
        let e = parse(
            b"wasm-filter",
            br#"{"role":"http-header-operation","reqest":{}}"#,
        )
        .err()
        .unwrap();
        assert!(e.contains("unknown field `reqest`"), "{e}");
        let e = parse(b"wasm-filter", br#"{"role":"tcp-total-data-size-counter"}"#)
            .err()
            .unwrap();
        assert!(
            e.starts_with("role: \"tcp-total-data-size-counter\""),
            "{e}"
        );
        let e = parse(b"other", b"{}").err().unwrap();
        assert!(e.contains("filter_name \"other\""), "{e}");
    }

    #[test]
    fn filter_name_may_name_the_plugin() {
        assert_eq!(plugin_name(b"wasm-filter").unwrap(), "wasm-filter");
        assert_eq!(
            plugin_name(b"wasm-filter/header-ops").unwrap(),
            "header-ops"
        );
        for bad in [
            &b"wasm-filter/"[..],
            b"wasm-filterx",
            b"wasm-filter-x",
            b"\xff",
        ] {
            let e = plugin_name(bad).unwrap_err();
            assert!(e.contains("wasm-filter/<plugin>"), "{e}");
        }
        assert!(plugin_name(format!("wasm-filter/{}", "p".repeat(257)).as_bytes()).is_err());
    }
}
