//! The emulated Envoy: reads a bootstrap, routes, and drives the engine's VMs with Envoy's
//! callback order, header-map availability and status codes. It uses [`crate::engine`] and
//! never names [`crate::runner`] (`harness/tests/all/layers.rs` checks).
//!
//! - [`bootstrap`]: the parts of an Envoy bootstrap the harness emulates, and route matching.
//! - [`http`]: the HTTP vocabulary (requests, replies, exchanges) every wing above shares.
//! - [`http1`]: the HTTP/1.1 codec for upstreams and callouts.
//! - [`proxy`]: the server: workers, streams, the router, callouts, TCP.
//! - [`builder`]: [`crate::Proxy::for_module`]'s one-plugin bootstrap.
//! - [`traffic`]: why a request or connection could not be sent.

pub mod bootstrap;
pub mod builder;
pub mod http;
pub mod http1;
pub mod proxy;
pub mod traffic;
