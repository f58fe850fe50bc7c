//! `make bench`: how long from a changed WasmPlugin file to real Envoy serving the new module,
//! with both modules already cached (the sidecar's everyday case: a rollout between versions
//! the node has seen). Each change swaps the module and the header value the filter adds; the
//! time runs from the file's rename to the first response carrying the new value, asked for
//! every 5 ms. `serve` runs with its default poll period (200 ms). Reports the median of
//! RUNS; exits 1 when it is over the 1 s target.

#[path = "../tests/all/serve_support.rs"]
#[allow(dead_code)]
mod serve_support;
#[path = "../tests/all/support.rs"]
#[allow(dead_code)]
mod support;
#[path = "../tests/all/oci_registry.rs"]
#[allow(dead_code)]
mod oci_registry;

use std::path::Path;
use std::time::{Duration, Instant};

use serve_support::*;

const RUNS: usize = 15;
const TARGET: Duration = Duration::from_secs(1);

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let (plugins, ecds, cache) = (
        dir.path().join("plugins"),
        dir.path().join("ecds"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&ecds).unwrap();
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
    let serve = Serve::start(&plugins, &ecds, &cache, &[], &["--poll-interval", "200ms"]);
    serve.wait_ready();
    write_plugin(&file, &plugin(0));
    let first = plugin(0);
    let envoy = Envoy::start(dir.path(), &ecds, &[&first], upstream.host());
    let served = |v: &str| get(&envoy.addr, "/").is_ok_and(|r| r.header("x-served-by") == Some(v));
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
        TARGET.as_millis(),
        if median < TARGET { "ok" } else { "MISSED" }
    );
    drop(serve);
    if median >= TARGET {
        std::process::exit(1);
    }
}
