//! The fetcher's integration tests, driving the built `wasm-fetcher` binary against real
//! files and a real HTTP server on 127.0.0.1 that can misbehave.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod attach;
mod bundle;
mod cache_integrity;
mod containerd;
mod cred_helper;
mod deadline;
mod deploy;
mod dynamic_module;
mod dynamic_module_registry;
mod dynamic_module_serve;
mod dynamic_module_trust;
mod hostile_registry;
mod hosts_referee;
mod image;
mod image_volume;
mod image_volume_node;
mod keyless;
mod layers;
mod library;
mod mirrors;
mod net_guard;
mod oci_registry;
mod private_sigstore;
mod public_good;
mod pull_file;
mod pull_http;
mod push;
mod push_refused;
mod real_envoy;
mod recheck;
mod referrers_front;
mod registry;
mod rewrite;
mod serve_events;
mod serve_hostile;
mod serve_lifecycle;
mod serve_reload;
mod serve_support;
mod side_inputs;
mod sidecar;
mod signature;
mod source_key;
mod support;
