//! The HTTP vocabulary shared by the harness, the scenario runner and the real-Envoy runner:
//! a request as a client sends it, what the upstream saw, what the client got back.

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

pub use crate::engine::header_map::{self as headers, HeaderMap};
pub use crate::engine::metadata::{self, DynamicMetadata};

/// What every HTTP message carries after its first line: the header block, the body as it
/// arrives, and the trailers. Requests, upstream replies, what the upstream saw and what the
/// client got share it, so one reader of a body or a header serves all four.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Message {
    /// Headers, names lower-cased (as HTTP/2 and Envoy have them). A request a client sends
    /// has no pseudo-headers here (its first line is its own fields); what an upstream saw
    /// has them all (`:method`, `:path`, `:authority`).
    pub headers: HeaderMap,
    /// The body, arriving as one chunk.
    #[serde(serialize_with = "bytes_as_text")]
    pub body: Vec<u8>,
    /// More of the body, arriving chunk by chunk after `body` (each is one body callback at
    /// the first filter). Only what a client or an upstream sends has them.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "chunks_as_text"
    )]
    pub body_chunks: Vec<Vec<u8>>,
    /// Trailers after the body (as an HTTP/2 peer or a gRPC call sends them). What an upstream
    /// saw has them as the router forwards them: none over HTTP/1.1 unless the cluster
    /// enables trailers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trailers: HeaderMap,
}

impl Message {
    /// The body as it arrives: `body` (if any), then `body_chunks`.
    pub fn chunks(&self) -> Vec<Vec<u8>> {
        chunks(&self.body, &self.body_chunks)
    }

    /// The whole body.
    pub fn full_body(&self) -> Vec<u8> {
        self.chunks().concat()
    }
}

/// Each message type reads and writes its [`Message`] part as its own fields
/// (`request.headers`, `response.body`): the part is what the four have in common, not a
/// thing a reader should have to name.
macro_rules! message_parts {
    ($($t:ty),*) => {$(
        impl std::ops::Deref for $t {
            type Target = Message;
            fn deref(&self) -> &Message {
                &self.message
            }
        }
        impl std::ops::DerefMut for $t {
            fn deref_mut(&mut self) -> &mut Message {
                &mut self.message
            }
        }
    )*};
}
message_parts!(Request, UpstreamReply, SeenRequest, Response);

/// A request as a client sends it to a listener.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authority: String,
    #[serde(flatten)]
    pub message: Message,
    /// Dynamic metadata the stream carries before the Wasm filters run (as a filter ahead
    /// of them would set it), read through the `metadata` property.
    #[serde(skip_serializing_if = "DynamicMetadata::is_empty")]
    pub dynamic_metadata: DynamicMetadata,
    /// What the client speaks to the listener.
    #[serde(skip_serializing_if = "Downstream::is_http1")]
    pub protocol: Downstream,
    /// How long ticks may run while a filter holds the request in its headers callback, one
    /// of them resuming it (the clock moves no further than the tick that did).
    #[serde(skip)]
    pub tick_wait: Option<std::time::Duration>,
}

/// The protocol a client speaks to a listener: it decides how Envoy's codec hands the
/// request to the filters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Downstream {
    /// HTTP/1.1, a body sent with its `content-length` (so no trailers), each chunk one
    /// socket read of Envoy's: the filters get each chunk, then an empty end of stream.
    #[default]
    Http1,
    /// HTTP/1.1 with `transfer-encoding: chunked`, each chunk one HTTP/1.1 chunk and one
    /// socket read of Envoy's, the trailers after the last chunk; they reach the filters
    /// only when the connection manager enables HTTP/1 trailers
    /// (`http_protocol_options.enable_trailers`), else the filters get an empty end of stream.
    Http1Chunked,
    /// HTTP/2 over cleartext (prior knowledge): pseudo-headers in the order the `h2` crate
    /// writes them (`:method`, `:scheme`, `:authority`, `:path`), each body chunk one DATA
    /// frame (one body callback in Envoy), trailers as a last HEADERS frame, no
    /// `content-length` unless the request has one.
    Http2,
}

impl Downstream {
    pub fn is_http1(&self) -> bool {
        *self == Self::Http1
    }

    /// The protocol as Envoy names it (`Http::Utility::getProtocolString`), what the
    /// `request.protocol` property answers.
    pub fn envoy_name(&self) -> &'static str {
        match self {
            Self::Http2 => "HTTP/2",
            Self::Http1 | Self::Http1Chunked => "HTTP/1.1",
        }
    }

    /// Whether Envoy's HTTP/1 codec reads the request (with or without chunks).
    pub fn speaks_http1(&self) -> bool {
        matches!(self, Self::Http1 | Self::Http1Chunked)
    }
}

impl Request {
    /// A GET for `path` (authority `localhost`); add headers with [`Request::header`].
    pub fn get(path: impl Into<String>) -> Self {
        Self::new("GET", path)
    }

    /// A POST for `path` with `body` as one chunk.
    pub fn post(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        let mut request = Self::new("POST", path);
        request.body = body.into();
        request
    }

    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            authority: "localhost".into(),
            ..Default::default()
        }
    }

    /// The request with one more header (name lower-cased, as HTTP/2 and Envoy have it).
    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// The request with `key` set to `value` in the dynamic metadata's `namespace`.
    pub fn metadata(mut self, namespace: &str, key: &str, value: serde_json::Value) -> Self {
        self.dynamic_metadata
            .entry(namespace.to_string())
            .or_default()
            .insert(key.to_string(), value);
        self
    }
}

/// Bytes in a report: the text when it is UTF-8 (bodies nearly always are), else
/// `{"base64": "..."}`. As an array of numbers, a body would take four to five bytes of JSON
/// per byte, and a large one gigabytes.
pub fn bytes_as_text<T: AsRef<[u8]>, S: Serializer>(bytes: &T, s: S) -> Result<S::Ok, S::Error> {
    BytesAsText(bytes.as_ref()).serialize(s)
}

/// Body chunks in a report, each as [`bytes_as_text`] writes it.
pub fn chunks_as_text<S: Serializer>(chunks: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(chunks.len()))?;
    for c in chunks {
        seq.serialize_element(&BytesAsText(c))?;
    }
    seq.end()
}

struct BytesAsText<'a>(&'a [u8]);

impl Serialize for BytesAsText<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                use base64::Engine as _;
                let mut map = s.serialize_map(Some(1))?;
                let encoded = base64::engine::general_purpose::STANDARD.encode(self.0);
                map.serialize_entry("base64", &encoded)?;
                map.end()
            }
        }
    }
}

fn chunks(body: &[u8], more: &[Vec<u8>]) -> Vec<Vec<u8>> {
    std::iter::once(body)
        .filter(|b| !b.is_empty())
        .map(<[u8]>::to_vec)
        .chain(more.iter().filter(|c| !c.is_empty()).cloned())
        .collect()
}

/// What an upstream answers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpstreamReply {
    pub status: u16,
    #[serde(flatten)]
    pub message: Message,
}

impl UpstreamReply {
    /// A reply with this status, no headers and no body.
    pub fn new(status: u16) -> Self {
        Self {
            status,
            ..Default::default()
        }
    }

    /// The reply with one more header.
    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// The reply with this body (one chunk).
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}

/// The request as it reached the upstream.
#[derive(Debug, Clone, Serialize)]
pub struct SeenRequest {
    pub cluster: String,
    #[serde(flatten)]
    pub message: Message,
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
    /// The route's cluster has no endpoint (Envoy's 503 `no healthy upstream`).
    NoHealthyUpstream { cluster: String },
    /// A deny-all RBAC filter, a fail-closed plugin's fallback (403 `RBAC: access denied`).
    Rbac,
    /// The upstream stream was reset before a response (Envoy's router answers 502/503).
    UpstreamReset,
}

/// What the client saw.
#[derive(Debug, Clone, Serialize)]
pub struct Response {
    pub status: u16,
    #[serde(flatten)]
    pub message: Message,
}

/// Everything one request did.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub worker: usize,
    pub upstream: Option<SeenRequest>,
    pub end: StreamEnd,
    pub local_reply: Option<LocalReplySource>,
    /// Things a filter author should know about this exchange (a body whose size no longer
    /// matches its `content-length`).
    pub notes: Vec<String>,
}

/// How a stream ended for the client: exactly one of these happens.
#[derive(Debug, Clone)]
pub enum StreamEnd {
    /// The client got this response.
    Answered(Response),
    /// A plugin paused the stream and nothing resumed it: Envoy would hold the request until
    /// a timeout fired.
    Stalled(String),
    /// The stream was reset (a plugin closed it): the client got no response.
    Reset(String),
}

impl Exchange {
    /// The response the client got (`None` if the stream stalled or was reset).
    pub fn response(&self) -> Option<&Response> {
        match &self.end {
            StreamEnd::Answered(r) => Some(r),
            StreamEnd::Stalled(_) | StreamEnd::Reset(_) => None,
        }
    }

    /// Why the stream stalled, if it did.
    pub fn stalled(&self) -> Option<&str> {
        match &self.end {
            StreamEnd::Stalled(why) => Some(why),
            StreamEnd::Answered(_) | StreamEnd::Reset(_) => None,
        }
    }

    /// Why the stream was reset, if it was.
    pub fn reset(&self) -> Option<&str> {
        match &self.end {
            StreamEnd::Reset(why) => Some(why),
            StreamEnd::Answered(_) | StreamEnd::Stalled(_) => None,
        }
    }

    /// The status the client got (`None` if the stream stalled or was reset).
    pub fn response_status(&self) -> Option<u16> {
        self.response().map(|r| r.status)
    }

    /// The body the client got (empty if the stream stalled or was reset).
    pub fn response_body(&self) -> &[u8] {
        self.response().map_or(&[], |r| &r.body)
    }

    /// A header of the response the client got, as text (first value; case-insensitive).
    pub fn response_header(&self, name: &str) -> Option<&str> {
        let r = self.response()?;
        header(&r.headers, name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// A header of the request the upstream saw, as text (first value; case-insensitive;
    /// pseudo-headers such as `:path` too). `None` also when no request reached it.
    pub fn upstream_header(&self, name: &str) -> Option<&str> {
        let u = self.upstream.as_ref()?;
        header(&u.headers, name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// The report's shape: `response` and `stalled` always present (null when they did not
/// happen), `reset` only when it did, so readers of `--json` see one layout.
impl Serialize for Exchange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Shape<'a> {
            worker: usize,
            upstream: &'a Option<SeenRequest>,
            response: Option<&'a Response>,
            local_reply: &'a Option<LocalReplySource>,
            stalled: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            reset: Option<&'a str>,
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            notes: &'a [String],
        }
        Shape {
            worker: self.worker,
            upstream: &self.upstream,
            response: self.response(),
            local_reply: &self.local_reply,
            stalled: self.stalled(),
            reset: self.reset(),
            notes: &self.notes,
        }
        .serialize(s)
    }
}

pub fn header<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers::get(map, name)
}

/// A reply the scenario gives for `proxy_http_call`s to `cluster` (whose `:path` starts with
/// `path_prefix`, if given), instead of a real upstream.
#[derive(Debug, Clone, Serialize)]
pub struct CannedHttpCall {
    pub cluster: String,
    pub path_prefix: Option<String>,
    pub answer: HttpCallAnswer,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpCallAnswer {
    /// The upstream answers this (Envoy's router adds its headers on the way back).
    Reply(UpstreamReply),
    /// The upstream closes the connection without answering: Envoy's router answers 503.
    Disconnect,
    /// The upstream starts its response, then resets the stream: Envoy's router cannot
    /// answer in its place once the response started, so the call fails; the guest sees
    /// `(0, 0, 0)` and status `BrokenConnection` "reset" (with `--envoy` the upstream does
    /// just that).
    Reset,
    /// The upstream takes the request and never answers: Envoy's router answers 504
    /// `upstream request timeout` when the call's timeout runs out; without one (the guest
    /// passed 0) the call never completes.
    Silent,
}

/// A reply the scenario gives for unary `proxy_grpc_call`s to `cluster` (and `service` /
/// `method`, if given).
#[derive(Debug, Clone, Serialize)]
pub struct CannedGrpcCall {
    pub cluster: String,
    pub service: Option<String>,
    pub method: Option<String>,
    pub answer: GrpcCallAnswer,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcCallAnswer {
    /// Status OK with this reply message (serialized protobuf).
    Message(Vec<u8>),
    /// A failure with this gRPC status code and message.
    Status { code: u32, message: String },
}

/// A callout a guest made, and how it was answered.
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    /// `http` or `grpc`.
    pub kind: &'static str,
    pub cluster: String,
    /// The worker whose VM made the call; `None` for the main thread.
    pub worker: Option<usize>,
    /// HTTP: the request headers as sent (pseudo-headers first). gRPC: `:path`
    /// (`/service/method`), then the initial metadata.
    pub headers: HeaderMap,
    /// HTTP: the request body. gRPC: the request message.
    #[serde(serialize_with = "bytes_as_text")]
    pub body: Vec<u8>,
    /// What answered: `canned reply 200`, `upstream 127.0.0.1:8081: 200`, `reset`, ...
    pub answer: String,
}

/// One thing that happens on a connection, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpEvent {
    /// The client sends these bytes.
    Downstream(Vec<u8>),
    /// The upstream sends these bytes.
    Upstream(Vec<u8>),
    /// The client closes its side; the upstream closes in turn.
    CloseDownstream,
    /// The upstream closes its side; the client closes in turn.
    CloseUpstream,
}

/// What a connection did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TcpOutcome {
    pub worker: usize,
    /// The cluster `tcp_proxy` connected to (empty when it connected to none).
    pub cluster: String,
    /// Every byte the upstream received.
    #[serde(serialize_with = "bytes_as_text")]
    pub upstream_received: Vec<u8>,
    /// Every byte the client received.
    #[serde(serialize_with = "bytes_as_text")]
    pub downstream_received: Vec<u8>,
    /// Who closed the connection: `client`, `upstream`, a plugin, the failure policy, or
    /// `still open` when the events ended first (the harness then closes it as the client).
    pub closed_by: String,
    /// Bytes a filter still held when the connection closed, by plugin.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_text_in_reports_and_base64_when_not_utf8() {
        let mut reply = UpstreamReply::new(200).body("hello");
        reply.body_chunks = vec![vec![0xff, 0x00]];
        let json = serde_json::to_value(&reply).unwrap();
        assert_eq!(json["body"], "hello");
        assert_eq!(json["body_chunks"][0]["base64"], "/wA=");
    }
}
