//! Real Envoy: the harness and Envoy agree on the shipped scenarios, and the build -> pull ->
//! run path of `make run` works end to end. Bootstraps themselves: `bootstraps.rs`.

use wasm_harness::compare;
use wasm_harness::{RunOptions, Verdict};

use crate::support::*;

#[test]
fn harness_and_envoy_agree_on_the_demo() {
    filter_wasm();
    let dir = tempfile::tempdir().unwrap();
    // Absolute module path: Envoy and the harness resolve relative ones against their cwd.
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    let report = compare::run_comparison(
        &envoy(),
        &root().join("testdata/scenarios/header-ops.yaml"),
        &RunOptions {
            workers: None,
            bootstrap: Some(b),
            ..Default::default()
        },
    );
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 3);
    for case in &report.cases {
        assert!(case.differences.is_empty(), "{report}");
        let seen = case.envoy.exchange().unwrap();
        assert!(seen.response().is_some());
    }
}

#[test]
fn a_difference_between_harness_and_envoy_is_reported() {
    // Take the harness's real exchange, drop a header its upstream saw, and compare with
    // Envoy's: the differential must name the header only Envoy's upstream saw.
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    let report = compare::run_comparison(
        &envoy(),
        &root().join("testdata/scenarios/header-ops.yaml"),
        &RunOptions {
            workers: Some(1),
            bootstrap: Some(b),
            ..Default::default()
        },
    );
    let harness_ex = report.cases[0].harness.outcome.exchange().cloned().unwrap();
    let mut tampered = harness_ex.clone();
    tampered
        .upstream
        .as_mut()
        .unwrap()
        .headers
        .retain(|(k, _)| k != "x-added-by");
    let diffs = compare::compare(&tampered, report.cases[0].envoy.exchange().unwrap());
    assert!(
        diffs
            .iter()
            .any(|d| d.contains("x-added-by") && d.contains("harness has none")),
        "{diffs:?}"
    );
    assert!(compare::compare(&harness_ex, report.cases[0].envoy.exchange().unwrap()).is_empty());
}

#[test]
fn build_pull_and_run_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let module = filter_wasm();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&module).unwrap()))
    };
    // Pull through the fetcher exactly as `make run` does: file:// with the sha256 pin.
    let cache = wasm_fetcher::Cache::open(&dir.path().join("cache")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pulled = rt
        .block_on(wasm_fetcher::pull(
            &wasm_fetcher::PullRequest {
                url: format!("file://{}", module.display()),
                sha256: Some(wasm_fetcher::Sha256::parse(&sha).unwrap()),
                ..Default::default()
            },
            &cache,
            &wasm_fetcher::Settings::default(),
        ))
        .unwrap();
    assert!(pulled.path.starts_with(dir.path()));
    let b = bootstrap_variant(dir.path(), &pulled.path, None, |_| {});
    assert!(std::fs::read_to_string(&b)
        .unwrap()
        .contains(pulled.path.to_str().unwrap()));
    let o = harness(&[
        "run",
        "--envoy",
        "--bootstrap",
        b.to_str().unwrap(),
        "testdata/scenarios/header-ops.yaml",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("harness vs real Envoy"), "{}", text(&o));
    assert!(text(&o).contains("3 passed, 0 failed"), "{}", text(&o));
}

#[test]
fn an_advance_step_keeps_harness_and_envoy_steps_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    // The demo's requests with a clock advance between the first and the second.
    let demo = std::fs::read_to_string(root().join("testdata/scenarios/header-ops.yaml")).unwrap();
    let demo = demo.replace(
        "  - name: a POST body",
        "  - advance: 200ms\n\n  - name: a POST body",
    );
    let s = dir.path().join("scenario.yaml");
    std::fs::write(&s, demo).unwrap();
    let report = compare::run_comparison(
        &envoy(),
        &s,
        &RunOptions {
            workers: None,
            bootstrap: Some(b),
            ..Default::default()
        },
    );
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    let names: Vec<&str> = report.cases.iter().map(|c| c.name()).collect();
    assert_eq!(names[1], "advance 200ms", "{report}");
    assert_eq!(
        report.cases[1].envoy.advance().map(|a| a.by.as_str()),
        Some("200ms")
    );
    // The request after the advance is compared with Envoy's answer to that same request.
    let post = report.cases[2].envoy.exchange().unwrap();
    assert_eq!(post.response().unwrap().status, 201, "{report}");
    assert!(report
        .to_string()
        .contains("envoy: waited 200ms of real time"));
}

/// A filter that rewrites `:path` sends the request where the new path routes: Envoy clears
/// the route cache when a Wasm filter changes request headers, and the harness routes after
/// the filters. The project's filter (Rust SDK) does the rewrite.
#[test]
fn a_rewritten_path_is_routed_again_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(
        dir.path(),
        &filter_wasm(),
        Some(
            r#"{"role": "http-header-operation", "request": {"set": [{"name": ":path", "value": "/healthz"}]}}"#,
        ),
        |_| {},
    );
    let s = scenario(
        dir.path(),
        &b,
        "  - name: any path lands on the health check
    request: {path: /api/items}
    expect: {response: {status: 200, body: \"ok\\n\"}, reached_upstream: false}
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, wasm_harness::Verdict::Passed, "{report}");
    assert_eq!(
        report.cases[0]
            .harness
            .outcome
            .exchange()
            .and_then(|e| e.local_reply.clone()),
        Some(wasm_harness::LocalReplySource::DirectResponse),
        "{report}"
    );
}

#[test]
fn a_bootstrap_built_by_proxy_for_module_runs_the_same_in_real_envoy() {
    // The shipped plugin configuration, through the builder instead of envoy-config/.
    let doc = shipped_bootstrap();
    let config = doc
        .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config/configuration/value")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    let builder = wasm_harness::Proxy::for_module(filter_wasm())
        .name("header-ops")
        .root_id("header-ops")
        .vm_id("wasm-filter")
        .configuration(config);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("built.yaml");
    std::fs::write(&path, builder.bootstrap_yaml()).unwrap();
    // The demo's requests, minus the /healthz direct response the built bootstrap has no
    // route for.
    let demo = std::fs::read_to_string(root().join("testdata/scenarios/header-ops.yaml")).unwrap();
    let requests = &demo[demo.find("requests:").unwrap() + "requests:\n".len()
        ..demo.find("  - name: the route's direct response").unwrap()];
    let s = scenario(dir.path(), &path, requests);
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 2);
}

/// Envoy sets a plugin's thread-local slot on the main thread too, so a filter's root ticks
/// there as well as on each worker: with 2 workers, 3 roots tick. The harness has the same
/// three (its report labels the main thread `main`).
#[test]
fn real_envoy_ticks_on_the_main_thread_and_each_worker() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(
        dir.path(),
        &assembled(dir.path(), "tick.wat"),
        Some(""),
        |_| {},
    );
    let real = wasm_harness::real_envoy::RealEnvoy::start(&envoy(), &b, 2).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let first_ticks = || -> Vec<String> {
        real.wasm_logs()
            .into_iter()
            .filter(|l| l.contains("on_tick root=1 n=1 "))
            .collect()
    };
    while first_ticks().len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Envoy's default log format: "[time][thread id][level][logger] ...".
    let threads: std::collections::BTreeSet<String> = first_ticks()
        .iter()
        .filter_map(|l| l.split("][").nth(1).map(str::to_string))
        .collect();
    assert_eq!(threads.len(), 3, "{:#?}", real.wasm_logs());

    let mut proxy =
        wasm_harness::Proxy::from_bootstrap(&b, &wasm_harness::ProxyOptions::with_workers(2))
            .unwrap();
    assert_eq!(proxy.advance(std::time::Duration::from_secs(1)), 3);
    let ticked: Vec<Option<usize>> = proxy
        .logs()
        .iter()
        .filter(|l| l.message.contains("on_tick root=1 n=1 "))
        .map(|l| l.worker)
        .collect();
    assert_eq!(ticked, [None, Some(0), Some(1)]);
}
