//! What Envoy's HTTP connection manager and router do around the filter chain: the headers
//! the connection manager puts in front of the filters, the route a request takes, the
//! replies the router and `sendLocalReply` make, the HTTP/1 codec's framing, and what the
//! connection manager adds on the way to the client.

use std::fmt::Write as _;

use crate::engine::host::LocalReply;
use crate::envoy::bootstrap::{Bootstrap, RouteAction, RouteConfig, UpstreamProtocol};
use crate::envoy::http::{
    headers, Downstream, HeaderMap, LocalReplySource, Request, Response, UpstreamReply,
};

/// A request as the connection manager hands it to the filters.
pub(super) struct Incoming {
    pub(super) headers: HeaderMap,
    pub(super) chunks: Vec<Vec<u8>>,
    pub(super) trailers: Option<HeaderMap>,
    /// Envoy answers a gRPC request's local replies the gRPC way.
    pub(super) grpc: bool,
}

/// What Envoy's connection manager puts in front of the filters: the pseudo-headers, a
/// `content-length` for a body sent without one, `x-forwarded-proto`, and an `x-request-id`
/// when the client sent none. `number` numbers the request for its id; `http1_trailers`:
/// the connection manager's `http_protocol_options.enable_trailers`.
pub(super) fn incoming(request: &Request, number: usize, http1_trailers: bool) -> Incoming {
    let mut headers = HeaderMap::with_capacity(request.headers.len() + ROOM_FOR_FILTERS);
    let (authority, path, method, scheme) = (
        (":authority".into(), request.authority.clone().into_bytes()),
        (":path".into(), request.path.clone().into_bytes()),
        (":method".into(), request.method.clone().into_bytes()),
        (":scheme".into(), b"http".to_vec()),
    );
    // Envoy keeps the pseudo-headers in the order its codec produced them: its HTTP/1 codec
    // this one, HTTP/2 the order the client sent.
    match request.protocol {
        Downstream::Http1 | Downstream::Http1Chunked => {
            headers.extend([authority, path, method, scheme])
        }
        Downstream::Http2 => headers.extend([method, scheme, authority, path]),
    }
    headers.extend(request.headers.iter().cloned());
    let grpc =
        headers::get(&headers, "content-type").is_some_and(|v| v.starts_with(b"application/grpc"));
    let mut chunks = request.chunks();
    let body_len: usize = chunks.iter().map(Vec::len).sum();
    // The HTTP/1.1 client sends a body with its length, or chunked (Envoy's HTTP/1 codec
    // keeps `transfer-encoding: chunked` from the filters, checked against Envoy 1.40); an
    // HTTP/2 one needs neither.
    if body_len > 0
        && request.protocol == Downstream::Http1
        && headers::get(&headers, "content-length").is_none()
    {
        headers.push(("content-length".into(), body_len.to_string().into_bytes()));
    }
    headers::replace(&mut headers, "x-forwarded-proto", b"http".to_vec());
    if headers::get(&headers, "x-request-id").is_none() {
        headers.push(("x-request-id".into(), request_id(number).into_bytes()));
    }
    let mut trailers = (!request.trailers.is_empty()).then(|| request.trailers.clone());
    if request.protocol.speaks_http1() {
        // Only a chunked message carries trailers, and Envoy's HTTP/1 codec hands them on
        // only when enabled.
        if request.protocol != Downstream::Http1Chunked || !http1_trailers {
            trailers = None;
        }
        let has_body = body_len > 0 || request.protocol == Downstream::Http1Chunked;
        http1_end_of_stream(&mut chunks, has_body, trailers.is_some());
    }
    Incoming {
        headers,
        chunks,
        trailers,
        grpc,
    }
}

/// Envoy's HTTP/1 codec (`source/common/http/http1/codec_impl.cc`) hands a message's body
/// to the filters as it reads it: what one socket read holds of the body is one
/// `decodeData(data, false)` at the end of that read's dispatch (or, chunked, when the last
/// chunk's header arrives), and the message's end is its own call: the trailers
/// (`decodeTrailers`), else an empty `decodeData(empty, true)`. The scenario's chunks are
/// its reads (the `--envoy` driver writes each once Envoy has read the one before), so the
/// filters get each chunk without the end of stream, then the empty end of stream, unless
/// trailers end the message. A message without a body (no length, not chunked) ends with
/// its headers.
pub(super) fn http1_end_of_stream(chunks: &mut Vec<Vec<u8>>, has_body: bool, trailers: bool) {
    if has_body && !trailers {
        chunks.push(Vec::new());
    }
}

/// Where the router sends a request that came through the decode filters.
pub(super) enum Routed {
    /// The router answers itself: no route, a direct response, a cluster that does not
    /// exist.
    Reply(LocalReplySource, Outgoing),
    /// To this cluster's upstream, with the router's headers added.
    Upstream(String),
}

/// The router's decision for a request with these (decoded) headers; on the way upstream it
/// stamps the request as Envoy's router does.
pub(super) fn route(
    bootstrap: &Bootstrap,
    routes: &RouteConfig,
    headers: &mut HeaderMap,
    grpc: bool,
) -> Routed {
    let action = {
        let authority =
            String::from_utf8_lossy(headers::get(headers, ":authority").unwrap_or_default());
        let path = String::from_utf8_lossy(headers::get(headers, ":path").unwrap_or_default());
        routes.route(&authority, &path).map(|r| r.action.clone())
    };
    match action {
        None => Routed::Reply(
            LocalReplySource::NoRoute,
            router_reply(404, Vec::new(), grpc),
        ),
        Some(RouteAction::Direct { status, body }) => Routed::Reply(
            LocalReplySource::DirectResponse,
            router_reply(status, body, grpc),
        ),
        Some(RouteAction::Cluster(cluster)) if bootstrap.cluster(&cluster).is_none() => {
            Routed::Reply(
                LocalReplySource::NoCluster { cluster },
                router_reply(503, Vec::new(), grpc),
            )
        }
        Some(RouteAction::Cluster(cluster))
            if bootstrap
                .cluster(&cluster)
                .is_some_and(|c| c.endpoints.is_empty()) =>
        {
            Routed::Reply(
                LocalReplySource::NoHealthyUpstream { cluster },
                router_reply(503, b"no healthy upstream".to_vec(), grpc),
            )
        }
        Some(RouteAction::Cluster(cluster)) => {
            headers::replace(headers, "x-envoy-expected-rq-timeout-ms", b"15000".to_vec());
            Routed::Upstream(cluster)
        }
    }
}

/// The `x-request-id` Envoy would generate: a UUID's shape, numbered by request so that runs
/// repeat. Built in its one 36-byte allocation (`format!` grows its buffer on the way).
pub(super) fn request_id(number: usize) -> String {
    let mut id = String::with_capacity(36);
    let _ = write!(id, "{:08x}-0000-4000-8000-{number:012x}", 0x5eed);
    id
}

/// Headers the connection manager, the router and typical filters add to a message: reserved
/// up front so that a request does not grow its header maps several times.
pub(super) const ROOM_FOR_FILTERS: usize = 10;

/// A response on its way back through the filters, as it arrives: headers, body chunks,
/// trailers.
pub(super) struct Outgoing {
    pub(super) status: u16,
    pub(super) headers: HeaderMap,
    pub(super) chunks: Vec<Vec<u8>>,
    pub(super) trailers: Option<HeaderMap>,
}

impl Outgoing {
    fn new(status: u16, headers: HeaderMap, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            chunks: if body.is_empty() { vec![] } else { vec![body] },
            trailers: None,
        }
    }
}

/// A reply the router makes (no route, no cluster, a direct response).
pub(super) fn router_reply(status: u16, body: Vec<u8>, grpc: bool) -> Outgoing {
    if grpc {
        return grpc_local_reply(status, &[], &body, None);
    }
    let mut headers: HeaderMap = vec![(":status".into(), status.to_string().into_bytes())];
    if !body.is_empty() {
        headers.push(("content-length".into(), body.len().to_string().into_bytes()));
        headers.push(("content-type".into(), b"text/plain".to_vec()));
    }
    Outgoing::new(status, headers, body)
}

/// What Envoy's RBAC filter answers a request it denies (a deny-all fallback denies all).
pub(super) fn rbac_denied() -> LocalReply {
    LocalReply {
        status: 403,
        details: "rbac_access_denied_matched_policy[none]".into(),
        body: b"RBAC: access denied".to_vec(),
        headers: Vec::new(),
        grpc_status: None,
    }
}

/// Envoy's `sendLocalReply`: `:status`, the plugin's headers, then length and type; to a
/// gRPC request, a trailers-only gRPC response instead.
pub(super) fn local_reply_response(reply: &LocalReply, grpc: bool) -> Outgoing {
    if grpc {
        return grpc_local_reply(reply.status, &reply.headers, &reply.body, reply.grpc_status);
    }
    let mut headers: HeaderMap = vec![(":status".into(), reply.status.to_string().into_bytes())];
    for (k, v) in &reply.headers {
        headers::add(&mut headers, k, v.clone());
    }
    if !reply.body.is_empty() {
        headers::replace(
            &mut headers,
            "content-length",
            reply.body.len().to_string().into_bytes(),
        );
        if headers::get(&headers, "content-type").is_none() {
            headers.push(("content-type".into(), b"text/plain".to_vec()));
        }
    }
    Outgoing::new(reply.status, headers, reply.body.clone())
}

/// Envoy's local reply to a gRPC request: HTTP 200 with headers only, `grpc-status` (the
/// one given, else mapped from the HTTP status as Envoy maps it) and the body as a
/// percent-encoded `grpc-message`.
fn grpc_local_reply(
    status: u16,
    extra: &[(String, Vec<u8>)],
    body: &[u8],
    grpc_status: Option<u32>,
) -> Outgoing {
    let code = grpc_status.unwrap_or(match status {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    });
    let mut headers: HeaderMap = vec![
        (":status".into(), b"200".to_vec()),
        ("content-type".into(), b"application/grpc".to_vec()),
        ("grpc-status".into(), code.to_string().into_bytes()),
    ];
    if !body.is_empty() {
        headers.push(("grpc-message".into(), grpc_message_encode(body)));
    }
    for (k, v) in extra {
        headers::add(&mut headers, k, v.clone());
    }
    Outgoing::new(200, headers, Vec::new())
}

/// A `grpc-message` value: printable ASCII except `%` as is, every other byte percent-encoded
/// (the gRPC over HTTP/2 spec's encoding, as Envoy writes it).
pub(crate) fn grpc_message_encode(text: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(text.len());
    for &b in text {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            message.push(b);
        } else {
            message.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    message
}

/// The upstream's response as the router hands it to the filters. Its trailers only when the
/// connection carries them: HTTP/2, or HTTP/1.1 with `enable_trailers` (Envoy's HTTP/1 codec
/// drops them otherwise, checked against Envoy 1.40).
pub(super) fn upstream_response(reply: UpstreamReply, protocol: UpstreamProtocol) -> Outgoing {
    let mut chunks = reply.chunks();
    let len = chunks.iter().map(Vec::len).sum();
    let message = reply.message;
    let trailers = (!message.trailers.is_empty() && protocol.passes_trailers())
        .then_some(message.trailers.clone());
    let had_length = headers::get(&message.headers, "content-length").is_some();
    let mut headers = routed_headers(reply.status, message.headers, len);
    if protocol != UpstreamProtocol::Http2 {
        // An upstream sends a reply with trailers chunked (the only framing with room for
        // them), any other with its length: a chunked one has no length to hand the filters.
        let chunked = !message.trailers.is_empty();
        if chunked && !had_length {
            headers::remove(&mut headers, "content-length");
        }
        http1_end_of_stream(&mut chunks, len > 0 || chunked, trailers.is_some());
    }
    Outgoing {
        status: reply.status,
        headers,
        chunks,
        trailers,
    }
}

/// What the route's cluster speaks (HTTP/1.1 for a cluster the bootstrap lacks).
pub(super) fn upstream_protocol(bootstrap: &Bootstrap, cluster: &str) -> UpstreamProtocol {
    bootstrap
        .cluster(cluster)
        .map_or(UpstreamProtocol::default(), |c| c.protocol)
}

/// The request trailers the upstream receives: none over HTTP/1.1 without `enable_trailers`.
pub(super) fn forwarded_trailers(
    trailers: Option<HeaderMap>,
    protocol: UpstreamProtocol,
) -> HeaderMap {
    trailers
        .filter(|_| protocol.passes_trailers())
        .unwrap_or_default()
}

/// An upstream's response headers as Envoy's router hands them on, to the filter chain or to
/// a callout's caller: `:status` first, the upstream's headers, a `content-length` when the
/// upstream sent none (never on a 204 or a 304, which have no body: Envoy's codecs hand
/// those on without one, checked against Envoy 1.40), and the router's service-time stamp.
pub(crate) fn routed_headers(status: u16, upstream: HeaderMap, body_len: usize) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(upstream.len() + ROOM_FOR_FILTERS);
    headers.push((":status".into(), status.to_string().into_bytes()));
    for (k, v) in upstream {
        headers::add(&mut headers, k, v);
    }
    if !matches!(status, 204 | 304) && headers::get(&headers, "content-length").is_none() {
        headers.push(("content-length".into(), body_len.to_string().into_bytes()));
    }
    headers::replace(&mut headers, "x-envoy-upstream-service-time", b"0".to_vec());
    headers
}

/// How a message's body fits the framing Envoy's HTTP/1 codec sends it with.
pub(super) enum Framing {
    Fine,
    /// The body was longer than its `content-length`: the peer reads only that much.
    Truncated(String),
    /// Shorter: the peer waits for bytes that never come.
    Short(String),
}

/// Envoy's HTTP/1 codec frames a message by the `content-length` the filters left, or
/// chunked without one; it does not fix a length a filter invalidated by changing the body
/// (filters that change a body's size remove `content-length` in their headers callback).
pub(super) fn http1_framing(headers: &mut HeaderMap, body: &mut Vec<u8>, peer: &str) -> Framing {
    let declared = headers::get(headers, "content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
    match declared {
        None if !body.is_empty() => {
            if headers::get(headers, "transfer-encoding").is_none() {
                headers.push(("transfer-encoding".into(), b"chunked".to_vec()));
            }
            Framing::Fine
        }
        None => Framing::Fine,
        Some(n) if n == body.len() => Framing::Fine,
        Some(n) if n < body.len() => {
            let note = format!(
                "content-length says {n} but the filters left a {}-byte body: the {peer} reads only the first {n} bytes (a filter that changes a body's size must remove content-length in its headers callback)",
                body.len()
            );
            body.truncate(n);
            Framing::Truncated(note)
        }
        Some(n) => Framing::Short(format!(
            "content-length says {n} but the filters left a {}-byte body: the {peer} waits for the rest and Envoy would time out (a filter that changes a body's size must remove content-length in its headers callback)",
            body.len()
        )),
    }
}

/// Over HTTP/2 a `content-length` the body does not match is a protocol error: Envoy's codec
/// resets the stream before the upstream gets the request, and the router answers 502. Says
/// why, when it does not match.
pub(super) fn http2_length_mismatch(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let declared = headers::get(headers, "content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok())?;
    (declared != body.len()).then(|| format!(
        "content-length says {declared} but the filters left a {}-byte body: over HTTP/2 that is a protocol error, so Envoy resets the upstream stream and answers 502 (a filter that changes a body's size must remove content-length in its headers callback)",
        body.len()
    ))
}

/// The router's answer to an upstream stream reset for a protocol error.
pub(super) fn protocol_error() -> LocalReply {
    LocalReply {
        status: 502,
        details: "upstream_reset_before_response_started{protocol_error}".into(),
        body: b"upstream connect error or disconnect/reset before headers. reset reason: protocol error".to_vec(),
        headers: Vec::new(),
        grpc_status: None,
    }
}

/// The request's chunks once a filter that paused in its headers callback is resumed by a
/// callout's answer: over HTTP/1.1 a `body` the client sent with the headers was read whole,
/// end of stream included, while the filter waited, and Envoy hands it on in one body
/// callback (its `StopAndResumeViaAsyncCall` test filter shows it; checked against Envoy
/// 1.40). Chunks the client sends one by one (`body_chunks`) still come one by one in the
/// harness; in Envoy how many of them its codec read before the answer came is a matter of
/// timing.
pub(super) fn buffered_while_paused(
    request: &Request,
    mut chunks: Vec<Vec<u8>>,
    trailers: bool,
) -> Vec<Vec<u8>> {
    let one_body = request.protocol == Downstream::Http1
        && request.body_chunks.is_empty()
        && !trailers
        && chunks.len() == 2
        && chunks.last().is_some_and(Vec::is_empty);
    if one_body {
        chunks.pop();
    }
    chunks
}

/// A response that starts before the request's end of stream was decoded (a local reply
/// before its body was read): Envoy's connection manager closes an HTTP/1.1 connection after
/// it and says so (`connection: close`, `ActiveStream::encodeHeaders`); an HTTP/2 one stays.
pub(super) fn close_after(response: &mut Response, protocol: Downstream) {
    if protocol != Downstream::Http2 {
        headers::replace(&mut response.headers, "connection", b"close".to_vec());
    }
}

/// What the connection manager does after the filters, on the way to the client.
/// `http1_trailers`: the connection manager's `http_protocol_options.enable_trailers`.
pub(super) fn finalize_downstream(
    response: &mut Response,
    protocol: Downstream,
    http1_trailers: bool,
) {
    response.status = headers::get(&response.headers, ":status")
        .and_then(|s| std::str::from_utf8(s).ok()?.parse().ok())
        .unwrap_or(response.status);
    headers::replace(&mut response.headers, "server", b"envoy".to_vec());
    // Envoy's HTTP/1 codec ends a bodiless response with `content-length: 0` unless the
    // status forbids a body (seen on its failure-policy 503, whose local reply has none);
    // its HTTP/2 codec needs no length.
    let bodiless_status = response.status < 200 || matches!(response.status, 204 | 304);
    // Envoy's HTTP/1 codec sends trailers only when enabled, after a chunked body (a
    // `content-length` leaves no room for them).
    if protocol.speaks_http1()
        && (!http1_trailers || headers::get(&response.headers, "content-length").is_some())
    {
        response.message.trailers.clear();
    }
    if response.body.is_empty()
        && protocol.speaks_http1()
        && !bodiless_status
        && headers::get(&response.headers, "content-length").is_none()
        && headers::get(&response.headers, "transfer-encoding").is_none()
    {
        response
            .headers
            .push(("content-length".into(), b"0".to_vec()));
    }
}
