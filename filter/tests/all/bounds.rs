//! What no client can grow, in real Envoy 1.40: one huge body cannot take the shared VM
//! down, and the rate limit's table holds a fixed number of entries whatever keys arrive.

use wasm_harness::real_envoy::RealEnvoy;
use wasm_harness::{Request, UpstreamReply};

use crate::support::{bootstrap_copy, envoy};

/// The shipped bootstrap with `edits` (from, to) applied to its text, each checked to apply.
fn start(dir: &std::path::Path, edits: &[(&str, &str)]) -> RealEnvoy {
    let path = bootstrap_copy(dir, "envoy-config/bootstrap.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    std::fs::write(&path, text).unwrap();
    RealEnvoy::start(&envoy(), &path, 1).unwrap_or_else(|e| panic!("{e}"))
}

/// A 16 MiB JSON response whose million short values a 400-byte mask would turn into
/// 400 MiB: the rewrite stops at `max_buffer_bytes` before building it, the body goes on as
/// `on_overflow` says, and the VM (every role in it) keeps working.
#[test]
fn a_body_a_mask_would_multiply_leaves_the_vm_and_every_role_working() {
    let dir = tempfile::tempdir().unwrap();
    let mask = "m".repeat(400);
    let mut real = start(
        dir.path(),
        &[
            (
                r#""max_buffer_bytes": 262144,"#,
                r#""max_buffer_bytes": 33554432, "fail_open": ["over-buffer"],"#,
            ),
            (r#""mask": "[redacted]""#, &format!(r#""mask": "{mask}""#)),
            (
                "\n  - name: bodies\n    address:",
                "\n  - name: bodies\n    per_connection_buffer_limit_bytes: 67108864\n    address:",
            ),
            (
                "\n  - name: backend\n    connect_timeout: 1s",
                "\n  - name: backend\n    per_connection_buffer_limit_bytes: 67108864\n    connect_timeout: 1s",
            ),
        ],
    );
    let element = r#"{"password":1},"#;
    let mut huge = String::with_capacity(16 << 20);
    huge.push('[');
    while huge.len() + element.len() < 16 << 20 {
        huge.push_str(element);
    }
    huge.push_str(r#"{"password":1}]"#);
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/huge"),
            &UpstreamReply::new(200)
                .header("content-type", "application/json")
                .body(huge.clone()),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(200), "{}", real.log_tail());
    let body = &ex.response().unwrap().body;
    assert_eq!(body.len(), huge.len(), "passed on unmodified");
    let over = crate::support::envoy_lines(&real, "over max_buffer_bytes (33554432)", 1);
    assert_eq!(over.len(), 1, "{}", real.log_tail());

    // The same VM still rewrites, and the other listener's roles still run.
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/small"),
            &UpstreamReply::new(200)
                .header("content-type", "application/json")
                .body(r#"{"password":"p"}"#),
        )
        .unwrap();
    let body = String::from_utf8_lossy(&ex.response().unwrap().body).into_owned();
    assert_eq!(body, format!(r#"{{"password":"{mask}"}}"#));
    let ex = real
        .send(
            Some("headers"),
            &Request::get("/"),
            &UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    assert_eq!(ex.response_header("x-served-by"), Some("wasm-filter"));
    let log = std::fs::read_to_string(&real.log_path).unwrap();
    for failure in ["Function: proxy_on", "wasm trap", "failed to allocate"] {
        assert!(!log.contains(failure), "{failure}:\n{}", real.log_tail());
    }
}

/// A table of four entries: the first four client keys get their own bucket, every later
/// key the one overflow bucket, however many keys come.
#[test]
fn distinct_keys_beyond_the_table_share_the_overflow_bucket_in_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start(
        dir.path(),
        &[(
            r#"{"role": "rate-limit", "key": "client-address",
                     "burst": 20, "refill_per_second": 10, "idle_seconds": 60}"#,
            r#"{"role": "rate-limit", "key": {"header": "x-api-key"}, "buckets": 4,
                     "burst": 1, "refill_per_second": 0.001, "idle_seconds": 60}"#,
        )],
    );
    let codes: Vec<_> = (0..40)
        .map(|i| {
            let ex = real
                .send(
                    Some("headers"),
                    &Request::get("/healthz").header("x-api-key", format!("k{i}")),
                    &UpstreamReply::new(200),
                )
                .unwrap();
            ex.response_status()
        })
        .collect();
    let ok = codes.iter().filter(|c| **c == Some(200)).count();
    assert_eq!(ok, 4 + 1, "{codes:?}");
    assert_eq!(
        real.stat("wasmcustom.wasm_filter.plugin.rate-limit.role.rate-limit.limited_total"),
        Some(35)
    );
}
