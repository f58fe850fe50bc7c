//! The harness's HTTP/1.1 on the wire: the client it uses for callouts to loopback upstreams
//! and for requests to real Envoy, and the reader and writer its loopback upstreams use
//! ([`read_request`], [`write_response`], in `server`).
//!
//! The peer is not trusted (a callout's upstream is whatever the bootstrap names on loopback):
//! the head, each chunk and the body are capped before anything is allocated for them, sizes
//! are parsed with checked arithmetic, and one deadline covers connecting, writing and reading,
//! so a peer that trickles bytes cannot hold the harness longer than the caller allowed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::envoy::http::{self, HeaderMap, Response};

pub mod pieces;
mod server;

pub use server::{read_request, response_pieces, write_response, ReadRequest};

/// Envoy's default for `max_request_headers_kb` (60 KiB), rounded up: a head longer than this
/// is refused rather than buffered.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How much of a message the reader keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The request or status line and the headers, with their line ends.
    pub head: usize,
    /// The body, however it is framed.
    pub body: usize,
}

impl Limits {
    pub const fn new(body: usize) -> Self {
        Self {
            head: MAX_HEAD_BYTES,
            body,
        }
    }
}

/// Why no complete message could be read or exchanged.
#[derive(Debug, thiserror::Error)]
pub enum Http1Error {
    #[error("connection closed before a complete message")]
    Closed,
    #[error("no complete response within {0:?}")]
    TimedOut(Duration),
    #[error("message head longer than {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("body longer than the harness's limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("malformed HTTP/1.1 message: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Http1Error {
    pub(crate) fn from_io(e: std::io::Error, timeout: Duration) -> Self {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                Self::TimedOut(timeout)
            }
            std::io::ErrorKind::UnexpectedEof => Self::Closed,
            _ => Self::Io(e),
        }
    }
}

/// A message as read: the head's bytes (for `httparse`), the body, de-chunked, and the
/// trailers a chunked body ended with (lower-cased names, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
}

/// Reads one line (through `\n`) onto `out`, refusing to let `out` pass `limit` bytes.
/// Returns false at a clean end of input before any byte of the line.
fn read_line(
    reader: &mut impl BufRead,
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<bool, Http1Error> {
    let start = out.len();
    loop {
        let room = limit.saturating_sub(out.len());
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return if out.len() == start {
                Ok(false)
            } else {
                Err(Http1Error::Closed)
            };
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        if take > room {
            return Err(Http1Error::HeadTooLarge { limit });
        }
        out.extend_from_slice(&available[..take]);
        reader.consume(take);
        if done {
            return Ok(true);
        }
    }
}

/// How a message's body is framed, from its head.
enum Framing {
    Length(u64),
    Chunked,
    /// A response without either: the body runs to the end of the connection.
    ToClose,
    None,
}

fn framing(head: &[u8], is_request: bool) -> Result<Framing, Http1Error> {
    // A 1xx, 204 or 304 response has no body, whatever its headers say (RFC 9112, 6.3).
    let status = head.split(|&b| b == b' ').nth(1);
    if !is_request && status.is_some_and(|s| s.starts_with(b"1") || s == b"204" || s == b"304") {
        return Ok(Framing::None);
    }
    let mut length = None;
    let mut chunked = false;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            let text = std::str::from_utf8(value)
                .map_err(|_| Http1Error::Malformed("content-length is not text".into()))?;
            let n: u64 = text.parse().map_err(|_| {
                Http1Error::Malformed(format!("content-length {text:?} is not a number"))
            })?;
            if length.is_some_and(|l| l != n) {
                return Err(Http1Error::Malformed(
                    "two different content-length headers".into(),
                ));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked |= value
                .split(|&b| b == b',')
                .any(|v| v.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        }
    }
    Ok(match (chunked, length) {
        (true, _) => Framing::Chunked,
        (false, Some(n)) => Framing::Length(n),
        (false, None) if is_request => Framing::None,
        (false, None) => Framing::ToClose,
    })
}

/// Appends exactly `n` bytes from `reader` to `body`, growing it only as bytes arrive (a peer
/// that announces more than it sends costs nothing), within `limit` for the whole body.
fn read_exact_into(
    reader: &mut impl Read,
    body: &mut Vec<u8>,
    n: u64,
    limit: usize,
) -> Result<(), Http1Error> {
    let end = u64::try_from(body.len())
        .ok()
        .and_then(|len| len.checked_add(n))
        .filter(|&end| end <= limit as u64)
        .ok_or(Http1Error::BodyTooLarge { limit })?;
    reader.take(n).read_to_end(body)?;
    if (body.len() as u64) < end {
        return Err(Http1Error::Closed);
    }
    Ok(())
}

/// Reads one HTTP/1.1 message: its head (within `limits.head`) and its body, by
/// content-length, chunked, or (a response without either) to the end of the connection,
/// within `limits.body`. `Ok(None)`: the connection ended cleanly before a message began.
pub fn read_message(
    reader: &mut impl BufRead,
    is_request: bool,
    limits: Limits,
) -> Result<Option<Message>, Http1Error> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        if !read_line(reader, &mut head, limits.head)? {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(Http1Error::Closed)
            };
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            if before == 0 {
                // Blank lines before a message are allowed (RFC 9112, 2.2).
                head.clear();
                continue;
            }
            break;
        }
    }
    let mut body = Vec::new();
    let mut trailers = HeaderMap::new();
    match framing(&head, is_request)? {
        Framing::None => {}
        Framing::Length(n) => read_exact_into(reader, &mut body, n, limits.body)?,
        Framing::ToClose => {
            let cap = (limits.body as u64).saturating_add(1);
            reader.take(cap).read_to_end(&mut body)?;
            if body.len() > limits.body {
                return Err(Http1Error::BodyTooLarge { limit: limits.body });
            }
        }
        Framing::Chunked => loop {
            let mut line = Vec::new();
            if !read_line(reader, &mut line, limits.head)? {
                return Err(Http1Error::Closed);
            }
            let text = std::str::from_utf8(&line)
                .map_err(|_| Http1Error::Malformed("chunk size is not text".into()))?;
            let digits = text.split(';').next().unwrap_or_default().trim();
            let size = u64::from_str_radix(digits, 16).map_err(|_| {
                Http1Error::Malformed(format!("chunk size {digits:?} is not hexadecimal"))
            })?;
            if size == 0 {
                // Trailers, if any, then the blank line; within the head's limit.
                let mut lines = Vec::new();
                loop {
                    let before = lines.len();
                    if !read_line(reader, &mut lines, limits.head)? {
                        return Err(Http1Error::Closed);
                    }
                    let l = &lines[before..];
                    if l == b"\r\n" || l == b"\n" {
                        break;
                    }
                    if let Some(colon) = l.iter().position(|&b| b == b':') {
                        trailers.push((
                            String::from_utf8_lossy(&l[..colon]).to_ascii_lowercase(),
                            l[colon + 1..].trim_ascii().to_vec(),
                        ));
                    }
                }
                break;
            }
            read_exact_into(reader, &mut body, size, limits.body)?;
            let mut end = Vec::new();
            let ended = matches!(read_line(reader, &mut end, 2), Ok(true));
            if !ended || !(end == b"\r\n" || end == b"\n") {
                return Err(Http1Error::Malformed("chunk not followed by CRLF".into()));
            }
        },
    }
    Ok(Some(Message {
        head,
        body,
        trailers,
    }))
}

/// A TCP stream whose every read and write waits at most until one deadline.
struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl DeadlineStream {
    fn remaining(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        self.stream.read(buf)
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// One HTTP/1.1 request on a new connection, written exactly as given: `headers` holds the
/// pseudo-headers `:method`, `:path`, `:authority` (sent as `host`) and the regular headers in
/// order. The whole exchange (connect, write, read) ends within `timeout`.
pub fn request(
    addr: SocketAddr,
    headers: &HeaderMap,
    body: &[u8],
    timeout: Duration,
    limits: Limits,
) -> Result<Response, Http1Error> {
    let deadline = Instant::now() + timeout;
    let io = |e| Http1Error::from_io(e, timeout);
    let conn = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    let mut conn = DeadlineStream {
        stream: conn,
        deadline,
    };
    conn.write_all(&request_head(headers)).map_err(io)?;
    conn.write_all(body).map_err(io)?;
    let mut reader = BufReader::new(conn);
    let message = read_message(&mut reader, false, limits)
        .map_err(|e| match e {
            Http1Error::Io(e) => io(e),
            other => other,
        })?
        .ok_or(Http1Error::Closed)?;
    let _ = reader.get_ref().stream.shutdown(Shutdown::Both);
    parse_response(message)
}

/// A request's first line and header block, as [`request`] writes them.
pub(crate) fn request_head(headers: &HeaderMap) -> Vec<u8> {
    let pseudo = |name: &str| {
        String::from_utf8_lossy(crate::envoy::http::header(headers, name).unwrap_or_default())
            .into_owned()
    };
    let mut out = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        pseudo(":method"),
        pseudo(":path"),
        pseudo(":authority")
    )
    .into_bytes();
    for (k, v) in headers.iter().filter(|(k, _)| !k.starts_with(':')) {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

pub(crate) fn parse_response(message: Message) -> Result<Response, Http1Error> {
    let mut headers_buf = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut headers_buf);
    resp.parse(&message.head)
        .map_err(|e| Http1Error::Malformed(format!("bad HTTP response: {e}")))?;
    let status = resp.code.unwrap_or_default();
    let mut headers: HeaderMap = vec![(":status".into(), status.to_string().into_bytes())];
    headers.extend(
        resp.headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())),
    );
    Ok(Response {
        status,
        message: http::Message {
            headers,
            body: message.body,
            trailers: message.trailers,
            ..http::Message::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::http::UpstreamReply;
    use proptest::prelude::*;

    fn read(bytes: &[u8], is_request: bool, limits: Limits) -> Result<Option<Message>, Http1Error> {
        read_message(&mut std::io::Cursor::new(bytes), is_request, limits)
    }

    const SMALL: Limits = Limits {
        head: 256,
        body: 1024,
    };

    #[test]
    fn reads_length_chunked_and_to_close_bodies() {
        let m = read(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
            false,
            SMALL,
        )
        .unwrap()
        .unwrap();
        assert_eq!(m.body, b"hello");
        let m = read(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nhel\r\n2\r\nlo\r\n0\r\nx-t: 1\r\n\r\n",
            false,
            SMALL,
        )
        .unwrap()
        .unwrap();
        assert_eq!(m.body, b"hello");
        let m = read(b"HTTP/1.1 200 OK\r\n\r\nto the end", false, SMALL)
            .unwrap()
            .unwrap();
        assert_eq!(m.body, b"to the end");
        let m = read(b"GET / HTTP/1.1\r\n\r\nnext", true, SMALL)
            .unwrap()
            .unwrap();
        assert!(m.body.is_empty());
        assert!(read(b"", true, SMALL).unwrap().is_none());
    }

    #[test]
    fn sizes_over_the_limits_are_refused_before_allocating() {
        let huge = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\nx", u64::MAX);
        assert!(matches!(
            read(huge.as_bytes(), false, SMALL),
            Err(Http1Error::BodyTooLarge { limit: 1024 })
        ));
        let chunk = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n";
        assert!(matches!(
            read(chunk, false, SMALL),
            Err(Http1Error::BodyTooLarge { .. })
        ));
        let overflow =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1ffffffffffffffff\r\n";
        assert!(matches!(
            read(overflow, false, SMALL),
            Err(Http1Error::Malformed(_))
        ));
        let long_head = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(300));
        assert!(matches!(
            read(long_head.as_bytes(), false, SMALL),
            Err(Http1Error::HeadTooLarge { limit: 256 })
        ));
        let endless = "a".repeat(2000);
        assert!(matches!(
            read(
                format!("HTTP/1.1 200 OK\r\n\r\n{endless}").as_bytes(),
                false,
                SMALL
            ),
            Err(Http1Error::BodyTooLarge { .. })
        ));
    }

    #[test]
    fn a_204_or_304_response_has_no_body() {
        for head in [
            "HTTP/1.1 204 No Content\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
        ] {
            let m = read(head.as_bytes(), false, SMALL).unwrap().unwrap();
            assert!(m.body.is_empty(), "{head}");
        }
    }

    #[test]
    fn a_short_body_is_a_closed_connection() {
        assert!(matches!(
            read(
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
                false,
                SMALL
            ),
            Err(Http1Error::Closed)
        ));
    }

    /// Messages built from plausible parts, with sizes that lie.
    fn message_parts() -> impl Strategy<Value = Vec<u8>> {
        let header = prop_oneof![
            any::<u64>().prop_map(|n| format!("content-length: {n}\r\n")),
            (0u64..4096).prop_map(|n| format!("Content-Length: {n}\r\n")),
            Just("transfer-encoding: chunked\r\n".to_string()),
            (
                prop::collection::vec(b'a'..=b'z', 1..12),
                prop::collection::vec(b' '..=b'~', 0..40)
            )
                .prop_map(|(n, v)| format!(
                    "{}: {}\r\n",
                    String::from_utf8_lossy(&n),
                    String::from_utf8_lossy(&v)
                )),
        ];
        let chunk = prop_oneof![
            any::<u64>().prop_map(|n| format!("{n:x}\r\n")),
            (0u64..64).prop_map(|n| format!("{n:x}\r\n{}\r\n", "z".repeat(n as usize))),
            prop::collection::vec(
                prop::sample::select(b"0123456789abcdefABCDEF;=x ".to_vec()),
                0..20
            )
            .prop_map(|v| format!("{}\r\n", String::from_utf8_lossy(&v))),
        ];
        (
            prop::collection::vec(header, 0..6),
            prop::collection::vec(chunk, 0..6),
            prop::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(headers, chunks, tail)| {
                let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
                for h in headers {
                    out.extend_from_slice(h.as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                for c in chunks {
                    out.extend_from_slice(c.as_bytes());
                }
                out.extend_from_slice(&tail);
                out
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the peer sends: no panic, and what is kept stays within the limits.
        #[test]
        fn any_bytes_stay_within_the_limits(bytes in prop::collection::vec(any::<u8>(), 0..2048), is_request: bool) {
            if let Ok(Some(m)) = read(&bytes, is_request, SMALL) {
                prop_assert!(m.head.len() <= SMALL.head);
                prop_assert!(m.body.len() <= SMALL.body);
            }
        }

        #[test]
        fn lying_sizes_stay_within_the_limits(bytes in message_parts(), is_request: bool) {
            if let Ok(Some(m)) = read(&bytes, is_request, SMALL) {
                prop_assert!(m.head.len() <= SMALL.head);
                prop_assert!(m.body.len() <= SMALL.body);
                // Grown as bytes arrived, never reserved from a claimed size.
                prop_assert!(m.body.capacity() <= 2 * SMALL.body + 64);
            }
        }
    }

    #[test]
    fn a_response_written_reads_back_and_a_request_reads_as_a_header_map() {
        let mut reply = UpstreamReply::new(201);
        reply.headers.push(("x-a".into(), b"1".to_vec()));
        reply.body = b"made".to_vec();
        let mut wire = Vec::new();
        write_response(&mut wire, &reply).unwrap();
        let response = parse_response(read(&wire, false, SMALL).unwrap().unwrap()).unwrap();
        assert_eq!(response.status, 201);
        assert_eq!(
            crate::envoy::http::header(&response.headers, "x-a"),
            Some(&b"1"[..])
        );
        assert_eq!(response.body, b"made");

        let request = b"POST /p?q HTTP/1.1\r\nX-B: 2\r\nHost: up\r\ncontent-length: 2\r\n\r\nhi";
        let ReadRequest { headers, body, .. } =
            read_request(&mut std::io::Cursor::new(&request[..]), SMALL)
                .unwrap()
                .unwrap();
        let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [":authority", ":method", ":path", "x-b", "content-length"]
        );
        assert_eq!(
            crate::envoy::http::header(&headers, ":path"),
            Some(&b"/p?q"[..])
        );
        assert_eq!(body, b"hi");
        assert!(read_request(&mut std::io::Cursor::new(&b""[..]), SMALL)
            .unwrap()
            .is_none());
    }

    #[test]
    fn trailers_go_out_chunked_and_read_back() {
        let mut reply = UpstreamReply::new(200).body("hel");
        reply.body_chunks.push(b"lo".to_vec());
        reply.trailers.push(("x-checksum".into(), b"abc".to_vec()));
        let mut wire = Vec::new();
        write_response(&mut wire, &reply).unwrap();
        assert!(wire.ends_with(b"3\r\nhel\r\n2\r\nlo\r\n0\r\nx-checksum: abc\r\n\r\n"));
        let response = parse_response(read(&wire, false, SMALL).unwrap().unwrap()).unwrap();
        assert_eq!(response.body, b"hello");
        assert_eq!(
            response.trailers,
            [("x-checksum".to_string(), b"abc".to_vec())]
        );
    }
}
