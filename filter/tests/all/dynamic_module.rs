//! The filter as an Envoy dynamic module (`libwasm_filter.so`) in real Envoy 1.40, on
//! envoy-config/dynamic-module.yaml: the HTTP roles give what the Wasm module gives on
//! envoy-config/bootstrap.yaml (the same requests go through both and are compared, and so
//! are the roles' counters on `/stats/prometheus`), the TCP counter as a network filter logs
//! and counts what the Wasm one does, a bad configuration is refused by field, and a panic
//! fails its request closed, or closes its connection, while Envoy goes on.

use std::path::Path;
use std::sync::Once;

use wasm_harness::real_envoy::{EnvoyError, RealEnvoy};
use wasm_harness::{Exchange, Request, TcpEvent, UpstreamReply};

use crate::support::{
    assert_three_of_five_pass, bootstrap_copy, dynamic_module_dir, envoy, prometheus, series,
    two_tcp_connections,
};

/// Envoy finds the module through its environment, which every Envoy a test starts
/// inherits: the search path of the tests' build (with the `fault` feature the panic test
/// uses, inert without its request header).
pub(crate) fn module_environment() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = dynamic_module_dir();
        std::env::set_var("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir);
    });
}

/// A copy of `relative` with `edit` applied to its text.
fn bootstrap(dir: &Path, relative: &str, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let path = bootstrap_copy(dir, relative);
    let text = edit(std::fs::read_to_string(&path).unwrap());
    std::fs::write(&path, text).unwrap();
    path
}

fn start_module(
    dir: &Path,
    workers: usize,
    edit: impl Fn(String) -> String,
) -> Result<RealEnvoy, EnvoyError> {
    module_environment();
    let path = bootstrap(dir, "envoy-config/dynamic-module.yaml", edit);
    RealEnvoy::start(&envoy(), &path, workers)
}

/// Whether Envoy's log has a line containing `needle`, waiting up to 10 s for it (Envoy
/// writes its log every 50 ms).
fn logged(real: &RealEnvoy, needle: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&real.log_path).unwrap_or_default();
        if text.contains(needle) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            eprintln!("{text}");
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What a client and the upstream saw, for comparing two Envoys.
fn seen(ex: &Exchange) -> String {
    let response = ex.response().map(|r| {
        let mut headers: Vec<_> = r
            .headers
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "date" | "x-envoy-upstream-service-time"))
            .collect();
        headers.sort();
        (
            r.status,
            headers,
            String::from_utf8_lossy(&r.body).into_owned(),
        )
    });
    let upstream = ex.upstream.as_ref().map(|u| {
        let mut headers: Vec<_> = u
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with("x-request-id") && k != "x-forwarded-proto")
            .collect();
        headers.sort();
        (u.cluster.clone(), headers, u.body.len())
    });
    format!("{response:?}\n{upstream:?}")
}

#[test]
fn dynamic_module_http_roles_answer_as_the_wasm_module_does() {
    let requests: Vec<(&str, Request, UpstreamReply)> = vec![
        (
            "headers",
            Request::get("/api/items").header("x-internal-secret", "s"),
            UpstreamReply::new(200).header("x-backend-version", "1"),
        ),
        (
            "headers",
            Request::get("/legacy/items"),
            UpstreamReply::new(200),
        ),
        (
            "headers",
            Request::post("/legacy/items", "x"),
            UpstreamReply::new(200),
        ),
        (
            "bodies",
            Request::post("/upload", vec![b'x'; 70_000]),
            UpstreamReply::new(200),
        ),
        (
            "bodies",
            Request::post("/upload", r#"{"a":1}"#),
            UpstreamReply::new(200),
        ),
        (
            "bodies",
            Request::get("/me"),
            UpstreamReply::new(200)
                .header("content-type", "application/json")
                .body(r#"{"name":"al","password":"p","links":["https://internal.example/a"]}"#),
        ),
        (
            "bodies",
            Request::get("/page"),
            UpstreamReply::new(200).body("<p>internal.example</p>"),
        ),
        // Big enough to reach the filter in several chunks, which it holds until the last.
        (
            "bodies",
            Request::get("/big"),
            UpstreamReply::new(200)
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"token":"t","text":"{}internal.example"}}"#,
                    "a".repeat(200_000)
                )),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut module = start_module(dir.path(), 2, |t| t).unwrap_or_else(|e| panic!("{e}"));
    let wasm_dir = tempfile::tempdir().unwrap();
    let wasm_bootstrap = bootstrap(wasm_dir.path(), "envoy-config/bootstrap.yaml", |t| t);
    let mut wasm = RealEnvoy::start(&envoy(), &wasm_bootstrap, 2).unwrap_or_else(|e| panic!("{e}"));
    let mut got = Vec::new();
    for (listener, request, reply) in &requests {
        let ex = module.send(Some(listener), request, reply).unwrap();
        let want = wasm.send(Some(listener), request, reply).unwrap();
        assert_eq!(seen(&ex), seen(&want), "{listener} {request:?}");
        got.push(ex);
    }
    // What they both did, spelled out.
    assert_eq!(got[0].upstream_header("x-added-by"), Some("wasm-filter"));
    assert_eq!(got[0].upstream_header("x-env"), Some("demo"));
    assert_eq!(got[0].upstream_header("x-internal-secret"), None);
    assert_eq!(got[0].response_header("x-served-by"), Some("wasm-filter"));
    assert_eq!(got[0].response_header("x-backend-version"), None);
    // `when` matched a GET under /legacy/: the new :path picked the /v2/ route.
    assert_eq!(got[1].upstream.as_ref().unwrap().cluster, "backend-v2");
    assert_eq!(got[1].upstream_header(":path"), Some("/v2/items"));
    assert_eq!(got[2].upstream.as_ref().unwrap().cluster, "backend");
    assert_eq!(got[3].response_status(), Some(413));
    assert!(got[3].upstream.is_none());
    assert_eq!(got[4].response_status(), Some(200));
    assert_eq!(
        String::from_utf8_lossy(&got[5].response().unwrap().body),
        r#"{"name":"al","password":"[redacted]","links":["https://example.com/a"]}"#
    );
    // Not JSON where it is redacted: reset before its body leaves.
    assert!(
        got[6].response().is_none_or(|r| r.body.is_empty()),
        "{:?}",
        got[6]
    );
    let big = String::from_utf8_lossy(&got[7].response().unwrap().body).into_owned();
    assert!(
        big.starts_with(r#"{"token":"[redacted]","text":"aaa"#),
        "{}",
        &big[..40]
    );
    assert!(
        big.ends_with(r#"aexample.com"}"#),
        "{}",
        &big[big.len() - 40..]
    );
    // The same counters, by name, plugin and role, with the same values (the Wasm bootstrap's
    // stats recorders are the Wasm module's alone).
    let counters = |real: &RealEnvoy| {
        let mut lines: Vec<String> = prometheus(real)
            .lines()
            .filter(|l| l.starts_with("wasm_filter_") && !l.contains("role=\"stats-aggregator\""))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    let (module_counters, wasm_counters) = (counters(&module), counters(&wasm));
    assert_eq!(module_counters, wasm_counters);
    let scrape = module_counters.join("\n");
    let count = |name: &str, plugin: &str, role: &str| series(&scrape, name, plugin, role);
    let headers = "http-header-operation";
    assert_eq!(
        count("wasm_filter_allowed_total", "rate-limit", "rate-limit"),
        Some(3)
    );
    assert_eq!(
        count("wasm_filter_edited_total", "header-ops", headers),
        Some(3)
    );
    assert_eq!(
        count("wasm_filter_edited_total", "legacy-path", headers),
        Some(1)
    );
    assert_eq!(
        count("wasm_filter_skipped_total", "legacy-path", headers),
        Some(2)
    );
    let body = "http-body-operation";
    // The 413, and the page that is not JSON (reset, as redaction fails closed).
    assert_eq!(
        count("wasm_filter_over_limit_total", "body-ops", body),
        Some(2)
    );
    assert_eq!(
        count("wasm_filter_rewritten_total", "body-ops", body),
        Some(2)
    );
    assert!(logged(&module, "Dynamic module ABI version v0.2.0 matched"));
    assert!(logged(
        &module,
        "wasm-filter: response body is not JSON serde_json reads"
    ));
    assert!(logged(&module, "wasm-filter: request refused with 413"));
}

#[test]
fn dynamic_module_rate_limit_is_one_table_for_every_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start_module(dir.path(), 2, |t| {
        t.replace(
            r#""burst": 20, "refill_per_second": 10"#,
            r#""burst": 3, "refill_per_second": 0.01"#,
        )
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let exchanges = assert_three_of_five_pass(&mut real);
    // The 429 is a local reply: the header role after the limiter never ran on it.
    assert!(exchanges[3].upstream.is_none());
}

#[test]
fn dynamic_module_bad_configuration_is_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let refused = start_module(dir.path(), 1, |t| {
        t.replace(r#""request": {"max_bytes": 65536}"#, r#""reqest": {}"#)
    });
    let Err(e) = refused else {
        panic!("Envoy started with a misspelt field");
    };
    let text = format!("{e:?}");
    assert!(
        text.contains("wasm-filter: invalid plugin configuration: unknown field `reqest`"),
        "{text}"
    );
}

#[test]
fn dynamic_module_panic_fails_the_request_closed_and_envoy_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start_module(dir.path(), 1, |t| t).unwrap_or_else(|e| panic!("{e}"));
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/a").header("x-wasm-filter-fault", "panic"),
            &UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(500));
    assert!(ex.upstream.is_none());
    let ex = real
        .send(
            Some("bodies"),
            &Request::get("/b"),
            &UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    assert!(logged(
        &real,
        "wasm-filter: panicked in the request headers hook"
    ));
    // A panic in the network filter's read hook: the connection is closed with nothing
    // passed either way, and the next connections are served.
    let out = real
        .connect(
            Some("tcp"),
            &[
                TcpEvent::Downstream(b"x-wasm-filter-fault: panic\r\n".to_vec()),
                TcpEvent::Upstream(b"late".to_vec()),
            ],
        )
        .unwrap();
    assert!(out.upstream_received.is_empty(), "{out:?}");
    assert!(out.downstream_received.is_empty(), "{out:?}");
    assert!(logged(
        &real,
        "wasm-filter: panicked in the network read hook: the connection is closed"
    ));
    two_tcp_connections(&mut real);
    assert!(logged(
        &real,
        "wasm-filter: tcp connection closed: in=10 out=1"
    ));
}

#[test]
fn dynamic_module_tcp_counter_logs_each_connection_and_counts_across_workers() {
    let dir = tempfile::tempdir().unwrap();
    let mut real = start_module(dir.path(), 2, |t| t).unwrap_or_else(|e| panic!("{e}"));
    two_tcp_connections(&mut real);
    assert!(logged(
        &real,
        "wasm-filter: tcp connection closed: in=5 out=2"
    ));
    assert!(logged(
        &real,
        "wasm-filter: tcp connection closed: in=10 out=1"
    ));
    // Named as the Wasm module's are: the plugin (`filter_name: wasm-filter/tcp-counter`) and
    // the role come out as tags.
    let scrape = prometheus(&real);
    let count = |name: &str| series(&scrape, name, "tcp-counter", "tcp-total-data-size-counter");
    assert_eq!(count("wasm_filter_bytes_in_total"), Some(15), "{scrape}");
    assert_eq!(count("wasm_filter_bytes_out_total"), Some(3));
    assert_eq!(count("wasm_filter_connections_total"), Some(2));
}
