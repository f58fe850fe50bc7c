//! TCP listeners: `envoy.filters.network.wasm` in front of `tcp_proxy`, driven with
//! `testdata/guests/tcp-bytes.wat` in the harness and through real Envoy with real sockets.

use std::time::{Duration, Instant};

use wasm_harness::proxy::TcpEvent;
use wasm_harness::real_envoy::RealEnvoy;
use wasm_harness::Verdict;
use wasm_harness::{Proxy, ProxyOptions, TrafficError};

use crate::support::*;

/// The shipped TCP bootstrap with the guest assembled (V8 takes binary modules only).
fn tcp_bootstrap(dir: &std::path::Path) -> std::path::PathBuf {
    let wasm = assembled(dir, "tcp-bytes.wat");
    let text = std::fs::read_to_string(root().join("testdata/scenarios/tcp-bytes.bootstrap.yaml"))
        .unwrap();
    let path = dir.join("tcp.bootstrap.yaml");
    std::fs::write(
        &path,
        text.replace("testdata/guests/tcp-bytes.wat", wasm.to_str().unwrap()),
    )
    .unwrap();
    path
}

#[test]
fn the_tcp_scenario_passes_in_the_harness_and_through_real_envoy() {
    let o = harness(&["run", "testdata/scenarios/tcp-bytes.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let dir = tempfile::tempdir().unwrap();
    let b = tcp_bootstrap(dir.path());
    if let Err(e) = wasm_harness::real_envoy::validate(&envoy(), &b) {
        panic!("envoy --mode validate: {e}");
    }

    let scenario = std::fs::read_to_string(root().join("testdata/scenarios/tcp-bytes.yaml"))
        .unwrap()
        .replace(
            "bootstrap: tcp-bytes.bootstrap.yaml",
            &format!("bootstrap: {}", b.display()),
        );
    let s = dir.path().join("tcp.yaml");
    std::fs::write(&s, scenario).unwrap();
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 3, "{report}");
}

/// The lines after "wasm log <plugin> ...: " in order.
fn messages(lines: impl Iterator<Item = String>) -> Vec<String> {
    lines
        .filter_map(|l| l.rsplit_once("tcp-bytes: ").map(|(_, m)| m.to_string()))
        .collect()
}

/// Each network callback, with its arguments, in the order real Envoy makes them.
#[test]
fn network_callbacks_come_in_envoys_order_with_envoys_arguments() {
    let cases: [(&str, Vec<TcpEvent>); 3] = [
        (
            "client closes",
            vec![
                TcpEvent::Downstream(b"ping".to_vec()),
                TcpEvent::Upstream(b"pong".to_vec()),
                TcpEvent::CloseDownstream,
            ],
        ),
        (
            "upstream closes, a held chunk",
            vec![
                TcpEvent::Downstream(b"hold".to_vec()),
                TcpEvent::Downstream(b"me".to_vec()),
                TcpEvent::CloseUpstream,
            ],
        ),
        (
            "the plugin closes",
            vec![TcpEvent::Downstream(b"quit".to_vec())],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let b = tcp_bootstrap(dir.path());
    for (name, events) in cases {
        let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
        let before = proxy.log_len();
        let h = proxy.connect(None, None, &events).unwrap();
        let harness_lines = messages(proxy.logs()[before..].iter().map(|r| r.to_string()));

        let mut real = RealEnvoy::start(&envoy(), &b, 1).unwrap();
        let e = real.connect(None, &events).unwrap();
        // Envoy writes its log asynchronously: wait for the context's last callback.
        let start = Instant::now();
        let mut envoy_lines = messages(real.wasm_logs().into_iter());
        while envoy_lines.last().map(String::as_str) != Some("log")
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(100));
            envoy_lines = messages(real.wasm_logs().into_iter());
        }
        assert_eq!(
            (&h.upstream_received, &h.downstream_received),
            (&e.upstream_received, &e.downstream_received),
            "{name}: bytes differ"
        );
        assert_eq!(harness_lines, envoy_lines, "{name}: callbacks differ");
    }
}

#[test]
fn tcp_and_http_listeners_refuse_the_other_kind_of_traffic_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy =
        Proxy::from_bootstrap(&tcp_bootstrap(dir.path()), &ProxyOptions::default()).unwrap();
    let e = proxy
        .send(None, None, &Default::default(), &mut |_| Default::default())
        .unwrap_err();
    assert!(
        matches!(&e, TrafficError::TcpListener { name } if name == "tcp"),
        "{e}"
    );
    assert!(e.to_string().contains("\"tcp\" is a TCP listener"), "{e}");

    let b = bootstrap_variant(dir.path(), &guest("tcp-bytes.wat"), None, |doc| {
        // A network Wasm filter in front of the HTTP connection manager.
        let filters = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters")
            .unwrap()
            .as_array_mut()
            .unwrap();
        filters.insert(0, serde_json::json!({
            "name": "envoy.filters.network.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
                "config": {"vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": "x.wasm"}}}}
            }
        }));
    });
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o)
            .contains("network Wasm filters in front of http_connection_manager are not emulated"),
        "{}",
        text(&o)
    );
    let http = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    let mut proxy = Proxy::from_bootstrap(&http, &ProxyOptions::default()).unwrap();
    let e = proxy.connect(None, None, &[]).unwrap_err();
    assert!(matches!(e, TrafficError::HttpListener { .. }), "{e}");
    assert!(e.to_string().contains("is an HTTP listener"), "{e}");
}
