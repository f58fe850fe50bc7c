//! The HTTP vocabulary shared by the harness, the scenario runner and the real-Envoy runner:
//! a request as a client sends it, what the upstream saw, what the client got back.

use serde::Serialize;

use crate::host::HeaderMap;

/// A request as a client sends it to a listener.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authority: String,
    /// Regular headers (no pseudo-headers), names lower-cased.
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// What an upstream answers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpstreamReply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// The request as it reached the upstream.
#[derive(Debug, Clone, Serialize)]
pub struct SeenRequest {
    pub cluster: String,
    /// All headers including pseudo-headers (`:method`, `:path`, `:authority`).
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Who produced a response that did not come from an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum LocalReplySource {
    /// A plugin called `proxy_send_local_response`.
    Plugin { plugin: String, details: String },
    /// The failure policy answered for a failed VM (Envoy's `wasm_fail_stream`).
    FailurePolicy { plugin: String },
    /// A route's `direct_response`.
    DirectResponse,
    /// No route matched (Envoy's 404 `route_not_found`).
    NoRoute,
    /// The route's cluster does not exist (Envoy's 503 `cluster_not_found`).
    NoCluster { cluster: String },
}

/// What the client saw.
#[derive(Debug, Clone, Serialize)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Everything one request did.
#[derive(Debug, Clone, Serialize)]
pub struct Exchange {
    pub worker: usize,
    pub upstream: Option<SeenRequest>,
    pub response: Option<Response>,
    pub local_reply: Option<LocalReplySource>,
    /// Set when a plugin paused the stream and nothing resumed it: Envoy would hold the
    /// request until a timeout fired.
    pub stalled: Option<String>,
}

pub fn header<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    crate::host::headers::get(map, name)
}
