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

pub mod abi;
pub mod bootstrap;
pub mod builder;
pub mod compare;
pub mod compiled;
pub mod expect;
pub mod guest;
pub mod host;
pub mod http;
pub mod http1;
pub mod input;
pub mod precompiled;
pub mod proxy;
pub mod real_envoy;
pub mod report;
pub mod run;
pub mod scenario;
pub mod traffic;
pub mod vm;
pub mod yaml;

pub use bootstrap::FailurePolicy;
pub use builder::ProxyBuilder;
pub use compare::{run_comparison, ComparedStep, ComparisonReport};
pub use http::{Exchange, LocalReplySource, Request, Response, SeenRequest, UpstreamReply};
pub use proxy::{Proxy, ProxyOptions, StartError};
pub use report::{ClockAdvance, ScenarioReport, StepOutcome, StepReport, Verdict};
pub use run::{run_scenario, RunOptions};
pub use scenario::Scenario;
pub use traffic::TrafficError;
