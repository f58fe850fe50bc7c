//! The VM and plugin contexts every role shares: VM configuration, refusals that name the
//! field, roots that never trap, and what a role on the wrong kind of filter does.

use wasm_harness::{Proxy, Request, StartError, TcpEvent, UpstreamReply};

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

/// The SDK's dispatcher makes each stream the kind of context its root says (the TCP role's
/// a stream context, every other role's an HTTP context) and traps on a callback for a
/// context of the other kind: a role on the wrong kind of filter traps its VM at its first
/// stream, which then gets the plugin's failure policy (docs/filter.md, Known limits).
#[test]
fn a_role_on_the_wrong_kind_of_filter_traps_its_vm_at_its_first_stream() {
    let trapped = "invalid context_id";
    // An HTTP role on a network filter: the connection is closed (fail closed).
    let mut tcp = Proxy::for_module(module())
        .configuration(r#"{"role": "http-header-operation"}"#)
        .tcp()
        .workers(1)
        .build()
        .unwrap();
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
    assert!(c.upstream_received.is_empty(), "{c:?}");
    assert_eq!(lines(&tcp, trapped).len(), 1, "{:?}", tcp.logs());

    // The TCP role on an HTTP filter: the request gets the failure policy's answer.
    let mut http = role("tcp-total-data-size-counter", serde_json::json!({}), 1).unwrap();
    let ex = http
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(503), "{ex:?}");
    assert_eq!(lines(&http, trapped).len(), 1, "{:?}", http.logs());
    assert!(lines(&http, "tcp connection closed").is_empty());
}
