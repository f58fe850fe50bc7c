//! The harness's integration tests: the CLI on scenarios, misbehaving guests, and real Envoy
//! (validation, differential runs, and the build -> pull -> run path of `make run`).
//!
//! They need the filter built (`make filter`) and Envoy installed (`make envoy`); `make test`
//! does both first.

mod abi;
mod bodies;
mod bootstraps;
mod callouts;
mod cli;
mod envoy;
mod guests;
mod hostile;
mod layers;
mod logs;
mod metadata;
mod precompiled;
mod services;
mod shutdown;
mod support;
mod tcp;
mod timers;
mod upstreams;
mod vm_keys;
