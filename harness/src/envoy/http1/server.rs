//! The server side of the harness's HTTP/1.1: what its loopback upstreams read (a request,
//! with the reader's caps and deadline) and write (a reply).

use std::io::{BufRead, Write};

use super::pieces::{body_pieces, with_head, BodyFraming};
use super::{read_message, Http1Error, Limits, Message};
use crate::envoy::http::{HeaderMap, UpstreamReply};

/// A request as a server reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// `:authority` from `host` first, then `:method`, `:path`, then the other headers
    /// lower-cased, in order.
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// What a chunked body ended with.
    pub trailers: HeaderMap,
}

/// Reads one request as a server does. `Ok(None)`: the connection ended cleanly before a
/// request began.
pub fn read_request(
    reader: &mut impl BufRead,
    limits: Limits,
) -> Result<Option<ReadRequest>, Http1Error> {
    let Some(Message {
        head,
        body,
        trailers,
    }) = read_message(reader, true, limits)?
    else {
        return Ok(None);
    };
    let mut headers_buf = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers_buf);
    match req.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(Http1Error::Malformed("incomplete request head".into()))
        }
        Err(e) => return Err(Http1Error::Malformed(format!("bad HTTP request: {e}"))),
    }
    let mut headers: HeaderMap = vec![
        (
            ":method".into(),
            req.method.unwrap_or_default().as_bytes().to_vec(),
        ),
        (
            ":path".into(),
            req.path.unwrap_or_default().as_bytes().to_vec(),
        ),
    ];
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name == "host" {
            headers.insert(0, (":authority".into(), h.value.to_vec()));
        } else {
            headers.push((name, h.value.to_vec()));
        }
    }
    Ok(Some(ReadRequest {
        headers,
        body,
        trailers,
    }))
}

/// Writes `reply` as an HTTP/1.1 response: the status line, its headers as given, and its
/// body with a `content-length`; a reply with trailers is sent chunked (one chunk per body
/// chunk) with them after the last, the only way HTTP/1.1 carries trailers.
pub fn write_response(writer: &mut impl Write, reply: &UpstreamReply) -> std::io::Result<()> {
    writer.write_all(&response_pieces(reply).concat())
}

/// [`write_response`]'s bytes in the pieces a peer writes one at a time: the head with the
/// first chunk, then each chunk (see [`super::pieces`]).
pub fn response_pieces(reply: &UpstreamReply) -> Vec<Vec<u8>> {
    let mut head = format!("HTTP/1.1 {} X\r\n", reply.status).into_bytes();
    for (k, v) in &reply.headers {
        head.extend_from_slice(k.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(v);
        head.extend_from_slice(b"\r\n");
    }
    let chunks = reply.chunks();
    let framing = if reply.trailers.is_empty() {
        let len: usize = chunks.iter().map(Vec::len).sum();
        head.extend_from_slice(format!("content-length: {len}\r\n\r\n").as_bytes());
        BodyFraming::Length
    } else {
        head.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
        BodyFraming::Chunked
    };
    with_head(head, body_pieces(&chunks, &reply.trailers, framing))
}
