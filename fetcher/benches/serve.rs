//! `make bench` for `serve` (`cargo bench -p wasm-fetcher --bench serve`), two figures:
//!
//! - reload: from a changed WasmPlugin file to real Envoy serving the new module, both modules
//!   already cached (the sidecar's everyday case: a rollout between versions the node has
//!   seen). Each change swaps the module and the header value the filter adds; the time runs
//!   from the file's rename to the first response carrying the new value, asked for every
//!   5 ms, with `serve`'s default poll period (200 ms). Median of RUNS; target under 1 s.
//! - idle: resident memory (VmRSS, peak over the window) and CPU time (utime + stime) read
//!   from /proc over a 20 s window once 50 plugins are served. Targets: under 20 MiB, under
//!   1 % of one core.
//!
//! Exits 1 when a target is missed.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/all/oci_registry.rs"]
#[allow(dead_code)]
mod oci_registry;
#[path = "../tests/all/real_envoy.rs"]
#[allow(dead_code)]
mod real_envoy;
#[path = "../tests/all/serve_support.rs"]
#[allow(dead_code)]
mod serve_support;
#[path = "../tests/all/support.rs"]
#[allow(dead_code)]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use real_envoy::Envoy;
use serve_support::*;

const RUNS: usize = 15;
const RELOAD_TARGET: Duration = Duration::from_secs(1);
const PLUGINS: usize = 50;
const WINDOW: Duration = Duration::from_secs(20);
const RSS_TARGET_KIB: u64 = 20 * 1024;
const CPU_TARGET: f64 = 0.01;

fn main() {
    let reload = reload();
    let idle = idle();
    if !(reload && idle) {
        std::process::exit(1);
    }
}

/// The reload figure; whether it met its target.
fn reload() -> bool {
    let d = dirs();
    let (dir, plugins, ecds) = (&d.tmp, &d.plugins, &d.ecds);
    // Two modules with the filter's behaviour and different bytes (a custom section added).
    let filter = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/wasm32-wasip1/wasm-release/wasm_filter.wasm");
    let a = std::fs::read(&filter).expect("run `make filter` first");
    let mut b = a.clone();
    b.extend_from_slice(&[0, 6, 5, b'b', b'e', b'n', b'c', b'h']);
    let urls: Vec<String> = [("a", &a), ("b", &b)]
        .iter()
        .map(|(n, bytes)| {
            let p = dir.path().join(format!("{n}.wasm"));
            std::fs::write(&p, bytes).unwrap();
            format!("file://{}", p.display())
        })
        .collect();
    let upstream = support::Server::start(vec![("/", support::Behaviour::Ok(b"ok".to_vec()))]);
    let file = plugins.join("bench.yaml");
    let plugin = |i: usize| wasm_plugin("bench", &urls[i % 2], &header_role(&format!("v{i}")));
    // Warm the cache with both modules.
    write_plugin(&file, &plugin(1));
    let serve = d.serve(&[], &["--poll-interval", "200ms"]);
    serve.wait_ready();
    write_plugin(&file, &plugin(0));
    let first = plugin(0);
    let envoy = Envoy::start(&ecds_bootstrap(
        dir.path(),
        ecds,
        &[&first],
        upstream.host(),
    ));
    let addr = format!("127.0.0.1:{}", envoy.port("main"));
    let served =
        |v: &str| http_get(&addr, "/").is_ok_and(|(_, r)| header(&r, "x-served-by") == Some(v));
    wait_for("envoy serves v0", Duration::from_secs(30), || served("v0"));
    let mut times = Vec::new();
    for i in 1..=RUNS {
        let start = Instant::now();
        write_plugin(&file, &plugin(i));
        let want = format!("v{i}");
        while !served(&want) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "v{i} never served: {}",
                serve.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        times.push(start.elapsed());
        std::thread::sleep(Duration::from_millis(300));
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "WasmPlugin change -> real Envoy serving the new (cached) module: median {:.0} ms over {RUNS} changes (min {:.0} ms, max {:.0} ms; target < {} ms): {}",
        median.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        RELOAD_TARGET.as_millis(),
        if median < RELOAD_TARGET { "ok" } else { "MISSED" }
    );
    drop(serve);
    median < RELOAD_TARGET
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// utime + stime in clock ticks (fields 14 and 15 of /proc/PID/stat, after the command).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The idle figures; whether both met their targets.
fn idle() -> bool {
    let d = dirs();
    let plugins = &d.plugins;
    let server = support::Server::start(
        (0..PLUGINS)
            .map(|i| (format!("/m{i}.wasm"), support::module(&format!("m{i}"))))
            .map(|(p, m)| {
                (
                    Box::leak(p.into_boxed_str()) as &str,
                    support::Behaviour::Ok(m),
                )
            })
            .collect(),
    );
    for i in 0..PLUGINS {
        write_plugin(
            &plugins.join(format!("p{i}.yaml")),
            &wasm_plugin(
                &format!("p{i}"),
                &server.url(&format!("/m{i}.wasm")),
                &header_role(&format!("v{i}")),
            ),
        );
    }
    let serve = d.serve(&[], &["--poll-interval", "200ms"]);
    serve.wait_ready();
    let pid = serve.child.id();
    std::thread::sleep(Duration::from_secs(2));
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    let mut peak = 0;
    while t0.elapsed() < WINDOW {
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(500));
    }
    let cpu = (cpu_ticks(pid) - c0) as f64 / ticks_per_s / t0.elapsed().as_secs_f64();
    let ok_mem = peak < RSS_TARGET_KIB;
    let ok_cpu = cpu < CPU_TARGET;
    println!(
        "serve idle with {PLUGINS} plugins (poll 200 ms, {}s window): RSS {:.1} MiB (target < 20 MiB): {}; CPU {:.2} % of a core (target < 1 %): {}",
        WINDOW.as_secs(),
        peak as f64 / 1024.0,
        if ok_mem { "ok" } else { "MISSED" },
        cpu * 100.0,
        if ok_cpu { "ok" } else { "MISSED" }
    );
    drop(serve);
    ok_mem && ok_cpu
}
