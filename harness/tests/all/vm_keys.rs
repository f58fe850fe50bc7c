//! How plugins share VMs and root contexts, counted in real Envoy 1.40 and in the harness with
//! `testdata/guests/lifecycle.wat` (one `on_vm_start` per VM, one `on_configure` per root
//! context): Envoy 1.40 keys a VM by every `vm_config` field it is built from, and a root
//! context by the whole plugin configuration but `vm_config`, so identical filters share one.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::support::*;

/// An HTTP Wasm filter running `module`, plugin `name` with configuration `config`, in VM `v`
/// with the given environment variables.
fn filter(module: &std::path::Path, name: &str, config: &str, env: Value) -> Value {
    let mut vm = json!({"vm_id": "v", "runtime": "envoy.wasm.runtime.v8",
        "code": {"local": {"filename": module}}});
    if !env.is_null() {
        vm["environment_variables"] = json!({ "key_values": env });
    }
    json!({"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": name, "root_id": "r", "vm_config": vm,
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config}}}})
}

/// Lines containing `what`, counted per thread label.
fn per_thread(lines: &[(String, String)], what: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (thread, line) in lines {
        if line.ends_with(what) {
            *out.entry(thread.clone()).or_default() += 1;
        }
    }
    out
}

#[test]
fn vms_and_root_contexts_are_shared_as_envoy_keys_them() {
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "lifecycle.wat");
    let mut doc = shipped_bootstrap();
    let filters = vec![
        filter(&module, "p", "a", Value::Null),
        filter(&module, "p", "a", Value::Null), // the same plugin again
        filter(&module, "p", "b", Value::Null), // another configuration
        filter(&module, "q", "a", Value::Null), // another name
        filter(&module, "p", "a", json!({"K": "V"})), // another VM: environment variables
        json!({"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    ];
    doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"] = Value::Array(filters);
    let b = dir.path().join("keys.yaml");
    std::fs::write(&b, serde_norway::to_string(&doc).unwrap()).unwrap();

    let real = wasm_harness::real_envoy::RealEnvoy::start(&envoy(), &b, 1).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let envoy_lines: Vec<(String, String)> = real
        .wasm_logs()
        .into_iter()
        .map(|l| (l.split("][").nth(1).unwrap_or_default().to_string(), l))
        .collect();
    drop(real);
    let proxy =
        wasm_harness::Proxy::from_bootstrap(&b, &wasm_harness::ProxyOptions::with_workers(1))
            .unwrap();
    let harness_lines: Vec<(String, String)> = proxy
        .logs()
        .iter()
        .filter(|l| l.message.contains("on_"))
        .map(|l| (format!("{:?}", l.worker), l.message.clone()))
        .collect();
    // Envoy's configuration canary runs on the main thread, first: the first thread to log is
    // the harness's `None` (canary and main thread), the other the worker.
    let main = envoy_lines[0].0.clone();
    let envoy_lines: Vec<(String, String)> = envoy_lines
        .into_iter()
        .map(|(t, l)| (if t == main { "None" } else { "Some(0)" }.to_string(), l))
        .collect();
    let on_worker = |lines: &[(String, String)], what: &str| {
        per_thread(lines, what).get("Some(0)").copied().unwrap_or(0)
    };
    // On the worker: one VM hosting p/a (twice in the chain, one root context), p/b and q/a;
    // another for p/a with environment variables.
    assert_eq!(
        on_worker(&envoy_lines, "on_vm_start n=1"),
        2,
        "{envoy_lines:#?}"
    );
    assert_eq!(
        on_worker(&envoy_lines, "on_vm_start n=3"),
        1,
        "{envoy_lines:#?}"
    );
    assert_eq!(
        on_worker(&envoy_lines, "on_configure a"),
        3,
        "{envoy_lines:#?}"
    );
    for what in [
        "on_vm_start n=1",
        "on_vm_start n=2",
        "on_vm_start n=3",
        "on_vm_start n=4",
        "on_configure a",
        "on_configure b",
    ] {
        assert_eq!(
            per_thread(&harness_lines, what),
            per_thread(&envoy_lines, what),
            "{what}, per thread\nenvoy: {envoy_lines:#?}\nharness: {harness_lines:#?}"
        );
    }
}
