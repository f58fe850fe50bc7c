//! The loopback upstreams real Envoy's clusters point at, one per cluster so a request's
//! cluster is known: each answers with the reply queued for it (or a callout's canned
//! answer) and records what it saw, or hands its connection over raw for a TCP proxy.
//!
//! Each speaks HTTP/1.1 and HTTP/2 cleartext with prior knowledge, told apart by the
//! connection's first bytes, so a cluster Envoy talks HTTP/2 to (`http2_protocol_options`,
//! `HttpProtocolOptions` with `explicit_http_config.http2_protocol_options` or
//! `use_downstream_protocol_config`; gRPC services) gets the same upstream as any other.

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasm_common::sync::lock;

use super::{h2c, io, EnvoyError, MAX_BODY_BYTES};
use crate::envoy::http::{
    headers, CannedGrpcCall, CannedHttpCall, GrpcCallAnswer, HeaderMap, HttpCallAnswer, Message,
    SeenRequest, UpstreamReply,
};
use crate::envoy::http1;

/// One loopback upstream per cluster: answers each request with the reply queued for it and
/// records what it saw.
#[derive(Default)]
pub(super) struct UpstreamState {
    pub(super) reply: UpstreamReply,
    /// Canned HTTP callout answers: a callout matching one gets its answer instead of `reply`.
    pub(super) calls: Vec<CannedHttpCall>,
    /// Canned unary gRPC callout answers.
    pub(super) grpc_calls: Vec<CannedGrpcCall>,
    /// Every request, numbered in the order the upstreams (all of them) received them.
    pub(super) seen: Vec<(u64, SeenRequest)>,
    /// While set, accepted connections are handed over raw (a TCP proxy's upstream).
    pub(super) tcp_handoff: Option<std::sync::mpsc::Sender<TcpStream>>,
    /// Where Envoy writes its admin address: an HTTP/1.1 reply is written a chunk at a
    /// time, each once Envoy has read the ones before ([`super::paced`]).
    pub(super) admin: Option<std::path::PathBuf>,
    /// Why a reply could not be paced, for the step's report ([`super::paced::Pacing`]).
    pub(super) unpaced: Vec<String>,
}

/// Numbers requests across every upstream, so callouts to several clusters keep their order.
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

/// What an upstream does with one request.
pub(super) enum UpstreamAnswer {
    /// An HTTP response.
    Reply(UpstreamReply),
    /// A gRPC response: the reply message with `grpc-status: 0`, or a trailers-only failure.
    Grpc(GrpcCallAnswer),
    /// Refuse the stream (HTTP/2 `REFUSED_STREAM`; HTTP/1.1 closes): a gRPC call the scenario
    /// gives no answer for, which Envoy's gRPC client reports as `UNAVAILABLE`.
    Refuse,
    /// Close the connection without answering, as a crashing upstream does.
    Close,
    /// Start a response, then reset the stream (HTTP/2 `RST_STREAM`; HTTP/1.1 closes within
    /// the body): Envoy's router can no longer answer for the upstream, so the callout fails.
    ResetAfterHeaders,
    /// Take the request and never answer, until Envoy gives up on it (its timeout, or the
    /// stream that made the call ending) or [`IDLE`] passes.
    Silent,
}

/// The header the driver has Envoy's router add to every request it routes (a route's
/// `request_headers_to_add`): what tells a routed request from a callout, as Envoy knows
/// them apart (a callout goes through the async client, on no route), whatever headers a
/// guest copies into its callouts. The upstream takes it off before anything compares.
pub(super) const ROUTED_MARK: &str = "x-wasm-harness-routed";

/// Whether a request came from Envoy's async client (a Wasm `proxy_http_call` or
/// `proxy_grpc_call`) rather than through a route: it has no [`ROUTED_MARK`].
pub(super) fn from_async_client(headers: &HeaderMap) -> bool {
    headers::get(headers, ROUTED_MARK).is_none()
}

/// A routed request as its upstream saw it, without the driver's mark.
pub(super) fn unmarked(mut seen: SeenRequest) -> SeenRequest {
    headers::remove(&mut seen.headers, ROUTED_MARK);
    seen
}

/// Marks every route of `doc` that sends requests to a cluster with [`ROUTED_MARK`].
pub(super) fn mark_routes(doc: &mut serde_json::Value) {
    let Some(listeners) = doc
        .pointer_mut("/static_resources/listeners")
        .and_then(serde_json::Value::as_array_mut)
    else {
        return;
    };
    let routes = listeners
        .iter_mut()
        .flat_map(|l| l["filter_chains"].as_array_mut().into_iter().flatten())
        .flat_map(|c| c["filters"].as_array_mut().into_iter().flatten())
        .filter_map(|f| f.pointer_mut("/typed_config/route_config/virtual_hosts"))
        .flat_map(|v| v.as_array_mut().into_iter().flatten())
        .flat_map(|v| v["routes"].as_array_mut().into_iter().flatten());
    for route in routes {
        if !route.get("route").is_some_and(serde_json::Value::is_object) {
            continue;
        }
        let mark = serde_json::json!({"header": {"key": ROUTED_MARK, "value": "1"}});
        match route
            .get_mut("request_headers_to_add")
            .and_then(serde_json::Value::as_array_mut)
        {
            Some(list) => list.push(mark),
            None => route["request_headers_to_add"] = serde_json::json!([mark]),
        }
    }
}

/// Whether a request is a gRPC call (`content-type: application/grpc...`).
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers::get(headers, "content-type").is_some_and(|v| v.starts_with(b"application/grpc"))
}

impl UpstreamState {
    /// Records `seen` and chooses its answer: a callout's canned answer (gRPC calls by
    /// service and method, HTTP calls by path), else the step's upstream reply; a gRPC callout
    /// without a canned answer is refused.
    pub(super) fn answer(&mut self, seen: SeenRequest) -> UpstreamAnswer {
        let answer = if from_async_client(&seen.headers) {
            self.callout_answer(&seen)
        } else {
            UpstreamAnswer::Reply(self.reply.clone())
        };
        self.seen
            .push((ARRIVALS.fetch_add(1, Ordering::Relaxed), seen));
        answer
    }

    fn callout_answer(&self, seen: &SeenRequest) -> UpstreamAnswer {
        let path = headers::get(&seen.headers, ":path").unwrap_or_default();
        if is_grpc(&seen.headers) {
            let text = String::from_utf8_lossy(path);
            let (service, method) = text
                .trim_start_matches('/')
                .split_once('/')
                .unwrap_or_default();
            return self
                .grpc_calls
                .iter()
                .find(|c| {
                    c.cluster == seen.cluster
                        && c.service.as_deref().is_none_or(|s| s == service)
                        && c.method.as_deref().is_none_or(|m| m == method)
                })
                .map_or(UpstreamAnswer::Refuse, |c| {
                    UpstreamAnswer::Grpc(c.answer.clone())
                });
        }
        let canned = self.calls.iter().find(|c| {
            c.cluster == seen.cluster
                && c.path_prefix
                    .as_deref()
                    .is_none_or(|p| path.starts_with(p.as_bytes()))
        });
        match canned.map(|c| &c.answer) {
            Some(HttpCallAnswer::Reply(r)) => UpstreamAnswer::Reply(r.clone()),
            // Envoy's router turns a close before the response into a 503.
            Some(HttpCallAnswer::Disconnect) => UpstreamAnswer::Close,
            Some(HttpCallAnswer::Reset) => UpstreamAnswer::ResetAfterHeaders,
            Some(HttpCallAnswer::Silent) => UpstreamAnswer::Silent,
            None => UpstreamAnswer::Reply(self.reply.clone()),
        }
    }
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
                let handoff = lock(&state).tcp_handoff.clone();
                if let Some(tx) = handoff {
                    let _ = tx.send(conn);
                    continue;
                }
                let state = state.clone();
                let cluster = cluster.clone();
                std::thread::spawn(move || serve_connection(conn, &cluster, state));
            }
        });
        Ok(Self { port })
    }
}

/// How long an upstream connection may stay silent before it is closed.
pub(super) const IDLE: Duration = Duration::from_secs(30);

/// Serves one connection in the protocol its first bytes announce.
fn serve_connection(conn: TcpStream, cluster: &str, state: Arc<Mutex<UpstreamState>>) {
    let _ = conn.set_read_timeout(Some(IDLE));
    let mut first = [0u8; 4];
    let peeked = conn.peek(&mut first).unwrap_or(0);
    if peeked == first.len() && &first == h2c::PREFACE_START {
        h2c::serve(conn, cluster, &state);
    } else {
        serve_http1(conn, cluster, &state);
    }
}

fn serve_http1(conn: TcpStream, cluster: &str, state: &Mutex<UpstreamState>) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut writer = conn;
    loop {
        let Ok(Some(request)) =
            http1::read_request(&mut reader, http1::Limits::new(MAX_BODY_BYTES))
        else {
            return;
        };
        let seen = SeenRequest {
            cluster: cluster.to_string(),
            message: Message {
                headers: request.headers,
                body: request.body,
                trailers: request.trailers,
                ..Message::default()
            },
        };
        let (answer, admin) = {
            let mut state = lock(state);
            (state.answer(seen), state.admin.clone())
        };
        let reply = match answer {
            UpstreamAnswer::Reply(r) => r,
            UpstreamAnswer::ResetAfterHeaders => {
                use std::io::Write;
                let _ =
                    writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1024\r\n\r\ncut short");
                return;
            }
            UpstreamAnswer::Silent => {
                // Until Envoy closes the connection, or the read timeout (IDLE) passes.
                use std::io::Read;
                let _ = reader.read(&mut [0u8; 1]);
                return;
            }
            // gRPC needs HTTP/2 (trailers): over HTTP/1.1 a gRPC callout is not answered.
            UpstreamAnswer::Grpc(_) | UpstreamAnswer::Refuse | UpstreamAnswer::Close => return,
        };
        let pieces = http1::response_pieces(&reply);
        let written = match admin {
            Some(admin) => {
                super::paced::Pacer::upstream(admin, cluster).write(&mut writer, &pieces)
            }
            None => std::io::Write::write_all(&mut writer, &pieces.concat())
                .map(|()| super::paced::Pacing::Paced),
        };
        match written {
            Ok(pacing) => {
                let whose = format!("the upstream reply's ({cluster})");
                if let Some(why) = pacing.unpaced(&whose) {
                    lock(state).unpaced.push(why);
                }
            }
            Err(_) => return,
        }
    }
}
