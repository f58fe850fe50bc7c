//! The HTTP/1.1 client for Envoy's listeners and its admin API. Requests are written as raw
//! HTTP/1.1 so Envoy receives exactly the scenario's headers.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::MAX_BODY_BYTES;
use crate::engine::host::HeaderMap;
use crate::envoy::http::{Downstream, Request, Response};
use crate::envoy::http1;
use crate::envoy::http1::pieces::{body_pieces, BodyFraming};

/// A GET on Envoy's admin API, once Envoy has written its admin address.
pub(super) fn admin_get(admin_path: &Path, path: &str) -> Option<Vec<u8>> {
    let address = std::fs::read_to_string(admin_path).ok()?;
    let port: u16 = address.trim().rsplit_once(':')?.1.parse().ok()?;
    let request = Request {
        method: "GET".into(),
        path: path.into(),
        authority: "admin".into(),
        ..Request::default()
    };
    Some(http1_exchange(port, &request).ok()?.message.body)
}

/// The listeners Envoy has bound, by name, from its admin API (`/listeners?format=json`).
pub(super) fn bound_listeners(admin_path: &Path) -> Option<HashMap<String, u16>> {
    let body = admin_get(admin_path, "/listeners?format=json")?;
    let doc: Value = serde_json::from_slice(&body).ok()?;
    Some(
        // Absent when the bootstrap has no listener (only Wasm services).
        doc.get("listener_statuses")
            .map_or(Some(&[][..]), |l| l.as_array().map(Vec::as_slice))?
            .iter()
            .filter_map(|l| {
                let name = l["name"].as_str()?.to_string();
                let port = l
                    .pointer("/local_address/socket_address/port_value")?
                    .as_u64()?;
                (port > 0).then_some((name, port as u16))
            })
            .collect(),
    )
}

pub(super) fn http1_exchange(port: u16, request: &Request) -> Result<Response, http1::Http1Error> {
    let (headers, body) = on_the_wire(request);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    http1::request(
        addr,
        &headers,
        &body,
        Duration::from_secs(30),
        http1::Limits::new(MAX_BODY_BYTES),
    )
}

/// The header block (pseudo-headers first) and the body this client sends for `request`.
pub(super) fn on_the_wire(request: &Request) -> (HeaderMap, Vec<u8>) {
    let (headers, pieces) = wire_pieces(request);
    (headers, pieces.concat())
}

/// [`on_the_wire`] with the body in the pieces the client writes one at a time: each chunk,
/// with its `content-length`, or chunked (`protocol: http1_chunked`) with the trailers
/// after the last chunk.
pub(super) fn wire_pieces(request: &Request) -> (HeaderMap, Vec<Vec<u8>>) {
    let mut headers: HeaderMap = vec![
        (":method".into(), request.method.clone().into_bytes()),
        (":path".into(), request.path.clone().into_bytes()),
        (":authority".into(), request.authority.clone().into_bytes()),
    ];
    headers.extend(request.headers.iter().cloned());
    let chunks = request.chunks();
    let framing = if request.protocol == Downstream::Http1Chunked {
        if crate::envoy::http::headers::get(&headers, "transfer-encoding").is_none() {
            headers.push(("transfer-encoding".into(), b"chunked".to_vec()));
        }
        BodyFraming::Chunked
    } else {
        let len: usize = chunks.iter().map(Vec::len).sum();
        if len > 0 {
            headers.push(("content-length".into(), len.to_string().into_bytes()));
        }
        BodyFraming::Length
    };
    let pieces = body_pieces(&chunks, &request.trailers, framing);
    (headers, pieces)
}
