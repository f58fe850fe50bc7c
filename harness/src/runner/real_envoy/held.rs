//! A request a filter may hold (`StopIteration` and nothing resumes it): sent through Envoy
//! without waiting for a response that never comes. The stream counts as held once Envoy's
//! admin stats show it active for [`HELD_FOR`] with no byte of a response, so its log lines
//! have been written; then the client gives up (over HTTP/1.1 it closes the connection, over
//! HTTP/2 it resets the stream), and Envoy ends the stream (its `on_log` / `on_done` lines
//! belong to the step) before the step is over.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use super::client::{admin_get, on_the_wire};
use super::{Canned, RealEnvoy, MAX_BODY_BYTES};
use crate::envoy::http::{CallRecord, Downstream, Exchange, Request, StreamEnd, UpstreamReply};
use crate::envoy::http1::{self, Http1Error};
use crate::envoy::traffic::TrafficError;

/// How long a stream must stay active without a response to count as held: three of
/// Envoy's log flushes (`--file-flush-interval-msec 50`) and then some.
pub const HELD_FOR: Duration = Duration::from_millis(500);
/// The longest a request may take before it is neither answered nor held.
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// How long Envoy may take to end the stream once the client closed.
const CLOSE_DEADLINE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

impl RealEnvoy {
    /// [`RealEnvoy::send_with_calls`] for a request a filter may hold: a held stream ends
    /// as [`StreamEnd::Stalled`], after the client closed it, instead of a 30 s timeout.
    pub fn send_may_hold(
        &mut self,
        listener: Option<&str>,
        request: &Request,
        reply: &UpstreamReply,
        canned: &Canned,
    ) -> Result<(Exchange, Vec<CallRecord>), TrafficError> {
        let admin = self.admin_path.clone();
        self.send_through(
            listener,
            request,
            reply,
            canned,
            |port, request| match request.protocol {
                Downstream::Http2 => {
                    super::h2_client::exchange_watching(port, request, Some(&admin))
                }
                _ => exchange(port, request, &admin).map_err(TrafficError::EnvoyRequest),
            },
        )
    }
}

fn exchange(port: u16, request: &Request, admin: &Path) -> Result<StreamEnd, Http1Error> {
    let timeout = |e| match e {
        Http1Error::Io(e) if is_timeout(&e) => Http1Error::TimedOut(REQUEST_DEADLINE),
        other => other,
    };
    let (headers, body) = on_the_wire(request);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = TcpStream::connect_timeout(&addr, REQUEST_DEADLINE)?;
    conn.set_write_timeout(Some(REQUEST_DEADLINE))?;
    conn.write_all(&http1::request_head(&headers))?;
    conn.write_all(&body)?;
    conn.set_read_timeout(Some(POLL))?;
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut watch = HoldWatch::default();
    loop {
        match conn.peek(&mut [0u8; 1]) {
            Ok(0) => {
                return Ok(StreamEnd::Reset(
                    "envoy closed the connection without a response".into(),
                ))
            }
            Ok(_) => {
                let left = deadline.saturating_duration_since(Instant::now());
                conn.set_read_timeout(Some(left.max(POLL)))?;
                let message = http1::read_message(&mut BufReader::new(&conn), false, limits())
                    .map_err(timeout)?;
                let _ = conn.shutdown(Shutdown::Both);
                return match message {
                    Some(m) => http1::parse_response(m).map(StreamEnd::Answered),
                    None => Err(Http1Error::Closed),
                };
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() > deadline {
            return Err(Http1Error::TimedOut(REQUEST_DEADLINE));
        }
        if watch.held(admin) {
            break;
        }
    }
    let _ = conn.shutdown(Shutdown::Both);
    drop(conn);
    let closing = Instant::now();
    while active_streams(admin) > 0 && closing.elapsed() < CLOSE_DEADLINE {
        std::thread::sleep(POLL);
    }
    Ok(StreamEnd::Stalled(held_why()))
}

/// Why a stream counts as held, for the report.
pub(super) fn held_why() -> String {
    format!(
        "envoy held the request: it stayed active with no response for {} ms, then the client gave up",
        HELD_FOR.as_millis()
    )
}

/// Whether Envoy shows a stream active for [`HELD_FOR`] in a row, polled between reads.
#[derive(Default)]
struct HoldWatch {
    active_since: Option<Instant>,
}

impl HoldWatch {
    fn held(&mut self, admin: &Path) -> bool {
        self.saw(active_streams(admin))
    }

    /// Takes one poll's count of active streams.
    fn saw(&mut self, active: u64) -> bool {
        let now = Instant::now();
        if active > 0 {
            now.duration_since(*self.active_since.get_or_insert(now)) >= HELD_FOR
        } else {
            self.active_since = None;
            false
        }
    }
}

/// Returns once Envoy has held a stream (for an HTTP/2 client racing it with the response;
/// the client's own deadline bounds the wait).
pub(super) async fn until_held(admin: &Path) {
    let mut watch = HoldWatch::default();
    while !watch.saw(active_streams_async(admin).await) {
        tokio::time::sleep(POLL).await;
    }
}

/// Waits (at most [`CLOSE_DEADLINE`]) for Envoy to end the streams a client gave up, letting
/// the client's connection task send its reset meanwhile.
pub(super) async fn until_ended(admin: &Path) {
    let closing = Instant::now();
    while active_streams_async(admin).await > 0 && closing.elapsed() < CLOSE_DEADLINE {
        tokio::time::sleep(POLL).await;
    }
}

/// [`active_streams`] on a blocking thread: the admin GET blocks, and on the HTTP/2 client's
/// single-threaded runtime it would stall the connection task (its reset, its reads) and
/// every timer racing it while it waits.
async fn active_streams_async(admin: &Path) -> u64 {
    let admin = admin.to_path_buf();
    tokio::task::spawn_blocking(move || active_streams(&admin))
        .await
        .unwrap_or(0)
}

fn limits() -> http1::Limits {
    http1::Limits::new(MAX_BODY_BYTES)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Streams Envoy's connection managers have open (`http.<stat_prefix>.downstream_rq_active`),
/// but the admin interface's own (the one asking).
fn active_streams(admin: &Path) -> u64 {
    let Some(body) = admin_get(admin, "/stats?filter=downstream_rq_active") else {
        return 0;
    };
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("http.") && !l.starts_with("http.admin."))
        .filter_map(|l| l.split_once(": ")?.1.trim().parse::<u64>().ok())
        .sum()
}
