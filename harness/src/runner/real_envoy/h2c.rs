//! HTTP/2 cleartext with prior knowledge (h2c) for the loopback upstreams, on the `h2` crate:
//! what Envoy speaks to a cluster configured for HTTP/2, and so to every gRPC service. Each
//! connection runs on its own single-threaded tokio runtime, each stream on a task of it (Envoy
//! multiplexes callouts and routed requests on one connection); every wait (the next stream, a
//! request's body) has the upstream's idle deadline, and a body is refused past the upstream's
//! limit before it is kept.

use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use h2::server::SendResponse;
use wasm_common::sync::lock;

use super::upstream::{UpstreamAnswer, UpstreamState, IDLE};
use super::MAX_BODY_BYTES;
use crate::envoy::http::{GrpcCallAnswer, HeaderMap, Message, SeenRequest, UpstreamReply};

/// The start of the HTTP/2 connection preface (`PRI * HTTP/2.0`): no HTTP/1.1 method.
pub(super) const PREFACE_START: &[u8; 4] = b"PRI ";

/// Serves HTTP/2 streams on `conn` until Envoy closes it or it stays idle for [`IDLE`].
pub(super) fn serve(conn: TcpStream, cluster: &str, state: &Arc<Mutex<UpstreamState>>) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        if conn.set_nonblocking(true).is_err() {
            return;
        }
        let Ok(conn) = tokio::net::TcpStream::from_std(conn) else {
            return;
        };
        let Ok(Ok(mut connection)) = tokio::time::timeout(IDLE, h2::server::handshake(conn)).await
        else {
            return;
        };
        // Each stream on its own task; accepting drives the connection for all of them. A
        // stream whose answer is to hang up ends the whole connection, as a crashing upstream
        // does (Envoy then reports `connection termination`, as over HTTP/1.1).
        let hang_up = Arc::new(tokio::sync::Notify::new());
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(IDLE, connection.accept()) => next,
                () = hang_up.notified() => return,
            };
            let Ok(Some(Ok((request, respond)))) = next else {
                return;
            };
            let state = state.clone();
            let cluster = cluster.to_string();
            let hang_up = hang_up.clone();
            tokio::spawn(async move {
                let Some(seen) = read_request(request, &cluster).await else {
                    return;
                };
                let answer = lock(&state).answer(seen);
                if matches!(answer, UpstreamAnswer::Close) {
                    hang_up.notify_one();
                    // Holding the stream open: dropping it now would reset it before the
                    // connection closes. The runtime drops this task after the connection.
                    let _held = respond;
                    std::future::pending::<()>().await;
                } else {
                    answer_stream(respond, answer).await;
                }
            });
        }
    });
}

/// The request's head, its body (within [`MAX_BODY_BYTES`]) and trailers, as the upstream saw
/// them; `None` when the stream failed or its body was too large.
async fn read_request(
    request: http::Request<h2::RecvStream>,
    cluster: &str,
) -> Option<SeenRequest> {
    let (parts, mut body) = request.into_parts();
    let mut headers: HeaderMap = vec![
        (":method".into(), parts.method.as_str().as_bytes().to_vec()),
        (
            ":scheme".into(),
            parts
                .uri
                .scheme_str()
                .unwrap_or_default()
                .as_bytes()
                .to_vec(),
        ),
        (
            ":authority".into(),
            parts
                .uri
                .authority()
                .map(|a| a.as_str().as_bytes().to_vec())
                .unwrap_or_default(),
        ),
        (
            ":path".into(),
            parts
                .uri
                .path_and_query()
                .map(|p| p.as_str().as_bytes().to_vec())
                .unwrap_or_default(),
        ),
    ];
    headers.extend(header_map(&parts.headers));
    let mut data = Vec::new();
    while let Ok(Some(chunk)) = tokio::time::timeout(IDLE, body.data()).await {
        let chunk = chunk.ok()?;
        if data.len() + chunk.len() > MAX_BODY_BYTES {
            return None;
        }
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = match tokio::time::timeout(IDLE, body.trailers()).await {
        Ok(Ok(Some(t))) => header_map(&t),
        _ => Vec::new(),
    };
    Some(SeenRequest {
        cluster: cluster.to_string(),
        message: Message {
            headers,
            body: data,
            trailers,
            ..Message::default()
        },
    })
}

fn header_map(map: &http::HeaderMap) -> HeaderMap {
    map.iter()
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// Writes `answer` on the stream; a header HTTP/2 cannot carry (`connection`,
/// `transfer-encoding`, ...) is left out, as Envoy's HTTP/2 codec leaves it out.
async fn answer_stream(mut respond: SendResponse<Bytes>, answer: UpstreamAnswer) {
    let (head, body, trailers) = match answer {
        UpstreamAnswer::Reply(reply) => reply_parts(reply),
        UpstreamAnswer::Grpc(GrpcCallAnswer::Message(message)) => {
            let mut framed = Vec::with_capacity(message.len() + 5);
            framed.push(0);
            framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
            framed.extend_from_slice(&message);
            (
                grpc_head(200, &[]),
                vec![framed],
                vec![("grpc-status".to_string(), b"0".to_vec())],
            )
        }
        UpstreamAnswer::Grpc(GrpcCallAnswer::Status { code, message }) => {
            let mut status = vec![("grpc-status".to_string(), code.to_string().into_bytes())];
            if !message.is_empty() {
                status.push((
                    "grpc-message".into(),
                    crate::envoy::proxy::grpc_message_encode(message.as_bytes()),
                ));
            }
            (grpc_head(200, &status), Vec::new(), Vec::new())
        }
        UpstreamAnswer::Refuse => {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            return;
        }
        // Handled by the connection (it closes); a stream on its own can only be reset.
        UpstreamAnswer::Close => {
            respond.send_reset(h2::Reason::INTERNAL_ERROR);
            return;
        }
        UpstreamAnswer::Silent => {
            // Held, unanswered, until Envoy resets the stream or closes the connection (the
            // runtime then drops this task) or IDLE passes.
            let _held = respond;
            tokio::time::sleep(IDLE).await;
            return;
        }
        UpstreamAnswer::ResetAfterHeaders => {
            if let Ok(mut stream) = respond.send_response(to_response(200, &[]), false) {
                stream.send_reset(h2::Reason::INTERNAL_ERROR);
            }
            return;
        }
    };
    let end_at_headers = body.is_empty() && trailers.is_empty();
    let Ok(mut stream) = respond.send_response(head, end_at_headers) else {
        return;
    };
    let chunks = body.len();
    for (i, chunk) in body.into_iter().enumerate() {
        let last = i + 1 == chunks && trailers.is_empty();
        if send_data(&mut stream, chunk, last).await.is_err() {
            return;
        }
    }
    if !trailers.is_empty() {
        let _ = stream.send_trailers(to_http_headers(&trailers));
    }
}

/// Sends `chunk` as flow control allows, waiting for window within the idle deadline.
async fn send_data(
    stream: &mut h2::SendStream<Bytes>,
    chunk: Vec<u8>,
    end: bool,
) -> Result<(), ()> {
    let mut rest = Bytes::from(chunk);
    loop {
        stream.reserve_capacity(rest.len());
        let granted =
            match tokio::time::timeout(IDLE, std::future::poll_fn(|cx| stream.poll_capacity(cx)))
                .await
            {
                Ok(Some(Ok(n))) => n,
                _ if rest.is_empty() => 0,
                _ => return Err(()),
            };
        let part = rest.split_to(granted.min(rest.len()));
        let done = rest.is_empty();
        stream.send_data(part, end && done).map_err(|_| ())?;
        if done {
            return Ok(());
        }
    }
}

/// The reply as an HTTP/2 response: its headers with a `content-length` for its body, as
/// the HTTP/1.1 upstream writes them; its chunks; its trailers.
fn reply_parts(reply: UpstreamReply) -> (http::Response<()>, Vec<Vec<u8>>, HeaderMap) {
    let body = reply.chunks();
    let len: usize = body.iter().map(Vec::len).sum();
    let mut head = to_response(reply.status, &reply.headers);
    if !head.headers().contains_key(http::header::CONTENT_LENGTH) {
        head.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    (head, body, reply.message.trailers)
}

fn grpc_head(status: u16, extra: &[(String, Vec<u8>)]) -> http::Response<()> {
    let mut headers = vec![("content-type".to_string(), b"application/grpc".to_vec())];
    headers.extend_from_slice(extra);
    to_response(status, &headers)
}

fn to_response(status: u16, headers: &[(String, Vec<u8>)]) -> http::Response<()> {
    let mut response = http::Response::new(());
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    *response.headers_mut() = to_http_headers(headers);
    response
}

/// Headers HTTP/2 forbids (RFC 9113, 8.2.2) are left out; so is anything not a valid name or
/// value.
fn to_http_headers(headers: &[(String, Vec<u8>)]) -> http::HeaderMap {
    const CONNECTION_SPECIFIC: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ];
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        if CONNECTION_SPECIFIC.contains(&k.as_str()) || k.starts_with(':') {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            http::HeaderValue::from_bytes(v),
        ) {
            map.append(name, value);
        }
    }
    map
}
