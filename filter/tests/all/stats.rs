//! `stats-aggregator` in the harness, on the shipped bootstrap: records from streams on
//! every worker reach the one singleton service, which logs a summary on each tick and
//! posts it; a failed post carries its counts over to the next.

use std::time::Duration;

use wasm_harness::http::{CannedHttpCall, HttpCallAnswer};
use wasm_harness::{Proxy, ProxyOptions, Request, UpstreamReply};

use crate::support::bootstrap_copy;

fn summaries(proxy: &Proxy, from: usize) -> Vec<(Option<usize>, String)> {
    proxy.logs()[from..]
        .iter()
        .filter(|l| l.message.contains("stats"))
        .map(|l| (l.worker, l.message.clone()))
        .collect()
}

#[test]
fn records_from_every_worker_reach_the_singleton_and_a_failed_post_carries_over() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
    let mut proxy = Proxy::from_bootstrap(&bootstrap, &ProxyOptions::default()).unwrap();
    assert_eq!(proxy.workers(), 2);
    let registered: Vec<_> = proxy
        .logs()
        .iter()
        .filter(|l| l.message.contains("registered queue \"wasm-filter.stats\""))
        .map(|l| l.worker)
        .collect();
    // The canary and the main thread's singleton; never a worker.
    assert_eq!(registered, [None, None]);

    for (listener, worker, path, status) in [
        ("headers", 0, "/api/items", 200),
        ("headers", 1, "/api/items", 503),
        ("bodies", 1, "/upload", 200),
    ] {
        let ex = proxy
            .send(
                Some(listener),
                Some(worker),
                &Request::get(path),
                &mut |_| UpstreamReply::new(status),
            )
            .unwrap();
        assert_eq!(ex.response_status(), Some(status));
    }
    // The collector is down: the post fails, the counts wait.
    proxy.set_http_call_replies(vec![CannedHttpCall {
        cluster: "stats-collector".into(),
        path_prefix: None,
        answer: HttpCallAnswer::Reply(UpstreamReply::new(503)),
    }]);
    let before = proxy.log_len();
    proxy.advance(Duration::from_secs(5));
    let lines = summaries(&proxy, before);
    let want = r#"stats summary: {"latency_ms":{"<1":3},"requests":3,"routes":{"/api":{"2xx":1,"5xx":1},"/upload":{"2xx":1}}}"#;
    assert!(
        lines.iter().any(|(w, l)| w.is_none() && l.ends_with(want)),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|(_, l)| l.contains("answered 503; the 3 requests carry over")),
        "{lines:#?}"
    );
    assert_eq!(proxy.call_records().len(), 1);
    let posted = String::from_utf8_lossy(&proxy.call_records()[0].body).into_owned();
    assert_eq!(format!("stats summary: {posted}"), want);
    // Every worker VM can read the summary the singleton stored in shared data.
    let stored = proxy
        .shared_data("wasm-filter", "wasm-filter/stats/wasm-filter.stats/summary")
        .unwrap();
    assert_eq!(
        format!("stats summary: {}", String::from_utf8_lossy(&stored)),
        want
    );
    // Drained: nothing is counted as waiting on the queue.
    let queued = proxy
        .shared_data("wasm-filter", "wasm-filter/stats/wasm-filter.stats/queued")
        .unwrap();
    assert_eq!(queued, b"0");
    let metric = |m: &str| proxy.metric(&format!("wasm_filter.plugin.{m}"));
    assert_eq!(
        metric("stats-recorder.role.stats-aggregator.records_queued_total"),
        Some(3)
    );
    assert_eq!(
        metric("stats-aggregator.role.stats-aggregator.records_received_total"),
        Some(3)
    );
    assert_eq!(
        metric("stats-aggregator.role.stats-aggregator.post_failures_total"),
        Some(1)
    );

    // One more request, then the collector is back: the next summary has all four.
    proxy
        .send(
            Some("headers"),
            Some(0),
            &Request::get("/api/items"),
            &mut |_| UpstreamReply::new(200),
        )
        .unwrap();
    proxy.set_http_call_replies(vec![CannedHttpCall {
        cluster: "stats-collector".into(),
        path_prefix: Some("/v1/summaries".into()),
        answer: HttpCallAnswer::Reply(UpstreamReply::new(204)),
    }]);
    let before = proxy.log_len();
    proxy.advance(Duration::from_secs(5));
    let lines = summaries(&proxy, before);
    assert!(
        lines
            .iter()
            .any(|(_, l)| l.contains("\"requests\":4") && l.contains("\"2xx\":2")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|(_, l)| l.contains("summary of 4 requests posted to \"stats-collector\" (204)")),
        "{lines:#?}"
    );
    // Posted: the next window starts empty.
    let before = proxy.log_len();
    proxy.advance(Duration::from_secs(5));
    let lines = summaries(&proxy, before);
    assert!(
        lines.iter().any(|(_, l)| l.contains("\"requests\":0")),
        "{lines:#?}"
    );
    assert!(proxy.take_errors().is_empty());
}

/// With no service, records have nowhere to go: each is dropped and counted, and the log
/// says why once.
#[test]
fn records_with_no_service_are_dropped_and_counted() {
    let mut proxy = Proxy::for_module(crate::support::module())
        .configuration(r#"{"role": "stats-aggregator", "mode": "record"}"#)
        .name("rec")
        .vm_id("wasm-filter")
        .build()
        .unwrap();
    for _ in 0..5 {
        proxy
            .send(None, Some(0), &Request::get("/"), &mut |_| {
                UpstreamReply::new(200)
            })
            .unwrap();
    }
    let name = "wasm_filter.plugin.rec.role.stats-aggregator.records_dropped_total";
    assert_eq!(proxy.metric(name), Some(5));
    assert_eq!(crate::support::lines(&proxy, "is not registered").len(), 1);
}
