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
#[doc(hidden)]
pub mod compiled_cache;
pub mod diff;
pub mod envoy;
pub mod guest;
pub mod host;
pub mod http;
#[doc(hidden)]
pub mod http1;
#[doc(hidden)]
pub mod input;
#[doc(hidden)]
pub mod precompiled_section;
pub mod proxy;
pub mod run;
#[doc(hidden)]
pub mod runtime;
pub mod scenario;
pub mod traffic;
#[doc(hidden)]
pub mod vm;
#[doc(hidden)]
pub mod yaml;

/// The Rust examples of the README and docs/rust-api.md, compiled and run by `cargo test` so
/// they cannot drift from the API (filter/tests/all/docs.rs checks every other example).
#[doc(hidden)]
pub mod doc_examples {
    #[doc = include_str!("../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../docs/rust-api.md")]
    pub struct RustApi;
}

pub use bootstrap::FailurePolicy;
pub use builder::ProxyBuilder;
pub use http::{Exchange, LocalReplySource, Request, Response, SeenRequest, UpstreamReply};
pub use proxy::{Proxy, ProxyOptions, StartError};
pub use traffic::TrafficError;
