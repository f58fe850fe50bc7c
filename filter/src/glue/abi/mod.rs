//! The proxy-wasm ABI 0.2.1 exports of the VM and its root contexts: start, the allocator the
//! host copies into, context creation and deletion, configuration, timers, queues and
//! callouts. The stream callbacks are in `stream`. Envoy skips a callback a module does not
//! export, so only those some role uses are here: no `proxy_on_done` (every context is done at
//! once, which is what the host assumes without it) and no `proxy_on_log` (a stream's end is
//! its deletion, which comes right after).
//!
//! The `u32` results are the ABI's `i32`s: 1 / 0 for the booleans.

mod stream;

use std::mem::MaybeUninit;

use super::contexts::{self, with_root};
use super::raw;
use crate::config::LogLevel;

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// Marks the ABI version Envoy speaks to the module in; never called.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The WASI reactor's start, before any other export: static constructors, then the panic
/// hook. The build aborts on panic, which traps the VM (Envoy then applies the plugin's
/// failure policy); the hook first logs the panic's message and place at `critical`, so the
/// operator sees why.
#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: wasi-libc's constructors, run once, before anything else runs in the module.
    #[cfg(target_os = "wasi")]
    unsafe {
        __wasm_call_ctors();
    }
    std::panic::set_hook(Box::new(|info| {
        raw::log(LogLevel::Critical as u32, &info.to_string());
    }));
}

/// Memory for what the host hands the module (headers, bodies, shared data): a `Vec<u8>`
/// of exactly `size` bytes, which `raw` takes back as one.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut v: Vec<MaybeUninit<u8>> = Vec::with_capacity(size);
    // SAFETY: the capacity is `size`; the bytes are uninitialised until the host writes them.
    unsafe { v.set_len(size) };
    Box::into_raw(v.into_boxed_slice()).cast::<u8>()
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, root_context_id: u32) {
    contexts::create(context_id, root_context_id);
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    contexts::delete(context_id);
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(root_id: u32, vm_configuration_size: usize) -> u32 {
    with_root("on_vm_start", root_id, |r| {
        r.on_vm_start(vm_configuration_size)
    })
    .is_some_and(|ok| ok)
    .into()
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(root_id: u32, plugin_configuration_size: usize) -> u32 {
    with_root("on_configure", root_id, |r| {
        r.on_configure(plugin_configuration_size)
    })
    .is_some_and(|ok| ok)
    .into()
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root_id: u32) {
    with_root("on_tick", root_id, |r| r.on_tick());
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(root_id: u32, queue_id: u32) {
    with_root("on_queue_ready", root_id, |r| r.on_queue_ready(queue_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    root_id: u32,
    token: u32,
    num_headers: usize,
    body_size: usize,
    _num_trailers: usize,
) {
    with_root("on_http_call_response", root_id, |r| {
        r.on_http_call_response(token, num_headers, body_size)
    });
}
