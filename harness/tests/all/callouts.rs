//! HTTP callouts: `testdata/guests/auth-callout.wat` pauses each request on a call to cluster
//! `auth` and resumes or denies it when the answer comes, the pattern external-auth filters
//! use. Answers come from canned replies, from a real upstream on loopback, or from what
//! Envoy's router makes up when the upstream fails; real Envoy runs the same scenarios.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use wasm_harness::Verdict;

use crate::support::*;

/// The shipped bootstrap with the auth guest as its filter and a cluster `auth` at `port`.
fn auth_bootstrap(
    dir: &std::path::Path,
    module: &std::path::Path,
    port: u16,
) -> std::path::PathBuf {
    bootstrap_variant(dir, module, None, move |doc| {
        let filter = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap();
        filter.as_object_mut().unwrap().remove("configuration");
        filter["name"] = "auth".into();
        filter["root_id"] = "auth".into();
        add_loopback_cluster(doc, "auth", port);
    })
}

const CANNED: &str = r#"  - name: allowed
    request: {headers: {authorization: "Bearer good"}}
    http_calls: [{cluster: auth, path: /check, reply: {status: 200, headers: {x-user: alice}}}]
    expect:
      calls: [{cluster: auth, headers: {":method": GET, ":path": /check, ":authority": auth, authorization: "Bearer good"}}]
      upstream: {headers: {x-user: alice}}
      response: {status: 200}
      logs: [auth allowed]
  - name: denied
    request: {headers: {authorization: "Bearer bad"}}
    http_calls: [{cluster: auth, reply: {status: 401, body: "bad token"}}]
    expect:
      calls: [{cluster: auth, headers: {authorization: "Bearer bad"}}]
      reached_upstream: false
      response: {status: 403, body: "bad token"}
      local_reply: plugin
      logs: [auth denied]
  - name: the auth service drops the connection
    request: {}
    http_calls: [{cluster: auth, disconnect: true}]
    expect:
      reached_upstream: false
      response: {status: 403, body: "upstream connect error or disconnect/reset before headers. reset reason: connection termination"}
"#;

#[test]
fn a_callout_pauses_the_request_and_its_answer_resumes_or_denies_it() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) is never called: every answer is canned.
    let b = auth_bootstrap(dir.path(), &guest("auth-callout.wat"), 9);
    let s = scenario(
        dir.path(),
        &b,
        &format!(
            "{CANNED}  - name: the call fails
    request: {{}}
    http_calls: [{{cluster: auth, reset: true}}]
    expect:
      response: {{status: 503, body: auth unavailable}}
      logs: [\"auth call failed: status 11 reset\"]
"
        ),
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The report names each call and its answer.
    assert!(
        text(&o).contains("http call to \"auth\": GET /check -> canned reply 200"),
        "{}",
        text(&o)
    );
}

/// Calls the auth service takes and never answers: without a timeout the request stays
/// paused; with one, Envoy's router answers 504 when it runs out.
const SILENT: &str = r#"  - name: the auth service never answers a call without a timeout
    request: {headers: {x-call-timeout-ms: "0"}}
    http_calls: [{cluster: auth, silent: true}]
    expect:
      paused: true
      calls: [{cluster: auth, headers: {":path": /check}, absent: [x-envoy-expected-rq-timeout-ms]}]
  - name: a call whose timeout runs out gets the router's 504
    request: {headers: {x-call-timeout-ms: "200"}}
    http_calls: [{cluster: auth, silent: true}]
    expect:
      calls: [{cluster: auth, headers: {x-envoy-expected-rq-timeout-ms: "200"}}]
      reached_upstream: false
      response: {status: 403, body: upstream request timeout}
      logs: [auth denied]
"#;

#[test]
fn real_envoy_answers_the_same_callouts_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "auth-callout.wat");
    let b = auth_bootstrap(dir.path(), &wasm, 9);
    let s = scenario(dir.path(), &b, &format!("{CANNED}{SILENT}"));
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report:#}");
    assert_eq!(report.cases.len(), 5, "{report:#}");
    // The call never answered: both held the stream (Envoy without waiting for a timeout).
    let held = &report.cases[3];
    assert!(held.harness.outcome.exchange().unwrap().stalled().is_some());
    let why = held.envoy.exchange().unwrap().stalled().unwrap();
    assert!(why.contains("envoy held the request"), "{report:#}");
}

/// A loopback HTTP server answering every request with `reply`, recording each request head.
fn auth_server(reply: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            record.lock().unwrap().push(head);
            let _ = (&conn).write_all(reply.as_bytes());
        }
    });
    (port, seen)
}

#[test]
fn without_a_canned_reply_the_call_reaches_a_real_loopback_upstream() {
    let (port, seen) = auth_server(
        "HTTP/1.1 200 OK\r\nx-user: bob\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let b = auth_bootstrap(dir.path(), &guest("auth-callout.wat"), port);
    let s = scenario(
        dir.path(),
        &b,
        "  - name: allowed by the real service
    request: {headers: {authorization: token-1}}
    expect: {upstream: {headers: {x-user: bob}}, calls: [{cluster: auth}]}
",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("upstream 127.0.0.1:{port}: 200")),
        "{}",
        text(&o)
    );
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("GET /check HTTP/1.1\r\n"), "{heads:?}");
    assert!(heads[0].contains("authorization: token-1\r\n"), "{heads:?}");
}

#[test]
fn an_unreachable_or_off_machine_upstream_is_answered_as_envoys_router_would() {
    // A port nobody listens on: connection refused, Envoy's router answers 503.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let b = auth_bootstrap(dir.path(), &guest("auth-callout.wat"), closed);
    let s = scenario(
        dir.path(),
        &b,
        "  - {name: refused, request: {}, expect: {response: {status: 403}, reached_upstream: false}}\n",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains(": 503"), "{}", text(&o));

    // An endpoint off this machine is never contacted; the report says what to add.
    let b = auth_bootstrap(dir.path(), &guest("auth-callout.wat"), 80);
    let mut doc: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
    doc["static_resources"]["clusters"][1]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        ["endpoint"]["address"]["socket_address"]["address"] = "192.0.2.10".into();
    let remote = dir.path().join("remote.yaml");
    std::fs::write(&remote, serde_json::to_string(&doc).unwrap()).unwrap();
    let s = scenario(
        dir.path(),
        &remote,
        "  - {name: remote, request: {}, expect: {response: {status: 403}}}\n",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("192.0.2.10:80 is not on loopback")
            && text(&o).contains("http_calls entry for \"auth\""),
        "{}",
        text(&o)
    );
}

#[test]
fn a_step_that_makes_other_calls_than_expected_fails_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let b = auth_bootstrap(dir.path(), &guest("auth-callout.wat"), 9);
    let s = scenario(
        dir.path(),
        &b,
        "  - name: two calls expected
    request: {}
    http_calls: [{cluster: auth, reply: {status: 200}}]
    expect: {calls: [{cluster: auth}, {cluster: auth}]}
  - name: wrong header
    request: {headers: {authorization: x}}
    http_calls: [{cluster: auth, reply: {status: 200}}]
    expect: {calls: [{cluster: auth, headers: {authorization: y}}]}
",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("calls: expected 2 callout(s), saw 1"), "{out}");
    assert!(
        out.contains(
            "call 1 (http \"auth\") header \"authorization\": expected \"y\", saw [\"x\"]"
        ),
        "{out}"
    );
}

#[test]
fn a_unary_grpc_call_gets_its_canned_message_or_status() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest("grpc-callout.wat"), None, |doc| {
        let clusters = doc
            .pointer_mut("/static_resources/clusters")
            .unwrap()
            .as_array_mut()
            .unwrap();
        let mut rl = clusters[0].clone();
        rl["name"] = "rl".into();
        clusters.push(rl);
    });
    let s = scenario(
        dir.path(),
        &b,
        "  - name: allowed
    request: {}
    grpc_calls: [{cluster: rl, service: ratelimit.v1.RateLimit, method: Check, message: OK}]
    expect:
      calls: [{cluster: rl, kind: grpc, headers: {':path': /ratelimit.v1.RateLimit/Check}, body: check}]
      upstream: {headers: {x-grpc-reply: OK}}
  - name: over the limit
    request: {}
    grpc_calls: [{cluster: rl, method: Check, status: 8, status_message: slow down}]
    expect:
      response: {status: 429, body: \"slow down{via_upstream}\"}
      logs: [grpc closed]
  - name: another method is not canned
    request: {}
    grpc_calls: [{cluster: rl, method: Report, message: OK}]
    expect:
      response: {status: 429}
",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("no canned reply for ratelimit.v1.RateLimit/Check"),
        "{}",
        text(&o)
    );
}

/// To a gRPC request Envoy's local replies are trailers-only gRPC responses: HTTP 200,
/// `grpc-status` mapped from the HTTP status, the body as `grpc-message`.
#[test]
fn local_replies_to_grpc_requests_are_grpc_responses_like_envoys() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "auth-callout.wat");
    let b = auth_bootstrap(dir.path(), &wasm, 9);
    let s = scenario(
        dir.path(),
        &b,
        r#"  - name: denied over gRPC
    request: {method: POST, path: /pkg.Svc/Get, headers: {content-type: application/grpc, te: trailers}}
    http_calls: [{cluster: auth, reply: {status: 401, body: "bad token: 100%"}}]
    expect:
      response: {status: 200, headers: {grpc-status: '7', grpc-message: "bad token: 100%25", content-type: application/grpc}}
  - name: direct response to a gRPC request
    request: {method: POST, path: /healthz, headers: {content-type: application/grpc}}
    http_calls: [{cluster: auth, reply: {status: 200}}]
    expect:
      response: {status: 200}
"#,
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
}

/// Calls made from `proxy_on_tick` are answered on the thread that made them, like a
/// stream's: each worker (and the main thread's instance) refreshes its own token.
#[test]
fn calls_from_ticks_are_answered_on_each_worker() {
    let dir = tempfile::tempdir().unwrap();
    let b = auth_bootstrap(dir.path(), &guest("tick-callout.wat"), 9);
    let path = dir.path().join("ticks.yaml");
    std::fs::write(
        &path,
        format!(
            "bootstrap: {}
workers: 2
http_calls: [{{cluster: auth, path: /token, reply: {{status: 200, body: t0k3n}}}}]
requests:
  - advance: 3s
    expect:
      log_counts:
        - {{contains: token refreshed, count: 9}}
        - {{contains: token refreshed, worker: main, count: 3}}
        - {{contains: token refreshed, worker: 0, count: 3}}
        - {{contains: token refreshed, worker: 1, count: 3}}
",
            b.display()
        ),
    )
    .unwrap();
    let o = harness(&["run", "--json", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let calls = report["scenarios"][0]["cases"][0]["calls"]
        .as_array()
        .unwrap();
    assert_eq!(calls.len(), 9, "{report:#}");
    assert!(
        calls
            .iter()
            .all(|c| c["answer"] == "canned reply 200" && c["cluster"] == "auth"),
        "{report:#}"
    );
}

/// A callout to the cluster the route also uses: real Envoy's upstream sees both requests,
/// and the comparison tells the callout (marked by Envoy's async client) from the routed
/// request, so each is compared with its counterpart in the harness.
#[test]
fn a_callout_to_the_routes_own_cluster_is_told_apart_from_the_routed_request() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "auth-callout.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |doc| {
        let filter = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap();
        filter.as_object_mut().unwrap().remove("configuration");
        filter["root_id"] = "auth".into();
        add_loopback_cluster(doc, "auth", 9);
        let route = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/1/route")
            .unwrap();
        route["cluster"] = "auth".into();
    });
    let s = scenario(
        dir.path(),
        &b,
        r#"  - name: the call and the routed request reach the same cluster
    request: {path: /api/items, headers: {authorization: "Bearer good"}}
    http_calls: [{cluster: auth, path: /check, reply: {status: 200, headers: {x-user: alice}}}]
    upstream: {status: 200, body: routed}
    expect:
      calls: [{cluster: auth, headers: {":path": /check, authorization: "Bearer good", x-envoy-internal: "true"}}]
      upstream: {headers: {":path": /api/items, x-user: alice}, absent: [x-envoy-internal]}
      response: {status: 200, body: routed}
  - name: a routed request whose path the canned call also matches gets the upstream's reply
    request: {path: /check/me}
    http_calls: [{cluster: auth, path: /check, reply: {status: 200, headers: {x-user: bob}}}]
    upstream: {status: 202, body: routed}
    expect:
      calls: [{cluster: auth}]
      upstream: {headers: {":path": /check/me, x-user: bob}}
      response: {status: 202, body: routed}
"#,
    );
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 2, "{report}");
}

/// The same callouts to an `auth` cluster Envoy speaks HTTP/2 to: real Envoy's loopback
/// upstream answers over HTTP/2, and a disconnect closes the connection, as over HTTP/1.1.
#[test]
fn callouts_to_an_http2_cluster_are_answered_and_compared_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "auth-callout.wat");
    let b = auth_bootstrap(dir.path(), &wasm, 9);
    let mut doc: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
    doc["static_resources"]["clusters"][1]["http2_protocol_options"] = serde_json::json!({});
    std::fs::write(&b, serde_norway::to_string(&doc).unwrap()).unwrap();
    let s = scenario(dir.path(), &b, CANNED);
    let report = differential(&s);
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 3, "{report}");
}
