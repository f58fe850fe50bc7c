//! What `run --envoy` compares beyond headers and statuses: values Envoy makes up, streams a
//! filter leaves paused, and a Wasm service's exit lines, each through the harness and real
//! Envoy 1.40.

use wasm_harness::compare::LogComparison;
use wasm_harness::Verdict;

use crate::logs::shipped_with_binary_guest;
use crate::support::*;

#[test]
fn generated_request_ids_compare_as_generated_and_a_held_stream_as_paused() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped_with_binary_guest(
        dir.path(),
        "request-headers.yaml",
        "request-headers.bootstrap.yaml",
        "request-headers.wat",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_eq!(report.cases.len(), 10, "{report:#}");
    for case in &report.cases {
        // An HTTP/1.1 request body is handed to the filters in the codec's own pieces.
        let body_over_http1 = case.name().contains("before the body was read");
        assert!(
            case.logs == LogComparison::Same || body_over_http1 && !case.logs.differs(),
            "{}: {report:#}",
            case.name()
        );
    }
    // Envoy's id is its own (random), not the harness's: masked, not equal.
    let routed = report.cases[0].envoy.exchange().unwrap();
    let sent = routed.upstream.as_ref().unwrap();
    let id = wasm_harness::http::headers::get(&sent.headers, "x-request-id").unwrap();
    assert!(!id.starts_with(b"00005eed-"), "{report:#}");
    // The held streams, over HTTP/1.1 and HTTP/2: no response on either side, and Envoy held
    // them (not a 30 s timeout).
    for held in [&report.cases[3], &report.cases[6]] {
        assert!(held.harness.outcome.exchange().unwrap().stalled().is_some());
        let why = held.envoy.exchange().unwrap().stalled().unwrap();
        assert!(why.contains("envoy held the request"), "{report:#}");
    }
}

#[test]
fn a_singleton_services_exit_lines_are_compared_with_envoys() {
    let dir = tempfile::tempdir().unwrap();
    let service = assembled(dir.path(), "shutdown.wat");
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |doc| {
        doc["bootstrap_extensions"] = serde_json::json!([{
            "name": "envoy.bootstrap.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
                "singleton": true,
                "config": {
                    "name": "exit-lines",
                    "root_id": "exit-lines",
                    "vm_config": {
                        "vm_id": "exit-lines",
                        "runtime": "envoy.wasm.runtime.v8",
                        "code": {"local": {"filename": service.display().to_string()}}
                    }
                }
            }
        }]);
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - {name: request, request: {path: /}, expect: {response: {status: 200}}}
  - shutdown: true
    expect:
      log_counts:
        - {contains: root on_done, worker: main, count: 1}
        - {contains: root on_delete, worker: main, count: 1}
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    let shutdown = report.cases.last().unwrap();
    assert_eq!(shutdown.logs, LogComparison::Same, "{report:#}");
}

/// An HTTP/2 cluster's response body reaches the filters one DATA frame (one chunk of the
/// reply) at a time in Envoy, as in the harness: its lines are compared, and its log
/// expectations checked on Envoy's lines too.
#[test]
fn a_response_body_from_an_http2_cluster_is_compared_chunk_by_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "body-buffer.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
        explicit_http2(&mut doc["static_resources"]["clusters"][0]);
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: chunks and trailers
    request: {}
    upstream: {status: 200, body: ab, body_chunks: [cde, f], trailers: {x-checksum: abc}}
    expect:
      log_counts: [{contains: 'response body size=', count: 3}]
      logs: ['response body size=6 eos=0']
  - name: chunks
    request: {}
    upstream: {status: 200, body: ab, body_chunks: [cde, f]}
    expect:
      logs: ['response body size=5 eos=0', 'response body size=6 eos=1']
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_logs_same(&report);
    let report = differential_with(&s, "count: 3}", "count: 4}");
    assert!(
        report.cases[0]
            .envoy_failures
            .iter()
            .any(|f| f.contains("Envoy wrote 3")),
        "{report:#}"
    );
}

/// A request body the client sends over HTTP/2 reaches the filters one DATA frame (one chunk)
/// at a time in Envoy, as in the harness, with its trailers: its lines are compared, and its
/// log expectations checked on Envoy's lines too.
#[test]
fn a_request_body_over_http2_is_compared_chunk_by_chunk_with_its_trailers() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "body-buffer.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |_| {});
    let s = scenario(
        dir.path(),
        &b,
        "  - name: chunks
    request: {protocol: http2, method: POST, body: ab, body_chunks: [cde, f]}
    expect:
      response: {status: 200}
      upstream: {body: '[abcdef]'}
      log_counts: [{contains: 'request body size=', count: 3}]
      logs: ['request body size=5 eos=0', 'request body size=6 eos=1']
  - name: chunks and trailers
    request: {protocol: http2, method: POST, body: ab, body_chunks: [cde, f], trailers: {x-checksum: abc}}
    expect:
      response: {status: 200}
      log_counts: [{contains: 'request body size=', count: 3}]
      logs: ['request body size=6 eos=0']
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_logs_same(&report);
    let report = differential_with(&s, "count: 3}", "count: 4}");
    for case in &report.cases {
        assert!(
            case.envoy_failures
                .iter()
                .any(|f| f.contains("Envoy wrote 3")),
            "{report:#}"
        );
    }
}
