//! `http-header-operation` in the harness: op order, pseudo-headers, `when` conditions, and
//! a `:path` rewrite that lands on another route.

use wasm_harness::{Proxy, ProxyOptions, Request, StartError, UpstreamReply};

use crate::support::{module, role};

fn header_ops(config: serde_json::Value) -> Result<Proxy, StartError> {
    role("http-header-operation", config, 1)
}

#[test]
fn request_and_response_headers_are_removed_set_and_added_in_that_order() {
    let mut proxy = header_ops(serde_json::json!({
        "request": {
            "remove": ["x-secret"],
            "set": [{"name": "x-env", "value": "test"}],
            "add": [{"name": "x-env", "value": "added"}, {"name": "x-by", "value": "wasm"}]
        },
        "response": {"set": [{"name": "cache-control", "value": "no-store"}], "remove": ["server", "x-backend"]}
    }))
    .unwrap();
    let exchange = proxy
        .round_trip(
            &Request::get("/items")
                .header("x-secret", "s3cr3t")
                .header("x-env", "prod"),
            UpstreamReply::new(200)
                .header("server", "backend/1.2")
                .header("x-backend", "b-7")
                .header("cache-control", "max-age=60")
                .body("[]"),
        )
        .unwrap();

    assert_eq!(exchange.upstream_header("x-secret"), None);
    assert_eq!(exchange.upstream_header("x-by"), Some("wasm"));
    let seen = exchange.upstream.as_ref().unwrap();
    let env: Vec<&[u8]> = seen
        .headers
        .iter()
        .filter(|(k, _)| k == "x-env")
        .map(|(_, v)| v.as_slice())
        .collect();
    assert_eq!(
        env,
        [&b"test"[..], b"added"],
        "set replaces, then add appends"
    );

    assert_eq!(exchange.response_status(), Some(200));
    assert_eq!(exchange.response_header("cache-control"), Some("no-store"));
    assert_eq!(exchange.response_header("x-backend"), None);
    // Removing `server` is not enough: Envoy's connection manager writes its own after the
    // filters (server_header_transformation OVERWRITE), and the harness does as Envoy does.
    assert_eq!(exchange.response_header("server"), Some("envoy"));
    assert_eq!(exchange.response().unwrap().body, b"[]");
}

#[test]
fn a_path_set_by_the_filter_is_what_the_upstream_sees() {
    let mut proxy = header_ops(serde_json::json!({
        "request": {"set": [{"name": ":path", "value": "/v2/items"}]}
    }))
    .unwrap();
    let exchange = proxy
        .round_trip(&Request::get("/items"), UpstreamReply::new(204))
        .unwrap();
    assert_eq!(exchange.upstream_header(":path"), Some("/v2/items"));
    assert_eq!(exchange.response_status(), Some(204));
}

#[test]
fn a_bad_configuration_is_rejected_at_start_with_the_filters_reason() {
    let e = header_ops(serde_json::json!({
        "request": {"add": [{"name": "bad name", "value": "x"}]}
    }))
    .err()
    .expect("the canary must refuse the configuration");
    let text = e.to_string();
    assert!(matches!(e, StartError::Rejected { .. }), "{text}");
    assert!(text.contains("proxy_on_configure returned false"), "{text}");
    assert!(text.contains("invalid plugin configuration"), "{text}");
    assert!(text.contains("bad name"), "{text}");
}

#[test]
fn the_main_thread_and_every_worker_configure_their_own_vm() {
    let proxy = Proxy::for_module(module())
        .configuration(r#"{"role": "http-header-operation"}"#)
        .workers(3)
        .build()
        .unwrap();
    let configured = proxy
        .logs()
        .iter()
        .filter(|l| l.message.contains("configured role http-header-operation"))
        .map(|l| l.worker)
        .collect::<Vec<_>>();
    // The canary and the main thread's instance (no worker: Envoy's main thread has one of
    // every plugin), then workers 0, 1 and 2.
    assert_eq!(configured, [None, None, Some(0), Some(1), Some(2)]);
}

#[test]
fn ops_apply_only_to_requests_matching_when() {
    let mut proxy = header_ops(serde_json::json!({
        "when": {"methods": ["POST"], "path_prefix": "/api", "headers": [{"name": "x-tenant", "value": "blue"}]},
        "request": {"add": [{"name": "x-matched", "value": "yes"}]},
        "response": {"add": [{"name": "x-matched", "value": "yes"}]}
    }))
    .unwrap();
    let matching = Request::post("/api/orders?id=1", "{}").header("x-tenant", "blue");
    let ex = proxy
        .round_trip(&matching, UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.upstream_header("x-matched"), Some("yes"));
    assert_eq!(ex.response_header("x-matched"), Some("yes"));
    for other in [
        Request::get("/api/orders").header("x-tenant", "blue"),
        Request::post("/web", "{}").header("x-tenant", "blue"),
        Request::post("/api/orders", "{}").header("x-tenant", "red"),
        Request::post("/api/orders", "{}"),
    ] {
        let ex = proxy.round_trip(&other, UpstreamReply::new(200)).unwrap();
        assert_eq!(ex.upstream_header("x-matched"), None, "{other:?}");
        assert_eq!(ex.response_header("x-matched"), None, "{other:?}");
    }
}

#[test]
fn a_rewritten_path_is_routed_again() {
    // The shipped bootstrap's header listener sends /v2/... to the `backend-v2` cluster; the
    // filter rewrites /legacy/... there (Envoy clears the route cache after request filters
    // change headers, so the new path picks the route).
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = crate::support::bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
    let mut proxy = Proxy::from_bootstrap(&bootstrap, &ProxyOptions::default()).unwrap();
    let ex = proxy
        .send(
            Some("headers"),
            None,
            &Request::get("/legacy/items"),
            &mut |seen| {
                UpstreamReply::new(if seen.cluster == "backend-v2" {
                    200
                } else {
                    404
                })
            },
        )
        .unwrap();
    assert_eq!(ex.upstream_header(":path"), Some("/v2/items"));
    assert_eq!(
        ex.upstream.as_ref().map(|u| u.cluster.as_str()),
        Some("backend-v2")
    );
    assert_eq!(ex.response_status(), Some(200));
}
