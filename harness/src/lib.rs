//! A proxy-wasm host on wasmtime with Envoy's semantics, for testing filters without Envoy.
//!
//! The harness reads the same Envoy bootstrap a real Envoy would run, starts each Wasm plugin
//! the way Envoy does (a canary VM that may reject the configuration, then one VM per worker
//! for each distinct vm_id / VM configuration / code), and sends requests through the filter
//! chain with Envoy's callback order, header-map availability and status codes.
//!
//! ```no_run
//! use wasm_harness::{Proxy, ProxyOptions, Request, UpstreamReply};
//! let mut proxy = Proxy::from_bootstrap("envoy-config/bootstrap.yaml".as_ref(), &ProxyOptions::default())?;
//! let request = Request {
//!     method: "GET".into(), path: "/".into(), authority: "demo.local".into(),
//!     headers: vec![], ..Default::default()
//! };
//! let exchange = proxy.send(None, None, &request, &mut |_| UpstreamReply { status: 200, ..Default::default() })?;
//! assert_eq!(exchange.response.unwrap().status, 200);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod abi;
pub mod bootstrap;
pub mod compiled;
pub mod diff;
pub mod envoy;
pub mod host;
pub mod http;
pub mod precompiled;
pub mod proxy;
pub mod run;
pub mod scenario;
pub mod vm;

pub use http::{Exchange, LocalReplySource, Request, Response, SeenRequest, UpstreamReply};
pub use proxy::{Proxy, ProxyOptions, StartError};
