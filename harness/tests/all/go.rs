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

/// The features guest as the HTTP filter (role `http`), the same module as a singleton Wasm
/// service (role `service`, vm_id `go-service`, which registers queue `paths`) and, with
/// `ticker`, as a ticking singleton (role `ticker`, vm_id `go-ticker`), and a cluster `auth` for callouts
/// (port 9: never reached, every answer is canned).
fn features_bootstrap(dir: &Path, module: &Path, ticker: bool) -> PathBuf {
    let service = |name: &str, role: &str| {
        serde_json::json!({
            "name": "envoy.bootstrap.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
                "singleton": true,
                "config": {
                    "name": name,
                    "root_id": name,
                    "configuration": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                        "value": role
                    },
                    "vm_config": {
                        "vm_id": name,
                        "runtime": "envoy.wasm.runtime.v8",
                        "code": {"local": {"filename": module.display().to_string()}}
                    }
                }
            }
        })
    };
    let (service, ticker_service) = (
        service("go-service", "service"),
        service("go-ticker", "ticker"),
    );
    go_bootstrap(dir, module, "http", move |doc| {
        doc["bootstrap_extensions"] = if ticker {
            serde_json::json!([service, ticker_service])
        } else {
            serde_json::json!([service])
        };
        add_loopback_cluster(doc, "auth", 9);
    })
}

const FEATURES_HEAD: &str = r#"http_calls: [{cluster: auth, path: /tick, reply: {status: 204}}]
"#;

/// Requests alternate between the workers: the count in shared data (CAS) and the metric are
/// proxy-wide, the service hears of every path through the queue.
const FEATURES: &str = r#"  - name: the first request counts 1
    worker: 0
    request: {path: /a}
    expect:
      cluster: backend
      upstream: {headers: {x-go-count: "1"}}
      response: {status: 200, headers: {x-go-requests: "1", x-go-metric: "1"}}
      logs: ["go http: request /a number 1 root go", "go service: got /a", "go http: upstream host 127.0.0.1 status 0"]
  - name: the other worker's VM sees it in shared data
    worker: -1
    request: {path: /b}
    expect:
      upstream: {headers: {x-go-count: "2"}}
      response: {status: 200, headers: {x-go-requests: "2", x-go-metric: "2"}}
      logs: ["go http: request /b number 2", "go service: got /b"]
      metrics: {go_requests: 2}
      shared_data: {go: {requests: "2"}}
  - name: a callout's answer resumes the request
    worker: 0
    request: {path: /callout}
    http_calls: [{cluster: auth, path: /check, reply: {status: 200, body: alice}}]
    expect:
      calls: [{cluster: auth, headers: {":path": /check, ":authority": auth}}]
      upstream: {headers: {x-go-auth: alice}}
      response: {status: 200}
      logs: ["go http: callout answered 200: alice"]
  - name: a body sent with the headers comes in one call once the callout's answer resumes
    worker: 0
    request: {method: POST, path: /callout, body: "abc"}
    http_calls: [{cluster: auth, path: /check, reply: {status: 200, body: alice}}]
    expect:
      upstream: {body: "abc"}
      logs: ["go http: request body of 3 bytes, end true"]
      log_counts: [{contains: "go http: request body of", count: 1}]
  - name: a callout with the request's own headers is still told from the routed request
    worker: 0
    request: {path: /copy}
    http_calls: [{cluster: auth, path: /check, reply: {status: 200, body: bob}}]
    upstream: {status: 200, body: "from the backend"}
    expect:
      calls: [{cluster: auth, headers: {":path": /check, x-forwarded-proto: http}}]
      upstream: {headers: {x-go-auth: bob}}
      response: {status: 200, body: "from the backend"}
  - name: a request the filter holds until its tick resumes it
    worker: 0
    request: {path: /hold}
    wait_for_ticks: 1s
    expect:
      upstream: {headers: {x-go-held: released}}
      response: {status: 200}
  - name: a refusal answers from the filter
    worker: 0
    request: {path: /callout}
    http_calls: [{cluster: auth, path: /check, reply: {status: 401}}]
    expect:
      reached_upstream: false
      response: {status: 403, headers: {x-go-auth: "401"}, body: "denied by auth\n"}
      local_reply: plugin
      logs: ["go http: upstream host  status 1"]
  - name: a 400 from the filter closes the HTTP/1.1 connection after it, as Envoy does
    worker: 0
    request: {path: /callout}
    http_calls: [{cluster: auth, path: /check, reply: {status: 400}}]
    expect:
      reached_upstream: false
      response: {status: 400, headers: {connection: close}, body: "bad credentials\n"}
      local_reply: plugin
  - name: a 204 has no content-length, in the callout's answer nor in the client's response
    worker: 0
    request: {path: /callout}
    http_calls: [{cluster: auth, path: /check, reply: {status: 204}}]
    upstream: {status: 204}
    expect:
      response: {status: 204, absent: [content-length]}
      logs: ["go http: callout answered 204:  (content-length , status 1)"]
  - name: the request body is buffered and rewritten, the response body counted
    worker: 0
    request: {method: POST, path: /upper, body_chunks: ["hello ", "go"]}
    upstream: {status: 200, body: "0123456789"}
    expect:
      upstream: {body: "HELLO GO"}
      response: {status: 200, body: "0123456789"}
      logs: ["go http: upper-cased 8 bytes", "go http: response body of 10 bytes"]
"#;

/// Ticks from the start: the first callouts are made before any request.
const TICKS: &str = r#"  - advance: 2s
    expect:
      logs: ["go ticker: tick 2", "go ticker: callout answered 204 with 0 bytes"]
      log_counts:
        - {contains: "go ticker: tick", worker: main, count: 2}
        - {contains: "go ticker: callout answered 204", count: 2}
  - name: a request meanwhile
    request: {path: /c}
    expect: {response: {status: 200}, logs: ["go service: got /c"]}
"#;

#[test]
fn a_go_filter_shares_data_queues_metrics_callouts_and_bodies_across_workers() {
    let dir = tempfile::tempdir().unwrap();
    let b = features_bootstrap(dir.path(), &go_guest("features"), false);
    let requests = FEATURES.replace("worker: -1", "worker: 1");
    let s = go_scenario(dir.path(), &b, "workers: 2\n", &requests);
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn the_go_features_run_the_same_in_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let b = features_bootstrap(dir.path(), &go_guest("features"), false);
    let requests = FEATURES
        .replace("    worker: -1\n", "")
        .replace("    worker: 0\n", "");
    let s = go_scenario(dir.path(), &b, "", &requests);
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_logs_same(&report);
}

#[test]
fn a_go_service_ticks_and_calls_out_from_start_up_in_the_harness_and_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let b = features_bootstrap(dir.path(), &go_guest("features"), true);
    let s = go_scenario(
        dir.path(),
        &b,
        &format!("workers: 1\n{FEATURES_HEAD}"),
        TICKS,
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    // In Envoy too the scenario's own answer serves the ticks' callouts from the start (its
    // lines are timing, compared or not: none may show a call left unanswered).
    let all = format!("{report:?}");
    assert!(!all.contains("callout answered 0 "), "{all}");
}

/// The shipped TCP bootstrap with `module` as its network filter, configured with `config`.
fn tcp_bootstrap(dir: &Path, module: &Path, config: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join("testdata/scenarios/tcp-bytes.bootstrap.yaml"))
        .unwrap()
        .replace("testdata/guests/tcp-bytes.wat", module.to_str().unwrap())
        .replace(
            "            vm_config:\n",
            &format!("            configuration: {{\"@type\": type.googleapis.com/google.protobuf.StringValue, value: {config:?}}}\n            vm_config:\n"),
        );
    let path = dir.join("tcp.bootstrap.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

const TCP: &str = r#"  - name: a connection's bytes are counted, the upstream's address read once connected
    connection:
      - downstream: "ping"
      - upstream: "pong!"
      - close: downstream
    expect:
      upstream_received: "ping"
      downstream_received: "pong!"
      logs: ["go tcp: upstream host 127.0.0.1 status 0", "go tcp: 4 bytes in, 5 bytes out"]
"#;

#[test]
fn a_go_tcp_filter_counts_bytes_and_reads_its_upstream_in_the_harness_and_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let b = tcp_bootstrap(dir.path(), &go_guest("features"), "tcp");
    let s = go_scenario(dir.path(), &b, "workers: 1\n", TCP);
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_logs_same(&report);
}

#[test]
fn a_property_envoy_has_and_the_harness_does_not_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let b = tcp_bootstrap(
        dir.path(),
        &guest("property-probe.wat"),
        "upstream/local_address\nupstream/address",
    );
    let s = go_scenario(
        dir.path(),
        &b,
        "workers: 1\n",
        r#"  - name: a connection
    connection: [{downstream: "x"}, {close: downstream}]
    expect:
      logs:
        - "property upstream.local_address exists in Envoy but is not emulated"
        - "upstream/local_address status=1"
        # Not connected upstream yet: NotFound, as in Envoy, and nothing to say about it.
        - "upstream/address status=1"
      log_counts: [{contains: "property upstream.address", count: 0}]
"#,
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn the_go_authors_page_shows_the_code_the_tests_build() {
    let page = std::fs::read_to_string(root().join("docs/go-filters.md")).unwrap();
    let source = std::fs::read_to_string(root().join("testdata/go/hello/main.go")).unwrap();
    let excerpt = page
        .split("```console\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap();
    assert!(
        excerpt.contains("func (h *httpContext) OnRequestHeaders"),
        "{excerpt}"
    );
    assert!(
        source.contains(excerpt),
        "docs/go-filters.md shows code that testdata/go/hello/main.go does not have:\n{excerpt}"
    );
}

#[test]
fn a_request_that_reaches_another_cluster_than_expected_fails_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let b = features_bootstrap(dir.path(), &go_guest("features"), false);
    let s = go_scenario(
        dir.path(),
        &b,
        "workers: 1\n",
        "  - {name: routed, request: {path: /a}, expect: {cluster: auth}}\n",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(
            "expected the request to reach cluster \"auth\", but cluster \"backend\" received it"
        ),
        "{}",
        text(&o)
    );
}
