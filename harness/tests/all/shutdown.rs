//! Root contexts at shutdown: `proxy_on_done`, then `proxy_on_delete` at once or after the
//! root calls `proxy_done`; checked against real Envoy's exit.

use std::time::Duration;

use wasm_harness::envoy::proxy::PendingRoot;
use wasm_harness::{Proxy, ProxyOptions, Request, UpstreamReply};

use crate::support::*;

fn messages(proxy: &Proxy, from: usize) -> Vec<(Option<usize>, String)> {
    proxy.logs()[from..]
        .iter()
        .map(|r| (r.worker, r.message.clone()))
        .collect()
}

#[test]
fn every_root_gets_on_done_then_on_delete_like_real_envoy_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "shutdown.wat");
    let b = bootstrap_variant(dir.path(), &module, Some(""), |_| {});

    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(2)).unwrap();
    proxy
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    let before = proxy.log_len();
    assert_eq!(proxy.shutdown(), []);
    let root = |w: Option<usize>| {
        [
            (w, "root on_done 1".to_string()),
            (w, "root on_delete 1".to_string()),
        ]
    };
    // Workers first, then the main thread, as Envoy's exit showed.
    let expected: Vec<_> = [Some(0), Some(1), None]
        .into_iter()
        .flat_map(root)
        .collect();
    assert_eq!(messages(&proxy, before), expected);
    let refused = proxy
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap_err();
    assert!(
        matches!(refused, wasm_harness::TrafficError::ShutDown),
        "{refused}"
    );
    let harness_lines: Vec<String> = proxy.logs().iter().map(|r| r.message.clone()).collect();

    let mut real = wasm_harness::real_envoy::RealEnvoy::start(&envoy(), &b, 2).unwrap();
    real.send(None, &Request::get("/"), &UpstreamReply::new(200))
        .unwrap();
    real.shutdown(Duration::from_secs(20)).unwrap();
    let envoy_lines = real.wasm_logs();
    for needle in [
        "proxy_done while running -> 1",
        "stream on_done",
        "root on_done 1",
        "root on_delete 1",
    ] {
        let h = harness_lines.iter().filter(|l| l.contains(needle)).count();
        let e = envoy_lines.iter().filter(|l| l.contains(needle)).count();
        assert_eq!(h, e, "{needle:?}: harness {h}, Envoy {e}\n{envoy_lines:#?}");
    }
    // On each of Envoy's threads, the root's on_delete follows its on_done directly.
    let thread = |l: &String| l.split("][").nth(1).unwrap_or_default().to_string();
    let done: Vec<String> = envoy_lines
        .iter()
        .filter(|l| l.contains("root on_done"))
        .map(thread)
        .collect();
    for t in &done {
        let mine: Vec<&String> = envoy_lines
            .iter()
            .filter(|l| thread(l) == *t && l.contains("root on_"))
            .collect();
        assert!(
            mine.len() == 2 && mine[1].contains("on_delete"),
            "{mine:#?}"
        );
    }
}

#[test]
fn a_root_that_answers_false_lives_until_it_calls_proxy_done() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest("shutdown.wat"), Some("wait"), |_| {});
    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(2)).unwrap();
    assert_eq!(
        proxy.advance(Duration::from_secs(5)),
        0,
        "no tick before shutdown"
    );
    let pending = proxy.shutdown();
    assert_eq!(
        pending,
        [Some(0), Some(1), None].map(|worker| PendingRoot { worker, root: 1 })
    );
    assert!(!messages(&proxy, 0)
        .iter()
        .any(|(_, m)| m.contains("on_delete")));

    // Its tick (armed in on_done) still comes; proxy_done succeeds there, and on_delete
    // follows once the tick has returned.
    let before = proxy.log_len();
    assert_eq!(proxy.advance(Duration::from_secs(1)), 3);
    let on_worker_0: Vec<String> = messages(&proxy, before)
        .into_iter()
        .filter(|(w, _)| *w == Some(0))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(
        on_worker_0,
        ["flushing", "proxy_done -> 0", "root on_delete 1"]
    );
    assert_eq!(proxy.pending_done(), []);
    // The deleted roots tick no more.
    assert_eq!(proxy.advance(Duration::from_secs(3)), 0);
}

#[test]
fn a_scenario_can_shut_the_proxy_down_in_the_harness_and_in_real_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "shutdown.wat");
    let b = bootstrap_variant(dir.path(), &module, Some(""), |_| {});
    let s = dir.path().join("shutdown.yaml");
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}
workers: 2
requests:
  - {{name: a request, request: {{path: /}}, expect: {{response: {{status: 200}}, logs: [stream on_done]}}}}
  - shutdown: true
    expect:
      log_counts:
        - {{contains: root on_done, count: 3}}
        - {{contains: root on_delete, count: 3}}
        - {{contains: root on_delete, worker: main, count: 1}}
",
            b.display()
        ),
    )
    .unwrap();
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("ok   shutdown"), "{}", text(&o));

    let report = wasm_harness::run_comparison(
        &envoy(),
        &s,
        &wasm_harness::RunOptions {
            workers: None,
            bootstrap: None,
            ..Default::default()
        },
    );
    assert_eq!(report.verdict, wasm_harness::Verdict::Passed, "{report}");
    // And a wrong count is caught on Envoy's side too.
    let wrong = std::fs::read_to_string(&s).unwrap().replace(
        "{contains: root on_done, count: 3}",
        "{contains: root on_done, count: 2}",
    );
    std::fs::write(&s, wrong).unwrap();
    let report = wasm_harness::run_comparison(
        &envoy(),
        &s,
        &wasm_harness::RunOptions {
            workers: None,
            bootstrap: None,
            ..Default::default()
        },
    );
    assert!(
        report.cases[1]
            .envoy_failures
            .iter()
            .any(|f| f.contains("Envoy wrote 3")),
        "{report}"
    );
}
