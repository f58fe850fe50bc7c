//! `serve` and the cache over time: versions racing, purges, the size cap, metrics, damage on
//! disk, signals and kills. A loopback HTTP server stands in for the module's host.

use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use crate::serve_support::*;
use crate::support::{fetcher, module, sha256_hex, stderr, Behaviour, Server};

fn module_file(cache: &Path, bytes: &[u8]) -> PathBuf {
    cache
        .join("modules/sha256")
        .join(format!("{}.wasm", sha256_hex(bytes)))
}

/// The module file the ECDS file for `test.NAME` points at, if it is a Wasm filter.
fn ecds_module(ecds: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(ecds.join(format!("test.{name}.yaml"))).ok()?;
    let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
    doc["resources"][0]["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]
        .as_str()
        .map(String::from)
}

/// `wasm-fetcher purge` on `cache` with `env`.
fn purge(cache: &Path, env: &[(&str, &str)]) -> std::process::Output {
    fetcher()
        .envs(env.iter().copied())
        .arg("purge")
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

#[test]
fn a_slow_pull_of_an_older_version_never_overwrites_a_newer_one() {
    let d = dirs();
    let (old, new) = (module("old"), module("new"));
    let server = Server::start(vec![
        (
            "/old.wasm",
            Behaviour::Slow(Duration::from_secs(3), old.clone()),
        ),
        ("/new.wasm", Behaviour::Ok(new.clone())),
    ]);
    let file = d.plugins.join("p.yaml");
    write_plugin(&file, &wasm_plugin("p", &server.url("/old.wasm"), ""));
    let serve = d.serve(&[], &[]);
    wait_for(
        "the old version's pull started",
        Duration::from_secs(10),
        || server.hits("/old.wasm") == 1,
    );
    write_plugin(&file, &wasm_plugin("p", &server.url("/new.wasm"), ""));
    let want = module_file(&d.cache, &new).display().to_string();
    wait_for(
        "the new version is written",
        Duration::from_secs(10),
        || ecds_module(&d.ecds, "p").as_deref() == Some(want.as_str()),
    );
    // Past the moment the old answer arrives, the file keeps naming the new module.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert_eq!(
            ecds_module(&d.ecds, "p").as_deref(),
            Some(want.as_str()),
            "{}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A removed resource takes its ECDS file with it.
    std::fs::remove_file(&file).unwrap();
    wait_for("the ECDS file is removed", Duration::from_secs(10), || {
        !d.ecds.join("test.p.yaml").exists()
    });
    assert!(serve.stop().success());
}

#[test]
fn purges_spare_the_modules_in_use_and_remove_the_rest() {
    let d = dirs();
    let (used, unused) = (module("used"), module("unused"));
    let server = Server::start(vec![
        ("/used.wasm", Behaviour::Ok(used.clone())),
        ("/unused.wasm", Behaviour::Ok(unused.clone())),
    ]);
    let o = crate::support::pull(&d.cache, &[&server.url("/unused.wasm")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    write_plugin(
        &d.plugins.join("p.yaml"),
        &wasm_plugin("p", &server.url("/used.wasm"), ""),
    );
    // Everything expires at once, and serve purges every 300 ms.
    let env = [
        ("WASM_MODULE_EXPIRY", "1ns"),
        ("WASM_PURGE_INTERVAL", "300ms"),
    ];
    let serve = d.serve_ready(&env, &[]);
    wait_for(
        "the unused module is purged",
        Duration::from_secs(10),
        || !module_file(&d.cache, &unused).exists(),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(module_file(&d.cache, &used).is_file(), "{}", serve.log());
    // The CLI's purge, in another process, spares it too: serve holds a lease on it.
    let o = purge(&d.cache, &env);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(module_file(&d.cache, &used).is_file());
    // Once serve is gone, the module is an ordinary expired one.
    assert!(serve.stop().success());
    let o = purge(&d.cache, &env);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("purged sha256:{}", sha256_hex(&used))
    );
}

#[test]
fn the_size_cap_evicts_least_recently_used_modules_first() {
    let d = dirs();
    let mods: Vec<Vec<u8>> = ["first", "second", "third"]
        .iter()
        .map(|t| module(t))
        .collect();
    let server = Server::start(vec![
        ("/1.wasm", Behaviour::Ok(mods[0].clone())),
        ("/2.wasm", Behaviour::Ok(mods[1].clone())),
        ("/3.wasm", Behaviour::Ok(mods[2].clone())),
    ]);
    for n in 1..=3 {
        let o = crate::support::pull(&d.cache, &[&server.url(&format!("/{n}.wasm"))]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    // Last used: the second most recently, then the third, then the first (seconds apart, as
    // pulls over a few minutes would leave them).
    let index_path = d.cache.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (m, ago) in mods.iter().zip([300, 100, 200]) {
        index["modules"][sha256_hex(m)]["last_used"] = (now - ago).into();
    }
    std::fs::write(&index_path, index.to_string()).unwrap();
    let cap = (mods[0].len() * 3 / 2).to_string();
    let o = purge(&d.cache, &[("WASM_CACHE_MAX_BYTES", &cap)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        lines,
        vec![
            format!("purged sha256:{}", sha256_hex(&mods[0])),
            format!("purged sha256:{}", sha256_hex(&mods[2])),
        ]
    );
    assert!(module_file(&d.cache, &mods[1]).is_file());
    let o = purge(&d.cache, &[("WASM_CACHE_MAX_BYTES", "lots")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("WASM_CACHE_MAX_BYTES"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn metrics_count_a_known_sequence_of_pulls_and_readyz_names_what_is_missing() {
    let d = dirs();
    let good = module("good");
    let server = Server::start(vec![
        ("/good.wasm", Behaviour::Ok(good.clone())),
        (
            "/text.wasm",
            Behaviour::Ok(b"<html>not a module</html>".to_vec()),
        ),
    ]);
    let url = server.url("/good.wasm");
    // a: a fetch; then b: the same module, from the cache.
    write_plugin(&d.plugins.join("a.yaml"), &wasm_plugin("a", &url, ""));
    let serve = d.serve_ready(&[], &["--verify-interval", "1h"]);
    write_plugin(&d.plugins.join("b.yaml"), &wasm_plugin("b", &url, ""));
    // c: not a module; d: a pin the bytes do not match. Both get their fallback.
    write_plugin(
        &d.plugins.join("c.yaml"),
        &wasm_plugin(
            "c",
            &server.url("/text.wasm"),
            "  failStrategy: FAIL_OPEN\n",
        ),
    );
    write_plugin(
        &d.plugins.join("d.yaml"),
        &wasm_plugin(
            "d",
            &server.url("/good.wasm?pinned"),
            &format!("  sha256: {}\n", "0".repeat(64)),
        ),
    );
    // e: not a WasmPlugin at all.
    write_plugin(
        &d.plugins.join("e.yaml"),
        "apiVersion: v1\nkind: ConfigMap\n",
    );
    wait_for("every plugin converted", Duration::from_secs(20), || {
        ["success", "fetch_failure", "unmarshal_failure"]
            .iter()
            .map(|r| serve.metric(&format!("wasm_config_conversion_count{{result=\"{r}\"}}")))
            .sum::<u64>()
            == 5
    });
    for (sample, value) in [
        ("wasm_cache_entries", 1),
        ("wasm_cache_lookup_count{hit=\"false\"}", 3),
        ("wasm_cache_lookup_count{hit=\"true\"}", 1),
        ("wasm_remote_fetch_count{result=\"success\"}", 1),
        ("wasm_remote_fetch_count{result=\"fetch_failure\"}", 1),
        ("wasm_remote_fetch_count{result=\"checksum_mismatched\"}", 1),
        ("wasm_remote_fetch_count{result=\"download_failure\"}", 0),
        ("wasm_config_conversion_count{result=\"success\"}", 2),
        ("wasm_config_conversion_count{result=\"fetch_failure\"}", 2),
        (
            "wasm_config_conversion_count{result=\"unmarshal_failure\"}",
            1,
        ),
    ] {
        assert_eq!(serve.metric(sample), value, "{sample}\n{}", serve.log());
    }
    assert_eq!(
        server.hits("/good.wasm"),
        2,
        "one fetch for a and b, one for d"
    );
    // The fallbacks are written (Envoy runs them); the file that is no WasmPlugin is not ready.
    assert!(d.ecds.join("test.c.yaml").is_file() && d.ecds.join("test.d.yaml").is_file());
    let (status, why) = get(&serve.addr, "/readyz").unwrap();
    assert_eq!(status, 503);
    assert!(why.contains("e.yaml"), "{why}");
    std::fs::remove_file(d.plugins.join("e.yaml")).unwrap();
    wait_for(
        "ready without the bad file",
        Duration::from_secs(10),
        || serve.ready(),
    );
    assert_eq!(get(&serve.addr, "/healthz").unwrap().0, 200);
}

#[test]
fn sighup_brings_back_a_deleted_or_damaged_module_file() {
    let d = dirs();
    let m = module("kept");
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(m.clone()))]);
    write_plugin(
        &d.plugins.join("p.yaml"),
        &wasm_plugin("p", &server.url("/m.wasm"), ""),
    );
    let serve = d.serve_ready(&[], &["--verify-interval", "1h"]);
    let file = module_file(&d.cache, &m);
    std::fs::remove_file(&file).unwrap();
    serve.signal(libc::SIGHUP);
    wait_for(
        "the deleted module is back",
        Duration::from_secs(10),
        || std::fs::read(&file).is_ok_and(|b| b == m),
    );
    // Damaged in place, size kept: only a re-hash can tell.
    let mut bad = m.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    std::fs::write(&file, &bad).unwrap();
    serve.signal(libc::SIGHUP);
    wait_for(
        "the damaged module is repaired",
        Duration::from_secs(10),
        || std::fs::read(&file).is_ok_and(|b| b == m),
    );
    assert_eq!(server.hits("/m.wasm"), 3, "{}", serve.log());
    assert!(serve.stop().success());
}

#[test]
fn kill_9_mid_pull_leaves_a_cache_the_next_start_uses_as_is_and_sigterm_leaves_whole_files() {
    let d = dirs();
    let (fast, slow) = (module("fast"), module(&"slow".repeat(20)));
    let server = Server::start(vec![
        ("/fast.wasm", Behaviour::Ok(fast.clone())),
        (
            "/slow.wasm",
            Behaviour::Trickle(slow.clone(), 40, Duration::from_millis(100)),
        ),
    ]);
    write_plugin(
        &d.plugins.join("a.yaml"),
        &wasm_plugin("a", &server.url("/fast.wasm"), ""),
    );
    write_plugin(
        &d.plugins.join("b.yaml"),
        &wasm_plugin("b", &server.url("/slow.wasm"), ""),
    );
    let mut serve = d.serve(&[], &[]);
    wait_for(
        "a written, b being downloaded",
        Duration::from_secs(10),
        || d.ecds.join("test.a.yaml").is_file() && server.hits("/slow.wasm") == 1,
    );
    std::thread::sleep(Duration::from_millis(500));
    let a_before = std::fs::read(d.ecds.join("test.a.yaml")).unwrap();
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    drop(serve);
    assert!(!d.ecds.join("test.b.yaml").exists());

    let serve = d.serve_ready(&[], &[]);
    assert_eq!(
        server.hits("/fast.wasm"),
        1,
        "the cached module was fetched again"
    );
    assert_eq!(std::fs::read(d.ecds.join("test.a.yaml")).unwrap(), a_before);
    assert_eq!(
        ecds_module(&d.ecds, "b"),
        Some(module_file(&d.cache, &slow).display().to_string())
    );
    assert_eq!(std::fs::read(module_file(&d.cache, &slow)).unwrap(), slow);

    // SIGTERM in the middle of another slow pull: a prompt, clean exit, every file whole.
    write_plugin(
        &d.plugins.join("b.yaml"),
        &wasm_plugin("b", &server.url("/slow.wasm?again"), ""),
    );
    wait_for(
        "the second slow pull started",
        Duration::from_secs(10),
        || server.hits("/slow.wasm") == 3,
    );
    let start = Instant::now();
    assert!(serve.stop().success());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    for e in std::fs::read_dir(&d.ecds).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == ".wasm-fetcher-written" {
            continue; // the record of what serve wrote, itself written whole
        }
        assert!(!name.starts_with('.'), "temp file left: {name}");
        let text = std::fs::read_to_string(e.path()).unwrap();
        let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
        assert!(doc["resources"][0]["name"].is_string(), "{name}: {text}");
    }
}

#[test]
fn failed_pulls_are_retried_with_backoff_until_the_deadline_then_the_fallback_is_written() {
    let d = dirs();
    let m = module("eventually");
    let server = Server::start(vec![
        ("/flaky.wasm", Behaviour::FailThenOk(2, m.clone())),
        ("/down.wasm", Behaviour::Status(503)),
    ]);
    write_plugin(
        &d.plugins.join("a.yaml"),
        &wasm_plugin("a", &server.url("/flaky.wasm"), ""),
    );
    write_plugin(
        &d.plugins.join("b.yaml"),
        &wasm_plugin(
            "b",
            &server.url("/down.wasm"),
            "  failStrategy: FAIL_OPEN\n",
        ),
    );
    // One HTTP attempt per pull: every retry here is serve's own.
    let started = Instant::now();
    let serve = d.serve_ready(
        &[("WASM_HTTP_REQUEST_MAX_RETRIES", "1")],
        &["--pull-timeout", "3s", "--verify-interval", "1h"],
    );
    assert_eq!(
        ecds_module(&d.ecds, "a"),
        Some(module_file(&d.cache, &m).display().to_string()),
        "{}",
        serve.log()
    );
    assert_eq!(server.hits("/flaky.wasm"), 3);
    // b: retried (pauses of 250 ms, 500 ms, 1 s) until the next pause would pass its 3 s
    // deadline, then the fail-open substitute.
    let b = std::fs::read_to_string(d.ecds.join("test.b.yaml")).unwrap();
    assert!(
        b.contains("envoy.extensions.filters.http.rbac.v3.RBAC"),
        "{b}"
    );
    assert!(b.contains("wasm-default-allow"), "{b}");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1700) && elapsed < Duration::from_secs(10),
        "{elapsed:?}"
    );
    let tries = server.hits("/down.wasm");
    assert!(
        (3..=6).contains(&tries),
        "{tries} attempts in 3 s of backoff"
    );
    assert_eq!(
        serve.metric("wasm_remote_fetch_count{result=\"download_failure\"}"),
        2 + u64::from(tries)
    );
    assert_eq!(
        serve.metric("wasm_remote_fetch_count{result=\"success\"}"),
        1
    );
}

#[test]
fn a_plugin_deleted_while_serve_is_down_loses_its_ecds_file_at_the_next_start() {
    let d = dirs();
    let server = Server::start(vec![
        ("/a.wasm", Behaviour::Ok(module("a"))),
        ("/b.wasm", Behaviour::Ok(module("b"))),
    ]);
    for name in ["a", "b"] {
        write_plugin(
            &d.plugins.join(format!("{name}.yaml")),
            &wasm_plugin(name, &server.url(&format!("/{name}.wasm")), ""),
        );
    }
    // A file someone else keeps in the directory Envoy watches.
    let theirs = d.ecds.join("theirs.other.yaml");
    std::fs::write(&theirs, "resources: []\n").unwrap();
    let serve = d.serve_ready(&[], &[]);
    assert!(ecds_module(&d.ecds, "a").is_some() && ecds_module(&d.ecds, "b").is_some());
    assert!(serve.stop().success());

    std::fs::remove_file(d.plugins.join("b.yaml")).unwrap();
    let serve = d.serve_ready(&[], &[]);
    // The file goes first, then the log line says so.
    wait_for(
        "serve says it removed b's file",
        Duration::from_secs(10),
        || {
            serve
                .log()
                .contains("removed the ECDS file of a plugin deleted while serve was down")
        },
    );
    assert!(!d.ecds.join("test.b.yaml").exists(), "{}", serve.log());
    assert!(ecds_module(&d.ecds, "a").is_some(), "{}", serve.log());
    assert!(theirs.is_file(), "a file serve did not write stays");
}
