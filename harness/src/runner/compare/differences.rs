//! What differs between the harness's outcome of a step and Envoy's: messages (status,
//! headers, body, which upstream), connections (bytes and cluster) and callouts, each as a
//! line a user can read.

use std::collections::BTreeMap;

use crate::envoy::http::{CallRecord, Exchange};
use crate::envoy::proxy::TcpOutcome;

/// Headers whose values legitimately differ between two runs (clock, ids, conditions); only
/// their presence is compared.
const VOLATILE: &[&str] = &["x-request-id", "x-envoy-upstream-service-time"];
/// Not compared at all: `date` is Envoy's wall clock, which the harness does not add, and an
/// HTTP/1.1 upstream cannot observe `:scheme`.
const IGNORED: &[&str] = &["date", ":scheme"];

fn normalize(headers: &[(String, Vec<u8>)]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        if IGNORED.contains(&k.as_str()) {
            continue;
        }
        let value = if VOLATILE.contains(&k.as_str()) {
            "<any>".to_string()
        } else {
            String::from_utf8_lossy(v).into_owned()
        };
        out.entry(k.clone()).or_default().push(value);
    }
    out
}

fn diff_headers(
    what: &str,
    harness: &[(String, Vec<u8>)],
    envoy: &[(String, Vec<u8>)],
    out: &mut Vec<String>,
) {
    let (h, e) = (normalize(harness), normalize(envoy));
    for (k, hv) in &h {
        match e.get(k) {
            None => out.push(format!(
                "{what} header {k:?}: harness {hv:?}, envoy has none"
            )),
            Some(ev) if ev != hv => {
                out.push(format!("{what} header {k:?}: harness {hv:?}, envoy {ev:?}"))
            }
            _ => {}
        }
    }
    for (k, ev) in &e {
        if !h.contains_key(k) {
            out.push(format!(
                "{what} header {k:?}: envoy {ev:?}, harness has none"
            ));
        }
    }
}

/// Every way two exchanges differ in what a client or an upstream could observe.
pub fn compare(harness: &Exchange, envoy: &Exchange) -> Vec<String> {
    let mut out = Vec::new();
    match (&harness.upstream, &envoy.upstream) {
        (Some(h), Some(e)) => {
            if h.cluster != e.cluster {
                out.push(format!(
                    "upstream cluster: harness {:?}, envoy {:?}",
                    h.cluster, e.cluster
                ));
            }
            diff_headers("upstream request", &h.headers, &e.headers, &mut out);
            if h.body != e.body {
                out.push("upstream request body differs".into());
            }
            diff_headers(
                "upstream request trailer",
                &h.trailers,
                &e.trailers,
                &mut out,
            );
        }
        (Some(_), None) => out.push("the harness reached the upstream, envoy did not".into()),
        (None, Some(_)) => out.push("envoy reached the upstream, the harness did not".into()),
        (None, None) => {}
    }
    match (harness.response(), envoy.response()) {
        (Some(h), Some(e)) => {
            if h.status != e.status {
                out.push(format!(
                    "response status: harness {}, envoy {}",
                    h.status, e.status
                ));
            }
            diff_headers("response", &h.headers, &e.headers, &mut out);
            // Envoy's HTTP/1 codec gives the client trailers only where the connection manager
            // enables them; the harness's client gets whatever the filters left.
            if !e.trailers.is_empty() {
                diff_headers("response trailer", &h.trailers, &e.trailers, &mut out);
            }
            if h.body != e.body {
                out.push(format!(
                    "response body: harness {:?}, envoy {:?}",
                    String::from_utf8_lossy(&h.body),
                    String::from_utf8_lossy(&e.body)
                ));
            }
        }
        (h, e) => {
            if h.is_some() != e.is_some() {
                out.push(format!(
                    "response: harness {}, envoy {}",
                    if h.is_some() { "answered" } else { "none" },
                    if e.is_some() { "answered" } else { "none" }
                ));
            }
        }
    }
    out
}

/// The cluster a connection reached and the bytes each side of it received.
pub(super) fn compare_connections(harness: &TcpOutcome, envoy: &TcpOutcome, out: &mut Vec<String>) {
    if harness.cluster != envoy.cluster {
        out.push(format!(
            "upstream cluster: harness {:?}, envoy {:?}",
            harness.cluster, envoy.cluster
        ));
    }
    for (what, h, e) in [
        (
            "upstream received",
            &harness.upstream_received,
            &envoy.upstream_received,
        ),
        (
            "client received",
            &harness.downstream_received,
            &envoy.downstream_received,
        ),
    ] {
        if h != e {
            out.push(format!(
                "{what}: harness {:?}, envoy {:?}",
                String::from_utf8_lossy(h),
                String::from_utf8_lossy(e)
            ));
        }
    }
}

/// Callouts as their upstreams saw them: HTTP calls whole; gRPC calls by cluster, `:path`,
/// message and the metadata the guest gave (Envoy's gRPC client adds headers of its own).
pub(super) fn compare_calls(harness: &[CallRecord], envoy: &[CallRecord], out: &mut Vec<String>) {
    if harness.len() != envoy.len() {
        out.push(format!(
            "callouts: harness made {}, envoy's upstreams saw {}",
            harness.len(),
            envoy.len()
        ));
        return;
    }
    for (n, (h, e)) in harness.iter().zip(envoy).enumerate() {
        let what = format!("callout {} ({} to {:?})", n + 1, h.kind, h.cluster);
        if h.kind != e.kind || h.cluster != e.cluster {
            out.push(format!(
                "{what}: envoy's was {} to {:?} instead",
                e.kind, e.cluster
            ));
            continue;
        }
        if h.kind == "grpc" {
            for (k, v) in &h.headers {
                if e.headers.iter().all(|(ek, ev)| ek != k || ev != v) {
                    out.push(format!(
                        "{what} {k}: harness {:?}, envoy {:?}",
                        String::from_utf8_lossy(v),
                        crate::envoy::http::header(&e.headers, k).map(String::from_utf8_lossy)
                    ));
                }
            }
        } else {
            diff_headers(&what, &h.headers, &e.headers, out);
        }
        if h.body != e.body {
            out.push(format!(
                "{what} body: harness {:?}, envoy {:?}",
                String::from_utf8_lossy(&h.body),
                String::from_utf8_lossy(&e.body)
            ));
        }
    }
}

/// Envoy's callouts during a step while a timer is armed, without those the harness's calls
/// do not account for: Envoy's ticks run in real time and may call out while a request step
/// runs, which is timing, not a difference. Each harness call keeps the first of Envoy's of
/// its kind, cluster and `:path` not kept yet; Envoy's order stays.
pub(super) fn without_timer_calls(
    harness: &[CallRecord],
    envoy: Vec<CallRecord>,
) -> Vec<CallRecord> {
    let path = |c: &CallRecord| crate::envoy::http::header(&c.headers, ":path").map(<[u8]>::to_vec);
    let mut kept = vec![false; envoy.len()];
    for h in harness {
        let found = (0..envoy.len()).find(|&i| {
            let e = &envoy[i];
            !kept[i] && e.kind == h.kind && e.cluster == h.cluster && path(e) == path(h)
        });
        if let Some(i) = found {
            kept[i] = true;
        }
    }
    envoy
        .into_iter()
        .zip(kept)
        .filter_map(|(call, keep)| keep.then_some(call))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(cluster: &str, path: &str) -> CallRecord {
        CallRecord {
            kind: "http",
            cluster: cluster.into(),
            worker: Some(0),
            headers: vec![(":path".into(), path.as_bytes().to_vec())],
            body: Vec::new(),
            answer: String::new(),
        }
    }

    #[test]
    fn a_ticks_callouts_are_left_out_and_the_steps_kept_in_envoys_order() {
        let harness = [call("auth", "/check")];
        let envoy = vec![
            call("auth", "/tick"),
            call("auth", "/check"),
            call("auth", "/tick"),
        ];
        let kept = without_timer_calls(&harness, envoy);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].headers[0].1, b"/check");
        // A call the harness made and Envoy did not stays missing: still a difference.
        assert!(without_timer_calls(&harness, vec![call("auth", "/tick")]).is_empty());
    }
}
