//! Every role in real Envoy 1.40 (V8), on the shipped bootstrap or a variant of it: what a
//! client and an upstream see, and what only Envoy's log and stats can show (TCP totals,
//! summaries of the singleton aggregator).

use wasm_harness::real_envoy::RealEnvoy;
use wasm_harness::{Request, UpstreamReply};

use crate::support::{
    assert_three_of_five_pass, bootstrap_copy, envoy, envoy_lines, two_tcp_connections,
};

/// The shipped bootstrap with `edit` applied to its text.
fn start(dir: &std::path::Path, workers: usize, edit: impl Fn(String) -> String) -> RealEnvoy {
    let path = bootstrap_copy(dir, "envoy-config/bootstrap.yaml");
    let text = edit(std::fs::read_to_string(&path).unwrap());
    std::fs::write(&path, text).unwrap();
    RealEnvoy::start(&envoy(), &path, workers).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_shipped_bootstrap_passes_envoy_validate() {
    let dir = tempfile::tempdir().unwrap();
    let path = bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
    wasm_harness::real_envoy::validate(&envoy(), &path).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn header_and_body_roles_in_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start(dir.path(), 2, |t| t);
    let ex = real
        .send(
            Some("headers"),
            &Request::get("/api/items").header("x-internal-secret", "s"),
            &UpstreamReply::new(200).header("x-backend-version", "1"),
        )
        .unwrap();
    assert_eq!(ex.upstream_header("x-added-by"), Some("wasm-filter"));
    assert_eq!(ex.upstream_header("x-internal-secret"), None);
    assert_eq!(ex.response_header("x-served-by"), Some("wasm-filter"));
    assert_eq!(ex.response_header("x-backend-version"), None);

    // `when` matches a GET under /legacy/: the new :path picks the /v2/ route.
    let ex = real
        .send(
            Some("headers"),
            &Request::get("/legacy/items"),
            &UpstreamReply::new(200),
        )
        .unwrap();
    let seen = ex.upstream.as_ref().unwrap();
    assert_eq!(seen.cluster, "backend-v2");
    assert_eq!(ex.upstream_header(":path"), Some("/v2/items"));
    let ex = real
        .send(
            Some("headers"),
            &Request::post("/legacy/items", "x"),
            &UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.upstream.as_ref().unwrap().cluster, "backend");

    // Request size limit: 413, the upstream never sees it.
    let ex = real
        .send(
            Some("bodies"),
            &Request::post("/upload", vec![b'x'; 70_000]),
            &UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(413));
    assert!(ex.upstream.is_none());

    // Redaction and replacement in a response; content-length no longer claims the old size.
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/me"),
            &UpstreamReply::new(200)
                .header("content-type", "application/json")
                .body(r#"{"name":"al","password":"p","links":["https://internal.example/a"]}"#),
        )
        .unwrap();
    let body = String::from_utf8_lossy(&ex.response().unwrap().body).into_owned();
    assert_eq!(
        body,
        r#"{"name":"al","password":"[redacted]","links":["https://example.com/a"]}"#
    );
    assert_ne!(ex.response_header("content-length"), Some("67"));

    // Not JSON where it is redacted: the body never reaches the client (its headers were
    // on their way: the stream is reset), and it is logged.
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/page"),
            &UpstreamReply::new(200).body("<p>internal.example</p>"),
        )
        .unwrap();
    assert!(ex.response().is_none_or(|r| r.body.is_empty()), "{ex:?}");
    assert_eq!(
        envoy_lines(&real, "is not JSON serde_json reads", 1).len(),
        1
    );
}

#[test]
fn a_response_announcing_a_size_over_the_buffer_becomes_a_502_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start(dir.path(), 1, |t| {
        t.replace(
            r#""max_buffer_bytes": 262144,"#,
            r#""max_buffer_bytes": 16,"#,
        )
        .replace(r#""on_overflow": "pass""#, r#""on_overflow": "reject""#)
    });
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/big"),
            &UpstreamReply::new(200).body(r#"{"password": "0123456789abcdef"}"#),
        )
        .unwrap();
    assert_eq!(
        ex.response_status(),
        Some(502),
        "{ex:?}\n{}",
        std::fs::read_to_string(&real.log_path).unwrap()
    );
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/small"),
            &UpstreamReply::new(200).body(r#"{"a":1}"#),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    assert_eq!(ex.response().unwrap().body, br#"{"a":1}"#);
}

#[test]
fn tcp_totals_and_rate_limit_in_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start(dir.path(), 2, |t| {
        t.replace(
            r#""burst": 20, "refill_per_second": 10"#,
            r#""burst": 3, "refill_per_second": 0.01"#,
        )
    });
    two_tcp_connections(&mut real);
    let closed = envoy_lines(&real, "tcp connection closed:", 2);
    assert!(
        closed.iter().any(|l| l.ends_with("in=5 out=2")),
        "{closed:?}"
    );
    assert!(
        closed.iter().any(|l| l.ends_with("in=10 out=1")),
        "{closed:?}"
    );
    assert_eq!(real.stat("wasmcustom.wasm_filter.plugin.tcp-counter.role.tcp-total-data-size-counter.bytes_in_total"), Some(15));
    assert_eq!(real.stat("wasmcustom.wasm_filter.plugin.tcp-counter.role.tcp-total-data-size-counter.bytes_out_total"), Some(3));
    assert_eq!(real.stat("wasmcustom.wasm_filter.plugin.tcp-counter.role.tcp-total-data-size-counter.connections_total"), Some(2));

    assert_three_of_five_pass(&mut real);
    assert_eq!(
        real.stat("wasmcustom.wasm_filter.plugin.rate-limit.role.rate-limit.limited_total"),
        Some(2)
    );
}

#[test]
fn the_singleton_aggregates_every_worker_and_posts_to_the_collector() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start(dir.path(), 2, |t| {
        t.replace(r#""tick_seconds": 5"#, r#""tick_seconds": 1"#)
    });
    for path in ["/api/a", "/api/b", "/web", "/api/c"] {
        let ex = real
            .send(
                Some("headers"),
                &Request::get(path),
                &UpstreamReply::new(200),
            )
            .unwrap();
        assert_eq!(ex.response_status(), Some(200));
    }
    let posted = envoy_lines(
        &real,
        "summary of 4 requests posted to \"stats-collector\" (200)",
        1,
    );
    assert_eq!(posted.len(), 1, "{:#?}", real.wasm_logs());
    let summaries = envoy_lines(&real, "\"requests\":4", 1);
    assert!(
        summaries[0].contains(r#""routes":{"/api":{"2xx":3},"/web":{"2xx":1}}"#),
        "{summaries:?}"
    );
}

#[test]
fn real_envoy_refuses_each_bad_configuration_with_the_filters_reason() {
    let dir = tempfile::tempdir().unwrap();
    for (from, to, want) in [
        (
            r#""burst": 20, "refill_per_second": 10"#,
            r#""burst": 0, "refill_per_second": 10"#,
            "burst: must be at least 1",
        ),
        (
            r#""on_overflow": "pass""#,
            r#""on_overflow": "drop""#,
            "unknown variant `drop`",
        ),
        (
            r#"{"role": "tcp-total-data-size-counter"}"#,
            r#"{"role": "tcp-total-data-size-counter", "verbose": true}"#,
            "unknown field `verbose`",
        ),
        (
            r#""path_prefix": "/legacy/""#,
            r#""path_prefix": "legacy""#,
            "when.path_prefix \"legacy\": must start with /",
        ),
        (
            r#""log_level": "info""#,
            r#""log_level": "chatty""#,
            "invalid VM configuration: unknown variant `chatty`",
        ),
    ] {
        let path = bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from}");
        std::fs::write(&path, text.replace(from, to)).unwrap();
        let e = wasm_harness::real_envoy::validate(&envoy(), &path)
            .err()
            .unwrap_or_else(|| panic!("{to}: envoy accepted it"))
            .to_string();
        assert!(e.contains(want), "{to}: {e}");
    }
}

/// `envoy --mode validate` does not start bootstrap extensions, so a bad service
/// configuration shows only when Envoy runs: the service does not load, and the log says why.
#[test]
fn real_envoy_names_a_bad_aggregator_configuration_in_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(r#""tick_seconds": 5"#, r#""tick_seconds": 0"#),
    )
    .unwrap();
    let wanted = "invalid plugin configuration: tick_seconds: must be at least 1";
    match RealEnvoy::start(&envoy(), &path, 1) {
        Ok(real) => assert_eq!(
            envoy_lines(&real, wanted, 1).len(),
            1,
            "{}",
            real.log_tail()
        ),
        Err(e) => assert!(e.to_string().contains(wanted), "{e}"),
    }
}

/// Many clients at once, on both workers: the bucket in shared data hands out exactly its
/// tokens, never one twice (each take is a compare-and-swap retried on a conflict).
#[test]
fn concurrent_clients_on_two_workers_get_exactly_the_burst() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    const BURST: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap().replace(
        r#""burst": 20, "refill_per_second": 10"#,
        &format!(r#""burst": {BURST}, "refill_per_second": 0.001"#),
    );
    text = text.replace("port_value: 10000", &format!("port_value: {port}"));
    for other in ["9901", "10001", "10002"] {
        text = text.replace(&format!("port_value: {other}"), "port_value: 0");
    }
    std::fs::write(&path, text).unwrap();
    let envoy = crate::support::EnvoyProcess::with_workers(dir.path(), &path, 2);
    assert!(
        envoy.wait_for("configured role rate-limit"),
        "{}",
        envoy.log()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "{}", envoy.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // /healthz is answered by the route itself: the rate limit runs, no upstream is needed.
    let statuses: Vec<String> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(move || {
                    (0..13)
                        .map(|_| {
                            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                            c.write_all(
                                b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
                            )
                            .unwrap();
                            let mut out = String::new();
                            c.read_to_string(&mut out).unwrap();
                            out.get(9..12).unwrap_or_default().to_string()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    let ok = statuses.iter().filter(|s| *s == "200").count();
    let limited = statuses.iter().filter(|s| *s == "429").count();
    assert_eq!((ok, limited), (BURST, 104 - BURST), "{statuses:?}");
}
