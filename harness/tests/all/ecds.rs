//! Filters configured by discovery files (ECDS `path_config_source`), read as Envoy reads them
//! at start, and the RBAC filters that stand in for a Wasm filter whose module cannot be
//! fetched (allow-all for a plugin failing open, deny-all otherwise), written exactly as
//! `wasm-fetcher` writes them; each compared with real Envoy.

use std::path::Path;

use serde_json::{json, Value};
use wasm_fetcher::envoy::fallback::{Fallback, FilterType};
use wasm_harness::Verdict;

use crate::support::*;

#[test]
fn the_sidecars_ecds_bootstrap_runs_as_in_envoy() {
    filter_wasm();
    let o = harness(&["validate", "envoy-config/bootstrap-ecds.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = harness(&["run", "--envoy", "testdata/scenarios/ecds.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("1 passed, 0 failed"), "{}", text(&o));
}

#[test]
fn a_swapped_ecds_file_configures_the_streams_after_it_as_in_envoy() {
    filter_wasm();
    let o = harness(&["run", "--envoy", "testdata/scenarios/ecds-swap.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("4 passed, 0 failed"), "{}", text(&o));
    assert!(
        text(&o).contains("harness: new configuration for istio-system.wasm-filter-header-ops | envoy: update applied"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains("harness: no plugin changed | envoy: update applied"),
        "{}",
        text(&o)
    );
    // A swap to a filter no discovery file configures is refused, naming it.
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.yaml");
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\nrequests:\n  - swap_ecds: {{filter: nobody, with: {}}}\n",
            root().join("envoy-config/bootstrap-ecds.yaml").display(),
            root()
                .join("testdata/scenarios/ecds-swap/header-ops-staging.yaml")
                .display()
        ),
    )
    .unwrap();
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("no filter named \"nobody\" is configured by discovery"),
        "{}",
        text(&o)
    );
}

/// An HTTP filter entry configured from `dir/<name>.yaml`.
fn discovered(dir: &Path, name: &str) -> Value {
    json!({
        "name": name,
        "config_discovery": {
            "config_source": {"path_config_source": {"path": dir.join(format!("{name}.yaml"))}},
            "type_urls": FilterType::Http.type_urls(),
        }
    })
}

/// Writes the discovery file of filter `name`, configured as `typed_config`.
fn write_ecds(dir: &Path, name: &str, typed_config: Value) {
    let response = json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": name,
        "typed_config": typed_config,
    }]});
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        serde_json::to_string(&response).unwrap(),
    )
    .unwrap();
}

#[test]
fn rbac_fallbacks_allow_or_deny_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "add-header.wat");
    let guest = |name: &str| {
        json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {"name": name, "root_id": name, "vm_config": {
                "vm_id": "guest", "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": wasm}}}}
        })
    };
    write_ecds(dir.path(), "guest", guest("guest"));
    write_ecds(dir.path(), "after", guest("after"));
    write_ecds(
        dir.path(),
        "allow",
        Fallback::AllowAll.config(FilterType::Http),
    );
    write_ecds(
        dir.path(),
        "deny",
        Fallback::DenyAll.config(FilterType::Http),
    );
    let router = json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}});
    let d = dir.path();
    let b = bootstrap_variant(d, &wasm, None, |doc| {
        doc["node"] = json!({"id": "harness-test", "cluster": "harness-test"});
        let listeners = doc["static_resources"]["listeners"].as_array_mut().unwrap();
        let mut closed = listeners[0].clone();
        let chain = "/filter_chains/0/filters/0/typed_config/http_filters";
        *listeners[0].pointer_mut(chain).unwrap() =
            json!([discovered(d, "guest"), discovered(d, "allow"), router]);
        closed["name"] = "closed".into();
        closed["address"]["socket_address"]["port_value"] = 10001.into();
        *closed.pointer_mut(chain).unwrap() = json!([
            discovered(d, "guest"),
            discovered(d, "deny"),
            discovered(d, "after"),
            router
        ]);
        listeners.push(closed);
    });
    let s = scenario(
        d,
        &b,
        "  - name: allow-all lets the request through
    request: {path: /}
    expect:
      upstream: {headers: {x-wat: '1'}}
      response: {status: 200}
      log_counts: [{contains: wat guest saw request headers, count: 1}]
  - name: deny-all answers 403, and the filters after it never see the request
    listener: closed
    request: {path: /}
    expect:
      reached_upstream: false
      local_reply: rbac
      response: {status: 403, body: 'RBAC: access denied'}
      log_counts: [{contains: wat guest saw request headers, count: 1}]
  - name: a request with a body is denied the same way
    listener: closed
    request: {method: POST, path: /, body: hello}
    expect:
      reached_upstream: false
      local_reply: rbac
      response: {status: 403, body: 'RBAC: access denied'}
      log_counts: [{contains: wat guest saw request headers, count: 1}]
",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    for case in &report.cases {
        assert!(case.envoy_failures.is_empty(), "{report}");
    }
}

#[test]
fn other_rbac_rules_and_config_sources_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wasm = assembled(d, "add-header.wat");
    let mut rules = Fallback::DenyAll.config(FilterType::Http);
    rules["rules"]["policies"] =
        json!({"p": {"permissions": [{"any": true}], "principals": [{"any": true}]}});
    write_ecds(d, "rules", rules);
    let b = bootstrap_variant(d, &wasm, None, |doc| {
        doc["node"] = json!({"id": "harness-test", "cluster": "harness-test"});
        let filters = doc
            .pointer_mut(
                "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
            )
            .unwrap()
            .as_array_mut()
            .unwrap();
        filters.insert(0, discovered(d, "rules"));
    });
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("http_filters[0].typed_config.rules.policies: not emulated"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_network_deny_all_closes_the_connection_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wasm = assembled(d, "tcp-bytes.wat");
    let network = |name: &str| {
        json!({"name": name, "config_discovery": {
            "config_source": {"path_config_source": {"path": d.join(format!("{name}.yaml"))}},
            "type_urls": FilterType::Network.type_urls(),
        }})
    };
    write_ecds(
        d,
        "counter",
        json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
            "config": {"name": "tcp-bytes", "root_id": "tcp-bytes", "vm_config": {
                "vm_id": "tcp-bytes", "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": wasm}}}}
        }),
    );
    write_ecds(d, "open", Fallback::AllowAll.config(FilterType::Network));
    write_ecds(d, "shut", Fallback::DenyAll.config(FilterType::Network));
    let proxy = json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": "tcp", "cluster": "backend"}});
    let listener = |name: &str, port: u16, fallback: &str| {
        json!({"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
               "filter_chains": [{"filters": [network("counter"), network(fallback), proxy]}]})
    };
    let b = bootstrap_variant(d, &wasm, None, |doc| {
        doc["node"] = json!({"id": "harness-test", "cluster": "harness-test"});
        doc["static_resources"]["listeners"] = json!([
            listener("open", 10001, "open"),
            listener("shut", 10002, "shut")
        ]);
    });
    let s = scenario(
        d,
        &b,
        "  - name: allow-all passes the bytes
    listener: open
    connection: [{downstream: ping}, {upstream: pong}, {close: downstream}]
    expect: {upstream_received: '[ping', downstream_received: 'pong!'}
  - name: deny-all closes at the client's first bytes, after the filters ahead of it saw them
    listener: shut
    connection: [{downstream: ping}]
    expect:
      upstream_received: ''
      downstream_received: ''
      log_counts: [{contains: downstream data size=4 eos=0, count: 1}]
",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

#[test]
fn a_replaced_plugins_root_contexts_end_as_in_envoy() {
    // request-headers.wat logs "stream on_done" from every context's proxy_on_done, roots too.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wasm = assembled(d, "request-headers.wat");
    let config = |value: &str| {
        json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {"name": "headers", "root_id": "headers",
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": value},
                "vm_config": {"vm_id": "request-headers", "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": wasm}}}}
        })
    };
    write_ecds(d, "headers", config("one"));
    let next = d.join("next");
    std::fs::create_dir(&next).unwrap();
    write_ecds(&next, "headers", config("two"));
    let b = bootstrap_variant(d, &wasm, None, |doc| {
        doc["node"] = json!({"id": "harness-test", "cluster": "harness-test"});
        *doc.pointer_mut(
            "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0",
        )
        .unwrap() = discovered(d, "headers");
    });
    let s = scenario(
        d,
        &b,
        &format!(
            "  - {{name: before, request: {{path: /, headers: {{x-request-id: a}}}}, expect: {{response: {{status: 200}}}}}}
  - name: the new configuration starts and the replaced root ends on every thread
    swap_ecds: {{filter: headers, with: {}}}
    expect:
      log_counts:
        - {{contains: stream on_done, worker: main, count: 1}}
        - {{contains: stream on_done, worker: 0, count: 1}}
  - {{name: after, request: {{path: /, headers: {{x-request-id: b}}}}, expect: {{response: {{status: 200}}}}}}
  - shutdown: true
    expect:
      log_counts:
        - {{contains: stream on_done, worker: main, count: 1}}
        - {{contains: stream on_done, worker: 0, count: 1}}
",
            next.join("headers.yaml").display()
        ),
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_eq!(report.cases.len(), 4, "{report:#}");
    assert_logs_same(&report);
}
