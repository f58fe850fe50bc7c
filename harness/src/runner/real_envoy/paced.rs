//! Messages written to Envoy a piece at a time, each once Envoy has read the ones before, so
//! that each piece is one socket read of Envoy's and so one body callback of its HTTP/1
//! codec (which hands the filters what one read holds: see
//! [`crate::envoy::http1::pieces`]). Envoy counts the bytes it reads per read, in live
//! counters its admin API shows: `http.<stat_prefix>.downstream_cx_rx_bytes_total` for its
//! clients, `cluster.<name>.upstream_cx_rx_bytes_total` for a cluster's upstreams.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::client::{admin_get, wire_pieces};
use super::MAX_BODY_BYTES;
use crate::envoy::http::{Request, Response};
use crate::envoy::http1::{self, pieces::with_head, Http1Error};

/// The longest Envoy may take to read a piece; past it the rest is written at once.
const READ_DEADLINE: Duration = Duration::from_secs(5);
/// How long a request may take to connect, be written and be answered (per read or write).
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(2);

/// Whose reads are counted.
#[derive(Debug, Clone)]
enum Reader {
    /// Envoy's connection managers reading their clients (the admin interface's own left
    /// out: it serves the polls).
    Downstream,
    /// Envoy reading a cluster's upstream connections.
    Upstream(String),
}

/// Writes pieces to Envoy as fast as Envoy's admin API shows it reading them.
#[derive(Debug, Clone)]
pub(super) struct Pacer {
    /// The file Envoy wrote its admin address to.
    admin: PathBuf,
    reader: Reader,
}

impl Pacer {
    /// For a client of Envoy's listeners.
    pub(super) fn downstream(admin: PathBuf) -> Self {
        Self {
            admin,
            reader: Reader::Downstream,
        }
    }

    /// For an upstream of `cluster`.
    pub(super) fn upstream(admin: PathBuf, cluster: &str) -> Self {
        Self {
            admin,
            reader: Reader::Upstream(cluster.to_string()),
        }
    }

    /// How many bytes Envoy has read so far, as the counters say.
    fn bytes_read(&self) -> Option<u64> {
        let body = admin_get(&self.admin, "/stats?filter=cx_rx_bytes_total")?;
        let text = String::from_utf8_lossy(&body);
        let mut counters = text
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(name, v)| Some((name, v.trim().parse::<u64>().ok()?)));
        match &self.reader {
            Reader::Downstream => Some(
                counters
                    .filter(|(name, _)| {
                        name.starts_with("http.")
                            && !name.starts_with("http.admin.")
                            && name.ends_with(".downstream_cx_rx_bytes_total")
                    })
                    .map(|(_, n)| n)
                    .sum(),
            ),
            Reader::Upstream(cluster) => {
                let name = format!("cluster.{cluster}.upstream_cx_rx_bytes_total");
                counters.find(|(n, _)| *n == name).map(|(_, n)| n)
            }
        }
    }

    /// Writes `pieces` to `conn`, each once Envoy has read every byte before it. When Envoy
    /// stops reading because it answered or closed, the rest goes at once (it reads no more
    /// of them); when its counters cannot be read or it does not read in time, the rest goes
    /// at once too, and the outcome says so: Envoy's body callbacks may then differ.
    pub(super) fn write(
        &self,
        conn: &mut TcpStream,
        pieces: &[Vec<u8>],
    ) -> std::io::Result<Pacing> {
        let Some((first, rest)) = pieces.split_first() else {
            return Ok(Pacing::Paced);
        };
        if rest.is_empty() {
            conn.write_all(first)?;
            return Ok(Pacing::Paced);
        }
        let mut pacing = Pacing::Paced;
        let mut start = self.bytes_read();
        if start.is_none() {
            pacing = Pacing::Coalesced {
                piece: 1,
                why: "envoy's admin API showed no read counter".into(),
            };
        }
        conn.write_all(first)?;
        let mut written = first.len() as u64;
        for (i, piece) in rest.iter().enumerate() {
            if let Some(s) = start {
                match self.wait_read(conn, s + written) {
                    Waited::Read => {}
                    Waited::Answered => start = None,
                    Waited::Deadline => {
                        start = None;
                        pacing = Pacing::Coalesced {
                            piece: i + 1,
                            why: format!(
                                "envoy had not read the piece before it within {} s",
                                READ_DEADLINE.as_secs()
                            ),
                        };
                    }
                }
            }
            conn.write_all(piece)?;
            written += piece.len() as u64;
        }
        Ok(pacing)
    }

    /// Waits until Envoy has read `total` bytes in all.
    fn wait_read(&self, conn: &TcpStream, total: u64) -> Waited {
        let deadline = Instant::now() + READ_DEADLINE;
        loop {
            if self.bytes_read().is_some_and(|n| n >= total) {
                return Waited::Read;
            }
            if answered(conn) {
                return Waited::Answered;
            }
            if Instant::now() > deadline {
                return Waited::Deadline;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// How a paced message went out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pacing {
    /// Each piece once Envoy had read the ones before (or the rest once Envoy had answered
    /// or closed: it reads no more of the message).
    Paced,
    /// Pieces `piece` (counted from 0, the head's piece first) and after went out together.
    Coalesced { piece: usize, why: String },
}

impl Pacing {
    /// Why the step's log lines cannot be compared, if pacing failed: one short line.
    pub(super) fn unpaced(&self, whose: &str) -> Option<String> {
        match self {
            Self::Paced => None,
            Self::Coalesced { piece, why } => Some(format!(
                "{whose} pieces from {piece} on went to Envoy in one write ({why}), so Envoy's body callbacks may differ"
            )),
        }
    }
}

/// How a wait for Envoy's reads ended.
enum Waited {
    Read,
    /// Envoy answered or closed first.
    Answered,
    Deadline,
}

/// Whether the peer has sent something back or closed: then it reads no more of the message.
fn answered(conn: &TcpStream) -> bool {
    if conn.set_nonblocking(true).is_err() {
        return true;
    }
    let peeked = conn.peek(&mut [0u8; 1]);
    let _ = conn.set_nonblocking(false);
    match peeked {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// One HTTP/1.1 request to the listener on `port`, written a piece at a time, and Envoy's
/// response. `pacing` is set to how the request went out.
pub(super) fn exchange(
    port: u16,
    request: &Request,
    pacer: &Pacer,
    pacing: &mut Pacing,
) -> Result<Response, Http1Error> {
    let io = |e| Http1Error::from_io(e, REQUEST_DEADLINE);
    let (headers, body) = wire_pieces(request);
    let pieces = with_head(http1::request_head(&headers), body);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = TcpStream::connect_timeout(&addr, REQUEST_DEADLINE).map_err(io)?;
    conn.set_write_timeout(Some(REQUEST_DEADLINE)).map_err(io)?;
    conn.set_read_timeout(Some(REQUEST_DEADLINE)).map_err(io)?;
    // Envoy may answer before the whole body is written, and close: its answer is read all
    // the same.
    if let Ok(p) = pacer.write(&mut conn, &pieces) {
        *pacing = p;
    }
    let message = http1::read_message(
        &mut BufReader::new(&conn),
        false,
        http1::Limits::new(MAX_BODY_BYTES),
    )
    .map_err(|e| match e {
        Http1Error::Io(e) => io(e),
        other => other,
    })?
    .ok_or(Http1Error::Closed)?;
    let _ = conn.shutdown(Shutdown::Both);
    http1::parse_response(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Without Envoy's read counters the pieces cannot be paced: they go out together, and
    /// the outcome says so.
    #[test]
    fn pieces_written_without_counters_are_reported_coalesced() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut all = Vec::new();
            conn.read_to_end(&mut all).unwrap();
            all
        });
        let dir = tempfile::tempdir().unwrap();
        let pacer = Pacer::downstream(dir.path().join("no-admin-address"));
        let mut conn = TcpStream::connect(addr).unwrap();
        let pieces = vec![b"head".to_vec(), b"one".to_vec(), b"two".to_vec()];
        let pacing = pacer.write(&mut conn, &pieces).unwrap();
        drop(conn);
        assert_eq!(reader.join().unwrap(), b"headonetwo");
        assert!(matches!(pacing, Pacing::Coalesced { piece: 1, .. }));
        let why = pacing.unpaced("the request's").unwrap();
        assert!(why.contains("no read counter"), "{why}");
    }
}
