//! The hooks Envoy calls on the HTTP filter (`envoy.filters.http.dynamic_modules`), and the
//! module's load hook. Each turns Envoy's pointers into a [`Stream`] handle and the stream's
//! [`StreamFilter`] and hands them to safe code.

use std::ffi::{c_char, c_void};

use super::owned::{
    config_into_raw, drop_config, drop_state, share_config, state_into_raw, state_mut,
};
use super::{init, EnvoyBuffer, Status, ABI_VERSION};
use crate::dynamic_module::host::{ConfigScope, Stream};
use crate::dynamic_module::http::{FilterConfig, StreamFilter};
use crate::dynamic_module::{configured, guard};

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    match guard(init) {
        Some(Ok(())) => ABI_VERSION.as_ptr().cast(),
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
    // SAFETY: Envoy's buffers, valid for this hook; parsed into owned values before it ends.
    let (name, config) = unsafe { (name.bytes(), config.bytes()) };
    // SAFETY: Envoy's configuration pointer for this hook; the scope ends with it.
    let scope = unsafe { ConfigScope::http(config_envoy_ptr) };
    let made = guard(|| FilterConfig::new(name, config, &scope));
    config_into_raw(configured(made, FilterConfig::summary))
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
    match unsafe { share_config::<FilterConfig>(config) } {
        Some(config) => state_into_raw(StreamFilter::new(config)),
        None => std::ptr::null(),
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    // SAFETY: the state filter_new made; Envoy destroys each filter once.
    unsafe { drop_state::<StreamFilter>(filter) };
}

/// Runs one stream hook's work on its handle and state; continues for a null filter.
///
/// # Safety
/// `envoy` and `filter` are the pointers Envoy passed to the running hook.
unsafe fn on_stream(
    envoy: *mut c_void,
    filter: *const c_void,
    f: impl FnOnce(&mut StreamFilter, &Stream) -> Status,
) -> u32 {
    // SAFETY: the hook's stream pointer, used only during the hook.
    let stream = unsafe { Stream::new(envoy) };
    // SAFETY: the state filter_new made; Envoy runs one stream's hooks on one thread, one at
    // a time, and never after destroy.
    let filter = unsafe { state_mut::<StreamFilter>(filter) };
    match (filter, stream) {
        (Some(filter), Some(stream)) => f(filter, &stream) as u32,
        _ => Status::Continue as u32,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe { on_stream(envoy, filter, |f, s| f.on_request_headers(s, end_of_stream)) }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe { on_stream(envoy, filter, |f, s| f.on_request_body(s, end_of_stream)) }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    envoy: *mut c_void,
    filter: *const c_void,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe { on_stream(envoy, filter, |f, s| f.on_request_trailers(s)) }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        on_stream(envoy, filter, |f, s| {
            f.on_response_headers(s, end_of_stream)
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
    unsafe { on_stream(envoy, filter, |f, s| f.on_response_body(s, end_of_stream)) }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: *mut c_void,
    filter: *const c_void,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe { on_stream(envoy, filter, |f, s| f.on_response_trailers(s)) }
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
