//! Why a request or a connection could not be sent, in the harness or to real Envoy: the
//! variants a caller branches on (a listener of the other kind, a proxy that has shut down),
//! each with the message a person reads.

use std::time::Duration;

use crate::envoy::http1::Http1Error;

#[derive(Debug, thiserror::Error)]
pub enum TrafficError {
    #[error("no listener named {name:?} in the bootstrap")]
    NoListener { name: String },
    /// The bootstrap has only Wasm services: its scenarios advance the clock, nothing else.
    #[error("the bootstrap has no listener to send traffic to (only bootstrap_extensions): use advance steps")]
    NoListeners,
    #[error("listener {name:?} is a TCP listener (tcp_proxy): send it a connection, not an HTTP request")]
    TcpListener { name: String },
    #[error("listener {name:?} is an HTTP listener: send it requests, not a connection")]
    HttpListener { name: String },
    #[error("the proxy has shut down: it takes no more traffic")]
    ShutDown,
    #[error("worker {worker} does not exist (the harness runs {workers} workers)")]
    NoWorker { worker: usize, workers: usize },
    /// Real Envoy: the HTTP/1.1 exchange with its listener failed.
    #[error("request to envoy failed: {0}")]
    EnvoyRequest(#[source] Http1Error),
    /// Real Envoy: a socket operation on a connection failed (`what` says which).
    #[error("{what}: {source}")]
    EnvoySocket {
        what: &'static str,
        source: std::io::Error,
    },
    /// Real Envoy: a request seeds dynamic metadata under a key Envoy was not started with.
    #[error("the request seeds dynamic metadata {namespace}.{key}, which envoy was not started to seed: pass every request's keys to RealEnvoy::start_seeding")]
    MetadataNotSeeded { namespace: String, key: String },
    /// Real Envoy never connected to the `tcp_proxy` cluster's upstream.
    #[error("envoy did not connect to the upstream within {}s", .0.as_secs())]
    EnvoyNoUpstream(Duration),
}

#[cfg(feature = "real-envoy")]
impl TrafficError {
    pub(crate) fn socket(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::EnvoySocket { what, source }
    }
}
