//! How the emulated proxy answers the HTTP and gRPC callouts guests make: with the scenario's
//! canned reply for the cluster when it has one, else, for an HTTP call to a cluster whose
//! endpoint is on loopback, with a real request to that upstream. The harness never sends
//! traffic off the machine: a cluster elsewhere without a canned reply is answered as Envoy
//! answers an unreachable upstream (503), and the call's record says why.
//!
//! Calls are answered after the callback that made them returns, in the order they were
//! made, on the root context that owns them (see [`crate::engine::host::callouts`]); what those
//! completions cause (more calls, queue notifications, a paused stream resuming) follows
//! before the stream goes on. The requests to loopback upstreams of the calls pending at once
//! are in flight together, as in Envoy, and one delivery round has a time budget
//! ([`Callouts::budget`]): an upstream that never answers costs the round at most that.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wasm_common::sync::lock;

use super::threads::{Dispatcher, Threads};
use crate::engine::host::callouts::{CallRequest, CallResponse, PendingCall};
use crate::engine::vm::CallOutcome;
use crate::envoy::bootstrap::Bootstrap;
use crate::envoy::http::{
    headers, CallRecord, CannedGrpcCall, CannedHttpCall, GrpcCallAnswer, HeaderMap, HttpCallAnswer,
    UpstreamReply,
};

/// How long a loopback upstream may take when the guest set no timeout (Envoy would wait
/// forever; a test should not).
pub const NO_TIMEOUT_LIMIT: Duration = Duration::from_secs(60);

/// The default [`Callouts::budget`]: the time one delivery round may spend waiting for
/// loopback upstreams, all calls together.
pub const DEFAULT_CALLOUT_BUDGET: Duration = NO_TIMEOUT_LIMIT;

/// How many requests to loopback upstreams are in flight at once.
pub const MAX_CONCURRENT_CALLOUTS: usize = 16;

/// The most of a loopback upstream's response body a callout keeps; a longer one resets the
/// call, as Envoy's buffer limit does.
pub const MAX_CALLOUT_BODY_BYTES: usize = 16 << 20;

const CALLOUT_LIMITS: crate::envoy::http1::Limits =
    crate::envoy::http1::Limits::new(MAX_CALLOUT_BODY_BYTES);

/// gRPC `UNAVAILABLE`.
const GRPC_UNAVAILABLE: u32 = 14;

/// The proxy's callout answers and the record of every call.
#[derive(Debug)]
pub struct Callouts {
    /// Canned HTTP replies; the first that matches answers.
    pub http: Vec<CannedHttpCall>,
    /// Canned gRPC replies; the first that matches answers.
    pub grpc: Vec<CannedGrpcCall>,
    /// Every call answered, oldest first, within [`super::MAX_CALL_RECORD_BYTES`].
    pub records: super::call_records::CallRecords,
    /// Each cluster's first endpoint.
    endpoints: Vec<(String, Option<(String, u16)>)>,
    /// How long one delivery round (the calls pending after a callback, and those their
    /// completions make) may wait for loopback upstreams in all; calls still waiting then are
    /// answered 504 and the round reports it.
    pub budget: Duration,
}

impl Default for Callouts {
    fn default() -> Self {
        Self {
            http: Vec::new(),
            grpc: Vec::new(),
            records: Default::default(),
            endpoints: Vec::new(),
            budget: DEFAULT_CALLOUT_BUDGET,
        }
    }
}

/// How one call was answered: what the guest is told, the record's text, and whether the
/// round's budget cut it short.
struct Answer {
    /// `None`: the call is never answered (its upstream stays silent and it has no timeout).
    outcome: Option<CallOutcome>,
    how: String,
    cut: bool,
}

impl Answer {
    fn new(outcome: CallOutcome, how: String) -> Self {
        Self {
            outcome: Some(outcome),
            how,
            cut: false,
        }
    }
}

impl Callouts {
    pub fn new(bootstrap: &Bootstrap) -> Self {
        Self {
            endpoints: bootstrap
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.endpoints.first().cloned()))
                .collect(),
            ..Self::default()
        }
    }

    fn endpoint(&self, cluster: &str) -> Option<&(String, u16)> {
        self.endpoints
            .iter()
            .find(|(name, _)| name == cluster)
            .and_then(|(_, e)| e.as_ref())
    }

    /// Answers one call by `deadline` (the round's budget).
    fn answer(&self, request: &CallRequest, deadline: Instant) -> Answer {
        match request {
            CallRequest::Http {
                cluster,
                headers,
                body,
                timeout,
                ..
            } => self.answer_http(cluster, headers, body, *timeout, deadline),
            CallRequest::Grpc {
                cluster,
                service,
                method,
                ..
            } => {
                let (outcome, how) = self.answer_grpc(cluster, service, method);
                Answer::new(outcome, how)
            }
        }
    }

    fn canned_http(&self, cluster: &str, headers: &HeaderMap) -> Option<&CannedHttpCall> {
        let path = headers::get(headers, ":path").unwrap_or_default();
        self.http.iter().find(|c| {
            c.cluster == cluster
                && c.path_prefix
                    .as_deref()
                    .is_none_or(|p| path.starts_with(p.as_bytes()))
        })
    }

    /// Whether answering `request` means waiting for a loopback upstream.
    fn goes_upstream(&self, request: &CallRequest) -> bool {
        match request {
            CallRequest::Http {
                cluster, headers, ..
            } => {
                self.canned_http(cluster, headers).is_none()
                    && self
                        .endpoint(cluster)
                        .is_some_and(|(host, port)| loopback(host, *port).is_some())
            }
            CallRequest::Grpc { .. } => false,
        }
    }

    fn answer_http(
        &self,
        cluster: &str,
        headers: &HeaderMap,
        body: &[u8],
        timeout: Option<Duration>,
        deadline: Instant,
    ) -> Answer {
        if let Some(c) = self.canned_http(cluster, headers) {
            return canned_answer(&c.answer, timeout);
        }
        let Some((host, port)) = self.endpoint(cluster) else {
            return Answer::new(
                CallOutcome::Http(router_reply(503, "no healthy upstream")),
                format!("cluster {cluster:?} has no endpoint: 503 no healthy upstream"),
            );
        };
        let Some(addr) = loopback(host, *port) else {
            return Answer::new(
                CallOutcome::Http(router_reply(503, CONNECT_FAILURE)),
                format!(
                    "no canned reply, and cluster {cluster:?}'s endpoint {host}:{port} is not on loopback (the harness only talks to 127.0.0.1 / ::1): answered 503 as an unreachable upstream; give the scenario an http_calls entry for {cluster:?}"
                ),
            );
        };
        self.ask_loopback(addr, headers, body, timeout, deadline)
    }

    /// Sends the call to its loopback upstream and answers what it answers, within the
    /// call's timeout and what is left of the round's budget.
    fn ask_loopback(
        &self,
        addr: std::net::SocketAddr,
        headers: &HeaderMap,
        body: &[u8],
        timeout: Option<Duration>,
        deadline: Instant,
    ) -> Answer {
        let own = timeout.unwrap_or(NO_TIMEOUT_LIMIT);
        let left = deadline.saturating_duration_since(Instant::now());
        let (limit, by_budget) = if left < own {
            (left, true)
        } else {
            (own, false)
        };
        let timed_out = |e: &dyn std::fmt::Display| {
            if by_budget {
                Answer {
                    outcome: Some(CallOutcome::Http(router_reply(
                        504,
                        "upstream request timeout",
                    ))),
                    how: format!(
                        "upstream {addr}: no response when the harness's callout budget of {} for this round ran out ({e}): 504",
                        super::format_duration(self.budget)
                    ),
                    cut: true,
                }
            } else {
                Answer::new(
                    CallOutcome::Http(router_reply(504, "upstream request timeout")),
                    format!(
                        "upstream {addr}: no response within {} ({e}): 504",
                        super::format_duration(own)
                    ),
                )
            }
        };
        if limit.is_zero() {
            return timed_out(&"not sent");
        }
        match crate::envoy::http1::request(addr, headers, body, limit, CALLOUT_LIMITS) {
            Ok(resp) => {
                let mut reply = UpstreamReply::new(resp.status).body(resp.message.body);
                reply.headers = resp
                    .message
                    .headers
                    .into_iter()
                    .filter(|(k, _)| k != ":status")
                    .collect();
                let status = reply.status;
                Answer::new(
                    CallOutcome::Http(from_upstream(reply)),
                    format!("upstream {addr}: {status}"),
                )
            }
            Err(e @ crate::envoy::http1::Http1Error::TimedOut(_)) => timed_out(&e),
            Err(e @ crate::envoy::http1::Http1Error::BodyTooLarge { .. }) => Answer::new(
                CallOutcome::HttpReset,
                format!("upstream {addr}: {e}: reset, as Envoy's buffer limit resets the call"),
            ),
            Err(e) => Answer::new(
                CallOutcome::Http(router_reply(503, CONNECT_FAILURE)),
                format!("upstream {addr}: {e}: 503"),
            ),
        }
    }

    /// Answers every call of `batch` by `deadline`, those waiting for loopback upstreams
    /// up to [`MAX_CONCURRENT_CALLOUTS`] at a time; the answers in the batch's order.
    fn answer_all(&self, batch: &[PendingCall], deadline: Instant) -> Vec<Answer> {
        let upstream = batch
            .iter()
            .filter(|c| self.goes_upstream(&c.request))
            .count();
        if upstream <= 1 {
            return batch
                .iter()
                .map(|c| self.answer(&c.request, deadline))
                .collect();
        }
        let slots: Vec<Mutex<Option<Answer>>> = batch.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(call) = batch.get(i) else {
                return;
            };
            let answer = self.answer(&call.request, deadline);
            *lock(&slots[i]) = Some(answer);
        };
        std::thread::scope(|scope| {
            // This thread works too, so a refused spawn only means less concurrency.
            for _ in 1..upstream.min(MAX_CONCURRENT_CALLOUTS) {
                let spawned = std::thread::Builder::new()
                    .name("wasm-harness-callout".into())
                    .spawn_scoped(scope, work);
                if spawned.is_err() {
                    break;
                }
            }
            work();
        });
        slots
            .into_iter()
            .zip(batch)
            .map(|(slot, call)| {
                slot.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .unwrap_or_else(|| self.answer(&call.request, deadline))
            })
            .collect()
    }

    fn answer_grpc(&self, cluster: &str, service: &str, method: &str) -> (CallOutcome, String) {
        let canned = self.grpc.iter().find(|c| {
            c.cluster == cluster
                && c.service.as_deref().is_none_or(|s| s == service)
                && c.method.as_deref().is_none_or(|m| m == method)
        });
        match canned.map(|c| &c.answer) {
            Some(GrpcCallAnswer::Message(m)) => (
                CallOutcome::GrpcMessage(m.clone()),
                format!("canned message ({} bytes)", m.len()),
            ),
            Some(GrpcCallAnswer::Status { code, message }) => (
                CallOutcome::GrpcClose {
                    status: *code,
                    message: grpc_close_message(message),
                },
                format!("canned status {code}"),
            ),
            None => (
                CallOutcome::GrpcClose {
                    status: GRPC_UNAVAILABLE,
                    message: REFUSED_STREAM.into(),
                },
                format!(
                    "no canned reply for {service}/{method} on {cluster:?} (the harness does not speak gRPC to upstreams): answered as an upstream refusing the stream, UNAVAILABLE; give the scenario a grpc_calls entry"
                ),
            ),
        }
    }
}

/// What a unary gRPC call's failure reads as (`proxy_get_status`) when the upstream answered
/// it trailers-only with `grpc-status` and `grpc-message`, as gRPC servers answer a failure:
/// Envoy 1.40's gRPC client hands on the `grpc-message` as sent (percent-encoded, not
/// decoded) followed by the stream's response code details (checked against it).
fn grpc_close_message(message: &str) -> String {
    if message.is_empty() {
        return "via_upstream".into();
    }
    let encoded = super::router::grpc_message_encode(message.as_bytes());
    format!("{}{{via_upstream}}", String::from_utf8_lossy(&encoded))
}

/// What Envoy's gRPC client reports when the upstream refuses the call's stream (HTTP/2
/// `REFUSED_STREAM`): the router's reset text, then the response code details.
const REFUSED_STREAM: &str = "upstream connect error or disconnect/reset before headers. reset reason: remote refused stream reset{upstream_reset_before_response_started{remote_refused_stream_reset}}";

/// What Envoy's router says when the upstream closed the connection without answering.
const DISCONNECTED: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection termination";

/// What Envoy's router says when it cannot reach the upstream.
const CONNECT_FAILURE: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection failure";

/// An upstream's reply as the guest sees it through Envoy's router.
fn from_upstream(reply: UpstreamReply) -> CallResponse {
    let message = reply.message;
    CallResponse {
        headers: super::router::routed_headers(reply.status, message.headers, message.body.len()),
        body: message.body,
        ..Default::default()
    }
}

/// A response Envoy's router makes up (no upstream answered).
fn router_reply(status: u16, body: &str) -> CallResponse {
    CallResponse {
        headers: vec![
            (":status".into(), status.to_string().into_bytes()),
            ("content-length".into(), body.len().to_string().into_bytes()),
            ("content-type".into(), b"text/plain".to_vec()),
        ],
        body: body.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// The endpoint's address if it is on this machine's loopback.
fn loopback(host: &str, port: u16) -> Option<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback().then_some(SocketAddr::new(ip, port));
    }
    if host.eq_ignore_ascii_case("localhost") {
        return (host, port)
            .to_socket_addrs()
            .ok()?
            .find(|a| a.ip().is_loopback());
    }
    None
}

/// The record of a call, as a user reads it in a report.
fn record(call: &PendingCall, answer: String) -> CallRecord {
    match &call.request {
        CallRequest::Http {
            cluster,
            headers,
            body,
            ..
        } => CallRecord {
            kind: "http",
            cluster: cluster.clone(),
            worker: call.receiver.worker,
            headers: headers.clone(),
            body: body.clone(),
            answer,
        },
        CallRequest::Grpc {
            cluster,
            service,
            method,
            metadata,
            message,
            ..
        } => {
            let mut headers: HeaderMap =
                vec![(":path".into(), format!("/{service}/{method}").into_bytes())];
            headers.extend(metadata.iter().cloned());
            CallRecord {
                kind: "grpc",
                cluster: cluster.clone(),
                worker: call.receiver.worker,
                headers,
                body: message.clone(),
                answer,
            }
        }
    }
}

/// What one call to [`deliver_calls`] did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Delivered {
    /// Completions delivered to guests.
    pub answered: usize,
    /// Of those, calls answered 504 because the round's budget ran out.
    pub cut: usize,
}

/// Answers the calls pending now, oldest first, at most `limit` of them, by `deadline`; a
/// call whose VM is gone (the canary's, a failed one) or that was cancelled is dropped
/// unanswered, as Envoy cancels it. Calls the completions make wait for the next call.
pub(super) fn deliver_calls(threads: &mut Threads, limit: usize, deadline: Instant) -> Delivered {
    let Threads {
        shared,
        main,
        workers,
        callouts,
        ..
    } = threads;
    let mut batch: Vec<PendingCall> = {
        let mut pending = lock(&shared.calls);
        let n = pending.len().min(limit);
        pending.drain(..n).collect()
    };
    // Answered or dropped, these calls no longer count against what guests may hold.
    shared
        .held
        .release(batch.iter().map(|c| c.held).sum::<usize>());
    batch.retain(|call| match receiver_vm(workers, main, call) {
        Some(vm)
            if vm.failed.is_none() && vm.state().callouts.in_flight.contains_key(&call.token) =>
        {
            true
        }
        Some(vm) => {
            // Failed VMs get no callbacks; a cancelled call is never answered.
            vm.state_mut().callouts.in_flight.remove(&call.token);
            false
        }
        None => false,
    });
    let answers = callouts.answer_all(&batch, deadline);
    let mut delivered = Delivered::default();
    for (call, answer) in batch.iter().zip(answers) {
        let Some(vm) = receiver_vm(workers, main, call) else {
            continue;
        };
        if vm.failed.is_some() || !vm.state().callouts.in_flight.contains_key(&call.token) {
            vm.state_mut().callouts.in_flight.remove(&call.token);
            continue;
        }
        callouts
            .records
            .push(call, answer.how.len(), || record(call, answer.how));
        // A call never answered stays in flight: what waits for it waits on.
        if let Some(outcome) = answer.outcome {
            vm.complete_call(call.token, outcome);
            delivered.answered += 1;
            delivered.cut += usize::from(answer.cut);
        }
    }
    delivered
}

/// The VM instance owning `call`, if it still exists.
fn receiver_vm<'w>(
    workers: &'w mut [Dispatcher],
    main: &'w mut Dispatcher,
    call: &PendingCall,
) -> Option<&'w mut crate::engine::vm::Vm> {
    let dispatcher = match call.receiver.worker {
        Some(w) => workers.get_mut(w)?,
        None => main,
    };
    dispatcher
        .vms
        .iter_mut()
        .find(|vm| vm.state().instance == call.receiver.instance)
}

/// The answer a canned entry gives (a silent upstream answers only at the call's timeout).
fn canned_answer(answer: &HttpCallAnswer, timeout: Option<Duration>) -> Answer {
    let (outcome, how) = match answer {
        HttpCallAnswer::Reply(r) => (
            CallOutcome::Http(from_upstream(r.clone())),
            format!("canned reply {}", r.status),
        ),
        HttpCallAnswer::Disconnect => (
            CallOutcome::Http(router_reply(503, DISCONNECTED)),
            "canned disconnect: 503".into(),
        ),
        HttpCallAnswer::Reset => (CallOutcome::HttpReset, "canned reset".into()),
        HttpCallAnswer::Silent => match timeout {
            Some(t) => (
                CallOutcome::Http(router_reply(504, "upstream request timeout")),
                format!(
                    "canned silence: no response within the call's timeout of {}: 504",
                    super::format_duration(t)
                ),
            ),
            None => {
                return Answer {
                    outcome: None,
                    how: "canned silence and no timeout: never answered".into(),
                    cut: false,
                }
            }
        },
    };
    Answer::new(outcome, how)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_endpoints_are_called() {
        assert!(loopback("127.0.0.1", 80).is_some());
        assert!(loopback("::1", 80).is_some());
        assert!(loopback("10.0.0.1", 80).is_none());
        assert!(loopback("auth.example.com", 80).is_none());
    }

    #[test]
    fn upstream_replies_carry_router_headers() {
        let r = from_upstream(UpstreamReply::new(403).header("x-why", "no").body("denied"));
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                ":status",
                "x-why",
                "content-length",
                "x-envoy-upstream-service-time"
            ]
        );
        assert_eq!(headers::get(&r.headers, "content-length"), Some(&b"6"[..]));
    }
}
