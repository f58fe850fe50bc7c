//! `http-body-operation` in the harness: the request size limit, redaction and replacement
//! across chunks, content-length, and each overflow policy.

use wasm_harness::{Request, UpstreamReply};

use crate::support::{lines, role};

fn body_ops(config: serde_json::Value) -> wasm_harness::Proxy {
    role("http-body-operation", config, 1).unwrap()
}

fn chunked(mut r: Request, chunks: &[&str]) -> Request {
    r.body_chunks = chunks.iter().map(|c| c.as_bytes().to_vec()).collect();
    r
}

#[test]
fn a_request_over_the_limit_gets_413_before_the_upstream() {
    let mut proxy = body_ops(serde_json::json!({"request": {"max_bytes": 8}}));
    let ex = proxy
        .round_trip(
            &chunked(Request::post("/upload", "1234"), &["5678", "9"]),
            UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(413));
    let ex = proxy
        .round_trip(
            &Request::post("/upload", "123456789").header("content-length", "9"),
            UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(413));
    assert!(ex.upstream.is_none());
    let ex = proxy
        .round_trip(
            &chunked(Request::post("/upload", "1234"), &["5678"]),
            UpstreamReply::new(201),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(201));
    assert_eq!(ex.upstream.as_ref().unwrap().body, b"12345678");
}

#[test]
fn json_fields_are_redacted_across_chunks_and_content_length_dropped() {
    let mut proxy = body_ops(serde_json::json!({
        "response": {"redact_json": {"keys": ["password", "token"], "mask": "[redacted]"},
                     "replace": [{"from": "internal.example", "to": "example.com"}]}
    }));
    let mut reply = UpstreamReply::new(200)
        .header("content-type", "application/json")
        .header("content-length", "71")
        .body(r#"{"user": {"name": "al", "pass"#);
    reply.body_chunks = vec![
        br#"word": "s3cret"}, "token": [1, 2],"#.to_vec(),
        br#" "link": "https://internal.example/"}"#.to_vec(),
    ];
    let ex = proxy.round_trip(&Request::get("/me"), reply).unwrap();
    let r = ex.response().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        r#"{"user": {"name": "al", "password": "[redacted]"}, "token": "[redacted]", "link": "https://example.com/"}"#
    );
    assert_eq!(ex.response_header("content-length"), None);
    assert!(ex.notes.is_empty(), "{:?}", ex.notes);
}

#[test]
fn a_body_that_is_not_json_is_refused_unless_the_configuration_opts_out() {
    let mut proxy = body_ops(serde_json::json!({"response": {"redact_json": {"keys": ["a"]}}}));
    let ex = proxy
        .round_trip(
            &Request::get("/"),
            UpstreamReply::new(200).body("<html>a</html>"),
        )
        .unwrap();
    // The headers were on their way: the stream is reset, the body never leaves.
    assert!(ex.response().is_none(), "{ex:?}");
    assert_eq!(lines(&proxy, "is not JSON serde_json reads").len(), 1);
    assert!(proxy.take_errors().is_empty());

    let mut proxy = body_ops(serde_json::json!({
        "response": {"redact_json": {"keys": ["a"]}}, "fail_open": ["not-json"]
    }));
    let ex = proxy
        .round_trip(
            &Request::get("/"),
            UpstreamReply::new(200).body("<html>a</html>"),
        )
        .unwrap();
    assert_eq!(ex.response().unwrap().body, b"<html>a</html>");
    assert_eq!(lines(&proxy, "response body is not JSON").len(), 1);
}

#[test]
fn overflow_passes_unmodified_or_is_refused_as_configured() {
    let config = |policy: &str| {
        serde_json::json!({
            "max_buffer_bytes": 10, "on_overflow": policy,
            "request": {"replace": [{"from": "a", "to": "b"}]},
            "response": {"replace": [{"from": "a", "to": "b"}]}
        })
    };
    let mut pass = body_ops(config("pass"));
    let ex = pass
        .round_trip(
            &chunked(Request::post("/", "aaaaaa"), &["aaaaaa"]),
            UpstreamReply::new(200).body("aaaaaaaaaaaa"),
        )
        .unwrap();
    assert_eq!(ex.upstream.as_ref().unwrap().body, b"aaaaaaaaaaaa");
    assert_eq!(ex.response().unwrap().body, b"aaaaaaaaaaaa");
    assert_eq!(
        lines(&pass, "over max_buffer_bytes (10): passed on unmodified").len(),
        2
    );
    let ex = pass
        .round_trip(&Request::post("/", "aa"), UpstreamReply::new(200).body("a"))
        .unwrap();
    assert_eq!(ex.upstream.as_ref().unwrap().body, b"bb");
    assert_eq!(ex.response().unwrap().body, b"b");

    let mut reject = body_ops(config("reject"));
    let ex = reject
        .round_trip(
            &chunked(Request::post("/", "aaaaaa"), &["aaaaaa"]),
            UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(413));
    let ex = reject
        .round_trip(
            &Request::post("/", "aaaaaaaaaaaa").header("content-length", "12"),
            UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(413));
    assert!(ex.upstream.is_none());
    // A response announcing a size over the buffer becomes a 502 before its headers go on.
    let mut reply = UpstreamReply::new(200)
        .header("content-length", "12")
        .header("content-encoding", "gzip")
        .body("aaaaaa");
    reply.body_chunks = vec![b"aaaaaa".to_vec()];
    let ex = reject.round_trip(&Request::get("/"), reply).unwrap();
    assert_eq!(ex.response_status(), Some(502), "{ex:?}");
    assert_eq!(
        String::from_utf8_lossy(&ex.response().unwrap().body),
        "content-length 12 is over max_buffer_bytes (10): the body cannot be rewritten"
    );
    // The plain-text reason is not labelled with the upstream body's encoding.
    assert_eq!(ex.response_header("content-encoding"), None);
}

#[test]
fn a_rewrite_that_would_outgrow_the_buffer_follows_the_overflow_policy() {
    // 50 bytes fit the 100-byte buffer, but rewritten they would be 500.
    let config = |policy: &str| {
        serde_json::json!({
            "request": {"replace": [{"from": "a", "to": "0123456789"}]},
            "max_buffer_bytes": 100, "on_overflow": policy
        })
    };
    let body = "a".repeat(50);
    let mut proxy = body_ops(config("pass"));
    let ex = proxy
        .round_trip(&Request::post("/up", body.clone()), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    assert_eq!(ex.upstream.as_ref().unwrap().body, body.as_bytes());
    assert_eq!(
        lines(
            &proxy,
            "rewritten body would be over max_buffer_bytes (100)"
        )
        .len(),
        1
    );
    let mut proxy = body_ops(config("reject"));
    let ex = proxy
        .round_trip(&Request::post("/up", body.clone()), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(413));
    assert!(ex.upstream.is_none());
}

#[test]
fn encoded_bodies_are_not_rewritten_and_responses_are_asked_for_unencoded() {
    let mut proxy = body_ops(serde_json::json!({
        "request": {"replace": [{"from": "a", "to": "b"}]},
        "response": {"replace": [{"from": "a", "to": "b"}]}
    }));
    // Bytes that stand for gzip output: replacing inside them would corrupt the body.
    let compressed = b"\x1f\x8baa\x00a".to_vec();
    let reply = UpstreamReply::new(200)
        .header("content-encoding", "gzip")
        .header("content-length", compressed.len().to_string())
        .body(compressed.clone());
    let request = Request::post("/", compressed.clone())
        .header("content-encoding", "gzip")
        .header("accept-encoding", "gzip, br");
    let ex = proxy.round_trip(&request, reply).unwrap();
    assert_eq!(ex.upstream_header("accept-encoding"), None);
    assert_eq!(ex.upstream.as_ref().unwrap().body, compressed);
    assert_eq!(ex.response().unwrap().body, compressed);
    assert_eq!(
        ex.response_header("content-length"),
        Some(compressed.len().to_string().as_str())
    );
    assert_eq!(lines(&proxy, "in content-encoding \"gzip\"").len(), 2);
}

/// On wasm32 the redacted size is a 32-bit count. A mask of 1024 control characters is
/// 6146 bytes quoted; over 698 256 one-byte values that makes the output 2^32 + 5361 bytes
/// (one value fewer stays under 2^32). The body (4 MiB) is within the hold, so either way the
/// answer is the overflow policy's 413, never a VM that traps building a 4 GiB body.
#[test]
fn a_request_whose_masks_would_total_4_gib_gets_413_not_a_trapped_vm() {
    let mask = "\u{1}".repeat(1024);
    let mut proxy = body_ops(serde_json::json!({
        "max_buffer_bytes": 8 << 20, "on_overflow": "reject",
        "request": {"redact_json": {"keys": ["k"], "mask": mask}}
    }));
    for n in [698_255, 698_256] {
        let mut body = String::with_capacity(6 * n + 1);
        body.push('{');
        for i in 0..n {
            if i > 0 {
                body.push(',');
            }
            body.push_str("\"k\":0");
        }
        body.push('}');
        let ex = proxy
            .round_trip(&Request::post("/", body), UpstreamReply::new(200))
            .unwrap();
        let log = proxy.logs().last().map(|l| l.message.clone());
        assert_eq!(ex.response_status(), Some(413), "{n} masks: {log:?}");
        assert!(ex.upstream.is_none());
    }
}

/// Redaction recurses once per level in the guest's stack: the deepest body it accepts is
/// redacted, one level more passes unmodified as not JSON, and neither traps the VM.
#[test]
fn a_request_nested_to_the_depth_limit_is_redacted_and_one_deeper_is_refused() {
    let mut proxy = body_ops(serde_json::json!({
        "request": {"redact_json": {"keys": ["k"], "mask": "-"}}
    }));
    let nested = |levels: usize| {
        let open = "{\"a\":".repeat(levels - 1) + "{\"k\":1}";
        (
            open.clone() + &"}".repeat(levels - 1),
            open.replace(":1}", ":\"-\"}") + &"}".repeat(levels - 1),
        )
    };
    // serde_json reads 127 levels of nesting, not 128.
    let (body, want) = nested(127);
    let ex = proxy
        .round_trip(&Request::post("/", body), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ex.upstream.as_ref().unwrap().body),
        want
    );
    let (body, _) = nested(128);
    let ex = proxy
        .round_trip(&Request::post("/", body.clone()), UpstreamReply::new(200))
        .unwrap();
    assert!(ex.upstream.is_none(), "{ex:?}");
    assert_eq!(ex.response_status(), Some(415));
    assert_eq!(lines(&proxy, "recursion limit exceeded").len(), 1);
}
