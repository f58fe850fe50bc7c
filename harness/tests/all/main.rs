//! The harness's integration tests: the CLI on scenarios, misbehaving guests, and real Envoy
//! (validation, differential runs, and the build -> pull -> run path of `make run`).
//!
//! They need the filter built (`make filter`) and Envoy installed (`make envoy`); `make test`
//! does both first.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod abi;
mod bodies;
mod bootstraps;
mod callouts;
mod cli;
mod compared;
mod ecds;
mod envoy;
mod go;
mod guests;
mod hostcalls;
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
