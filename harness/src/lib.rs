//! A proxy-wasm host on wasmtime with Envoy's semantics, for testing filters without Envoy.
//!
//! The harness reads the same Envoy bootstrap a real Envoy would run, starts each Wasm plugin
//! the way Envoy does (a canary VM that may reject the configuration, then one VM per worker
//! for each distinct vm_id / VM configuration / code), and sends requests through the filter
//! chain with Envoy's callback order, header-map availability and status codes.
//!
//! ```no_run
//! use wasm_harness::{guest, Proxy, Request, UpstreamReply};
//! // In a filter crate's tests/: build the crate for wasm32-wasip1, run it as Envoy would.
//! let module = guest::build(env!("CARGO_MANIFEST_DIR"), "release")?;
//! let mut proxy = Proxy::for_module(&module).configuration(r#"{"key": "value"}"#).build()?;
//! let exchange = proxy.round_trip(&Request::get("/").header("x-a", "1"), UpstreamReply::new(200))?;
//! assert_eq!(exchange.response_status(), Some(200));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Proxy::from_bootstrap`] starts from a whole Envoy bootstrap instead (several listeners,
//! plugins, Wasm services, routes and clusters).
//!
//! Scenario files (YAML: a bootstrap, then requests, clock advances, connections and a
//! shutdown, each with what must hold) run with [`run_scenario`]; with the `real-envoy`
//! feature (on by default), [`run_comparison`] runs each step in real Envoy too and reports
//! where the two differ.
//!
//! # Features
//! - `cli` (default): the `wasm-harness` command, its argument parsing and log output; it
//!   turns on `real-envoy`. A filter crate that only runs the emulated proxy in its tests can
//!   depend on the harness with `default-features = false` and compile less.
//! - `real-envoy`: [`real_envoy`] (drive a real Envoy with the same bootstrap) and
//!   [`compare`]. The emulated proxy never depends on it.

// The three wings, lowest first: each names only those below it.
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod envoy;
#[doc(hidden)]
pub mod runner;

pub use envoy::http;
pub use runner::guest;
#[cfg(feature = "real-envoy")]
pub use runner::{compare, real_envoy};

/// The Rust examples of the README and docs/rust-api.md, compiled and run by `cargo test` so
/// they cannot drift from the API (filter/tests/all/docs.rs checks every other example).
#[doc(hidden)]
pub mod doc_examples {
    #[doc = include_str!("../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../docs/rust-api.md")]
    pub struct RustApi;
}

pub use engine::abi::LogLevel;
pub use engine::host::{HeaderMap, LogRecord};
pub use envoy::bootstrap::FailurePolicy;
pub use envoy::builder::ProxyBuilder;
pub use envoy::http::{
    CallRecord, Exchange, LocalReplySource, Message, Request, Response, SeenRequest, StreamEnd,
    UpstreamReply,
};
pub use envoy::proxy::{Proxy, ProxyOptions, StartError, TcpEvent, TcpOutcome};
pub use envoy::traffic::TrafficError;
#[cfg(feature = "real-envoy")]
pub use runner::compare::{run_comparison, ComparedStep, ComparisonReport};
pub use runner::report::{ClockAdvance, ScenarioReport, StepOutcome, StepReport, Verdict};
pub use runner::run::{run_scenario, RunOptions};
pub use runner::scenario::Scenario;
