//! The VM and plugin contexts every role shares: VM configuration, refusals that name the
//! field, and roots that never trap.

use wasm_harness::{Proxy, ProxyOptions, Request, StartError, TcpEvent, UpstreamReply};

use crate::support::{lines, module, role};

fn start_error(e: Result<Proxy, StartError>) -> String {
    let e = e.err().expect("the configuration must be refused");
    let text = e.to_string();
    assert!(matches!(e, StartError::Rejected { .. }), "{text}");
    text
}

#[test]
fn a_bad_vm_configuration_fails_vm_start_naming_the_field() {
    for (vm_config, want) in [
        (r#"{"log_levl": "debug"}"#, "unknown field `log_levl`"),
        (r#"{"log_level": "loud"}"#, "unknown variant `loud`"),
        ("{not json", "key must be a string"),
        (r#"{"queue_name": ""}"#, "queue_name: must not be empty"),
    ] {
        let text = start_error(
            Proxy::for_module(module())
                .configuration(r#"{"role": "http-header-operation"}"#)
                .vm_configuration(vm_config)
                .workers(1)
                .build(),
        );
        assert!(text.contains("invalid VM configuration"), "{text}");
        assert!(text.contains(want), "{vm_config}: {text}");
    }
}

#[test]
fn the_vm_log_level_silences_lower_lines() {
    let proxy = Proxy::for_module(module())
        .configuration(r#"{"role": "http-header-operation"}"#)
        .vm_configuration(r#"{"log_level": "warn"}"#)
        .workers(1)
        .build()
        .unwrap();
    assert!(proxy
        .logs()
        .iter()
        .all(|l| !l.message.contains("configured role")));
}

#[test]
fn every_bad_plugin_configuration_is_one_line_naming_what_was_wrong() {
    for (config, want) in [
        (
            serde_json::json!({"role": "nope"}),
            "unknown variant `nope`",
        ),
        (serde_json::json!({}), "missing field `role`"),
        (
            serde_json::json!({"role": "http-body-operation", "max_buffer_bytes": 0}),
            "max_buffer_bytes 0",
        ),
        (
            serde_json::json!({"role": "rate-limit", "key": "client-address", "burst": 0, "refill_per_second": 1}),
            "burst: must be at least 1",
        ),
        (
            serde_json::json!({"role": "tcp-total-data-size-counter", "log": true}),
            "unknown field `log`",
        ),
        (
            serde_json::json!({"role": "stats-aggregator", "collector": {"cluster": "c"}}),
            "collector: only",
        ),
    ] {
        let role_name = config["role"].as_str().unwrap_or("").to_string();
        let proxy = Proxy::for_module(module())
            .configuration(config.to_string())
            .workers(1)
            .build();
        let text = start_error(proxy);
        assert!(text.contains("invalid plugin configuration"), "{text}");
        assert!(text.contains(want), "{role_name}: {text}");
        assert!(!text.contains("panicked"), "{text}");
    }
    // An empty configuration too.
    let text = start_error(Proxy::for_module(module()).workers(1).build());
    assert!(text.contains("the plugin configuration is empty"), "{text}");
}

#[test]
fn a_role_configured_once_serves_many_streams_without_growing() {
    let mut proxy = role("http-header-operation", serde_json::json!({}), 1).unwrap();
    for _ in 0..50 {
        let ex = proxy
            .round_trip(&Request::get("/"), UpstreamReply::new(200))
            .unwrap();
        assert_eq!(ex.response_status(), Some(200));
    }
    assert!(proxy.take_errors().is_empty());
}

#[test]
fn a_role_on_the_wrong_kind_of_filter_passes_streams_through_and_says_so_once() {
    let misplaced = "where it cannot run: its streams pass through untouched";
    // An HTTP role on a network filter: the bytes go through both ways.
    let mut tcp = Proxy::for_module(module())
        .configuration(r#"{"role": "http-header-operation"}"#)
        .tcp()
        .workers(1)
        .build()
        .unwrap();
    for _ in 0..2 {
        let c = tcp
            .connect(
                None,
                Some(0),
                &[
                    TcpEvent::Downstream(b"ping".to_vec()),
                    TcpEvent::Upstream(b"pong".to_vec()),
                    TcpEvent::CloseDownstream,
                ],
            )
            .unwrap();
        assert_eq!(c.upstream_received, b"ping");
        assert_eq!(c.downstream_received, b"pong");
    }
    assert_eq!(
        lines(&tcp, misplaced),
        ["wasm-filter: role http-header-operation is on a network filter, where it cannot run: its streams pass through untouched"]
    );
    assert!(tcp.take_errors().is_empty());

    // The stats record role on a network filter, behind a deny-all RBAC filter: the
    // connection closes on its first bytes, before they reach the role, so the role's stream
    // ends with no request seen and no record is taken for it.
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap.yaml");
    let wasm = serde_json::json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
        "config": {"name": "rec", "root_id": "rec",
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": r#"{"role": "stats-aggregator", "mode": "record"}"#},
            "vm_config": {"vm_id": "wasm-filter", "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": module()}}}}
    });
    let config = serde_json::json!({"static_resources": {
        "listeners": [{"name": "tcp",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10002}},
            "filter_chains": [{"filters": [
                {"name": "envoy.filters.network.rbac", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC",
                    "stat_prefix": "deny", "rules": {}}},
                {"name": "envoy.filters.network.wasm", "typed_config": wasm},
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "tcp", "cluster": "backend"}}]}]}],
        "clusters": [{"name": "backend", "connect_timeout": "1s", "type": "STATIC",
            "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address":
                    {"address": "127.0.0.1", "port_value": 8080}}}}]}]}}]}});
    std::fs::write(&bootstrap, config.to_string()).unwrap();
    let mut tcp = Proxy::from_bootstrap(&bootstrap, &ProxyOptions::default()).unwrap();
    for events in [
        &[TcpEvent::Downstream(b"GET / HTTP/1.1\r\n\r\n".to_vec())][..],
        &[TcpEvent::CloseDownstream],
    ] {
        let c = tcp.connect(None, Some(0), events).unwrap();
        assert!(c.upstream_received.is_empty(), "{c:?}");
    }
    let taken = |m: &str| tcp.metric(&format!("wasm_filter.plugin.rec.role.stats-aggregator.{m}"));
    assert_eq!(taken("records_dropped_total"), Some(0));
    assert_eq!(taken("records_queued_total"), Some(0));
    assert!(lines(&tcp, "is not registered").is_empty());
    assert!(tcp.take_errors().is_empty());

    // The TCP role on an HTTP filter: requests are answered, nothing is counted.
    let mut http = role("tcp-total-data-size-counter", serde_json::json!({}), 1).unwrap();
    for _ in 0..2 {
        let ex = http
            .round_trip(&Request::get("/"), UpstreamReply::new(200))
            .unwrap();
        assert_eq!(ex.response_status(), Some(200));
    }
    assert_eq!(lines(&http, misplaced).len(), 1);
    assert!(lines(&http, "tcp connection closed").is_empty());
    assert!(http.take_errors().is_empty());
}
