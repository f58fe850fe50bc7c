//! The clusters' protocols in the comparison with real Envoy: HTTP/2 clusters (gRPC services,
//! HTTP/2 backends) get HTTP/2 cleartext loopback upstreams, callouts to the route's own
//! cluster are told apart from the routed request, and what each side sends upstream keeps
//! the scenario's order.

use serde_json::{json, Value};
use wasm_harness::Verdict;

use crate::support::*;

/// Cluster `name`, a copy of the first, speaking HTTP/2 to its endpoint the way `how` says.
fn add_http2_cluster(doc: &mut Value, name: &str, how: Http2) {
    add_loopback_cluster(doc, name, 9);
    let clusters = doc
        .pointer_mut("/static_resources/clusters")
        .unwrap()
        .as_array_mut()
        .unwrap();
    let cluster = clusters.last_mut().unwrap();
    match how {
        Http2::Legacy => cluster["http2_protocol_options"] = json!({}),
        Http2::Explicit => explicit_http2(cluster),
    }
}

#[derive(Clone, Copy)]
enum Http2 {
    /// The cluster's own (deprecated) `http2_protocol_options`.
    Legacy,
    /// `HttpProtocolOptions` with `explicit_http_config.http2_protocol_options`.
    Explicit,
}

const GRPC_STEPS: &str = "  - name: allowed
    request: {}
    grpc_calls: [{cluster: rl, service: ratelimit.v1.RateLimit, method: Check, message: OK}]
    expect:
      calls: [{cluster: rl, kind: grpc, headers: {':path': /ratelimit.v1.RateLimit/Check}, body: check}]
      upstream: {headers: {x-grpc-reply: OK}}
      response: {status: 200}
  - name: over the limit
    request: {}
    grpc_calls: [{cluster: rl, method: Check, status: 8, status_message: slow down}]
    expect:
      calls: [{cluster: rl, kind: grpc}]
      response: {status: 429, body: \"slow down{via_upstream}\"}
  - name: the status code and a message that needs percent-encoding, seen by a gRPC client
    request: {method: POST, path: /pkg.Svc/Get, headers: {content-type: application/grpc}}
    grpc_calls: [{cluster: rl, method: Check, status: 7, status_message: \"100% denied\"}]
    expect:
      response: {status: 200, headers: {grpc-status: '7', grpc-message: \"100%2525 denied{via_upstream}\"}}
  - name: a status without a message
    request: {}
    grpc_calls: [{cluster: rl, method: Check, status: 14}]
    expect:
      response: {status: 429, body: via_upstream}
  - name: a call the scenario gives no answer for is refused
    request: {method: POST, path: /pkg.Svc/Get, headers: {content-type: application/grpc}}
    grpc_calls: [{cluster: rl, method: Report, message: OK}]
    expect:
      calls: [{cluster: rl, kind: grpc}]
      response: {status: 200, headers: {grpc-status: '14'}}
";

/// `testdata/guests/grpc-callout.wat` calls `ratelimit.v1.RateLimit/Check` on cluster `rl`
/// for each request; with `rl` an HTTP/2 cluster, real Envoy's gRPC client reaches a loopback
/// HTTP/2 upstream that answers as the scenario's `grpc_calls` say, and both sides agree on
/// the reply message, the failure status and its message.
#[test]
fn grpc_callouts_to_an_http2_cluster_are_compared_with_real_envoy() {
    for how in [Http2::Explicit, Http2::Legacy] {
        let dir = tempfile::tempdir().unwrap();
        let wasm = assembled(dir.path(), "grpc-callout.wat");
        let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
            add_http2_cluster(doc, "rl", how)
        });
        let s = scenario(dir.path(), &b, GRPC_STEPS);
        let report = differential(&s);
        assert_eq!(report.verdict, Verdict::Passed, "{report}");
        assert_eq!(report.cases.len(), 5, "{report}");
    }
}

/// A gRPC request routed to an HTTP/2 backend: real Envoy speaks HTTP/2 to the loopback
/// upstream, which answers with the scenario's reply and its trailers.
#[test]
fn a_grpc_route_to_an_http2_backend_is_compared_with_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "add-header.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
        let plugin = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap();
        plugin.as_object_mut().unwrap().remove("configuration");
        let backend = doc.pointer_mut("/static_resources/clusters/0").unwrap();
        explicit_http2(backend);
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: a unary gRPC call through the route
    request: {method: POST, path: /pkg.Svc/Get, headers: {content-type: application/grpc, te: trailers}, body: \"\\0\\0\\0\\0\\x02hi\"}
    upstream: {status: 200, headers: {content-type: application/grpc}, body: \"\\0\\0\\0\\0\\x02ok\", trailers: {grpc-status: '0'}}
    expect:
      upstream: {headers: {content-type: application/grpc, te: trailers}}
      response: {status: 200, headers: {content-type: application/grpc}}
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

/// `headers:` written as a map reach the upstream in the written order (not sorted), in the
/// harness and through real Envoy alike: `testdata/scenarios/header-order.yaml`.
#[test]
fn headers_in_map_form_reach_the_upstream_in_the_written_order() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    let shipped =
        std::fs::read_to_string(root().join("testdata/scenarios/header-order.yaml")).unwrap();
    let (_, steps) = shipped.split_once("requests:\n").unwrap();
    let report = differential(&scenario(dir.path(), &b, steps));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    let written = ["x-zebra", "x-apple", "x-mango", "accept", "x-banana"];
    let order = |headers: &[(String, Vec<u8>)]| -> Vec<String> {
        headers
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| written.contains(&k.as_str()))
            .collect()
    };
    let case = &report.cases[0];
    let harness = case
        .harness
        .outcome
        .exchange()
        .unwrap()
        .upstream
        .as_ref()
        .unwrap();
    let envoy = case.envoy.exchange().unwrap().upstream.as_ref().unwrap();
    assert_eq!(order(&harness.headers), written, "{report}");
    assert_eq!(order(&envoy.headers), written, "{report}");
}

/// Response trailers from the upstream reach the filters only where the connection carries
/// them: HTTP/2, or HTTP/1.1 with `enable_trailers`; Envoy's HTTP/1 codec drops them
/// otherwise. `testdata/guests/body-buffer.wat` shows which: it buffers the response body
/// until `end_of_stream` and wraps it in brackets, and with trailers no body callback sees
/// `end_of_stream`, so the body leaves unwrapped.
#[test]
fn upstream_trailers_reach_the_filters_as_the_clusters_protocol_options_say() {
    let cases: [(&str, Value, &str); 4] = [
        ("plain HTTP/1.1", json!(null), "[hello]"),
        (
            "HTTP/1.1 with enable_trailers",
            json!({"explicit_http_config": {"http_protocol_options": {"enable_trailers": true}}}),
            "hello",
        ),
        (
            "HTTP/1.1 without enable_trailers",
            json!({"explicit_http_config": {"http_protocol_options": {}}}),
            "[hello]",
        ),
        (
            "HTTP/2",
            json!({"explicit_http_config": {"http2_protocol_options": {}}}),
            "hello",
        ),
    ];
    for (what, options, body) in cases {
        let dir = tempfile::tempdir().unwrap();
        let wasm = assembled(dir.path(), "body-buffer.wat");
        let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
            if !options.is_null() {
                let mut options = options.clone();
                options["@type"] =
                    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
                        .into();
                doc["static_resources"]["clusters"][0]["typed_extension_protocol_options"] =
                    json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": options});
            }
        });
        let s = scenario(
            dir.path(),
            &b,
            &format!(
                "  - name: {what}
    request: {{}}
    upstream: {{status: 200, body: hello, trailers: {{x-checksum: abc}}}}
    expect:
      response: {{status: 200, body: '{body}'}}
"
            ),
        );
        let report = differential(&s);
        assert_eq!(report.verdict, Verdict::Passed, "{what}: {report}");
    }
}
