//! Guests, inputs and upstreams written to hurt the host: each must end in a clear error or a
//! reported, bounded outcome, never an abort, a hang or an exhausted memory.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use wasm_harness::engine::host::log_book::MAX_LOG_BYTES;
use wasm_harness::envoy::proxy::{
    DeliveryError, MAX_CALL_DELIVERIES, MAX_CALL_RECORD_BYTES, MAX_TICKS_PER_ADVANCE, MAX_WORKERS,
};
use wasm_harness::http::{Request, UpstreamReply};
use wasm_harness::{Proxy, ProxyOptions, StartError};

use crate::support::*;

const PLUGIN: &str = "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config";

/// The shipped bootstrap with `guest_file` as its filter (configuration `config`) and a
/// cluster `slow` at 127.0.0.1:`port`.
fn bootstrap_with_slow(dir: &Path, guest_file: &str, config: &str, port: u16) -> PathBuf {
    bootstrap_variant(dir, &guest(guest_file), Some(config), move |doc| {
        add_loopback_cluster(doc, "slow", port)
    })
}

fn proxy(bootstrap: &Path, workers: usize) -> Proxy {
    Proxy::from_bootstrap(bootstrap, &ProxyOptions::with_workers(workers)).unwrap()
}

/// The flood guests do a lot of work in one callback (filling a map or shared data up to the
/// harness's limit): they get more than the default deadline, so a busy machine cannot turn
/// the refusal under test into a timeout.
fn patient_proxy(bootstrap: &Path) -> Proxy {
    let options = ProxyOptions {
        callback_deadline: std::time::Duration::from_secs(30),
        ..ProxyOptions::with_workers(1)
    };
    Proxy::from_bootstrap(bootstrap, &options).unwrap()
}

/// A loopback server that serves each connection with `serve` on its own thread.
fn server(serve: fn(std::net::TcpStream)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn));
        }
    });
    port
}

/// Reads the request head, so that what follows is the answer to it.
fn read_head(conn: &mut std::net::TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
}

#[test]
fn a_guest_flooding_the_log_is_kept_within_the_cap_and_told_what_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest("log-flood.wat"), None, |_| {});
    let mut p = proxy(&b, 1);
    let ex = p
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    let kept: usize = p.logs().iter().map(|r| r.message.len()).sum();
    assert!(kept <= MAX_LOG_BYTES, "{kept} bytes of log kept");
    assert!(kept > MAX_LOG_BYTES / 2, "only {kept} bytes of log kept");
    let dropped = p.log_dropped();
    // 100 records of 1 MiB: what did not fit, and the 4 GiB fd_write, are counted.
    assert!(dropped.records >= 100 - 64, "{dropped:?}");
    assert!(dropped.bytes >= 4 << 30, "{dropped:?}");

    let s = scenario(dir.path(), &b, "  - {name: flood, request: {}}\n");
    let o = harness(&["run", s.to_str().unwrap()]);
    assert!(
        text(&o).contains("the log reached the harness's cap of 64 MiB for a run"),
        "{}",
        &text(&o)[..2000.min(text(&o).len())]
    );
}

#[test]
fn a_tick_every_millisecond_over_an_hour_stops_at_the_cap_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest("tick-storm.wat"), None, |_| {});
    let mut p = proxy(&b, 2);
    let ticks = p.advance(Duration::from_secs(3600));
    assert_eq!(ticks, MAX_TICKS_PER_ADVANCE);
    let errors = p.take_errors();
    assert!(
        matches!(&errors[..], [DeliveryError::TickStorm { fired, .. }] if *fired == MAX_TICKS_PER_ADVANCE),
        "{errors:?}"
    );
    let message = errors[0].to_string();
    assert!(
        message
            .contains("advancing the clock by 1h would fire more than 100000 proxy_on_tick calls"),
        "{message}"
    );
    // The clock stopped where the ticks did (three roots, one per ms), not an hour later.
    assert!(p.elapsed() < Duration::from_secs(60), "{:?}", p.elapsed());
}

/// Answers every request after 300 ms.
fn slow_200(mut conn: std::net::TcpStream) {
    read_head(&mut conn);
    std::thread::sleep(Duration::from_millis(300));
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
}

#[test]
fn callouts_to_loopback_upstreams_are_in_flight_together() {
    let dir = tempfile::tempdir().unwrap();
    // 32 calls of 300 ms each: 9.6 s one after another, well over the 5 s budget.
    let b = bootstrap_with_slow(
        dir.path(),
        "call-storm.wat",
        &"x".repeat(32),
        server(slow_200),
    );
    let mut p = proxy(&b, 1);
    p.set_callout_budget(Duration::from_secs(5));
    let ex = p
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    let answers: Vec<&str> = p.call_records().iter().map(|r| r.answer.as_str()).collect();
    assert_eq!(answers.len(), 32);
    assert!(answers.iter().all(|a| a.ends_with(": 200")), "{answers:?}");
    assert!(p.take_errors().is_empty());
}

/// Accepts, reads the request, and never answers.
fn silent(mut conn: std::net::TcpStream) {
    read_head(&mut conn);
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn many_calls_to_an_upstream_that_never_answers_end_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // 200 calls without a timeout: an hour and more one after another at 60 s each.
    let b = bootstrap_with_slow(
        dir.path(),
        "call-storm.wat",
        &"x".repeat(200),
        server(silent),
    );
    let mut p = proxy(&b, 1);
    p.set_callout_budget(Duration::from_secs(1));
    let started = std::time::Instant::now();
    let ex = p
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    // Not a timing target: a guard against hanging for the calls' own 60 s limits.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ex.response_status(), Some(200));
    assert_eq!(p.call_records().len(), 200);
    assert!(
        p.call_records()
            .iter()
            .all(|r| r.answer.contains("callout budget of 1s") && r.answer.ends_with(": 504")),
        "{:?}",
        p.call_records()[0].answer
    );
    let errors = p.take_errors();
    assert!(
        matches!(
            &errors[..],
            [DeliveryError::CalloutBudget {
                answered: 200,
                cut: 200,
                ..
            }]
        ),
        "{errors:?}"
    );
    assert!(
        errors[0].to_string().contains("200 calls were answered, 200 of them 504 because no response came before the budget ran out"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_callout_storm_says_how_many_were_answered_and_dropped_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_with_slow(
        dir.path(),
        "call-storm.wat",
        &"x".repeat(MAX_CALL_DELIVERIES + 50),
        9,
    );
    let mut p = proxy(&b, 1);
    p.set_http_call_replies(vec![wasm_harness::http::CannedHttpCall {
        cluster: "slow".into(),
        path_prefix: None,
        answer: wasm_harness::http::HttpCallAnswer::Reply(Default::default()),
    }]);
    let ex = p
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    let errors = p.take_errors();
    assert!(
        matches!(
            &errors[..],
            [DeliveryError::CalloutStorm { answered, dropped: 50, made_by_completions: 0, .. }]
                if *answered == MAX_CALL_DELIVERIES
        ),
        "{errors:?}"
    );
    let message = errors[0].to_string();
    assert!(
        message.contains("answered 10000 (every one of them made at once, before any was answered), then dropped the 50 still pending"),
        "{message}"
    );
}

/// Answers with a content-length no machine could hold, then a little data.
fn huge_length(mut conn: std::net::TcpStream) {
    read_head(&mut conn);
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\nabc");
}

/// Answers with a chunk size that overflows, then garbage.
fn garbled(mut conn: std::net::TcpStream) {
    read_head(&mut conn);
    let _ = conn.write_all(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1ffffffffffffffffff\r\n\x00\x01",
    );
}

/// A response head that never ends.
fn endless_head(mut conn: std::net::TcpStream) {
    read_head(&mut conn);
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nx-a: ");
    let line = vec![b'a'; 64 * 1024];
    while conn.write_all(&line).is_ok() {}
}

/// A body larger than a callout keeps, sent for real.
fn huge_body(mut conn: std::net::TcpStream) {
    read_head(&mut conn);
    let size = wasm_harness::envoy::proxy::MAX_CALLOUT_BODY_BYTES + 1;
    let _ = conn.write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n").as_bytes());
    let _ = conn.write_all(&vec![b'b'; size]);
}

#[test]
fn hostile_upstream_responses_end_the_call_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for (serve, answer) in [
        (
            huge_length as fn(_),
            "body longer than the harness's limit of 16777216 bytes: reset",
        ),
        (garbled, "malformed HTTP/1.1 message: chunk size"),
        (endless_head, "message head longer than 65536 bytes: 503"),
        (
            huge_body,
            "body longer than the harness's limit of 16777216 bytes: reset",
        ),
    ] {
        let b = bootstrap_with_slow(dir.path(), "call-storm.wat", "x", server(serve));
        let mut p = proxy(&b, 1);
        let ex = p
            .round_trip(&Request::get("/"), UpstreamReply::new(200))
            .unwrap();
        assert_eq!(ex.response_status(), Some(200));
        let got = &p.call_records()[0].answer;
        assert!(got.contains(answer), "expected {answer:?} in {got:?}");
    }
}

#[test]
fn many_workers_get_their_vms_and_zero_or_too_many_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    let o = harness(&["validate", b.to_str().unwrap(), "--workers", "128"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("128 worker(s)"), "{}", text(&o));
    let p = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(0));
    assert!(matches!(p, Err(StartError::NoWorkers)), "{:?}", p.err());
    let o = harness(&["validate", b.to_str().unwrap(), "--workers", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("workers: 0: the harness needs at least one worker"),
        "{}",
        text(&o)
    );
    let too_many = (MAX_WORKERS + 1).to_string();
    let o = harness(&["validate", b.to_str().unwrap(), "--workers", &too_many]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("is more than the harness runs (at most 1024"),
        "{}",
        text(&o)
    );
}

#[test]
fn devices_fifos_and_directories_are_refused_as_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let o = harness(&["run", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o)
            .contains("cannot read scenario /dev/zero: not a regular file (a character device)"),
        "{}",
        text(&o)
    );
    let o = harness(&["validate", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("not a regular file (a directory)"),
        "{}",
        text(&o)
    );
    let fifo = dir.path().join("module.wasm");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let b = bootstrap_variant(dir.path(), &fifo, None, |_| {});
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("not a regular file (a FIFO)"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_module_that_is_not_wasm_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("plugin.wasm");
    std::fs::write(&module, "(module)").unwrap();
    let b = bootstrap_variant(dir.path(), &module, None, |_| {});
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("is not a Wasm binary"), "{}", text(&o));
    // The same text in a .wat file is WebAssembly text (and lacks the ABI export).
    let wat = dir.path().join("plugin.wat");
    std::fs::write(&wat, "(module)").unwrap();
    let b = bootstrap_variant(dir.path(), &wat, None, |_| {});
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert!(
        text(&o).contains("Missing or unknown Proxy-Wasm ABI version"),
        "{}",
        text(&o)
    );
}

#[test]
fn fields_of_the_wrong_type_are_named_with_the_type_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |doc| {
        doc["static_resources"]["listeners"] = Value::from(5);
    });
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        // One value where a list goes is a list of one, as in Envoy: the item is wrong.
        text(&o).contains("static_resources.listeners[0]: expected a map, found a number (5)"),
        "{}",
        text(&o)
    );
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |doc| {
        doc.pointer_mut(PLUGIN).unwrap()["fail_open"] = "maybe".into();
    });
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert!(
        text(&o).contains("config.fail_open: expected true or false, found a string (\"maybe\")"),
        "{}",
        text(&o)
    );
    let b = bootstrap_variant(dir.path(), &filter_wasm(), None, |_| {});
    let s = scenario(dir.path(), &b, "  - {name: r, request: {headers: 5}}\n");
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("request \"r\": request.headers: invalid type: integer `5`, expected a map of header names to values"),
        "{}",
        text(&o)
    );
}

#[test]
fn an_endless_start_function_is_interrupted_naming_it_and_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest("start-loop.wat"), None, |_| {});
    let o = harness(&["validate", b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("_start was interrupted: it ran longer than the harness's deadline of 1s for one call into the VM"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_scenario_sets_the_callout_budget_and_reports_what_it_cut() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_with_slow(dir.path(), "call-storm.wat", "xx", server(silent));
    let s = dir.path().join("budget.yaml");
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\ncallout_budget: 500ms\nrequests:\n  - {{name: silent upstream, request: {{}}}}\n",
            b.display()
        ),
    )
    .unwrap();
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("took longer than the harness's budget of 500ms for one round: 2 calls were answered, 2 of them 504"),
        "{}",
        text(&o)
    );
}

/// One request through `guest_file` on one worker, answered 200 as the guest let it go on,
/// with the guest's own line `said` in the log; the proxy, the exchange and the log lines.
fn one_request(
    dir: &Path,
    guest_file: &str,
    said: &str,
) -> (Proxy, wasm_harness::http::Exchange, Vec<String>) {
    let b = bootstrap_variant(dir, &guest(guest_file), None, |_| {});
    let mut p = patient_proxy(&b);
    let ex = p
        .round_trip(&Request::get("/"), UpstreamReply::new(200))
        .unwrap();
    assert_eq!(ex.response_status(), Some(200));
    let lines: Vec<String> = p.logs().iter().map(ToString::to_string).collect();
    assert!(lines.iter().any(|l| l.contains(said)), "{lines:?}");
    (p, ex, lines)
}

#[test]
fn a_guest_hoarding_shared_data_is_refused_at_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, lines) = one_request(dir.path(), "hoard.wat", "hoard refused");
    assert!(
        lines.iter().any(|l| l.contains(
            "proxy_set_shared_data: refused 1048834 bytes: guests already make the harness hold"
        ) && l.contains("it holds at most 268435456 (InternalFailure)")),
        "{lines:?}"
    );
    // What was stored before the refusal is there; the last key stored is under the budget.
    let vm_id = &p.bootstrap().listeners[0].plugins()[0].vm_id;
    let stored = (0u16..1024)
        .take_while(|&i| {
            let key = [b'A' + (i & 31) as u8, b'A' + (i >> 5) as u8];
            let key = std::str::from_utf8(&key).unwrap();
            p.shared_data(vm_id, key).is_some()
        })
        .count();
    assert!(
        stored * (1 << 20) <= wasm_harness::engine::host::held::MAX_HELD_BYTES && stored >= 250,
        "{stored} values stored"
    );
}

#[test]
fn a_guest_adding_headers_in_a_loop_is_refused_at_the_map_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ex, lines) = one_request(dir.path(), "header-flood.wat", "header refused");
    assert!(
        lines.iter().any(|l| l.contains("would pass the harness's limit of 8192 entries or 16777216 bytes")),
        "{lines:?}"
    );
    let seen = ex.upstream.unwrap().message.headers;
    let flood = seen.iter().filter(|(k, _)| k == "x-flood").count();
    assert!((8000..=8192).contains(&flood), "{flood} x-flood headers");
}

#[test]
fn a_guest_setting_stream_properties_in_a_loop_is_refused_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, lines) = one_request(dir.path(), "property-flood.wat", "props refused");
    assert!(
        lines.iter().any(|l| l.contains(
            "proxy_set_property: the stream's properties would pass the harness's limit of 16777216 bytes"
        )),
        "{lines:?}"
    );
}

#[test]
fn a_guest_enqueueing_empty_items_in_a_loop_is_refused_at_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, lines) = one_request(dir.path(), "queue-flood.wat", "enqueue refused");
    assert!(
        lines.iter().any(|l| l.contains(&format!(
            "proxy_enqueue_shared_queue: refused {} bytes",
            wasm_harness::engine::host::held::ENTRY_OVERHEAD
        ))),
        "{lines:?}"
    );
    // A new queue's names are held too, so none can be made once the budget is spent.
    assert!(
        lines.iter().any(|l| l.contains("register refused")),
        "{lines:?}"
    );
}

#[test]
fn call_records_stop_at_their_budget_and_count_what_was_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_with_slow(dir.path(), "call-body-tick.wat", "x", 9);
    let mut p = proxy(&b, 1);
    p.set_http_call_replies(vec![wasm_harness::http::CannedHttpCall {
        cluster: "slow".into(),
        path_prefix: None,
        answer: wasm_harness::http::HttpCallAnswer::Reply(Default::default()),
    }]);
    // Each root calls with 4 MiB on every 1 ms tick: 160 MiB and more over 40 ms.
    p.advance(Duration::from_millis(40));
    let kept: usize = p.call_records().iter().map(|r| r.body.len()).sum();
    assert!(
        kept <= MAX_CALL_RECORD_BYTES,
        "{kept} bytes of call records kept"
    );
    assert!(kept >= MAX_CALL_RECORD_BYTES / 2, "only {kept} bytes kept");
    assert!(
        p.call_records().dropped() >= 20,
        "{}",
        p.call_records().dropped()
    );

    let s = dir.path().join("calls.yaml");
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\nhttp_calls:\n  - {{cluster: slow, reply: {{status: 200}}}}\nrequests:\n  - {{name: ticks, advance: 40ms}}\n",
            b.display()
        ),
    )
    .unwrap();
    let o = harness(&["run", s.to_str().unwrap()]);
    assert!(
        text(&o).contains("call(s) answered but not kept; the harness keeps at most 64 MiB of call records for a run"),
        "{}",
        &text(&o)[..2000.min(text(&o).len())]
    );
}

#[test]
fn yaml_aliases_that_multiply_a_bootstrap_or_scenario_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // 26 KB standing for 20 million values (40 MB): a list of 10,000 used 2,000 times.
    let bomb = format!(
        "a: &a [{}]\nb: [{}]\n",
        vec!["0"; 10_000].join(","),
        vec!["*a"; 2_000].join(",")
    );
    let path = dir.path().join("bomb.yaml");
    std::fs::write(&path, &bomb).unwrap();
    for command in ["validate", "run"] {
        let o = harness(&[command, path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains(&format!(
                "its aliases expand to more than {} bytes (twice the file's size is allowed)",
                2 * bomb.len()
            )),
            "{command}: {}",
            text(&o)
        );
    }
}
