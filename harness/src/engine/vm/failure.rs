//! A VM failure in Envoy's words, so a log expectation written against one holds against the
//! other: a trap is `Function: NAME failed: Uncaught RuntimeError: unreachable` as Envoy's V8
//! writes it (wasm_vm.cc, at `error`), followed, when the module names its functions, by
//! V8's `Proxy-Wasm plugin in-VM backtrace:` frames; and a configuration the canary refuses
//! is followed by the lines Envoy writes when it refuses to start.

use crate::engine::abi::LogLevel;
use crate::engine::plugin::FailurePolicy;

use super::PluginStartError;

/// V8 prints at most this many frames of a trap's backtrace (checked against Envoy 1.40).
const MAX_FRAMES: usize = 20;

/// What V8 says for a wasmtime trap. V8 words a few traps differently by instruction where
/// wasmtime has one trap for both: `remainder by zero` (here `divide by zero`) and `float
/// unrepresentable in integer range` for a float-to-integer overflow (here `divide result
/// unrepresentable`).
fn v8_words(trap: wasmtime::Trap) -> Option<&'static str> {
    use wasmtime::Trap;
    Some(match trap {
        Trap::UnreachableCodeReached => "Uncaught RuntimeError: unreachable",
        Trap::MemoryOutOfBounds => "Uncaught RuntimeError: memory access out of bounds",
        Trap::IntegerDivisionByZero => "Uncaught RuntimeError: divide by zero",
        Trap::IntegerOverflow => "Uncaught RuntimeError: divide result unrepresentable",
        Trap::BadConversionToInteger => {
            "Uncaught RuntimeError: float unrepresentable in integer range"
        }
        Trap::StackOverflow => "Uncaught RangeError: Maximum call stack size exceeded",
        Trap::IndirectCallToNull | Trap::BadSignature => {
            "Uncaught RuntimeError: function signature mismatch"
        }
        Trap::TableOutOfBounds => "Uncaught RuntimeError: table index is out of bounds",
        Trap::HeapMisaligned => {
            "Uncaught RuntimeError: operation does not support unaligned accesses"
        }
        _ => return None,
    })
}

/// The failure of a call into the guest, as Envoy logs it: `Function: NAME failed: CAUSE`,
/// then the backtrace when `names` (the module has a `name` section with function names, as
/// V8 needs to print one).
pub fn describe(function: &str, error: &wasmtime::Error, names: bool) -> String {
    let cause = match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => match v8_words(*trap) {
            Some(words) => words.to_string(),
            None => format!("Uncaught RuntimeError: {trap}"),
        },
        // Not a trap: a hostcall failed in a way only the harness has (one of its limits).
        None => format!("{error:#}").replace('\n', " "),
    };
    let mut message = format!("Function: {function} failed: {cause}");
    if names {
        if let Some(trace) = error.downcast_ref::<wasmtime::WasmBacktrace>() {
            message.push_str("\nProxy-Wasm plugin in-VM backtrace:");
            for (i, frame) in trace.frames().iter().take(MAX_FRAMES).enumerate() {
                let name = frame.func_name().map_or_else(
                    || format!("unknown(function index:{})", frame.func_index()),
                    str::to_string,
                );
                let offset = frame.module_offset().unwrap_or_default();
                message.push_str(&format!("\n{i:>3}:  {offset:#x} - {name}"));
            }
        }
    }
    message
}

/// What Envoy logs, after the guest's own lines and the trap if any, when the canary refuses
/// a plugin and Envoy refuses the configuration (checked against Envoy 1.40; the last line's
/// own words are `error `Unable to create Wasm plugin NAME` initializing config '...'`).
pub fn refusal(error: &PluginStartError, policy: Option<FailurePolicy>) -> Vec<(LogLevel, String)> {
    let (plugin, stage) = match error {
        PluginStartError::VmStartFailed { plugin } => (plugin, "Failed to start base Wasm"),
        PluginStartError::ConfigureFailed { plugin } => {
            (plugin, "Failed to configure base Wasm plugin")
        }
        PluginStartError::Trapped { plugin, message }
            if message.starts_with("proxy_on_configure") =>
        {
            (plugin, "Failed to configure base Wasm plugin")
        }
        PluginStartError::Trapped { plugin, .. } => (plugin, "Failed to start base Wasm"),
        PluginStartError::Uninitialized { plugin, .. } => {
            (plugin, "Failed to initialize Wasm code")
        }
    };
    let mut lines = vec![
        (LogLevel::Error, format!("Wasm VM failed {stage}")),
        (
            LogLevel::Critical,
            format!("Plugin {plugin} failed to load"),
        ),
    ];
    if policy == Some(FailurePolicy::FailClosed) {
        lines.push((
            LogLevel::Critical,
            "Plugin configured to fail closed failed to load".into(),
        ));
    }
    lines.push((
        LogLevel::Critical,
        format!("Unable to create Wasm plugin {plugin}"),
    ));
    lines
}
