//! `make bench` for `serve` (`cargo bench -p wasm-fetcher --bench serve`), two figures:
//!
//! - reload: from a changed WasmPlugin file to real Envoy serving the new module, both modules
//!   already cached (the sidecar's everyday case: a rollout between versions the node has
//!   seen). Each change swaps the module and the header value the filter adds; the time runs
//!   from the file's rename to the first response carrying the new value, asked for every
//!   5 ms, `serve` woken by the file's events (its scan timers at their defaults, the
//!   fallback). Median of RUNS; target under 100 ms.
//! - idle: resident memory (VmRSS, peak over the window) and CPU time (utime + stime) read
//!   from /proc over a 20 s window once 50 plugins are served. Targets: under 20 MiB, under
//!   0.35 % of one core (what a 200 ms poll of 50 files cost).
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
const RELOAD_TARGET: Duration = Duration::from_millis(100);
const PLUGINS: usize = 50;
const WINDOW: Duration = Duration::from_secs(20);
const RSS_TARGET_KIB: u64 = 20 * 1024;
const CPU_TARGET: f64 = 0.0035;

fn main() {
    let reload = reload();
    let idle = idle();
    if !(reload && idle) {
        std::process::exit(1);
    }
}

/// The medians of one series of changes: to the ECDS file written (`serve`'s part) and to
/// Envoy answering with the change.
struct Series {
    ecds: Duration,
    envoy: Duration,
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// The reload figures; whether they met their targets.
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
    let ecds_file = ecds.join("test.bench.yaml");
    let plugin = |url: &str, i: usize| wasm_plugin("bench", url, &header_role(&format!("v{i}")));
    // Warm the cache with both modules.
    write_plugin(&file, &plugin(&urls[1], 1));
    let serve = d.serve(
        &[],
        &["--poll-interval", "200ms", "--rescan-interval", "10s"],
    );
    serve.wait_ready();
    write_plugin(&file, &plugin(&urls[0], 0));
    let first = plugin(&urls[0], 0);
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
    let mut version = 0;
    let mut series = |url_of: &dyn Fn(usize) -> usize| {
        let (mut to_ecds, mut to_envoy) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            version += 1;
            let want = format!("v{version}");
            let start = Instant::now();
            write_plugin(&file, &plugin(&urls[url_of(version)], version));
            while !std::fs::read_to_string(&ecds_file).is_ok_and(|t| t.contains(&want)) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{want} never written: {}",
                    serve.log()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            to_ecds.push(start.elapsed());
            while !served(&want) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{want} never served: {}",
                    envoy.log()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            to_envoy.push(start.elapsed());
            std::thread::sleep(Duration::from_millis(300));
        }
        Series {
            ecds: median(to_ecds),
            envoy: median(to_envoy),
        }
    };
    let config = series(&|_| 0);
    let module = series(&|v| v % 2);
    drop(serve);
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    let ok = [
        config.ecds < RELOAD_TARGET,
        config.envoy < RELOAD_TARGET,
        module.ecds < RELOAD_TARGET,
    ];
    println!(
        "WasmPlugin pluginConfig change -> ECDS file written: median {} over {RUNS} (target < {}): {}; -> real Envoy serving it: median {} (target < {}): {}",
        ms(config.ecds),
        ms(RELOAD_TARGET),
        verdict(ok[0]),
        ms(config.envoy),
        ms(RELOAD_TARGET),
        verdict(ok[1]),
    );
    println!(
        "WasmPlugin module change (cached) -> ECDS file written: median {} over {RUNS} (target < {}): {}; -> real Envoy serving it: median {} (Envoy compiles the new module; no target)",
        ms(module.ecds),
        ms(RELOAD_TARGET),
        verdict(ok[2]),
        ms(module.envoy),
    );
    ok.iter().all(|o| *o)
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
    let serve = d.serve(
        &[],
        &["--poll-interval", "200ms", "--rescan-interval", "10s"],
    );
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
        "serve idle with {PLUGINS} plugins (file events, rescan 10 s, {}s window): RSS {:.1} MiB (target < 20 MiB): {}; CPU {:.3} % of a core (target < 0.35 %): {}",
        WINDOW.as_secs(),
        peak as f64 / 1024.0,
        if ok_mem { "ok" } else { "MISSED" },
        cpu * 100.0,
        if ok_cpu { "ok" } else { "MISSED" }
    );
    drop(serve);
    ok_mem && ok_cpu
}
