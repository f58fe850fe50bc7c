//! How the emulated proxy answers the HTTP and gRPC callouts guests make: with the scenario's
//! canned reply for the cluster when it has one, else, for an HTTP call to a cluster whose
//! endpoint is on loopback, with a real request to that upstream. The harness never sends
//! traffic off the machine: a cluster elsewhere without a canned reply is answered as Envoy
//! answers an unreachable upstream (503), and the call's record says why.
//!
//! Calls are answered after the callback that made them returns, in the order they were
//! made, on the root context that owns them (see [`crate::host::callouts`]); what those
//! completions cause (more calls, queue notifications, a paused stream resuming) follows
//! before the stream goes on.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::Worker;
use crate::bootstrap::Bootstrap;
use crate::host::callouts::{CallRequest, CallResponse, PendingCall};
use crate::host::{self, HeaderMap, Shared};
use crate::http::{
    CallRecord, CannedGrpcCall, CannedHttpCall, GrpcCallAnswer, HttpCallAnswer, UpstreamReply,
};
use crate::vm::CallOutcome;

/// How long a loopback upstream may take when the guest set no timeout (Envoy would wait
/// forever; a test should not).
pub const NO_TIMEOUT_LIMIT: Duration = Duration::from_secs(60);

/// gRPC `UNAVAILABLE`.
const GRPC_UNAVAILABLE: u32 = 14;

/// The proxy's callout answers and the record of every call.
#[derive(Debug, Default)]
pub struct Callouts {
    /// Canned HTTP replies; the first that matches answers.
    pub http: Vec<CannedHttpCall>,
    /// Canned gRPC replies; the first that matches answers.
    pub grpc: Vec<CannedGrpcCall>,
    /// Every call answered, oldest first.
    pub records: Vec<CallRecord>,
    /// Each cluster's first endpoint.
    endpoints: Vec<(String, Option<(String, u16)>)>,
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

    /// Answers one call; returns what the guest is told and how it was answered.
    fn answer(&self, request: &CallRequest) -> (CallOutcome, String) {
        match request {
            CallRequest::Http {
                cluster,
                headers,
                body,
                timeout,
                ..
            } => self.answer_http(cluster, headers, body, *timeout),
            CallRequest::Grpc {
                cluster,
                service,
                method,
                ..
            } => self.answer_grpc(cluster, service, method),
        }
    }

    fn answer_http(
        &self,
        cluster: &str,
        headers: &HeaderMap,
        body: &[u8],
        timeout: Option<Duration>,
    ) -> (CallOutcome, String) {
        let path =
            String::from_utf8_lossy(host::headers::get(headers, ":path").unwrap_or_default())
                .into_owned();
        let canned = self.http.iter().find(|c| {
            c.cluster == cluster && c.path_prefix.as_deref().is_none_or(|p| path.starts_with(p))
        });
        if let Some(c) = canned {
            return match &c.answer {
                HttpCallAnswer::Reply(r) => (
                    CallOutcome::Http(from_upstream(r.clone())),
                    format!("canned reply {}", r.status),
                ),
                HttpCallAnswer::Disconnect => (
                    CallOutcome::Http(router_reply(503, DISCONNECTED)),
                    "canned disconnect: 503".into(),
                ),
                HttpCallAnswer::Reset => (CallOutcome::HttpReset, "canned reset".into()),
            };
        }
        let Some((host, port)) = self.endpoint(cluster) else {
            return (
                CallOutcome::Http(router_reply(503, "no healthy upstream")),
                format!("cluster {cluster:?} has no endpoint: 503 no healthy upstream"),
            );
        };
        let Some(addr) = loopback(host, *port) else {
            return (
                CallOutcome::Http(router_reply(503, CONNECT_FAILURE)),
                format!(
                    "no canned reply, and cluster {cluster:?}'s endpoint {host}:{port} is not on loopback (the harness only talks to 127.0.0.1 / ::1): answered 503 as an unreachable upstream; give the scenario an http_calls entry for {cluster:?}"
                ),
            );
        };
        let limit = timeout.unwrap_or(NO_TIMEOUT_LIMIT);
        let started = Instant::now();
        match crate::envoy::http1_request(addr, headers, body, limit) {
            Ok(resp) => {
                let reply = UpstreamReply {
                    status: resp.status,
                    headers: resp
                        .headers
                        .into_iter()
                        .filter(|(k, _)| k != ":status")
                        .collect(),
                    body: resp.body,
                    ..UpstreamReply::default()
                };
                let status = reply.status;
                (
                    CallOutcome::Http(from_upstream(reply)),
                    format!("upstream {addr}: {status}"),
                )
            }
            Err(e) if started.elapsed() >= limit => (
                CallOutcome::Http(router_reply(504, "upstream request timeout")),
                format!(
                    "upstream {addr}: no response within {} ({e}): 504",
                    super::format_duration(limit)
                ),
            ),
            Err(e) => (
                CallOutcome::Http(router_reply(503, CONNECT_FAILURE)),
                format!("upstream {addr}: {e}: 503"),
            ),
        }
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
                    message: message.clone(),
                },
                format!("canned status {code}"),
            ),
            None => (
                CallOutcome::GrpcClose {
                    status: GRPC_UNAVAILABLE,
                    message: "no healthy upstream".into(),
                },
                format!(
                    "no canned reply for {service}/{method} on {cluster:?} (the harness does not speak gRPC to upstreams): UNAVAILABLE; give the scenario a grpc_calls entry"
                ),
            ),
        }
    }
}

/// What Envoy's router says when the upstream closed the connection without answering.
const DISCONNECTED: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection termination";

/// What Envoy's router says when it cannot reach the upstream.
const CONNECT_FAILURE: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection failure";

/// An upstream's reply as the guest sees it through Envoy's router.
fn from_upstream(reply: UpstreamReply) -> CallResponse {
    CallResponse {
        headers: super::routed_headers(reply.status, reply.headers, reply.body.len()),
        body: reply.body,
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

/// Answers every pending call, oldest first, including calls the answers cause, up to
/// `limit`; a call whose VM is gone (the canary's, a failed one) is dropped unanswered, as
/// Envoy cancels it. Returns how many were answered.
pub(super) fn deliver_calls(
    shared: &Shared,
    workers: &mut [Worker],
    main: &mut Worker,
    callouts: &mut Callouts,
    limit: usize,
) -> usize {
    let mut answered = 0;
    while answered < limit {
        let next = shared
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        let Some(call) = next else {
            break;
        };
        let dispatcher = match call.receiver.worker {
            Some(w) => workers.get_mut(w),
            None => Some(&mut *main),
        };
        let Some(vm) = dispatcher.and_then(|w| {
            w.vms
                .iter_mut()
                .find(|vm| vm.state().instance == call.receiver.instance)
        }) else {
            continue;
        };
        if vm.failed.is_some() || !vm.state().callouts.in_flight.contains_key(&call.token) {
            // Failed VMs get no callbacks; a cancelled call is never answered.
            vm.state_mut().callouts.in_flight.remove(&call.token);
            continue;
        }
        let (outcome, how) = callouts.answer(&call.request);
        callouts.records.push(record(&call, how));
        vm.complete_call(call.token, outcome);
        answered += 1;
    }
    answered
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
        let r = from_upstream(UpstreamReply {
            status: 403,
            headers: vec![("x-why".into(), b"no".to_vec())],
            body: b"denied".to_vec(),
            ..UpstreamReply::default()
        });
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
        assert_eq!(
            host::headers::get(&r.headers, "content-length"),
            Some(&b"6"[..])
        );
    }
}
