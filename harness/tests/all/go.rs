//! Go guests (testdata/go/), built by Go from PyPI as Go SDK users build a filter, run in the
//! harness and through real Envoy 1.40: start-up (WASI as Envoy gives it, the guest's own
//! lines, a panic in `_initialize`), the four contexts, a Wasm service, shared data with CAS
//! across workers, a shared queue, ticks, callouts, metrics, properties and bodies.

use std::path::{Path, PathBuf};

use wasm_harness::Verdict;

use crate::support::*;

/// The shipped bootstrap with `module` as its HTTP filter, named `go` (plugin, root_id and
/// vm_id), with this plugin configuration and `LEVEL=debug` in its environment.
fn go_bootstrap(
    dir: &Path,
    module: &Path,
    config: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    bootstrap_variant(dir, module, Some(config), move |doc| {
        let plugin = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap();
        plugin["name"] = "go".into();
        plugin["root_id"] = "go".into();
        plugin["vm_config"]["vm_id"] = "go".into();
        plugin["vm_config"]["environment_variables"] =
            serde_json::json!({"key_values": {"LEVEL": "debug"}});
        edit(doc);
    })
}

/// A scenario file with a head (top-level keys) and its requests.
fn go_scenario(dir: &Path, bootstrap: &Path, head: &str, requests: &str) -> PathBuf {
    let path = dir.join("scenario.yaml");
    std::fs::write(
        &path,
        format!(
            "bootstrap: {}\n{head}requests:\n{requests}",
            bootstrap.display()
        ),
    )
    .unwrap();
    path
}

const HELLO_START: &str = r#"expect_start:
  logs: ["go hello: vm started", "go hello: stdout at vm start", "go hello: configured with bonjour"]
  log_counts:
    # The canary, the main thread and one worker each start the plugin.
    - {contains: "go hello: vm started", count: 3}
    - {contains: "go hello: configured with bonjour", worker: 0, count: 1}
"#;

const HELLO: &str = r#"  - name: a request gets the greeting, its response the filter's header
    request: {path: /hi}
    expect:
      upstream: {headers: {x-go-greeting: bonjour}}
      response: {status: 200, headers: {x-go-filter: hello}}
      logs: ["go hello: request /hi"]
  - name: a panic in a request callback fails the VM and the policy answers
    request: {path: /panic}
    expect:
      reached_upstream: false
      response: {status: 503}
      local_reply: failure_policy
      logs: ["panic: ", "go hello: asked to panic", "Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable"]
  - name: the failed VM answers every later request
    request: {path: /after}
    expect: {reached_upstream: false, response: {status: 503}, local_reply: failure_policy}
"#;

#[test]
fn a_go_filter_starts_in_the_harness_with_its_own_lines() {
    let dir = tempfile::tempdir().unwrap();
    let b = go_bootstrap(dir.path(), &go_guest("hello"), "bonjour", |_| {});
    let s = go_scenario(dir.path(), &b, &format!("workers: 1\n{HELLO_START}"), HELLO);
    let o = harness(&["run", s.to_str().unwrap()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    // fmt.Print("\n") is a write of a lone newline: an empty line, as Envoy logs it.
    let empty = out
        .lines()
        .filter(|l| l.ends_with("[info] wasm log go go: "))
        .count();
    assert_eq!(empty, 3, "{out}");
}

#[test]
fn a_go_filter_runs_the_same_in_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let b = go_bootstrap(dir.path(), &go_guest("hello"), "bonjour", |_| {});
    let s = go_scenario(dir.path(), &b, HELLO_START, HELLO);
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_eq!(
        report.startup_logs,
        Some(wasm_harness::compare::LogComparison::Same),
        "{report:#}"
    );
    assert_logs_same(&report);
}

const PANIC_START: &str = r#"expect_start:
  outcome: rejected
  logs:
    - "go panic-init: starting, LEVEL=debug"
    - "go panic-init: no configuration"
    - "Function: _initialize failed: Uncaught RuntimeError: unreachable"
    - "Wasm VM failed Failed to initialize Wasm code"
    - "Unable to create Wasm plugin go"
"#;

#[test]
fn a_panic_in_go_initialize_reads_as_envoy_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = go_bootstrap(dir.path(), &go_guest("panic-init"), "", |_| {});
    let s = go_scenario(
        dir.path(),
        &b,
        &format!("workers: 1\n{PANIC_START}"),
        "  []\n",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    // The guest's lines come first, then the trap, then Envoy's refusal.
    let at = |needle: &str| {
        out.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {out}"))
    };
    assert!(
        at("LEVEL=debug") < at("Function: _initialize failed"),
        "{out}"
    );
    assert!(
        at("Function: _initialize failed") < at("Failed to initialize Wasm code"),
        "{out}"
    );

    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert!(report.envoy_startup_failures.is_empty(), "{report:#}");
}
