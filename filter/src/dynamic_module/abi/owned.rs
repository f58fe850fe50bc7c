//! What the module hands Envoy to keep as an opaque pointer, and takes back: a filter
//! configuration (an `Arc`, one more owner per stream or connection, so a configuration
//! Envoy destroys while streams still run stays alive for them), and one stream's or
//! connection's state (a `Box`, destroyed once).

use std::ffi::c_void;
use std::sync::Arc;

/// A configuration for Envoy to keep until its config_destroy hook; null (which makes Envoy
/// refuse the configuration) for `None`.
pub fn config_into_raw<T>(config: Option<T>) -> *const c_void {
    config.map_or(std::ptr::null(), |c| Arc::into_raw(Arc::new(c)).cast())
}

/// Ends what [`config_into_raw`] made.
///
/// # Safety
/// `config` is null or a pointer `config_into_raw::<T>` made that has not been dropped yet.
pub unsafe fn drop_config<T>(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: per the contract, the Arc config_into_raw leaked, dropped once.
        drop(unsafe { Arc::from_raw(config.cast::<T>()) });
    }
}

/// One more owner of a configuration, for a new stream or connection; `None` for null.
///
/// # Safety
/// `config` is null or a pointer `config_into_raw::<T>` made that is not dropped before the
/// returned `Arc`'s owner.
pub unsafe fn share_config<T>(config: *const c_void) -> Option<Arc<T>> {
    if config.is_null() {
        return None;
    }
    let config = config.cast::<T>();
    // SAFETY: per the contract, config_into_raw's Arc is alive: one more strong count for
    // the new owner.
    unsafe {
        Arc::increment_strong_count(config);
        Some(Arc::from_raw(config))
    }
}

/// A stream's or connection's state, for Envoy to pass back to each of its hooks.
pub fn state_into_raw<T>(state: T) -> *const c_void {
    Box::into_raw(Box::new(state)).cast_const().cast()
}

/// The state behind a hook's pointer; `None` for null.
///
/// # Safety
/// `state` is null or a pointer `state_into_raw::<T>` made and not dropped, and nothing
/// else uses it while the returned reference lives (Envoy runs one stream's or connection's
/// hooks on one thread, one at a time).
pub unsafe fn state_mut<'a, T>(state: *const c_void) -> Option<&'a mut T> {
    // SAFETY: per the contract.
    unsafe { state.cast::<T>().cast_mut().as_mut() }
}

/// Ends what [`state_into_raw`] made.
///
/// # Safety
/// `state` is null or a pointer `state_into_raw::<T>` made that has not been dropped yet.
pub unsafe fn drop_state<T>(state: *const c_void) {
    if !state.is_null() {
        // SAFETY: per the contract, the Box state_into_raw leaked, dropped once.
        drop(unsafe { Box::from_raw(state.cast::<T>().cast_mut()) });
    }
}
