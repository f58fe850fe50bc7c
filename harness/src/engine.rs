//! The engine: runs a proxy-wasm guest on wasmtime and answers its hostcalls, and knows nothing
//! of listeners, routes or clusters. Above it, [`crate::envoy`] decides what the guest is
//! called with and when; the engine names neither that nor [`crate::runner`]
//! (`harness/tests/all/layers.rs` checks).
//!
//! - [`abi`]: the Proxy-Wasm ABI's statuses, types and encodings.
//! - [`runtime`]: one wasmtime `Engine` and `Linker`, and code loading.
//! - [`compiled_cache`], [`precompiled_section`]: the two caches of compiled code.
//! - [`vm`]: a VM instance and the calls into its guest.
//! - [`host`]: the hostcalls, one module per family, and the state they share.
//! - [`header_map`], [`metadata`]: a stream's header maps and dynamic metadata, with Envoy's
//!   rules for editing and encoding them.
//! - [`plugin`]: what a plugin asks of the engine (code, configuration, failure policy).
//! - [`input`]: the bounded reads of files a user names.

pub mod abi;
pub mod compiled_cache;
pub mod header_map;
pub mod host;
pub mod input;
pub mod metadata;
pub mod plugin;
pub mod precompiled_section;
pub mod runtime;
pub mod vm;
