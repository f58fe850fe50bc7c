//! The all-in-one proxy-wasm module. One `.wasm` serves several roles; the plugin
//! configuration's `role` field picks one, so operators ship and pin a single artifact.
//!
//! The crate is split so the decisions can be tested natively: `config` and each role module
//! are plain Rust (parsing, validation, and what to do to a request), while `glue` (compiled
//! only for Wasm) is the thin layer on the proxy-wasm SDK that reads buffers and edits maps.
//! The glue never unwraps a host status: a failed hostcall is logged and the request goes on.

pub mod config;
pub mod header_ops;

#[cfg(target_family = "wasm")]
mod glue;
