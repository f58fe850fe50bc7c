//! `--timeout` bounds the whole pull wherever it waits, and zero durations mean what they mean
//! to Istio's agent.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// Slack for process start and a loaded machine; a deadline overrun beyond it is the bug.
const SLACK: Duration = Duration::from_secs(3);

#[test]
fn a_file_source_that_never_opens_times_out_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("m.wasm");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let cache = dir.path().join("cache");
    let url = format!("file://{}", fifo.display());
    let (o, took) = run_within(
        fetcher()
            .args(["pull", &url, "--timeout", "1s", "--cache-dir"])
            .arg(&cache),
        Duration::from_secs(20),
    );
    assert_failed(&o, &cache, &url, "timed out after 1s (--timeout)");
    assert!(took < Duration::from_secs(1) + SLACK, "took {took:?}");
}

#[test]
fn waiting_for_another_process_holding_the_source_lock_times_out_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    std::fs::write(&src, module("locked")).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let always = ["--pull-policy", "Always", "--timeout", "1s"];
    let o = pull(&cache, &[&url, "--pull-policy", "Always"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Another puller of the same source, stuck: it holds the source's lock file.
    let locks = lock_files(&cache);
    assert_eq!(locks.len(), 1, "{locks:?}");
    let held = std::fs::File::options()
        .write(true)
        .open(&locks[0])
        .unwrap();
    held.lock().unwrap();
    let (o, took) = run_within(
        fetcher()
            .arg("pull")
            .arg(&url)
            .args(always)
            .arg("--cache-dir")
            .arg(&cache),
        Duration::from_secs(20),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("timed out after 1s (--timeout)"), "{err}");
    assert!(took < Duration::from_secs(1) + SLACK, "took {took:?}");
    // Once the other lets go, the same pull goes through.
    drop(held);
    let o = pull(
        &cache,
        &[&url, "--pull-policy", "Always", "--timeout", "5s"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn a_zero_timeout_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = pull(dir.path(), &["file:///x.wasm", "--timeout", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("zero timeout"), "{}", stderr(&o));
}

#[test]
fn a_zero_http_request_timeout_means_five_seconds_as_in_istio() {
    let m = module("zero-timeout");
    let server = Server::start(vec![(
        "/m.wasm",
        Behaviour::Slow(Duration::from_millis(300), m.clone()),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let o = fetcher()
        .env("WASM_HTTP_REQUEST_TIMEOUT", "0")
        .env("WASM_HTTP_REQUEST_MAX_RETRIES", "1")
        .args(["pull", &server.url("/m.wasm"), "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
    assert_eq!(server.hits("/m.wasm"), 1);
}

#[test]
fn zero_expiry_and_purge_interval_mean_istios_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    std::fs::write(&src, module("zero-expiry")).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let cached = stdout_path(&pull(&cache, &[&url]));
    // A download in progress in another process.
    let live = cache.join("tmp").join("download-live.part");
    std::fs::write(&live, b"\0asm").unwrap();
    let o = fetcher()
        .env("WASM_MODULE_EXPIRY", "0")
        .env("WASM_PURGE_INTERVAL", "0s")
        .args(["purge", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        o.stdout.is_empty(),
        "nothing is 24h old: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(cached.is_file(), "WASM_MODULE_EXPIRY=0 is 24h");
    assert!(
        live.is_file(),
        "WASM_PURGE_INTERVAL=0 is 1h: a fresh temp file is live"
    );
    let ls = fetcher()
        .env("WASM_MODULE_EXPIRY", "0")
        .args(["ls", "--json", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let m = &listed[0];
    assert_eq!(
        m["expires"].as_u64().unwrap() - m["last_used"].as_u64().unwrap(),
        24 * 3600
    );
}
