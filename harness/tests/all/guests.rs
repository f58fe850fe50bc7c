//! Small hand-written guests: the failure policy after a trap, a guest that never returns,
//! and a configuration refused by the canary.

use crate::support::*;

fn run_guest(
    guest_file: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    requests: &str,
) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(dir.path(), &guest(guest_file), None, edit);
    let s = scenario(dir.path(), &b, requests);
    harness(&["run", s.to_str().unwrap()])
}

fn set_plugin_field(
    key: &'static str,
    value: serde_json::Value,
) -> impl FnOnce(&mut serde_json::Value) {
    move |doc| {
        doc.pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap()[key] = value;
    }
}

#[test]
fn a_wat_guest_adds_a_header() {
    let o = run_guest(
        "add-header.wat",
        |_| {},
        "  - {name: wat, request: {path: /}, expect: {upstream: {headers: {x-wat: '1'}}, logs: [wat guest saw request headers]}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_trap_fails_closed_with_503_then_keeps_failing() {
    let o = run_guest(
        "trap.wat",
        |_| {},
        "  - {name: first, worker: 0, request: {path: /}, expect: {reached_upstream: false, response: {status: 503}, local_reply: failure_policy}}\n  - {name: again, worker: 0, request: {path: /}, expect: {reached_upstream: false, response: {status: 503}, local_reply: failure_policy}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(
            "Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable"
        ),
        "{}",
        text(&o)
    );
}

#[test]
fn a_trap_under_fail_open_passes_the_request() {
    let o = run_guest(
        "trap.wat",
        set_plugin_field("fail_open", serde_json::json!(true)),
        "  - {name: open, request: {path: /}, expect: {reached_upstream: true, response: {status: 200}, local_reply: none}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn an_infinite_loop_is_interrupted() {
    let o = run_guest(
        "loop.wat",
        |_| {},
        "  - {name: loop, request: {path: /}, expect: {response: {status: 503}, local_reply: failure_policy}}\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(
            "Function: proxy_on_request_headers failed: interrupted: the callback ran longer than the harness's deadline of 1s"
        ),
        "{}",
        text(&o)
    );
}

#[test]
fn a_configure_refusal_is_a_start_failure() {
    let o = run_guest(
        "reject-config.wat",
        |_| {},
        "  - {name: x, request: {path: /}}\n",
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("configuration rejected by the canary VM"),
        "{}",
        text(&o)
    );
}

/// `proxy_close_stream` resets the stream: no response, no upstream request, in the
/// harness as in Envoy.
#[test]
fn a_plugin_that_closes_the_stream_resets_it_like_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "close-stream.wat");
    let b = bootstrap_variant(dir.path(), &wasm, None, |_| {});
    let s = scenario(
        dir.path(),
        &b,
        "  - {name: closed, request: {path: /close}, expect: {reset: true, reached_upstream: false}}
  - {name: open, request: {path: /open}, expect: {response: {status: 200}}}
",
    );
    let report = differential(&s);
    assert_eq!(report.verdict, wasm_harness::Verdict::Passed, "{report}");
    let o = harness(&["run", s.to_str().unwrap()]);
    assert!(
        text(&o).contains("closed the stream in on_http_request_headers (proxy_close_stream)"),
        "{}",
        text(&o)
    );
    // Expecting a response from a reset stream fails, naming the reset.
    let s = scenario(
        dir.path(),
        &b,
        "  - {name: closed, request: {path: /close}, expect: {response: {status: 200}}}\n",
    );
    let o = harness(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("the stream was reset: plugin"),
        "{}",
        text(&o)
    );
}
