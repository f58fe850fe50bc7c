//! What the whole VM shares, whichever plugin's context runs: the level below which nothing
//! is logged, and the linear memory last reported. One VM per worker thread in Envoy and in
//! the harness, so thread-locals are the VM's globals.

use std::cell::Cell;

use super::{host, log};
use crate::config::{LogLevel, VmConfig};

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
    let host = match host::host_log_level() {
        Some(0) | None => LogLevel::Trace,
        Some(1) => LogLevel::Debug,
        Some(2) => LogLevel::Info,
        Some(3) => LogLevel::Warn,
        Some(4) => LogLevel::Error,
        Some(_) => LogLevel::Critical,
    };
    LEVEL.with(|l| l.set(vm.log_level.max(host)));
}

#[inline(never)]
pub(crate) fn emit(level: LogLevel, message: std::fmt::Arguments) {
    host::log(level as u32, &format!("wasm-filter: {message}"));
}
