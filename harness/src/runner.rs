//! The runner: scenario files, their run in the emulated Envoy, the reports, and (with the
//! `real-envoy` feature, which `cli` turns on) the same scenario in real Envoy and the
//! comparison of the two. Nothing below names it (`harness/tests/all/layers.rs` checks).
//!
//! - [`scenario`]: a scenario file and its expectations.
//! - [`run`], [`report`]: a scenario's run in the emulated Envoy and what it found.
//! - [`real_envoy`], [`compare`]: real Envoy with the same bootstrap, and where the two differ.
//! - [`guest`]: builds a filter crate for `wasm32-wasip1`, for tests that run it.

pub mod guest;
pub mod report;
pub mod run;
pub mod scenario;

#[cfg(feature = "real-envoy")]
pub mod compare;
#[cfg(feature = "real-envoy")]
pub mod real_envoy;
