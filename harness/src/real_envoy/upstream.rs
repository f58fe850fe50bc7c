//! The loopback upstreams real Envoy's clusters point at, one per cluster so a request's
//! cluster is known: each answers with the reply queued for it (or a callout's canned
//! answer) and records what it saw, or hands its connection over raw for a TCP proxy.

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{io, EnvoyError, MAX_BODY_BYTES};
use crate::http::{CannedHttpCall, HttpCallAnswer, SeenRequest, UpstreamReply};
use crate::http1;

/// One loopback upstream per cluster: answers each request with the reply queued for it and
/// records what it saw.
#[derive(Default)]
pub(super) struct UpstreamState {
    pub(super) reply: UpstreamReply,
    /// Canned callout answers: a request matching one gets its answer instead of `reply`.
    pub(super) calls: Vec<CannedHttpCall>,
    pub(super) seen: Vec<SeenRequest>,
    /// While set, accepted connections are handed over raw (a TCP proxy's upstream).
    pub(super) tcp_handoff: Option<std::sync::mpsc::Sender<TcpStream>>,
}

pub(super) struct Upstream {
    pub(super) port: u16,
}

impl Upstream {
    pub(super) fn start(
        cluster: String,
        state: Arc<Mutex<UpstreamState>>,
    ) -> Result<Self, EnvoyError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| io("upstream bind", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| io("upstream addr", e))?
            .port();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let handoff = state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .tcp_handoff
                    .clone();
                if let Some(tx) = handoff {
                    let _ = tx.send(conn);
                    continue;
                }
                let state = state.clone();
                let cluster = cluster.clone();
                std::thread::spawn(move || serve_upstream(conn, &cluster, &state));
            }
        });
        Ok(Self { port })
    }
}

fn serve_upstream(conn: TcpStream, cluster: &str, state: &Mutex<UpstreamState>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut writer = conn;
    loop {
        let Ok(Some((headers, body))) =
            http1::read_request(&mut reader, http1::Limits::new(MAX_BODY_BYTES))
        else {
            return;
        };
        let path = headers
            .iter()
            .find(|(name, _)| name == ":path")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        let answer = {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.seen.push(SeenRequest {
                cluster: cluster.to_string(),
                headers,
                body,
                trailers: Vec::new(),
            });
            s.calls
                .iter()
                .find(|c| {
                    c.cluster == cluster
                        && c.path_prefix.as_deref().is_none_or(|p| path.starts_with(p))
                })
                .map(|c| c.answer.clone())
                .unwrap_or_else(|| HttpCallAnswer::Reply(s.reply.clone()))
        };
        let reply = match answer {
            HttpCallAnswer::Reply(r) => r,
            // Close without answering: what a crashing upstream does. (Envoy's router turns
            // it into a 503; nothing on the wire makes Envoy report a callout reset.)
            HttpCallAnswer::Disconnect | HttpCallAnswer::Reset => return,
        };
        if http1::write_response(&mut writer, &reply).is_err() {
            return;
        }
    }
}
