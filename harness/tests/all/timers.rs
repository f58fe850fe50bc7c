//! Ticks and shared-queue notifications on the virtual clock, with the hand-written guests
//! `tick.wat` and `queue.wat`: through the library (exact order and clock readings) and through
//! scenario files run by the CLI (what a user writes).

use std::time::Duration;

use wasm_harness::engine::host::LogRecord;
use wasm_harness::{Proxy, ProxyOptions, Request, UpstreamReply};

use crate::support::*;

/// 2026-01-01T00:00:00Z in ns: where the harness's wall clock starts.
const START: u64 = wasm_harness::engine::host::time::START_WALL_NANOS;
const SECOND: u64 = 1_000_000_000;
/// WASI's monotonic clock at the start: Envoy's steady clock counts from the machine's boot.
const STEADY: u64 = wasm_harness::engine::host::time::START_STEADY_NANOS;

fn proxy_with(dir: &std::path::Path, guest_file: &str, config: &str, workers: usize) -> Proxy {
    let b = bootstrap_variant(dir, &guest(guest_file), Some(config), |_| {});
    Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(workers)).unwrap()
}

/// Log lines since `from` that contain `needle`, as (worker, message).
fn lines(proxy: &Proxy, from: usize, needle: &str) -> Vec<(Option<usize>, String)> {
    proxy.logs()[from..]
        .iter()
        .filter(|r: &&LogRecord| r.message.contains(needle))
        .map(|r| (r.worker, r.message.clone()))
        .collect()
}

fn get(proxy: &mut Proxy, worker: usize) -> u16 {
    let request = Request {
        method: "GET".into(),
        path: "/".into(),
        authority: "demo.local".into(),
        ..Default::default()
    };
    let ex = proxy
        .send(None, Some(worker), &request, &mut |_| UpstreamReply {
            status: 200,
            ..Default::default()
        })
        .unwrap();
    ex.response().unwrap().status
}

#[test]
fn each_worker_and_the_main_thread_tick_once_per_period_on_the_virtual_clock() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = proxy_with(dir.path(), "tick.wat", "", 2);
    assert_eq!(
        lines(&proxy, 0, "on_tick").len(),
        0,
        "no tick before the clock moves"
    );
    assert_eq!(get(&mut proxy, 0), 200);
    assert_eq!(
        lines(&proxy, 0, "on_tick").len(),
        0,
        "requests do not move the clock"
    );

    let before = proxy.log_len();
    // The main thread's instance of the plugin ticks too, as in Envoy (see
    // envoy::real_envoy_ticks_on_the_main_thread_and_each_worker).
    assert_eq!(proxy.advance(Duration::from_secs(3)), 9);
    assert_eq!(proxy.elapsed(), Duration::from_secs(3));
    let ticks = lines(&proxy, before, "on_tick");
    // In time order, the main thread then worker 0 first at equal times; the clocks read the
    // tick's own time.
    let expected: Vec<(Option<usize>, String)> = (1..=3u64)
        .flat_map(|n| {
            [None, Some(0), Some(1)].map(|w| {
                (
                    w,
                    format!(
                        "on_tick root=1 n={n} now={} mono={}",
                        START + n * SECOND,
                        STEADY + n * SECOND
                    ),
                )
            })
        })
        .collect();
    assert_eq!(ticks, expected);

    // Half a period crosses no boundary; the next half does.
    let before = proxy.log_len();
    assert_eq!(proxy.advance(Duration::from_millis(500)), 0);
    assert_eq!(proxy.advance(Duration::from_millis(500)), 3);
    let ticks = lines(&proxy, before, "on_tick");
    assert_eq!(ticks.len(), 3);
    assert!(ticks[0].1.ends_with(&format!(
        "n=4 now={} mono={}",
        START + 4 * SECOND,
        STEADY + 4 * SECOND
    )));
    assert!(proxy.take_errors().is_empty());
}

#[test]
fn a_period_of_zero_stops_the_ticks() {
    let dir = tempfile::tempdir().unwrap();
    // "stop": the guest sets the period to 0 during its second tick.
    let mut proxy = proxy_with(dir.path(), "tick.wat", "stop", 2);
    assert_eq!(proxy.advance(Duration::from_secs(10)), 6);
    for w in [None, Some(0), Some(1)] {
        let mine: Vec<_> = lines(&proxy, 0, "on_tick")
            .into_iter()
            .filter(|(worker, _)| *worker == w)
            .collect();
        assert_eq!(mine.len(), 2, "worker {w:?}: {mine:?}");
    }
}

#[test]
fn a_period_set_from_a_request_ticks_that_workers_root_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = proxy_with(dir.path(), "tick.wat", "request", 2);
    assert_eq!(
        proxy.advance(Duration::from_secs(2)),
        0,
        "no period set yet"
    );
    assert_eq!(get(&mut proxy, 1), 200);
    let before = proxy.log_len();
    // 500 ms from the request, at t = 2 s: ticks at 2.5, 3, 3.5 and 4 s.
    assert_eq!(proxy.advance(Duration::from_secs(2)), 4);
    let ticks = lines(&proxy, before, "on_tick");
    assert!(ticks.iter().all(|(w, _)| *w == Some(1)), "{ticks:?}");
    assert!(
        ticks[0]
            .1
            .contains(&format!("now={}", START + 2 * SECOND + SECOND / 2)),
        "{ticks:?}"
    );
}

#[test]
fn queue_notifications_go_to_the_last_registrant_after_the_enqueuing_callback() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = proxy_with(dir.path(), "queue.wat", "", 2);
    // A request on worker 0 registers the queue for its root and enqueues "req": the
    // notification is delivered once on_request_headers has returned.
    assert_eq!(get(&mut proxy, 0), 200);
    let seq: Vec<_> = proxy
        .logs()
        .iter()
        .map(|r| (r.worker, r.message.clone()))
        .collect();
    assert_eq!(
        seq,
        [
            (Some(0), "registered queue pings id=1".to_string()),
            (Some(0), "on_queue_ready root=1 queue=1 got req".to_string()),
        ]
    );

    // Ticks on the main thread and both workers enqueue; every notification reaches worker
    // 0's root, each right after the tick that enqueued it.
    let before = proxy.log_len();
    assert_eq!(proxy.advance(Duration::from_secs(2)), 6);
    let seq: Vec<_> = proxy.logs()[before..]
        .iter()
        .map(|r| (r.worker, r.message.clone()))
        .collect();
    let one_tick = |w: Option<usize>| {
        [
            (w, "tick enqueued ping".to_string()),
            (
                Some(0),
                "on_queue_ready root=1 queue=1 got ping".to_string(),
            ),
        ]
    };
    let expected: Vec<_> = [None, Some(0), Some(1), None, Some(0), Some(1)]
        .into_iter()
        .flat_map(one_tick)
        .collect();
    assert_eq!(seq, expected);

    // Worker 1 registers again: from now on it gets the notifications.
    assert_eq!(get(&mut proxy, 1), 200);
    let before = proxy.log_len();
    proxy.advance(Duration::from_secs(1));
    let ready = lines(&proxy, before, "on_queue_ready");
    assert_eq!(ready.len(), 3, "{ready:?}");
    assert!(ready.iter().all(|(w, _)| *w == Some(1)), "{ready:?}");
    assert!(proxy.take_errors().is_empty());
}

#[test]
fn a_queue_ping_pong_is_stopped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = proxy_with(dir.path(), "queue.wat", "pingpong", 2);
    let started = std::time::Instant::now();
    assert_eq!(get(&mut proxy, 0), 200);
    let errors = proxy.take_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].to_string().contains("never settled"),
        "{}",
        errors[0]
    );
    assert_eq!(
        lines(&proxy, 0, "on_queue_ready").len(),
        wasm_harness::envoy::proxy::MAX_QUEUE_DELIVERIES
    );
    // The proxy still works afterwards.
    assert_eq!(get(&mut proxy, 1), 200);
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// A scenario beside a bootstrap running `guest_file` with plugin configuration `config`.
fn run_scenario(
    guest_file: &str,
    config: &str,
    workers: usize,
    steps: &str,
) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest(guest_file), Some(config), |_| {});
    let s = dir.path().join("scenario.yaml");
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\nworkers: {workers}\nrequests:\n{steps}",
            b.display()
        ),
    )
    .unwrap();
    harness(&["run", s.to_str().unwrap()])
}

const TICK_STEPS: &str = r#"
  - name: before the clock moves
    request: {path: /}
    expect: {response: {status: 200}, log_counts: [{contains: on_tick, count: 0}]}
  - advance: 3s
    expect:
      logs: ["on_tick root=1 n=3"]
      log_counts:
        - {contains: on_tick, count: 9}
        - {contains: on_tick, worker: main, count: 3}
        - {contains: on_tick, worker: 0, count: 3}
        - {contains: on_tick, worker: 1, count: 3}
  - {name: after, request: {path: /}, expect: {response: {status: 200}}}
"#;

#[test]
fn a_scenario_advances_the_clock_between_requests() {
    let o = run_scenario("tick.wat", "", 2, TICK_STEPS);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("ok   advance 3s (clock +3s, 9 tick(s))"),
        "{out}"
    );
    assert!(out.contains("3 passed, 0 failed"), "{out}");
}

#[test]
fn a_wrong_tick_count_fails_the_scenario() {
    let steps = TICK_STEPS.replace("worker: 1, count: 3", "worker: 1, count: 4");
    let o = run_scenario("tick.wat", "", 2, &steps);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(r#"expected 4 line(s) containing "on_tick" from worker 1, saw 3"#),
        "{out}"
    );
}

#[test]
fn a_scenario_sees_queue_messages_reach_the_registering_root() {
    let steps = r#"
  - advance: 1s
    expect: {log_counts: [{contains: "tick: no queue yet", count: 3}, {contains: on_queue_ready, count: 0}]}
  - name: worker 0 registers the queue
    worker: 0
    request: {path: /}
    expect:
      logs: [registered queue pings]
      log_counts: [{contains: "on_queue_ready root=1 queue=1 got req", worker: 0, count: 1}]
  - advance: 2s
    expect:
      log_counts:
        - {contains: tick enqueued ping, count: 6}
        - {contains: tick enqueued ping, worker: main, count: 2}
        - {contains: "on_queue_ready root=1 queue=1 got ping", worker: 0, count: 6}
        - {contains: on_queue_ready, worker: 1, count: 0}
"#;
    let o = run_scenario("queue.wat", "", 2, steps);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_scenario_reports_a_queue_storm_as_a_failure() {
    // Each request re-registers and enqueues, so each starts its own storm; the run goes on.
    let steps = "  - {name: storm, worker: 0, request: {path: /}, expect: {response: {status: 200}}}\n  - {name: again, worker: 1, request: {path: /}, expect: {response: {status: 200}}}\n";
    let o = run_scenario("queue.wat", "pingpong", 2, steps);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL storm (worker 0)"), "{out}");
    assert!(out.contains("FAIL again (worker 1)"), "{out}");
    assert_eq!(
        out.matches("proxy_on_queue_ready never settled").count(),
        2,
        "{out}"
    );
    assert!(out.contains("0 passed, 2 failed"), "{out}");
}

#[test]
fn an_advance_without_a_unit_is_refused() {
    let o = run_scenario("tick.wat", "", 2, "  - advance: 5\n");
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("needs a unit"), "{out}");
}

#[test]
fn the_shipped_ticks_and_queues_scenario_passes() {
    let o = harness(&["run", "testdata/scenarios/ticks-and-queues.yaml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("5 passed, 0 failed"), "{out}");
}

#[test]
fn a_trap_in_on_tick_fails_that_workers_vm_like_any_callback() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = proxy_with(dir.path(), "tick.wat", "trap", 2);
    assert_eq!(proxy.advance(Duration::from_secs(1)), 3);
    let traps = lines(
        &proxy,
        0,
        "Function: proxy_on_tick failed: Uncaught RuntimeError: unreachable",
    );
    assert_eq!(traps.len(), 3, "{traps:?}");
    // The failed VMs tick no more, and the failure policy (fail closed) answers requests.
    assert_eq!(proxy.advance(Duration::from_secs(5)), 0);
    assert_eq!(get(&mut proxy, 0), 503);
    assert_eq!(get(&mut proxy, 1), 503);
}
