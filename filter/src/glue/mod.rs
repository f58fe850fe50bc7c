//! The proxy-wasm side, on the ABI directly (version 0.2.1): `abi` holds the exports Envoy
//! calls, `contexts` the table that finds a context's state by its id, `root` one plugin's
//! root context (it reads the VM and plugin configurations and becomes the role's root), and
//! `stream` what each stream gets from its root's role. Each role's glue has its own module;
//! `raw` holds the hostcalls they all use, which return statuses instead of panicking.
//!
//! The module has its own dispatcher rather than the proxy-wasm SDK's: per callback the SDK
//! looks the context up in a hash map and calls a boxed trait object allocated per stream,
//! where this one finds it in a slot indexed by the id and matches on an enum, with no
//! allocation per stream (docs/performance.md has the measurement). Nothing here panics on
//! what the host sends: an unknown context id or a callback for a root that never got a
//! configuration is logged and answered as a pass-through would be.

mod abi;
mod body;
mod contexts;
mod headers;
mod metrics;
mod rate_limit;
mod raw;
mod root;
mod shared;
mod stats;
mod stream;
mod tcp;

use std::cell::Cell;

use crate::config::{LogLevel, VmConfig};

/// What a stream callback answers Envoy: proxy-wasm's filter status, 0 to go on, 1 to stop
/// iterating (the request or response waits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    Continue = 0,
    Pause = 1,
}

thread_local! {
    /// The level below which nothing is logged: the VM configuration's, or Envoy's when that
    /// is higher, since Envoy drops those lines after the guest has formatted and passed them
    /// (one VM per thread in Envoy and in the harness).
    static LEVEL: Cell<LogLevel> = const { Cell::new(LogLevel::Info) };
    /// The linear memory size last reported, in 64 KiB pages.
    static PAGES: Cell<usize> = const { Cell::new(0) };
}

/// Logs the VM's linear memory each time it has grown (it never shrinks), when a stream
/// starts: operators see a VM that keeps growing, and `make bench` reads the figure. Costs
/// one instruction per stream otherwise.
pub(crate) fn note_memory() {
    let pages = core::arch::wasm32::memory_size(0);
    if pages > PAGES.with(Cell::get) {
        PAGES.with(|p| p.set(pages));
        log!(Info, "linear memory is {} KiB", pages * 64);
    }
}

pub(crate) fn enabled(level: LogLevel) -> bool {
    LEVEL.with(|l| level >= l.get())
}

/// Sets the level from the VM configuration and Envoy's level, read once here (at VM start and
/// at each configuration) rather than per line: a level Envoy lowers at run time
/// (`/logging?wasm=debug`) takes effect at the plugin's next configuration.
pub(crate) fn set_level(vm: &VmConfig) {
    let host = match raw::host_log_level() {
        Some(0) | None => LogLevel::Trace,
        Some(1) => LogLevel::Debug,
        Some(2) => LogLevel::Info,
        Some(3) => LogLevel::Warn,
        Some(4) => LogLevel::Error,
        Some(_) => LogLevel::Critical,
    };
    LEVEL.with(|l| l.set(vm.log_level.max(host)));
}

/// Logs `wasm-filter: <message>` at a level, formatting only when the level is enabled. The
/// formatting is [`emit`]'s, one function for every line the module logs.
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        if $crate::glue::enabled($crate::config::LogLevel::$level) {
            $crate::glue::emit(
                $crate::config::LogLevel::$level,
                format_args!($($arg)*),
            );
        }
    };
}
pub(crate) use log;

#[inline(never)]
pub(crate) fn emit(level: LogLevel, message: std::fmt::Arguments) {
    raw::log(level as u32, &format!("wasm-filter: {message}"));
}
