//! What a scenario step must have done, and the checks that compare it with what happened.
//!
//! The same checks read the harness's outcomes and real Envoy's (`compare`), so a failure is
//! worded the same way for both: what was expected, then what was seen.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod logs;

pub use logs::*;

use super::Headers;
use crate::engine::host::HeaderMap;
use crate::envoy::http::{self, CallRecord, Exchange, LocalReplySource};
use crate::envoy::proxy::{Proxy, TcpOutcome};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionExpect {
    /// Every byte the upstream received, as text.
    #[serde(default)]
    pub upstream_received: Option<String>,
    /// Every byte the client received, as text.
    #[serde(default)]
    pub downstream_received: Option<String>,
    /// A substring of who closed the connection (`client`, `upstream`, `plugin "name"`,
    /// `failure policy`).
    #[serde(default)]
    pub closed_by: Option<String>,
    /// The cluster `tcp_proxy` connected to (`""`: none), as a plugin steered it through
    /// `set_envoy_filter_state` or as configured.
    #[serde(default)]
    pub upstream_cluster: Option<String>,
    #[serde(default)]
    pub logs: Vec<String>,
    #[serde(default)]
    pub log_counts: Vec<LogCount>,
    #[serde(default)]
    pub metrics: BTreeMap<String, u64>,
    #[serde(default)]
    pub shared_data: BTreeMap<String, BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// What the upstream must have seen; implies the request reached it.
    #[serde(default)]
    pub upstream: Option<UpstreamExpect>,
    /// The cluster the request must reach (its route's, or the one a filter chose); implies
    /// it reached one.
    #[serde(default)]
    pub cluster: Option<String>,
    /// Whether the request must (true) or must not (false) reach an upstream.
    #[serde(default)]
    pub reached_upstream: Option<bool>,
    /// Whether a plugin must reset the stream (`proxy_close_stream`): no response at all.
    #[serde(default)]
    pub reset: Option<bool>,
    /// Whether the stream must still be paused after the step (`true`: a filter held it and
    /// nothing resumed it, so no response came; its log lines are checked). Without it a held
    /// stream is a failure.
    #[serde(default)]
    pub paused: Option<bool>,
    #[serde(default)]
    pub response: Option<MessageExpect>,
    #[serde(default)]
    pub local_reply: Option<LocalReplyKind>,
    /// Substrings that must appear in log lines written while this request ran.
    #[serde(default)]
    pub logs: Vec<String>,
    /// Exact numbers of log lines (written while this request ran) containing a substring.
    #[serde(default)]
    pub log_counts: Vec<LogCount>,
    /// Custom metrics (counter or gauge, by name with or without `wasmcustom.`) and their
    /// proxy-wide values after this request.
    #[serde(default)]
    pub metrics: BTreeMap<String, u64>,
    /// Every HTTP / gRPC callout the step makes, in order (`[]`: none). Without it, calls
    /// are not checked.
    #[serde(default)]
    pub calls: Option<Vec<CallExpect>>,
    /// Shared data after this request: `{vm_id: {key: value}}`, values as UTF-8 text.
    #[serde(default)]
    pub shared_data: BTreeMap<String, BTreeMap<String, String>>,
}

/// What a message (the request the upstream saw, or the response) must hold. Header checks
/// are a case-insensitive subset: the listed headers with these values, others allowed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageExpect {
    /// The response status; an upstream request has none (see [`UpstreamExpect`]).
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub headers: Headers,
    /// Headers that must not be there.
    #[serde(default)]
    pub absent: Vec<String>,
    #[serde(default)]
    pub body: Option<String>,
    /// Trailers that must be there (subset, case-insensitive).
    #[serde(default)]
    pub trailers: Headers,
}

/// What the upstream must have seen: a message check without a status, refused at parse
/// time so a misplaced `status` is not silently never checked.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "MessageExpect")]
pub struct UpstreamExpect(pub MessageExpect);

impl TryFrom<MessageExpect> for UpstreamExpect {
    type Error = &'static str;
    fn try_from(m: MessageExpect) -> Result<Self, Self::Error> {
        match m.status {
            Some(_) => Err("unknown field `status`: the upstream sees a request, which has no status (check it under `response`)"),
            None => Ok(Self(m)),
        }
    }
}

/// Who answered instead of the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalReplyKind {
    None,
    Plugin,
    FailurePolicy,
    DirectResponse,
    NoRoute,
    NoCluster,
    NoHealthyUpstream,
    Rbac,
    UpstreamReset,
}

impl LocalReplyKind {
    pub fn of(source: Option<&LocalReplySource>) -> Self {
        match source {
            None => Self::None,
            Some(LocalReplySource::Plugin { .. }) => Self::Plugin,
            Some(LocalReplySource::FailurePolicy { .. }) => Self::FailurePolicy,
            Some(LocalReplySource::DirectResponse) => Self::DirectResponse,
            Some(LocalReplySource::NoRoute) => Self::NoRoute,
            Some(LocalReplySource::NoCluster { .. }) => Self::NoCluster,
            Some(LocalReplySource::NoHealthyUpstream { .. }) => Self::NoHealthyUpstream,
            Some(LocalReplySource::Rbac) => Self::Rbac,
            Some(LocalReplySource::UpstreamReset) => Self::UpstreamReset,
        }
    }
}

/// One callout a step must make: `{cluster: auth, kind: http, headers: {...}, body: ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallExpect {
    pub cluster: String,
    /// `http` or `grpc`; either if absent.
    #[serde(default)]
    pub kind: Option<String>,
    /// HTTP request headers (subset, case-insensitive); for gRPC `:path` is
    /// `/service/method`, then the initial metadata.
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub absent: Vec<String>,
    #[serde(default)]
    pub body: Option<String>,
}

/// Checks one exchange against its expectations; returns every failed check, worded for a
/// person: what was expected and what was seen.
pub fn check_exchange(expect: &Expect, ex: &Exchange, logs: &WrittenLog) -> Vec<String> {
    let mut failures = Vec::new();
    match (expect.paused, ex.stalled()) {
        (Some(true), Some(_)) => {
            check_logs(&expect.logs, &expect.log_counts, logs, &mut failures);
            return failures;
        }
        (Some(true), None) => {
            let end = match ex.response_status() {
                Some(status) => format!("the client got a {status} response"),
                None => format!("the stream was reset: {}", ex.reset().unwrap_or_default()),
            };
            failures.push(format!(
                "expected the stream to be still paused after the step, but {end}"
            ));
            return failures;
        }
        (_, Some(why)) => {
            failures.push(format!("the request never completed: {why}"));
            return failures;
        }
        _ => {}
    }
    match (expect.reset, ex.reset()) {
        (Some(true), None) => {
            failures.push("expected the stream to be reset, but it was not".into())
        }
        (Some(false) | None, Some(why)) => {
            failures.push(format!("the stream was reset: {why}"));
            return failures;
        }
        _ => {}
    }
    let must_reach = expect
        .reached_upstream
        .or((expect.upstream.is_some() || expect.cluster.is_some()).then_some(true));
    match (must_reach, &ex.upstream) {
        (Some(true), None) => failures.push(format!(
            "expected the request to reach the upstream, but it did not (local reply: {:?})",
            LocalReplyKind::of(ex.local_reply.as_ref())
        )),
        (Some(false), Some(seen)) => failures.push(format!(
            "expected the request not to reach an upstream, but cluster {:?} received it",
            seen.cluster
        )),
        _ => {}
    }
    if let (Some(want), Some(seen)) = (&expect.cluster, &ex.upstream) {
        if &seen.cluster != want {
            failures.push(format!(
                "expected the request to reach cluster {want:?}, but cluster {:?} received it",
                seen.cluster
            ));
        }
    }
    if let (Some(want), Some(seen)) = (&expect.upstream, &ex.upstream) {
        let seen = Message {
            status: None,
            headers: &seen.headers,
            trailers: &seen.trailers,
            body: &seen.body,
        };
        check_message("upstream request", &want.0, &seen, &mut failures);
    }
    if let Some(want) = &expect.response {
        match ex.response() {
            None => failures.push("expected a response, but none was sent".into()),
            Some(resp) => {
                let seen = Message {
                    status: Some(resp.status),
                    headers: &resp.headers,
                    trailers: &resp.trailers,
                    body: &resp.body,
                };
                check_message("response", want, &seen, &mut failures);
            }
        }
    }
    if let Some(kind) = expect.local_reply {
        let got = LocalReplyKind::of(ex.local_reply.as_ref());
        if got != kind {
            failures.push(format!(
                "local reply: expected {kind:?}, saw {got:?} ({:?})",
                ex.local_reply
            ));
        }
    }
    check_logs(&expect.logs, &expect.log_counts, logs, &mut failures);
    failures
}

/// A message as the checks read it: the request an upstream saw, or a response.
struct Message<'a> {
    status: Option<u16>,
    headers: &'a HeaderMap,
    trailers: &'a HeaderMap,
    body: &'a [u8],
}

/// The one check for a message, upstream request or response; `what` names it in failures.
fn check_message(what: &str, want: &MessageExpect, seen: &Message, failures: &mut Vec<String>) {
    if let (Some(status), Some(got)) = (want.status, seen.status) {
        if got != status {
            failures.push(format!("{what} status: expected {status}, saw {got}"));
        }
    }
    check_headers(what, seen.headers, &want.headers, &want.absent, failures);
    check_headers(
        &format!("{what} trailer"),
        seen.trailers,
        &want.trailers,
        &[],
        failures,
    );
    if let Some(body) = &want.body {
        if seen.body != body.as_bytes() {
            failures.push(format!(
                "{what} body: expected {body:?}, saw {:?}",
                show(seen.body)
            ));
        }
    }
}

/// Checks one connection against its expectations.
pub fn check_connection(
    expect: &ConnectionExpect,
    outcome: &TcpOutcome,
    logs: &WrittenLog,
) -> Vec<String> {
    let mut failures = Vec::new();
    check_connection_bytes(expect, outcome, &mut failures);
    if let Some(by) = &expect.closed_by {
        if !outcome.closed_by.contains(by.as_str()) {
            failures.push(format!(
                "closed by: expected {by:?}, saw {:?}",
                outcome.closed_by
            ));
        }
    }
    check_logs(&expect.logs, &expect.log_counts, logs, &mut failures);
    failures
}

/// Checks what each side of a connection received and which cluster's upstream it reached:
/// what a client and the upstreams observe, so the part of a connection's expectations real
/// Envoy is held to as well.
pub fn check_connection_bytes(
    expect: &ConnectionExpect,
    outcome: &TcpOutcome,
    failures: &mut Vec<String>,
) {
    for (what, want, got) in [
        (
            "upstream received",
            &expect.upstream_received,
            &outcome.upstream_received,
        ),
        (
            "client received",
            &expect.downstream_received,
            &outcome.downstream_received,
        ),
    ] {
        if let Some(want) = want {
            if got != want.as_bytes() {
                failures.push(format!("{what}: expected {want:?}, saw {:?}", show(got)));
            }
        }
    }
    if let Some(want) = &expect.upstream_cluster {
        if *want != outcome.cluster {
            failures.push(format!(
                "upstream cluster: expected {want:?}, saw {:?}",
                outcome.cluster
            ));
        }
    }
}

/// Checks the callouts a step made against `calls:`: the same number, and each in order
/// matching its cluster, kind, headers and body.
pub fn check_calls(want: &[CallExpect], got: &[CallRecord], failures: &mut Vec<String>) {
    if want.len() != got.len() {
        let made: Vec<String> = got
            .iter()
            .map(|c| format!("{} {:?}", c.kind, c.cluster))
            .collect();
        failures.push(format!(
            "calls: expected {} callout(s), saw {}: {made:?}",
            want.len(),
            got.len()
        ));
    }
    for (n, (w, c)) in want.iter().zip(got).enumerate() {
        let what = format!("call {} ({} {:?})", n + 1, c.kind, c.cluster);
        if w.cluster != c.cluster {
            failures.push(format!(
                "{what}: expected cluster {:?}, saw {:?}",
                w.cluster, c.cluster
            ));
        }
        if let Some(kind) = &w.kind {
            if kind != c.kind {
                failures.push(format!("{what}: expected a {kind} call, saw {}", c.kind));
            }
        }
        check_headers(&what, &c.headers, &w.headers, &w.absent, failures);
        if let Some(body) = &w.body {
            if c.body != body.as_bytes() {
                failures.push(format!(
                    "{what} body: expected {body:?}, saw {:?}",
                    show(&c.body)
                ));
            }
        }
    }
}

/// Checks custom metrics and shared data after a step.
pub fn check_state(
    proxy: &Proxy,
    metrics: &BTreeMap<String, u64>,
    shared_data: &BTreeMap<String, BTreeMap<String, String>>,
    failures: &mut Vec<String>,
) {
    for (name, want) in metrics {
        match proxy.metric(name) {
            Some(v) if v == *want => {}
            Some(v) => failures.push(format!("metric {name}: expected {want}, got {v}")),
            None => failures.push(format!(
                "metric {name}: expected {want}, but the plugin never defined it"
            )),
        }
    }
    for (vm_id, keys) in shared_data {
        for (key, want) in keys {
            match proxy.shared_data(vm_id, key) {
                Some(v) if v == want.as_bytes() => {}
                Some(v) => failures.push(format!(
                    "shared data {vm_id}/{key}: expected {want:?}, got {:?}",
                    show(&v)
                )),
                None => failures.push(format!(
                    "shared data {vm_id}/{key}: expected {want:?}, but it is not set"
                )),
            }
        }
    }
}

fn show(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

fn check_headers(
    what: &str,
    map: &HeaderMap,
    want: &Headers,
    absent: &[String],
    failures: &mut Vec<String>,
) {
    for (k, v) in &want.0 {
        let values: Vec<String> = map
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| show(v))
            .collect();
        if !values.iter().any(|got| got == v) {
            if values.is_empty() {
                failures.push(format!(
                    "{what} header {k:?}: expected {v:?}, but it is missing"
                ));
            } else {
                failures.push(format!(
                    "{what} header {k:?}: expected {v:?}, saw {values:?}"
                ));
            }
        }
    }
    for k in absent {
        if let Some(v) = http::header(map, k) {
            failures.push(format!(
                "{what} header {k:?}: expected absent, saw {:?}",
                show(v)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::abi::LogLevel;
    use crate::engine::host::LogRecord;

    fn record(worker: Option<usize>, message: &str) -> LogRecord {
        LogRecord {
            worker,
            level: LogLevel::Info,
            source: crate::engine::host::logging::LogSource::Guest,
            plugin: "p".into(),
            root_id: String::new(),
            vm_id: "vm".into(),
            stream: false,
            message: message.into(),
        }
    }

    #[test]
    fn log_counts_are_exact_and_per_worker() {
        let logs = [
            record(Some(0), "tick 1"),
            record(Some(1), "tick 1"),
            record(Some(0), "tick 2"),
            record(None, "tick canary"),
        ];
        let count = |contains: &str, count, worker| LogCount {
            contains: contains.into(),
            count,
            worker,
        };
        let mut failures = Vec::new();
        check_logs(
            &["tick 2".into()],
            &[
                count("tick", 4, None),
                count("tick", 2, Some(LogThread::Worker(0))),
                count("tick", 1, Some(LogThread::Worker(1))),
                count("tick", 1, Some(LogThread::Main)),
                count("tock", 0, None),
            ],
            &WrittenLog::harness(&logs),
            &mut failures,
        );
        assert!(failures.is_empty(), "{failures:?}");
        check_logs(
            &["tock".into()],
            &[count("tick", 3, Some(LogThread::Worker(0)))],
            &WrittenLog::harness(&logs),
            &mut failures,
        );
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(failures[1].contains("expected 3 line(s) containing \"tick\" from worker 0, saw 2"));
    }

    #[test]
    fn envoy_lines_are_checked_like_the_harness_s_but_not_by_worker() {
        let count = |contains: &str, count, worker| LogCount {
            contains: contains.into(),
            count,
            worker,
        };
        let lines = vec![
            "wasm log p: done 1".to_string(),
            "wasm log p: done 2".into(),
        ];
        let mut failures = Vec::new();
        check_logs(
            &["done 2".into(), "deleted".into()],
            &[
                count("done", 3, None),
                count("done", 9, Some(LogThread::Worker(0))),
            ],
            &WrittenLog::envoy(lines),
            &mut failures,
        );
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(
            failures[0].contains("\"deleted\", Envoy wrote 2 lines"),
            "{failures:?}"
        );
        assert!(
            failures[1].ends_with("containing \"done\", Envoy wrote 2"),
            "{failures:?}"
        );
    }

    #[test]
    fn upstream_and_response_are_checked_alike() {
        let expect: Expect = serde_norway::from_str(
            "{upstream: {headers: {x-a: '1'}, absent: [x-b], body: up, trailers: {t: '1'}},
              response: {status: 200, headers: {x-a: '1'}, absent: [x-b], body: down, trailers: {t: '1'}}}",
        )
        .unwrap();
        let headers: HeaderMap = vec![("x-b".into(), b"2".to_vec())];
        let ex = Exchange {
            worker: 0,
            upstream: Some(http::SeenRequest {
                cluster: "c".into(),
                message: http::Message {
                    headers: headers.clone(),
                    body: b"other".to_vec(),
                    ..http::Message::default()
                },
            }),
            end: http::StreamEnd::Answered(http::Response {
                status: 503,
                message: http::Message {
                    headers,
                    body: b"other".to_vec(),
                    ..http::Message::default()
                },
            }),
            local_reply: None,
            notes: Vec::new(),
        };
        let failures = check_exchange(&expect, &ex, &WrittenLog::harness(&[]));
        let upstream: Vec<&String> = failures
            .iter()
            .filter(|f| f.starts_with("upstream request"))
            .collect();
        let response: Vec<&String> = failures
            .iter()
            .filter(|f| f.starts_with("response"))
            .collect();
        assert_eq!(upstream.len(), 4, "{failures:?}");
        assert_eq!(response.len(), 5, "{failures:?}");
        assert_eq!(response[0], "response status: expected 200, saw 503");
        assert!(
            upstream[3].starts_with("upstream request body: expected \"up\""),
            "{failures:?}"
        );
        assert!(
            response[2].contains("\"x-b\": expected absent, saw \"2\""),
            "{failures:?}"
        );
    }

    #[test]
    fn a_held_stream_passes_only_when_expected_paused() {
        let exchange = |end| Exchange {
            worker: 0,
            upstream: None,
            end,
            local_reply: None,
            notes: Vec::new(),
        };
        let held = exchange(http::StreamEnd::Stalled("held".into()));
        let answered = exchange(http::StreamEnd::Answered(http::Response {
            status: 200,
            message: http::Message::default(),
        }));
        let paused: Expect = serde_norway::from_str("{paused: true, logs: [holding]}").unwrap();
        let logs = WrittenLog::envoy(vec!["wasm log p: holding the stream".into()]);
        assert!(check_exchange(&paused, &held, &logs).is_empty());
        let failures = check_exchange(&paused, &held, &WrittenLog::envoy(Vec::new()));
        assert_eq!(failures.len(), 1, "{failures:?}");
        let failures = check_exchange(&paused, &answered, &logs);
        assert!(
            failures[0].ends_with("but the client got a 200 response"),
            "{failures:?}"
        );
        let failures = check_exchange(&Expect::default(), &held, &logs);
        assert_eq!(failures, ["the request never completed: held"]);
    }

    #[test]
    fn an_upstream_request_has_no_status() {
        let e = serde_norway::from_str::<Expect>("{upstream: {status: 200}}").unwrap_err();
        assert!(e.to_string().contains("has no status"), "{e}");
    }
}
