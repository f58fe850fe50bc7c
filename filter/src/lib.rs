//! The all-in-one proxy-wasm module. One `.wasm` serves several roles; the plugin
//! configuration's `role` field picks one, so operators ship and pin a single artifact.
//!
//! The crate is split so the decisions can be tested natively: `config` and each role module
//! are plain Rust (parsing, validation, and what to do to a request, a body, a bucket, a
//! record), while `glue` (compiled only for Wasm) is the thin layer on the proxy-wasm SDK that
//! reads buffers, edits maps and talks to shared data and queues. The glue never unwraps a
//! host status: a failed hostcall is logged and the request goes on. Built natively, the
//! same decisions run behind a second glue, `dynamic_module`: the cdylib is then an Envoy
//! dynamic module (`libwasm_filter.so`) for the HTTP roles.

// `unsafe` is for the runtimes' foreign edges only, each in one room: the Wasm module's
// hostcalls and the SDK's entry point (`glue::host`), and the dynamic module's ABI with the
// hooks Envoy calls (`dynamic_module::abi`) and the handles' calls into Envoy
// (`dynamic_module::host`); every block says why it is sound.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod body_flow;
pub mod body_ops;
pub mod bucket_table;
pub mod conditions;
pub mod config;
pub mod de;
pub mod header_ops;
pub mod keyed_hash;
pub mod metrics;
pub mod quote;
pub mod rate_config;
pub mod rate_limit;
pub mod redact;
pub mod stats;
pub mod stored;
pub mod tcp_count;

#[cfg(not(target_family = "wasm"))]
mod dynamic_module;
#[cfg(target_family = "wasm")]
mod glue;
