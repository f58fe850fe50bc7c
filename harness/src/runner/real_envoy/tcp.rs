//! TCP connections through real Envoy's `tcp_proxy` listeners, played with real sockets.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;
use wasm_common::sync::lock;

use super::RealEnvoy;
use crate::envoy::proxy::{TcpEvent, TcpOutcome};
use crate::envoy::traffic::TrafficError;

/// How long `tcp_proxy` may take to connect upstream after the client connected, before the
/// connection counts as reaching no cluster.
const UPSTREAM_WAIT: Duration = Duration::from_secs(5);

impl RealEnvoy {
    /// Opens a connection to a TCP listener and plays `events` with real sockets: the client
    /// side here, the upstream side on the loopback upstream of whichever cluster `tcp_proxy`
    /// connected to (each cluster has its own, so the outcome names the cluster reached).
    /// After each send it reads what arrives on the other side until it goes quiet; a close is
    /// a half-close (`shutdown(Write)`) answered by the other side's. When no upstream
    /// connects, upstream events are skipped and the cluster is empty.
    pub fn connect(
        &mut self,
        listener: Option<&str>,
        events: &[TcpEvent],
    ) -> Result<TcpOutcome, TrafficError> {
        let name = listener.unwrap_or(&self.first_listener).to_string();
        let port = *self
            .listeners
            .get(&name)
            .ok_or_else(|| TrafficError::NoListener { name: name.clone() })?;
        let mut taps = Vec::new();
        for (cluster, s) in &self.upstreams {
            let (tx, rx) = std::sync::mpsc::channel();
            lock(s).tcp_handoff = Some(tx);
            taps.push((cluster.clone(), rx));
        }
        let result = (|| {
            let mut client = TcpStream::connect(("127.0.0.1", port))
                .map_err(TrafficError::socket("cannot connect to envoy"))?;
            let mut out = TcpOutcome::default();
            let Some((cluster, mut upstream)) = accept_upstream(&taps, UPSTREAM_WAIT) else {
                play_without_upstream(&mut client, events, &mut out)?;
                return Ok(out);
            };
            out.cluster = cluster;
            let mut closed = false;
            for event in events {
                match event {
                    TcpEvent::Downstream(d) => {
                        client
                            .write_all(d)
                            .map_err(TrafficError::socket("client write"))?;
                        out.upstream_received.extend(quiet_read(&mut upstream));
                    }
                    TcpEvent::Upstream(d) => {
                        upstream
                            .write_all(d)
                            .map_err(TrafficError::socket("upstream write"))?;
                        out.downstream_received.extend(quiet_read(&mut client));
                    }
                    TcpEvent::CloseDownstream => {
                        half_close_both(&mut client, &mut upstream, &mut out, true);
                        out.closed_by = "client".into();
                        closed = true;
                        break;
                    }
                    TcpEvent::CloseUpstream => {
                        half_close_both(&mut upstream, &mut client, &mut out, false);
                        out.closed_by = "upstream".into();
                        closed = true;
                        break;
                    }
                }
            }
            if !closed {
                half_close_both(&mut client, &mut upstream, &mut out, true);
                out.closed_by = "still open (closed as the client)".into();
            }
            Ok(out)
        })();
        for s in self.upstreams.values() {
            lock(s).tcp_handoff = None;
        }
        result
    }
}

/// The first connection any cluster's upstream accepts within `wait`, with its cluster.
fn accept_upstream(
    taps: &[(String, std::sync::mpsc::Receiver<TcpStream>)],
    wait: Duration,
) -> Option<(String, TcpStream)> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        for (cluster, rx) in taps {
            if let Ok(conn) = rx.try_recv() {
                return Some((cluster.clone(), conn));
            }
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A connection `tcp_proxy` did not connect upstream: the client's bytes are sent (nothing
/// receives them), what Envoy writes back is read, and the client closes at its `close` or
/// after the last event.
fn play_without_upstream(
    client: &mut TcpStream,
    events: &[TcpEvent],
    out: &mut TcpOutcome,
) -> Result<(), TrafficError> {
    for event in events {
        match event {
            TcpEvent::Downstream(d) => {
                if client.write_all(d).is_err() {
                    break;
                }
                out.downstream_received.extend(quiet_read(client));
            }
            TcpEvent::Upstream(_) => {}
            TcpEvent::CloseDownstream | TcpEvent::CloseUpstream => break,
        }
    }
    let _ = client.shutdown(Shutdown::Write);
    let _ = client.set_read_timeout(Some(Duration::from_secs(1)));
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(client, &mut rest);
    out.downstream_received.extend(rest);
    out.closed_by = "client (no upstream connected)".into();
    Ok(())
}

/// Reads until the peer has been quiet for a moment or closed.
fn quiet_read(s: &mut TcpStream) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(s, &mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads until the peer closes its side (or 10 s pass).
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(s, &mut out);
    out
}

/// `first` half-closes; what it still had to receive and what the other side gets until
/// `first`'s close reaches it are read; then `second` closes too.
fn half_close_both(
    first: &mut TcpStream,
    second: &mut TcpStream,
    out: &mut TcpOutcome,
    first_is_client: bool,
) {
    let _ = first.shutdown(Shutdown::Write);
    let at_second = read_to_close(second);
    let _ = second.shutdown(Shutdown::Write);
    let at_first = read_to_close(first);
    if first_is_client {
        out.upstream_received.extend(at_second);
        out.downstream_received.extend(at_first);
    } else {
        out.downstream_received.extend(at_second);
        out.upstream_received.extend(at_first);
    }
}
