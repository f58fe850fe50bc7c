//! Bodies in chunks and trailers, with Envoy's buffering: `testdata/guests/body-buffer.wat`
//! pauses on each chunk until the end of the stream, then rewrites the whole buffer.

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
    // Trailers cross an HTTP/1.1 upstream connection only with `enable_trailers`.
    let b = bootstrap_variant(dir.path(), &guest("body-buffer.wat"), None, |doc| {
        doc["static_resources"]["clusters"][0]["http_protocol_options"] =
            serde_json::json!({"enable_trailers": true});
    });
    let s = scenario(
        dir.path(),
        &b,
        &format!(
            "{CHUNKED}  - name: trailers end the request instead of the last chunk
    request: {{method: POST, body_chunks: [ab, cd], trailers: {{x-checksum: abcd}}}}
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

#[test]
fn real_envoy_delivers_the_same_rewritten_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "body-buffer.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |_| {});
    // Envoy receives the request body in one piece from this client, so only the results
    // are compared, not the per-chunk log lines.
    let s = scenario(dir.path(), &b, CHUNKED);
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
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
