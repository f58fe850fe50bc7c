//! `proxy_log` and `proxy_get_log_level`. Records carry what Envoy puts in its log prefix
//! (plugin name, root id, vm id) so a report reads like Envoy's `wasm log ...` lines, and
//! who wrote them: the guest, Envoy's Wasm host (a VM failure), or the harness itself (a note
//! about a limit or something it does not emulate, which real Envoy never writes).
//!
//! Envoy's log level (`-l`, default `info`) is the run's ([`LogBook::level`]): lines below it
//! are not written, as in Envoy, and `proxy_get_log_level` answers it.

use wasm_common::sync::lock;
use wasmtime::{Caller, Linker};

use super::log_book::LogBook;
use super::{finish, hostcall, memory, HostState};
use crate::engine::abi::{LogLevel, Status};

/// Who wrote a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogSource {
    /// The guest: `proxy_log`, or WASI stdout / stderr (Envoy's `wasm log` lines).
    Guest,
    /// Envoy's Wasm host about the VM, e.g. `Function: proxy_on_request_headers failed: ...`.
    Vm,
    /// The harness about itself (a limit, something not emulated): never in Envoy's log, so
    /// never compared with it, and kept whatever the log level.
    Harness,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LogRecord {
    /// `None`: the canary VM Envoy runs at configuration time.
    pub worker: Option<usize>,
    pub level: LogLevel,
    pub source: LogSource,
    pub plugin: String,
    pub root_id: String,
    pub vm_id: String,
    /// Whether a stream (not a root or the VM) context logged it; Envoy's prefix differs.
    pub stream: bool,
    pub message: String,
}

impl LogRecord {
    /// The line as Envoy writes it after its `[time][thread][level][logger] [file:line] `
    /// prefix: `wasm log<prefix>: <msg>` for the guest, the bare message for a VM failure.
    pub fn envoy_text(&self) -> String {
        match self.source {
            LogSource::Guest => {
                let mut parts = Vec::new();
                if self.stream {
                    parts.push(self.plugin.as_str());
                }
                parts.push(self.root_id.as_str());
                parts.push(self.vm_id.as_str());
                let mut out = String::from("wasm log");
                for p in parts.into_iter().filter(|p| !p.is_empty()) {
                    out.push(' ');
                    out.push_str(p);
                }
                out.push_str(": ");
                out.push_str(&self.message);
                out
            }
            LogSource::Vm => self.message.clone(),
            LogSource::Harness => format!(
                "wasm-harness: {}",
                self.message.trim_start_matches("wasm-harness: ")
            ),
        }
    }
}

impl std::fmt::Display for LogRecord {
    /// `[level] ` then [`LogRecord::envoy_text`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.level.as_str(), self.envoy_text())
    }
}

/// A line the harness writes about itself (a limit it enforces, something it does not
/// emulate), attributed to the calling context; kept whatever the log level.
pub fn record(state: &HostState, level: LogLevel, message: String) {
    push(state, level, LogSource::Harness, message);
}

/// A line the guest writes (`proxy_log`, WASI stdout / stderr); dropped below the log level.
pub fn guest(state: &HostState, level: LogLevel, message: String) {
    push(state, level, LogSource::Guest, message);
}

/// A VM failure in Envoy's words (`Function: NAME failed: ...`), at Envoy's level for it.
pub fn vm_failure(state: &HostState, message: String) {
    push(state, LogLevel::Error, LogSource::Vm, message);
}

fn push(state: &HostState, level: LogLevel, source: LogSource, message: String) {
    let mut log = book(state);
    if source != LogSource::Harness && level < log.level() {
        return;
    }
    let id = state.context_id();
    let plugin = state.plugin_of(id);
    let rec = LogRecord {
        worker: state.worker,
        level,
        source,
        plugin: plugin.map(|p| p.name.clone()).unwrap_or_default(),
        root_id: plugin.map(|p| p.root_id.clone()).unwrap_or_default(),
        vm_id: plugin.map(|p| p.vm_id.clone()).unwrap_or_default(),
        stream: matches!(
            state.contexts.get(&id),
            Some(super::ContextKind::Http(_) | super::ContextKind::Tcp(_))
        ),
        message,
    };
    tracing::debug!(target: "wasm", "{rec}");
    log.push(rec);
}

fn book(state: &HostState) -> std::sync::MutexGuard<'_, LogBook> {
    lock(&state.shared.log)
}

/// Whether a guest line at `level` would be written (Envoy's log level lets it through).
pub fn enabled(state: &HostState, level: LogLevel) -> bool {
    level >= book(state).level()
}

/// Bytes of message a new record may still have within the run's log cap.
pub fn room(state: &HostState) -> usize {
    book(state).room()
}

/// Counts a message the cap leaves out (whole, or the `bytes` cut from a kept one).
pub fn count_dropped(state: &HostState, bytes: u64, whole: bool) {
    let mut log = book(state);
    if whole {
        log.drop_message(bytes);
    } else {
        log.drop_bytes(bytes);
    }
}

fn proxy_log(
    caller: Caller<'_, HostState>,
    level: i32,
    ptr: i32,
    len: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let level = LogLevel::from_raw(level).ok_or(Status::BadArgument)?;
        // Past the cap the message is not copied at all, only checked and counted.
        let size = memory::check(&caller, ptr, len)?;
        if !enabled(caller.data(), level) {
            return Ok(());
        }
        if size > room(caller.data()) {
            count_dropped(caller.data(), size as u64, true);
            return Ok(());
        }
        let msg = memory::read_string(&caller, ptr, len)?;
        guest(caller.data(), level, msg);
        Ok(())
    })
}

fn proxy_get_log_level(mut caller: Caller<'_, HostState>, ret: i32) -> wasmtime::Result<i32> {
    let level = book(caller.data()).level();
    finish(memory::write_u32(&mut caller, ret, level as u32))
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_log", proxy_log)?;
    linker.func_wrap("env", "proxy_get_log_level", proxy_get_log_level)?;
    Ok(())
}
