//! `proxy_log` and `proxy_get_log_level`. Records carry what Envoy puts in its log prefix
//! (plugin name, root id, vm id) so a report reads like Envoy's `wasm log ...` lines.

use wasmtime::{Caller, Linker};

use super::{finish, memory, HostState};
use crate::abi::{LogLevel, Status};

/// The level `proxy_get_log_level` reports: Envoy's default (`info`) for its `wasm` logger.
pub const HOST_LOG_LEVEL: LogLevel = LogLevel::Info;

#[derive(Debug, Clone, serde::Serialize)]
pub struct LogRecord {
    /// `None`: the canary VM Envoy runs at configuration time.
    pub worker: Option<usize>,
    pub level: LogLevel,
    pub plugin: String,
    pub root_id: String,
    pub vm_id: String,
    /// Whether a stream (not a root or the VM) context logged it; Envoy's prefix differs.
    pub stream: bool,
    pub message: String,
}

impl std::fmt::Display for LogRecord {
    /// Envoy's `wasm log<prefix>: <msg>`, empty prefix parts omitted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.stream {
            parts.push(self.plugin.as_str());
        }
        parts.push(self.root_id.as_str());
        parts.push(self.vm_id.as_str());
        write!(f, "[{}] wasm log", self.level.as_str())?;
        for p in parts.into_iter().filter(|p| !p.is_empty()) {
            write!(f, " {p}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Appends a record attributed to the calling context; also used by WASI `fd_write` and by the
/// host itself to report traps, as Envoy does.
pub fn record(state: &HostState, level: LogLevel, message: String) {
    let id = state.context_id();
    let plugin = state.plugin_of(id);
    let rec = LogRecord {
        worker: state.worker,
        level,
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
    state
        .shared
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(rec);
}

/// Bytes of message a new record may still have within the run's log cap.
pub fn room(state: &HostState) -> usize {
    state
        .shared
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .room()
}

/// Counts a message the cap leaves out (whole, or the `bytes` cut from a kept one).
pub fn count_dropped(state: &HostState, bytes: u64, whole: bool) {
    let mut log = state.shared.log.lock().unwrap_or_else(|e| e.into_inner());
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
    finish((|| {
        let level = LogLevel::from_raw(level).ok_or(Status::BadArgument)?;
        // Past the cap the message is not copied at all, only checked and counted.
        let size = memory::check(&caller, ptr, len)?;
        if size > room(caller.data()) {
            count_dropped(caller.data(), size as u64, true);
            return Ok(());
        }
        let msg = memory::read_string(&caller, ptr, len)?;
        record(caller.data(), level, msg);
        Ok(())
    })())
}

fn proxy_get_log_level(mut caller: Caller<'_, HostState>, ret: i32) -> wasmtime::Result<i32> {
    finish(memory::write_u32(&mut caller, ret, HOST_LOG_LEVEL as u32))
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_log", proxy_log)?;
    linker.func_wrap("env", "proxy_get_log_level", proxy_get_log_level)?;
    Ok(())
}
