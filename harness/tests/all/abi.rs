//! ABI versions and guests that misbehave on purpose: bad pointers, a memory bomb, an import
//! the module's ABI does not have. Each guest marks the request with what it observed, so the
//! test checks what the host answered from inside the guest.

use wasm_harness::Verdict;

use crate::support::*;

fn run(guest_file: &str, config: Option<&str>, requests: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest(guest_file), config, |_| {});
    let s = scenario(dir.path(), &b, requests);
    harness(&["run", s.to_str().unwrap()])
}

#[test]
fn an_abi_0_1_0_module_gets_the_0_1_0_host() {
    // Two-argument header callbacks, proxy_get_configuration, and Ok+"" for a missing header.
    let o = run(
        "abi-0-1-0.wat",
        Some("v010"),
        "  - {name: v010, request: {path: /}, expect: {upstream: {headers: {x-abi: 0.1.0}}}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The configuration is read with the 0.1.0 call: another one is refused by the guest.
    let o = run("abi-0-1-0.wat", Some("v999"), "");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("proxy_on_configure returned false"),
        "{}",
        text(&o)
    );
}

#[test]
fn an_import_outside_the_modules_abi_does_not_link() {
    let o = run("abi-0-2-0-log-level.wat", None, "");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("import env.proxy_get_log_level is not part of Proxy-Wasm ABI 0.2.0"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_pointers_get_invalid_memory_access_and_the_host_carries_on() {
    let o = run(
        "bad-pointers.wat",
        None,
        "  - {name: bad pointers, request: {path: /}, expect: {response: {status: 200}, upstream: {headers: {x-bad-pointers: rejected}}}}\n  - {name: still serving, request: {path: /}, expect: {response: {status: 200}}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn memory_growth_stops_at_envoys_1_gib_cap_without_a_trap() {
    let o = run(
        "memory-bomb.wat",
        None,
        "  - {name: bomb, worker: 0, request: {path: /}, expect: {response: {status: 200}, upstream: {headers: {x-memory: capped}}}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// The same guests in real Envoy (V8 takes binary modules only, so the text is assembled
/// first): what the guests observe must be what they observe in the harness.
#[test]
fn real_envoy_agrees_on_abi_0_1_0_bad_pointers_and_the_memory_cap() {
    for (file, config, header, value) in [
        ("abi-0-1-0.wat", Some("v010"), "x-abi", "0.1.0"),
        ("bad-pointers.wat", None, "x-bad-pointers", "rejected"),
        ("memory-bomb.wat", None, "x-memory", "capped"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let wasm = assembled(dir.path(), file);
        let b = bootstrap_variant(dir.path(), &wasm, config, |_| {});
        let s = scenario(
            dir.path(),
            &b,
            &format!("  - {{name: {file}, request: {{path: /}}, expect: {{upstream: {{headers: {{{header}: '{value}'}}}}}}}}\n"),
        );
        let report = differential(&s);
        assert_eq!(report.verdict, Verdict::Passed, "{file}: {report}");
        let seen = report.cases[0]
            .envoy
            .exchange()
            .and_then(|e| e.upstream.as_ref());
        assert!(
            seen.is_some_and(|u| u
                .headers
                .iter()
                .any(|(k, v)| k == header && v == value.as_bytes())),
            "{file}: Envoy's upstream did not see {header}: {value}: {report}"
        );
    }
}

#[test]
fn node_metadata_and_request_properties_match_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "properties.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
        doc["node"] = serde_json::json!({"id": "sidecar~10.0.0.1~web", "cluster": "web", "metadata": {"team": "payments"}});
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: properties\n    request: {path: /, headers: {x-multi: abc}}\n    expect: {upstream: {headers: {x-team: payments, x-node-id: sidecar~10.0.0.1~web, x-multi-joined: abc, x-mtls: 'false'}}}\n",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

#[test]
fn fail_reload_recreates_a_trapped_vm_after_the_backoff_like_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "trap-on-path.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
        doc.pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap()["failure_policy"] = serde_json::json!("FAIL_RELOAD");
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - {name: alive, request: {path: /}, expect: {response: {status: 200}, upstream: {headers: {x-alive: '1'}}}}
  - {name: trap, request: {path: /trap}, expect: {response: {status: 503}, local_reply: failure_policy}}
  - {name: within the backoff, request: {path: /}, expect: {response: {status: 503}, local_reply: failure_policy}}
  - advance: 1500ms
  - {name: reloaded, request: {path: /}, expect: {response: {status: 200}, upstream: {headers: {x-alive: '1'}}, logs: [trap-on-path VM started]}}
",
    );
    let o = harness(&["run", "--workers", "1", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

#[test]
fn custom_metrics_are_proxy_wide_across_workers() {
    let o = run(
        "counter.wat",
        None,
        "  - {name: first, worker: 0, request: {path: /}, expect: {metrics: {requests: 1}}}
  - {name: second on the other worker, worker: 1, request: {path: /}, expect: {metrics: {wasmcustom.requests: 2}}}
  - {name: third, worker: 0, request: {path: /}, expect: {metrics: {requests: 3}}}
",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = run(
        "counter.wat",
        None,
        "  - {name: wrong, request: {path: /}, expect: {metrics: {requests: 5, undefined: 1}}}\n",
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("metric requests: expected 5, got 1"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains("metric undefined: expected 1, but the plugin never defined it"),
        "{}",
        text(&o)
    );
}

#[test]
fn real_envoy_counts_custom_metrics_proxy_wide_too() {
    use wasm_harness::http::{Request, UpstreamReply};
    use wasm_harness::real_envoy::RealEnvoy;
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "counter.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |_| {});
    let mut real = RealEnvoy::start(&envoy(), &b, 2).unwrap();
    let request = Request {
        method: "GET".into(),
        path: "/".into(),
        authority: "demo.local".into(),
        ..Default::default()
    };
    let reply = UpstreamReply {
        status: 200,
        ..Default::default()
    };
    for _ in 0..3 {
        real.send(None, &request, &reply).unwrap();
    }
    // Envoy flushes stats asynchronously; give it a moment.
    let start = std::time::Instant::now();
    while real.stat("wasmcustom.requests") != Some(3) && start.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        real.stat("wasmcustom.requests"),
        Some(3),
        "{}",
        real.log_tail()
    );
}

#[test]
fn a_cas_race_between_workers_ends_in_cas_mismatch_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "cas.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |_| {});
    let race = |worker_of_bump: usize| {
        format!(
            "  - {{name: init, worker: 0, request: {{path: /init}}, expect: {{upstream: {{headers: {{x-result: init}}}}, shared_data: {{wasm-filter: {{k: i}}}}}}}}
  - {{name: read, worker: 0, request: {{path: /read}}, expect: {{upstream: {{headers: {{x-result: read}}}}}}}}
  - {{name: bump, worker: {worker_of_bump}, request: {{path: /bump}}, expect: {{upstream: {{headers: {{x-result: bumped}}}}, shared_data: {{wasm-filter: {{k: b}}}}}}}}
  - {{name: stale write, worker: 0, request: {{path: /stale}}, expect: {{upstream: {{headers: {{x-result: cas-mismatch}}}}, shared_data: {{wasm-filter: {{k: b}}}}}}}}
"
        )
    };
    // Two workers: the bump on the other worker wins; the stale CAS loses.
    let s = scenario(dir.path(), &b, &race(1));
    let o = harness(&["run", "--workers", "2", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // A wrong expectation on shared data is reported with what was there.
    let wrong = scenario(
        dir.path(),
        &b,
        "  - {name: init, request: {path: /init}, expect: {shared_data: {wasm-filter: {k: z, other: x}}}}\n",
    );
    let o = harness(&["run", wrong.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(r#"shared data wasm-filter/k: expected "z", got "i""#),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains(r#"shared data wasm-filter/other: expected "x", but it is not set"#),
        "{}",
        text(&o)
    );
    // Real Envoy (one worker, so the kept CAS stays in one VM) answers each step the same.
    let s = scenario(dir.path(), &b, &race(0));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

/// `source.*` / `destination.*` / `connection.id` answer on streams as in Envoy: addresses
/// as `ip:port` text, ports and ids as 8-byte integers. The values differ by nature (Envoy's
/// client port is ephemeral, its listener port chosen at start), so each side is checked
/// for its own.
#[test]
fn connection_addresses_answer_like_envoys() {
    use wasm_harness::http::{Request, UpstreamReply};
    use wasm_harness::real_envoy::RealEnvoy;
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "addresses.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |_| {});
    let request = Request {
        method: "GET".into(),
        path: "/".into(),
        authority: "demo.local".into(),
        ..Default::default()
    };
    let reply = |_: &wasm_harness::SeenRequest| UpstreamReply {
        status: 200,
        ..Default::default()
    };
    let mut proxy = wasm_harness::Proxy::from_bootstrap(&b, &Default::default()).unwrap();
    let seen = proxy
        .send(None, None, &request, &mut { reply })
        .unwrap()
        .upstream
        .unwrap();
    let header = |h: &wasm_harness::engine::host::HeaderMap, k: &str| {
        wasm_harness::http::header(h, k).map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(
        header(&seen.headers, "x-source").as_deref(),
        Some("127.0.0.1:40001")
    );
    assert_eq!(
        header(&seen.headers, "x-destination").as_deref(),
        Some("127.0.0.1:10000")
    );
    assert_eq!(header(&seen.headers, "x-ints").as_deref(), Some("ok"));

    let mut real = RealEnvoy::start(&envoy(), &b, 1).unwrap();
    let ex = real
        .send(
            None,
            &request,
            &UpstreamReply {
                status: 200,
                ..Default::default()
            },
        )
        .unwrap();
    let seen = ex.upstream.unwrap();
    for k in ["x-source", "x-destination"] {
        let v = header(&seen.headers, k).unwrap_or_default();
        let port = v
            .strip_prefix("127.0.0.1:")
            .and_then(|p| p.parse::<u16>().ok());
        assert!(port.is_some(), "envoy's {k}: {v:?}");
    }
    assert_eq!(header(&seen.headers, "x-ints").as_deref(), Some("ok"));
}

/// `proxy_call_foreign_function`: Envoy's `compress` / `uncompress` round trip, a
/// serialization failure for bytes that are not zlib, `NotFound` for an unknown name, and
/// `clear_route_cache` without result pointers; the same statuses in the harness and Envoy.
#[test]
fn foreign_functions_answer_like_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "foreign.wat");
    let b = bootstrap_variant(dir.path(), &module, None, |_| {});
    let expected = "compress=0 uncompress=0 same=1 garbage=3 unknown=1 clear=0";

    let mut proxy =
        wasm_harness::Proxy::from_bootstrap(&b, &wasm_harness::ProxyOptions::with_workers(1))
            .unwrap();
    let ex = proxy
        .round_trip(
            &wasm_harness::Request::get("/"),
            wasm_harness::UpstreamReply::new(200),
        )
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    let harness_says: Vec<String> = proxy
        .logs()
        .iter()
        .filter(|l| l.message.starts_with("compress="))
        .map(|l| l.message.clone())
        .collect();
    assert_eq!(harness_says, [expected]);

    let mut real = wasm_harness::real_envoy::RealEnvoy::start(&envoy(), &b, 1).unwrap();
    real.send(
        None,
        &wasm_harness::Request::get("/"),
        &wasm_harness::UpstreamReply::new(200),
    )
    .unwrap();
    real.shutdown(std::time::Duration::from_secs(20)).unwrap();
    let envoy_says: Vec<String> = real
        .wasm_logs()
        .into_iter()
        .filter(|l| l.contains("compress="))
        .collect();
    assert_eq!(envoy_says.len(), 1, "{envoy_says:?}");
    assert!(envoy_says[0].ends_with(expected), "{envoy_says:?}");
}
