//! The HTTP/2 cleartext (prior knowledge) client for Envoy's listeners, on the `h2` crate:
//! each chunk of the request's body goes as one DATA frame and its trailers as a last
//! HEADERS frame, so Envoy's HTTP/2 codec hands the filters the scenario's chunks (one
//! `decodeData` per frame) as the harness does. The whole exchange has one deadline, and the
//! response body is refused past [`MAX_BODY_BYTES`] before it is kept.

use std::time::Duration;

use bytes::Bytes;

use super::MAX_BODY_BYTES;
use crate::envoy::http::{HeaderMap, Message, Request, Response, StreamEnd};
use crate::envoy::http1::Http1Error;
use crate::envoy::traffic::TrafficError;

const DEADLINE: Duration = Duration::from_secs(30);

/// One request on a new HTTP/2 connection to `port`; a stream Envoy resets ends as
/// [`StreamEnd::Reset`].
pub(super) fn exchange(port: u16, request: &Request) -> Result<StreamEnd, TrafficError> {
    exchange_watching(port, request, None)
}

/// [`exchange`]; with `admin` (Envoy's admin address file), a stream Envoy holds (see
/// [`super::held`]) is given up (the client resets it) and ends as [`StreamEnd::Stalled`]
/// once Envoy has ended it too.
pub(super) fn exchange_watching(
    port: u16,
    request: &Request,
    admin: Option<&std::path::Path>,
) -> Result<StreamEnd, TrafficError> {
    let failed = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| {
            TrafficError::EnvoyRequest(Http1Error::Io(std::io::Error::new(
                e.kind(),
                format!("HTTP/2 {what}: {e}"),
            )))
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(failed("runtime"))?;
    runtime.block_on(async {
        match tokio::time::timeout(DEADLINE, send(port, request, admin)).await {
            Ok(result) => result,
            Err(_) => Err(TrafficError::EnvoyRequest(Http1Error::TimedOut(DEADLINE))),
        }
    })
}

async fn send(
    port: u16,
    request: &Request,
    admin: Option<&std::path::Path>,
) -> Result<StreamEnd, TrafficError> {
    let io = |e: std::io::Error| TrafficError::EnvoyRequest(Http1Error::Io(e));
    let h2 = |e: h2::Error| {
        TrafficError::EnvoyRequest(Http1Error::Io(std::io::Error::other(format!(
            "HTTP/2: {e}"
        ))))
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(io)?;
    let (client, connection) = h2::client::handshake(tcp).await.map_err(h2)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.map_err(h2)?;
    let uri = format!("http://{}{}", request.authority, request.path);
    let mut head = http::Request::builder()
        .method(request.method.as_str())
        .uri(uri);
    for (name, value) in &request.headers {
        head = head.header(name.as_str(), value.as_slice());
    }
    let head = head.body(()).map_err(|e| io(std::io::Error::other(e)))?;
    let chunks: Vec<Vec<u8>> = request
        .chunks()
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    let trailers = &request.trailers;
    let end_at_headers = chunks.is_empty() && trailers.is_empty();
    let (response, mut body) = client.send_request(head, end_at_headers).map_err(h2)?;
    let last = chunks.len();
    for (i, chunk) in chunks.into_iter().enumerate() {
        let end = i + 1 == last && trailers.is_empty();
        body.send_data(Bytes::from(chunk), end).map_err(h2)?;
    }
    if !trailers.is_empty() {
        body.send_trailers(to_http_headers(trailers)).map_err(h2)?;
    }
    let response = match admin {
        None => response.await,
        Some(admin) => tokio::select! {
            r = response => r,
            () = super::held::until_held(admin) => {
                // The client gives up: it resets the stream (Envoy ends it as for a client
                // that closes its HTTP/1.1 connection).
                body.send_reset(h2::Reason::CANCEL);
                super::held::until_ended(admin).await;
                return Ok(StreamEnd::Stalled(super::held::held_why()));
            }
        },
    };
    let response = match response {
        Ok(r) => r,
        Err(e) if e.is_reset() => {
            return Ok(StreamEnd::Reset(format!("envoy reset the stream: {e}")))
        }
        Err(e) => return Err(h2(e)),
    };
    let (parts, mut received) = response.into_parts();
    let mut headers: HeaderMap =
        vec![(":status".into(), parts.status.as_str().as_bytes().to_vec())];
    headers.extend(from_http_headers(&parts.headers));
    let mut body_bytes = Vec::new();
    while let Some(data) = received.data().await {
        let data = match data {
            Ok(d) => d,
            Err(e) if e.is_reset() => {
                return Ok(StreamEnd::Reset(format!("envoy reset the stream: {e}")))
            }
            Err(e) => return Err(h2(e)),
        };
        if body_bytes.len() + data.len() > MAX_BODY_BYTES {
            return Err(TrafficError::EnvoyRequest(Http1Error::BodyTooLarge {
                limit: MAX_BODY_BYTES,
            }));
        }
        let _ = received.flow_control().release_capacity(data.len());
        body_bytes.extend_from_slice(&data);
    }
    let trailers = received.trailers().await.map_err(h2)?;
    Ok(StreamEnd::Answered(Response {
        status: parts.status.as_u16(),
        message: Message {
            headers,
            body: body_bytes,
            trailers: trailers.as_ref().map(from_http_headers).unwrap_or_default(),
            ..Message::default()
        },
    }))
}

fn to_http_headers(headers: &HeaderMap) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            http::HeaderValue::from_bytes(v),
        ) {
            map.append(name, value);
        }
    }
    map
}

fn from_http_headers(headers: &http::HeaderMap) -> HeaderMap {
    headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}
