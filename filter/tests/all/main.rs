//! The filter as Envoy runs it: the crate's own module, built for wasm32-wasip1 by the test,
//! in the harness's Envoy-faithful host and in real Envoy 1.40. One `mod` per role, plus the
//! contexts every role shares, the shipped configurations and the scenarios.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod body;
mod bounds;
mod contexts;
mod docs;
mod dynamic_module;
mod envoy;
mod headers;
mod layers;
mod metrics;
mod rate_limit;
mod redaction;
mod remote;
mod scenarios;
mod stats;
mod support;
mod tcp;
mod wasmplugins;
