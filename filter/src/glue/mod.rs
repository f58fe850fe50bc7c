//! The proxy-wasm side, on the proxy-wasm SDK (ABI 0.2.1). The SDK's dispatcher finds each
//! context and calls the traits it defines; the names here are the seed's:
//!
//! - `plugin`: [`plugin::PluginContext`], the SDK's `RootContext` for one plugin. Envoy gives
//!   each plugin sharing the VM a root; each reads the VM configuration at VM start (the VM
//!   context's part, `vm`) and its plugin configuration at configure, becomes the role's
//!   root, and creates the stream contexts.
//! - `vm`: what the whole VM shares: the log level and the linear memory note.
//! - `stream`: the stream contexts, [`stream::HttpStream`] (the SDK's `HttpContext`) and
//!   [`stream::TcpStream`] (its `StreamContext`), each routing callbacks to its role.
//! - one module per role's glue (`headers`, `body`, `tcp`, `rate_limit`, `stats`), and
//!   `host`, the hostcalls they use, which return the SDK's `Status` instead of panicking,
//!   and the SDK's entry point: the Wasm module's one room for `unsafe`.
//!
//! What a role decides is in the pure modules (`crate::header_ops`, `crate::body_flow`, ...);
//! the glue reads, calls and logs.

mod body;
mod headers;
#[allow(unsafe_code)]
mod host;
mod metrics;
mod plugin;
mod rate_limit;
mod shared;
mod stats;
mod stream;
mod tcp;
mod vm;

pub(crate) use vm::{emit, enabled};

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
