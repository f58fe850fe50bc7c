//! What filters meet at the edges of a stream, as Envoy 1.40 has it: trailers added from
//! the last body callback, bytes written into a network filter's empty end-of-stream buffer,
//! callouts and routes to clusters without endpoints, a reset callout, a stale length over
//! HTTP/2. Each runs in the harness and through real Envoy, compared.

use std::path::{Path, PathBuf};

use wasm_harness::Verdict;

use crate::support::*;

/// The shipped scenario `name` beside a copy of its bootstrap (`NAME.bootstrap.yaml`) whose
/// module `guest` is assembled (real Envoy's V8 loads binary modules only).
fn shipped(dir: &Path, name: &str, guest: &str) -> PathBuf {
    let bootstrap = name.replace(".yaml", ".bootstrap.yaml");
    shipped_with_binary_guests(dir, name, &bootstrap, &[guest])
}

#[test]
fn trailers_added_at_the_end_of_a_body_go_out_as_in_envoy() {
    let o = harness(&["run", "testdata/scenarios/add-trailer.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let dir = tempfile::tempdir().unwrap();
    let report = differential(&shipped(dir.path(), "add-trailer.yaml", "add-trailer.wat"));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    let envoy = report.cases[0].envoy.exchange().unwrap();
    let upstream = envoy.upstream.as_ref().unwrap();
    assert_eq!(
        upstream.trailers,
        vec![("x-added".to_string(), b"request".to_vec())],
        "{report}"
    );
    assert_eq!(
        envoy.response().unwrap().trailers,
        vec![("x-added".to_string(), b"response".to_vec())],
        "{report}"
    );
}

#[test]
fn bytes_written_into_the_empty_end_of_stream_buffer_reach_the_peer() {
    let o = harness(&["run", "testdata/scenarios/tcp-eos-insert.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let dir = tempfile::tempdir().unwrap();
    let report = differential(&shipped(
        dir.path(),
        "tcp-eos-insert.yaml",
        "tcp-eos-insert.wat",
    ));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

/// The shipped bootstrap with `testdata/guests/auth-callout.wat` (assembled) as its filter,
/// which calls cluster `auth`, here as `edit` leaves it (a copy of the backend's cluster).
fn auth_bootstrap(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let wasm = assembled(dir, "auth-callout.wat");
    bootstrap_variant(dir, &wasm, None, move |doc| {
        let filter = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap();
        filter.as_object_mut().unwrap().remove("configuration");
        filter["name"] = "auth".into();
        filter["root_id"] = "auth".into();
        add_loopback_cluster(doc, "auth", 9);
        edit(&mut doc["static_resources"]["clusters"][1]);
    })
}

#[test]
fn a_call_to_a_cluster_without_endpoints_fails_as_it_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let b = auth_bootstrap(dir.path(), |auth| {
        auth["load_assignment"] = serde_json::json!({"cluster_name": "auth", "endpoints": []});
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: the call is refused, and the request goes on
    request: {}
    expect:
      reached_upstream: true
      response: {status: 200}
      logs: [auth dispatch failed]
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert!(report.cases[0].envoy_failures.is_empty(), "{report}");
}

#[test]
fn a_reset_callout_fails_the_call_in_harness_and_envoy_alike() {
    let dir = tempfile::tempdir().unwrap();
    let b = auth_bootstrap(dir.path(), |_| {});
    let s = scenario(
        dir.path(),
        &b,
        "  - name: the auth service resets the call after its response started
    request: {}
    http_calls: [{cluster: auth, reset: true}]
    expect:
      reached_upstream: false
      response: {status: 503, body: auth unavailable}
      logs: [\"auth call failed: status 11 reset\"]
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert!(report.cases[0].envoy_failures.is_empty(), "{report}");
}

#[test]
fn a_body_that_no_longer_matches_its_length_is_a_502_over_http2() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "body-buffer.wat");
    let b = bootstrap_variant(dir.path(), &wasm, Some("keep-length"), |doc| {
        explicit_http2(&mut doc["static_resources"]["clusters"][0]);
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: grown by two bytes, sent to an HTTP/2 upstream with the old length
    request: {method: POST, body: abcd}
    expect:
      reached_upstream: false
      response: {status: 502}
      local_reply: upstream_reset
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

#[test]
fn a_route_to_a_cluster_without_endpoints_is_a_503_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |doc| {
        doc["static_resources"]["clusters"][0]["load_assignment"]["endpoints"] =
            serde_json::json!([]);
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: no endpoint to send the request to
    request: {path: /api}
    expect:
      reached_upstream: false
      local_reply: no_healthy_upstream
      response: {status: 503, body: no healthy upstream, headers: {x-served-by: wasm-filter}}
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

#[test]
fn tcp_proxy_to_a_cluster_without_endpoints_closes_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped(dir.path(), "tcp-bytes.yaml", "tcp-bytes.wat");
    let b = dir.path().join("tcp-bytes.bootstrap.yaml");
    let mut doc: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
    doc["static_resources"]["clusters"][0]["load_assignment"]["endpoints"] = serde_json::json!([]);
    std::fs::write(&b, serde_json::to_string(&doc).unwrap()).unwrap();
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\nworkers: 1\nrequests:
  - name: no endpoint for tcp_proxy
    connection: [{{downstream: ping}}]
    expect: {{upstream_received: '', downstream_received: ''}}
",
            b.display()
        ),
    )
    .unwrap();
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}
