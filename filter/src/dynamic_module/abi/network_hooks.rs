//! The hooks Envoy calls on the network filter (`envoy.filters.network.dynamic_modules`).
//! Each turns Envoy's pointers into a [`Connection`] handle and the connection's [`Tally`]
//! and hands them to safe code.

use std::ffi::c_void;

use super::owned::{
    config_into_raw, drop_config, drop_state, share_config, state_into_raw, state_mut,
};
use super::{EnvoyBuffer, NetworkStatus, EVENT_LOCAL_CLOSE, EVENT_REMOTE_CLOSE};
use crate::dynamic_module::host::{ConfigScope, Connection};
use crate::dynamic_module::tcp::{Tally, TcpConfig};
use crate::dynamic_module::{configured, guard};

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_new(
    config_envoy_ptr: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: Envoy's buffers, valid for this hook; parsed into owned values before it ends.
    let (name, config) = unsafe { (name.bytes(), config.bytes()) };
    // SAFETY: Envoy's configuration pointer for this hook; the scope ends with it.
    let scope = unsafe { ConfigScope::network(config_envoy_ptr) };
    let made = guard(|| TcpConfig::new(name, config, &scope));
    config_into_raw(configured(made, TcpConfig::summary))
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
    match unsafe { share_config::<TcpConfig>(config) } {
        Some(config) => state_into_raw(Tally::new(config)),
        None => std::ptr::null(),
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_destroy(filter: *const c_void) {
    // SAFETY: the state filter_new made; Envoy destroys each filter once.
    unsafe { drop_state::<Tally>(filter) };
}

/// Runs one connection hook's work on its handle and state; `true` (the data goes on) for
/// a null filter.
///
/// # Safety
/// `envoy` and `filter` are the pointers Envoy passed to the running hook.
unsafe fn on_connection(
    envoy: *mut c_void,
    filter: *const c_void,
    f: impl FnOnce(&mut Tally, &Connection) -> bool,
) -> bool {
    // SAFETY: the hook's connection pointer, used only during the hook.
    let connection = unsafe { Connection::new(envoy) };
    // SAFETY: the state filter_new made; Envoy runs one connection's hooks on one thread,
    // one at a time, and never after destroy.
    let tally = unsafe { state_mut::<Tally>(filter) };
    match (tally, connection) {
        (Some(tally), Some(connection)) => f(tally, &connection),
        _ => true,
    }
}

/// What a data hook answers: the data goes on, unless the hook panicked.
fn data_status(ran: bool) -> u32 {
    let status = if ran {
        NetworkStatus::Continue
    } else {
        NetworkStatus::Stop
    };
    status as u32
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new_connection(
    _envoy: *mut c_void,
    _filter: *const c_void,
) -> u32 {
    NetworkStatus::Continue as u32
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_read(
    envoy: *mut c_void,
    filter: *const c_void,
    data_length: usize,
    _end_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    data_status(unsafe { on_connection(envoy, filter, |t, c| t.on_read(c, data_length)) })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_write(
    envoy: *mut c_void,
    filter: *const c_void,
    data_length: usize,
    _end_stream: bool,
) -> u32 {
    // SAFETY: the pointers Envoy passed to this hook.
    data_status(unsafe { on_connection(envoy, filter, |t, c| t.on_write(c, data_length)) })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_network_filter_event(
    envoy: *mut c_void,
    filter: *const c_void,
    event: u32,
) {
    if !matches!(event, EVENT_REMOTE_CLOSE | EVENT_LOCAL_CLOSE) {
        return;
    }
    // SAFETY: the pointers Envoy passed to this hook.
    unsafe {
        on_connection(envoy, filter, |t, c| {
            t.on_close(c);
            true
        })
    };
}
