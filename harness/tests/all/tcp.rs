//! TCP listeners: `envoy.filters.network.wasm` in front of `tcp_proxy`, driven with
//! `testdata/guests/tcp-bytes.wat` in the harness and through real Envoy with real sockets.

use std::time::{Duration, Instant};

use wasm_harness::envoy::proxy::TcpEvent;
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

/// `testdata/scenarios/tcp-route.yaml` with its module assembled for real Envoy.
fn route_scenario(dir: &std::path::Path) -> std::path::PathBuf {
    let wasm = assembled(dir, "tcp-route.wat");
    let text = std::fs::read_to_string(root().join("testdata/scenarios/tcp-route.bootstrap.yaml"))
        .unwrap()
        .replace("testdata/guests/tcp-route.wat", wasm.to_str().unwrap());
    let b = dir.join("tcp-route.bootstrap.yaml");
    std::fs::write(&b, text).unwrap();
    wasm_harness::real_envoy::validate(&envoy(), &b).unwrap();
    let s = dir.join("tcp-route.yaml");
    std::fs::write(
        &s,
        std::fs::read_to_string(root().join("testdata/scenarios/tcp-route.yaml")).unwrap(),
    )
    .unwrap();
    s
}

/// set_envoy_filter_state steers tcp_proxy in the harness as in Envoy: each connection reaches
/// the same cluster (each has its own loopback upstream in Envoy), with the same bytes.
#[test]
fn set_envoy_filter_state_steers_tcp_proxy_to_the_same_cluster_as_in_envoy() {
    let o = harness(&["run", "testdata/scenarios/tcp-route.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let dir = tempfile::tempdir().unwrap();
    let report = differential(&route_scenario(dir.path()));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 3, "{report}");
}

/// The statuses Envoy answers: NotFound without a stream (a root context) and for a key with
/// no factory, BadArgument for arguments that are not the protobuf or a value the factory
/// refuses; and what reading `filter_state.<key>` back gives.
#[test]
fn set_envoy_filter_state_answers_envoys_statuses_and_reads_back_as_envoy_does() {
    let dir = tempfile::tempdir().unwrap();
    let s = route_scenario(dir.path());
    let b = dir.path().join("tcp-route.bootstrap.yaml");
    let probes: Vec<TcpEvent> = [
        "?envoy.string=hi",
        "?no.such.key=1",
        "?envoy.tcp_proxy.cluster=alpha",
        "?envoy.ratelimit.hits_addend=-1",
        "?envoy.ratelimit.hits_addend=10",
        "?envoy.network.ip=127.0.0.1",
        "?envoy.tcp_proxy.disable_tunneling=yes",
        "?envoy.network.transport_socket.original_dst_address=[::1]:80",
        "?envoy.bool=maybe",
    ]
    .iter()
    .map(|p| TcpEvent::Downstream(p.as_bytes().to_vec()))
    .collect();
    let lines = |all: Vec<String>| -> Vec<String> {
        all.into_iter()
            .filter_map(|l| {
                l.rsplit_once("tcp-route-config: ")
                    .map(|(_, m)| m.to_string())
            })
            .collect()
    };
    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
    let before = proxy.log_len();
    let h = proxy.connect(Some("by-config"), None, &probes).unwrap();
    let harness_lines = lines(
        proxy.logs()[before..]
            .iter()
            .map(|r| r.to_string())
            .collect(),
    );

    let mut real = RealEnvoy::start(&envoy(), &b, 1).unwrap();
    let e = real.connect(Some("by-config"), &probes).unwrap();
    let start = Instant::now();
    let mut envoy_lines = lines(real.wasm_logs());
    while envoy_lines.len() < harness_lines.len() + 1 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        envoy_lines = lines(real.wasm_logs());
    }
    assert_eq!((h.cluster.as_str(), e.cluster.as_str()), ("beta", "beta"));
    // Envoy's lines include start-up's ("root set ...") for the canary and the worker.
    let root: Vec<&String> = envoy_lines
        .iter()
        .filter(|l| l.starts_with("root set"))
        .collect();
    assert!(
        root.iter()
            .all(|l| *l == "root set status=1 garbage status=2"),
        "{root:?}"
    );
    let envoy_stream: Vec<String> = envoy_lines
        .iter()
        .filter(|l| !l.starts_with("root set"))
        .cloned()
        .collect();
    assert_eq!(harness_lines, envoy_stream);
    assert!(
        harness_lines.contains(&"get envoy.network.ip status=0 value=127.0.0.1:0".to_string()),
        "{harness_lines:?}"
    );
    drop(s);
}
