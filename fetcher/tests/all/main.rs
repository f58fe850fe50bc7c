//! The fetcher's integration tests, driving the built `wasm-fetcher` binary against real
//! files and a real HTTP server on 127.0.0.1 that can misbehave.

mod cache_integrity;
mod deadline;
mod deploy;
mod hostile_registry;
mod library;
mod net_guard;
mod oci_registry;
mod pull_file;
mod pull_http;
mod push;
mod real_envoy;
mod registry;
mod rewrite;
mod serve_lifecycle;
mod serve_reload;
mod serve_support;
mod side_inputs;
mod sidecar;
mod signature;
mod source_key;
mod support;
