//! `envoy.bootstrap.wasm` services: a singleton runs once on the main thread, a
//! non-singleton once per worker and once on the main thread (Envoy's thread-local slots
//! include the main thread); ticks and queue notifications reach them there. Both counts
//! were read off real Envoy 1.40 (`--concurrency 2`).

use crate::support::*;

fn with_service(dir: &std::path::Path, singleton: bool) -> std::path::PathBuf {
    let service = guest("service-queue.wat");
    bootstrap_variant(dir, &guest("add-header.wat"), None, move |doc| {
        doc["bootstrap_extensions"] = serde_json::json!([{
            "name": "envoy.bootstrap.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
                "singleton": singleton,
                "config": {
                    "name": "aggregator",
                    "root_id": "aggregator",
                    "vm_config": {
                        "vm_id": "aggregator",
                        "runtime": "envoy.wasm.runtime.v8",
                        "code": {"local": {"filename": service.display().to_string()}}
                    }
                }
            }
        }]);
    })
}

#[test]
fn a_singleton_service_ticks_and_gets_its_queue_on_the_main_thread_only() {
    let dir = tempfile::tempdir().unwrap();
    let b = with_service(dir.path(), true);
    let s = scenario(
        dir.path(),
        &b,
        "  - {name: request, request: {path: /}, expect: {response: {status: 200}}}
  - advance: 3s
    expect: {log_counts: [{contains: service tick, count: 3}, {contains: service queue ready, count: 3}]}
",
    );
    let o = harness(&["run", "--workers", "2", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    let service_lines: Vec<&str> = out.lines().filter(|l| l.contains("service ")).collect();
    assert_eq!(service_lines.len(), 6, "{out}");
    assert!(
        service_lines.iter().all(|l| l.contains("[main]")),
        "service lines not on the main thread: {out}"
    );
}

#[test]
fn a_non_singleton_service_runs_on_every_worker_and_the_main_thread() {
    let dir = tempfile::tempdir().unwrap();
    let b = with_service(dir.path(), false);
    let s = scenario(
        dir.path(),
        &b,
        "  - advance: 2s
    expect:
      log_counts:
        - {contains: service tick, count: 6}
        - {contains: service tick, worker: main, count: 2}
        - {contains: service tick, worker: 0, count: 2}
        - {contains: service tick, worker: 1, count: 2}
        # Every tick enqueues; the last root to register the queue (worker 1's, started
        # after the main thread's and worker 0's) gets every notification.
        - {contains: service queue ready, worker: 1, count: 6}
",
    );
    let o = harness(&["run", "--workers", "2", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn another_bootstrap_extension_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest("add-header.wat"), None, |doc| {
        doc["bootstrap_extensions"] = serde_json::json!([{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}
        }]);
    });
    let s = scenario(dir.path(), &b, "");
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("bootstrap_extensions[0]"), "{}", text(&o));
    assert!(text(&o).contains("InternalListener"), "{}", text(&o));
}

#[test]
fn a_reloaded_vm_shared_with_a_service_starts_the_service_again() {
    use wasm_harness::{Proxy, ProxyOptions, Request, UpstreamReply};
    let dir = tempfile::tempdir().unwrap();
    let module = guest("trap-on-path.wat");
    let b = bootstrap_variant(dir.path(), &module, None, |doc| {
        doc.pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap()["failure_policy"] = serde_json::json!("FAIL_RELOAD");
        // Same vm_id, configuration and code as the filter: one VM per worker hosts both.
        doc["bootstrap_extensions"] = serde_json::json!([{
            "name": "envoy.bootstrap.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
                "singleton": false,
                "config": {
                    "name": "beside-the-filter",
                    "root_id": "beside-the-filter",
                    "vm_config": {
                        "vm_id": "wasm-filter",
                        "runtime": "envoy.wasm.runtime.v8",
                        "code": {"local": {"filename": module.display().to_string()}}
                    }
                }
            }
        }]);
    });
    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
    // The plugins whose root context started (`proxy_on_vm_start` logs) on worker 0.
    let started_on_worker = |proxy: &Proxy, from: usize| -> Vec<String> {
        proxy
            .logs_since(from)
            .iter()
            .filter(|l| l.worker == Some(0) && l.message == "trap-on-path VM started")
            .map(|l| l.plugin.clone())
            .collect()
    };
    assert_eq!(
        started_on_worker(&proxy, 0),
        ["header-ops", "beside-the-filter"]
    );
    let trapped = proxy
        .round_trip(&Request::get("/trap"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(trapped.response_status(), Some(503));
    proxy.advance(std::time::Duration::from_millis(1500));
    let before_reload = proxy.log_len();
    let reloaded = proxy
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(reloaded.response_status(), Some(200));
    assert_eq!(
        started_on_worker(&proxy, before_reload),
        ["header-ops", "beside-the-filter"],
        "the reloaded VM must host the service's root context again"
    );
}
