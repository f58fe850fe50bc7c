//! Bodies in chunks and trailers, with Envoy's buffering: `testdata/guests/body-buffer.wat`
//! pauses on each chunk until the end of the stream, then rewrites the whole buffer.

use wasm_harness::compare::LogComparison;
use wasm_harness::Verdict;

use crate::support::*;

const CHUNKED: &str = r#"  - name: a chunked request body is buffered, then rewritten whole
    request: {method: POST, body: "ab", body_chunks: [cd, ef]}
    upstream: {status: 200, body: "x", body_chunks: ["y", "z"]}
    expect:
      upstream: {body: "[abcdef]"}
      response: {status: 200, body: "[xyz]"}
      log_counts:
        - {contains: "request body size=2 eos=0", count: 1}
        - {contains: "request body size=4 eos=0", count: 1}
        - {contains: "request body size=6 eos=1", count: 1}
        - {contains: "response body size=3 eos=1", count: 1}
"#;

#[test]
fn body_chunks_grow_the_buffer_a_pausing_filter_sees() {
    let dir = tempfile::tempdir().unwrap();
    // Trailers cross an HTTP/1.1 connection only with `enable_trailers`: the client's (the
    // connection manager's option) and the upstream's (the cluster's).
    let b = bootstrap_variant(dir.path(), &guest("body-buffer.wat"), None, |doc| {
        doc["static_resources"]["clusters"][0]["http_protocol_options"] =
            serde_json::json!({"enable_trailers": true});
        doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
            ["http_protocol_options"] = serde_json::json!({"enable_trailers": true});
    });
    let s = scenario(
        dir.path(),
        &b,
        &format!(
            "{CHUNKED}  - name: trailers end the request instead of the last chunk
    request: {{protocol: http1_chunked, method: POST, body_chunks: [ab, cd], trailers: {{x-checksum: abcd}}}}
    expect:
      upstream: {{body: abcd, trailers: {{x-checksum: abcd, x-trailer-seen: '1'}}}}
      log_counts: [{{contains: eos=1, count: 0}}, {{contains: request body size=4 eos=0, count: 1}}]
  - name: response trailers reach the client
    request: {{}}
    upstream: {{status: 200, body: ok, trailers: {{grpc-status: '0'}}}}
    expect:
      response: {{body: ok, trailers: {{grpc-status: '0'}}}}
"
        ),
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Bodies over HTTP/1.1, with a `content-length` and chunked with trailers both ways, reach
/// the filters in real Envoy as in the harness: each chunk one socket read, then the end of
/// stream on its own (`testdata/scenarios/http1-bodies.yaml`). Their lines are compared, and
/// the log expectations checked on Envoy's lines too.
#[test]
fn http1_bodies_are_compared_read_by_read_with_their_trailers() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped_with_binary_guests(
        dir.path(),
        "http1-bodies.yaml",
        "http1-bodies.bootstrap.yaml",
        &["request-headers.wat", "body-buffer.wat"],
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_eq!(report.cases.len(), 3, "{report:#}");
    assert_logs_same(&report);
    let trailers = report.cases[2].envoy.exchange().unwrap();
    let sent = trailers.upstream.as_ref().unwrap();
    assert_eq!(
        wasm_harness::http::headers::get(&sent.trailers, "x-checksum"),
        Some(&b"abcd"[..]),
        "{report:#}"
    );
    let report = differential_with(&s, "count: 2}", "count: 3}");
    assert!(
        report.cases[2]
            .envoy_failures
            .iter()
            .any(|f| f.contains("Envoy wrote 2")),
        "{report:#}"
    );
}

/// Without `enable_trailers` Envoy's HTTP/1 codec drops the trailers it reads, from the
/// client and from the upstream: the filters get an empty end of stream instead, and the
/// client gets no trailers (each checked against real Envoy).
#[test]
fn http1_trailers_are_dropped_without_enable_trailers_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped_with_binary_guests(
        dir.path(),
        "http1-bodies.yaml",
        "http1-bodies.bootstrap.yaml",
        &["request-headers.wat", "body-buffer.wat"],
    );
    let b = dir.path().join("http1-bodies.bootstrap.yaml");
    let without = std::fs::read_to_string(&b).unwrap().replace(
        "http_protocol_options: {enable_trailers: true}",
        "http_protocol_options: {}",
    );
    std::fs::write(&b, without).unwrap();
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\nworkers: 1\nrequests:
  - name: trailers dropped both ways
    request: {{protocol: http1_chunked, method: POST, headers: {{x-request-id: t}}, body: ab, trailers: {{x-checksum: ab}}}}
    upstream: {{status: 200, body: ok, trailers: {{x-served: 'yes'}}}}
    expect:
      upstream: {{body: '[ab]'}}
      response: {{status: 200, body: '[ok]'}}
      logs: ['request body size=2 eos=1', 'response body size=2 eos=1']
",
            b.display()
        ),
    )
    .unwrap();
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    let case = &report.cases[0];
    assert_eq!(case.logs, LogComparison::Same, "{report:#}");
    for exchange in [case.harness.outcome.exchange(), case.envoy.exchange()] {
        let exchange = exchange.unwrap();
        assert!(
            exchange.upstream.as_ref().unwrap().trailers.is_empty(),
            "{report:#}"
        );
        assert!(
            exchange.response().unwrap().trailers.is_empty(),
            "{report:#}"
        );
    }
}

/// A filter that grows a body but leaves `content-length` alone: Envoy frames the message by
/// the stale length, so each peer reads a truncated body. The harness shows the same bytes,
/// and says why.
#[test]
fn a_stale_content_length_truncates_the_body_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "body-buffer.wat");
    let b = bootstrap_variant(dir.path(), &wasm, Some("keep-length"), |_| {});
    let s = scenario(
        dir.path(),
        &b,
        "  - name: grown by two bytes, framed by the old length
    request: {method: POST, body: abcd}
    upstream: {status: 200, body: xyz}
    expect:
      upstream: {body: '[abc', headers: {content-length: '4'}}
      response: {status: 200, body: '[xy'}
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    let out = report.to_string();
    let harness = harness(&["run", s.to_str().unwrap()]);
    assert!(
        text(&harness).contains("note: content-length says 4 but the filters left a 6-byte body: the upstream reads only the first 4 bytes"),
        "{}\n{out}",
        text(&harness)
    );
}
