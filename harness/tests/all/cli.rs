//! `wasm-harness run` / `validate` on the project's filter: exit codes and what they print.

use crate::support::*;

#[test]
fn the_demo_scenario_passes() {
    filter_wasm();
    let o = harness(&["run", "testdata/scenarios/header-ops.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("3 passed, 0 failed"), "{out}");
    assert!(
        out.contains(
            "wasm-filter: configured role http-header-operation (request: 3 ops, response: 2 ops)"
        ),
        "{out}"
    );
}

#[test]
fn the_demo_fails_loudly_when_the_filter_does_not_add_the_header() {
    let dir = tempfile::tempdir().unwrap();
    // Same role, but the request `add` is gone: the demo's expectation must catch it.
    let b = bootstrap_variant(
        dir.path(),
        &filter_wasm(),
        Some(
            r#"{"role":"http-header-operation","request":{"set":[{"name":"x-env","value":"demo"}],"remove":["x-internal-secret"]},"response":{"add":[{"name":"x-served-by","value":"wasm-filter"}],"remove":["x-backend-version"]}}"#,
        ),
        |_| {},
    );
    let o = harness(&[
        "run",
        "--bootstrap",
        b.to_str().unwrap(),
        "testdata/scenarios/header-ops.yaml",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("FAIL request headers are set, added and removed"),
        "{out}"
    );
    assert!(
        out.contains(
            r#"upstream request header "x-added-by": expected "wasm-filter", but it is missing"#
        ),
        "{out}"
    );
}

#[test]
fn a_rejected_plugin_configuration_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(
        dir.path(),
        &filter_wasm(),
        Some(
            r#"{"role":"http-header-operation","request":{"add":[{"name":"bad name","value":"x"}]}}"#,
        ),
        |_| {},
    );
    let s = scenario(dir.path(), &b, "  - {name: any, request: {path: /}}\n");
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("proxy_on_configure returned false"), "{out}");

    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn validate_accepts_a_bootstrap_and_prints_the_plugin_log() {
    filter_wasm();
    let o = harness(&[
        "validate",
        "testdata/scenarios/header-ops.bootstrap.yaml",
        "--workers",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("ok (1 listener(s), 3 worker(s))"), "{out}");
    // The canary, the main thread and each of the three workers configure the plugin, as
    // in Envoy (whose main thread has an instance of every plugin, serving no traffic).
    assert_eq!(
        out.matches("configured role http-header-operation").count(),
        5,
        "{out}"
    );
}

#[test]
fn an_unsupported_filter_is_named_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |doc| {
        let filters = doc
            .pointer_mut(
                "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
            )
            .unwrap()
            .as_array_mut()
            .unwrap();
        filters.insert(0, serde_json::json!({"name": "envoy.filters.http.cors", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}}));
    });
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(r#"unsupported filter "envoy.filters.http.cors""#),
        "{}",
        text(&o)
    );
}

#[test]
fn json_report_is_machine_readable() {
    filter_wasm();
    let o = harness(&["run", "--json", "testdata/scenarios/header-ops.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verdict"], "passed");
    let case = &v["scenarios"][0]["cases"][0];
    assert_eq!(case["failures"].as_array().unwrap().len(), 0);
    assert_eq!(case["exchange"]["response"]["status"], 200);
    // Bodies are text, not arrays of numbers.
    assert!(
        case["exchange"]["response"]["body"].is_string(),
        "{:#}",
        case["exchange"]["response"]
    );
}

#[test]
fn the_highest_exit_code_wins_across_scenarios() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let o = harness(&[
        "run",
        "testdata/scenarios/header-ops.yaml",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("cannot read scenario"), "{}", text(&o));
}
