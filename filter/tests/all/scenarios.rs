//! The filter's scenarios in testdata/scenarios, each run in the harness and through real
//! Envoy (`wasm-harness run --envoy`), compared request by request.

use wasm_harness::run_comparison;
use wasm_harness::{RunOptions, Verdict};

use crate::support::{bootstrap_copy, envoy, root};

fn passes_in_harness_and_envoy(scenario: &str, bootstrap: &str, steps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = bootstrap_copy(dir.path(), bootstrap);
    // body-ops.yaml's "not JSON passes unmodified" step is the opt-out's: redaction refuses
    // such a body unless `fail_open` names the case.
    let text = std::fs::read_to_string(&bootstrap).unwrap();
    let text = text.replace(
        r#""on_overflow": "reject""#,
        r#""on_overflow": "reject", "fail_open": ["not-json"]"#,
    );
    std::fs::write(&bootstrap, text).unwrap();
    let report = run_comparison(
        &envoy(),
        &root().join("testdata/scenarios").join(scenario),
        &RunOptions {
            workers: None,
            bootstrap: Some(bootstrap),
            ..Default::default()
        },
    );
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), steps, "{report}");
}

#[test]
fn demo() {
    passes_in_harness_and_envoy("demo.yaml", "envoy-config/bootstrap.yaml", 6);
}

#[test]
fn rate_limit_across_workers() {
    passes_in_harness_and_envoy(
        "rate-limit.yaml",
        "testdata/scenarios/roles.bootstrap.yaml",
        4,
    );
}

#[test]
fn body_operations_at_their_limits() {
    passes_in_harness_and_envoy(
        "body-ops.yaml",
        "testdata/scenarios/roles.bootstrap.yaml",
        4,
    );
}

#[test]
fn tcp_totals_across_workers() {
    passes_in_harness_and_envoy(
        "tcp-totals.yaml",
        "testdata/scenarios/roles.bootstrap.yaml",
        2,
    );
}

#[test]
fn stats_from_every_worker_reach_the_singleton() {
    passes_in_harness_and_envoy("stats.yaml", "testdata/scenarios/roles.bootstrap.yaml", 5);
}
