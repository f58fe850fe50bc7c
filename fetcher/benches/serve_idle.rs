//! `make bench`: `serve`'s footprint while idle with 50 plugins: resident memory (VmRSS) and
//! CPU time (utime + stime) read from /proc over a 20 s window after every plugin is served.
//! Targets: under 20 MiB and under 1 % of one core. Exits 1 when one is missed.

#[path = "../tests/all/serve_support.rs"]
#[allow(dead_code)]
mod serve_support;
#[path = "../tests/all/support.rs"]
#[allow(dead_code)]
mod support;
#[path = "../tests/all/oci_registry.rs"]
#[allow(dead_code)]
mod oci_registry;

use std::time::{Duration, Instant};

use serve_support::*;

const PLUGINS: usize = 50;
const WINDOW: Duration = Duration::from_secs(20);
const RSS_TARGET_KIB: u64 = 20 * 1024;
const CPU_TARGET: f64 = 0.01;

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

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let (plugins, ecds, cache) = (
        dir.path().join("plugins"),
        dir.path().join("ecds"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&ecds).unwrap();
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
    let serve = Serve::start(&plugins, &ecds, &cache, &[], &["--poll-interval", "200ms"]);
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
    if !(ok_mem && ok_cpu) {
        std::process::exit(1);
    }
}
