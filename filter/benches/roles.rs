//! `make bench` for the filter: what each HTTP role costs.
//!
//! 1. Real Envoy 1.40 (V8) at 1, 2, 4 and 8 workers, one keep-alive client connection per
//!    worker per listener: the median time per request and the throughput through a listener
//!    running each role, against the same listener without any filter, with a module that does
//!    nothing in each callback (`noop.wat`), the same exporting only the header callbacks
//!    (`noop-headers-only.wat`), the same making the header role's hostcalls and nothing else
//!    (`hostcalls.wat`), the proxy-wasm SDK doing nothing (`sdk-minimal/`, built here), with Envoy's Lua filter and with its native `header_mutation` filter
//!    making the header role's edits, and with the HTTP roles as the Envoy dynamic module
//!    (`target/release/libwasm_filter.so`); the listeners taken in turn within one run, each
//!    variant's added time the median of its round-by-round differences with no filter, so
//!    load changes hit all alike; Envoy's CPU time per request likewise. Then Envoy's
//!    resident memory and its allocator's heap with each variant alone, the variants in turn,
//!    three times at one worker, once at more (`WASM_FILTER_BENCH_RSS_SAMPLES`), and with
//!    `WASM_FILTER_BENCH_RELEASE=1` each also with Envoy's allocator release on (the
//!    bootstrap's `memory_allocator_manager`). `WASM_FILTER_BENCH_WORKERS=1,2` picks the
//!    worker counts, `WASM_FILTER_BENCH_ROUNDS` the rounds (10),
//!    `WASM_FILTER_BENCH_VARIANTS=Lua,http-` the variants (by the start of their names),
//!    `WASM_FILTER_BENCH_MODULES=label=a.wasm,label2=b.wat` adds other modules with the
//!    header role's configuration. With binaryen's `wasm-opt` on PATH, the header role's
//!    module after `wasm-opt -Oz` is measured too. Then Envoy's RSS before and after a
//!    header-keyed rate limit sees 100 000 distinct keys (`WASM_FILTER_BENCH_KEYS=1000000` for
//!    a million, `0` for none).
//! 2. The harness: time per request for each role.
//! 3. Guest linear memory per worker VM after 10k and 100k requests through each role (the
//!    filter logs its memory each time it grows).
//!
//! Prints each figure next to its target and exits 1 when one is missed.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "roles/envoy.rs"]
mod envoy;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use envoy::{Measured, Variant, JSON_REPLY};
use serde_json::{json, Value};
use wasm_harness::{Proxy, Request, UpstreamReply};

/// The prefix of the dynamic module's variants: `dynamic module: <role>`.
const DYNAMIC: &str = "dynamic module: ";

/// Requests per batch and batches in the harness.
const BATCH: u32 = 2000;
const BATCHES: usize = 11;

struct Role {
    name: &'static str,
    config: Value,
}

fn roles() -> Vec<Role> {
    vec![
        Role {
            name: "http-header-operation",
            config: json!({"role": "http-header-operation",
                "request": {"set": [{"name": "x-env", "value": "bench"}], "remove": ["x-internal-secret"],
                            "add": [{"name": "x-added-by", "value": "wasm-filter"}]},
                "response": {"add": [{"name": "x-served-by", "value": "wasm-filter"}]}}),
        },
        Role {
            name: "http-body-operation",
            config: json!({"role": "http-body-operation",
                "response": {"redact_json": {"keys": ["password"]}}}),
        },
        Role {
            name: "rate-limit",
            config: json!({"role": "rate-limit", "key": "client-address",
                "burst": 4_000_000_000u64, "refill_per_second": 1_000_000}),
        },
        Role {
            name: "stats-aggregator (record)",
            config: json!({"role": "stats-aggregator", "mode": "record"}),
        },
    ]
}

fn module() -> PathBuf {
    wasm_harness::guest::build(env!("CARGO_MANIFEST_DIR"), "wasm-release")
        .unwrap_or_else(|e| panic!("{e}"))
}

fn median<T: Copy + Ord>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn request() -> Request {
    Request::get("/api/items").header("x-internal-secret", "s3cret")
}

fn reply() -> UpstreamReply {
    UpstreamReply::new(200)
        .header("content-type", "application/json")
        .body(JSON_REPLY)
}

// ---- harness --------------------------------------------------------------------------

fn harness_proxy(config: &Value) -> Proxy {
    Proxy::for_module(module())
        .configuration(config.to_string())
        .workers(1)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn harness_per_request(config: &Value) -> Duration {
    let mut proxy = harness_proxy(config);
    let (req, rep) = (request(), reply());
    let mut upstream = |_: &wasm_harness::SeenRequest| rep.clone();
    let ex = proxy.send(None, Some(0), &req, &mut upstream).unwrap();
    assert_eq!(ex.response_status(), Some(200), "{ex:?}");
    let mut batches = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let start = Instant::now();
        for _ in 0..BATCH {
            proxy.send(None, Some(0), &req, &mut upstream).unwrap();
        }
        batches.push(start.elapsed() / BATCH);
    }
    median(batches)
}

/// KiB of linear memory worker 0's VM reported last.
fn memory_kib(proxy: &Proxy) -> u64 {
    proxy
        .logs()
        .iter()
        .filter(|l| l.worker == Some(0))
        .filter_map(|l| {
            l.message
                .strip_prefix("wasm-filter: linear memory is ")?
                .strip_suffix(" KiB")?
                .parse()
                .ok()
        })
        .max()
        .unwrap_or(0)
}

/// The "SDK minimal" variant: the proxy-wasm SDK with nothing of ours, whose Envoy memory is
/// the floor the module's is measured from (the SDK is the design's choice; what we add is ours).
const SDK_MINIMAL: &str = "SDK minimal";

/// `benches/sdk-minimal` built for the guest (its own workspace and lock file, so `make build`
/// never builds it), with the filter's `wasm-release` settings.
fn sdk_minimal() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = root.join("target/sdk-minimal");
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .arg("build")
        .arg("--quiet")
        .arg("--release")
        .arg("--locked")
        .args(["--target", "wasm32-wasip1"])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/sdk-minimal/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success(), "building benches/sdk-minimal failed");
    target.join("wasm32-wasip1/release/sdk_minimal.wasm")
}

/// Linear memory after 10k and after 100k requests.
fn memory_after(config: &Value) -> (u64, u64) {
    let mut proxy = harness_proxy(config);
    let (req, rep) = (request(), reply());
    let mut upstream = |_: &wasm_harness::SeenRequest| rep.clone();
    let mut at_10k = 0;
    for i in 1..=100_000 {
        proxy.send(None, Some(0), &req, &mut upstream).unwrap();
        if i == 10_000 {
            at_10k = memory_kib(&proxy);
        }
    }
    // One more stream, so growth during the last request is reported too.
    proxy.send(None, Some(0), &req, &mut upstream).unwrap();
    (at_10k, memory_kib(&proxy))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let module = module();
    let roles = roles();
    let mut missed = Vec::new();
    let mut check = |what: String, ok: bool| {
        println!("  {} {what}", if ok { "ok  " } else { "MISS" });
        if !ok {
            missed.push(what);
        }
    };

    let dir = tempfile::tempdir().unwrap();
    let bench_module = |name: &str| {
        let wasm = dir.path().join(format!("{name}.wasm"));
        let wat = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("benches/{name}.wat"));
        std::fs::write(&wasm, wat::parse_file(wat).unwrap()).unwrap();
        wasm
    };
    let noop = bench_module("noop");
    let mut variants = vec![
        Variant {
            name: "no filter".into(),
            filters: Vec::new(),
        },
        Variant {
            name: "do-nothing module".into(),
            filters: vec![envoy::wasm_plugin("floor", &json!({}), &noop)],
        },
        Variant {
            name: "do-nothing, header callbacks only".into(),
            filters: vec![envoy::wasm_plugin(
                "floor-headers",
                &json!({}),
                &bench_module("noop-headers-only"),
            )],
        },
        Variant {
            name: "do-nothing + header role's hostcalls".into(),
            filters: vec![envoy::wasm_plugin(
                "hostcalls",
                &json!({}),
                &bench_module("hostcalls"),
            )],
        },
        Variant {
            name: SDK_MINIMAL.into(),
            filters: vec![envoy::wasm_plugin(
                "sdk-minimal",
                &json!({}),
                &sdk_minimal(),
            )],
        },
        Variant {
            name: "our module, no edits".into(),
            filters: vec![envoy::wasm_plugin(
                "no-edits",
                &json!({"role": "http-header-operation"}),
                &module,
            )],
        },
        Variant {
            name: "Lua (header edits)".into(),
            filters: vec![envoy::lua_headers()],
        },
        Variant {
            name: "header_mutation (native)".into(),
            filters: vec![envoy::native_headers()],
        },
    ];
    // The same module through binaryen's `wasm-opt -Oz` (names stripped), when it is
    // installed: whether a smaller module costs Envoy less memory.
    let optimized = dir.path().join("wasm-opt-oz.wasm");
    // The features rustc's wasm32-wasip1 target enables; the module carries no
    // `target_features` section for wasm-opt to read them from (the profile strips it).
    let wasm_opt = std::process::Command::new("wasm-opt")
        .arg("-Oz")
        .arg("--strip-debug")
        .args([
            "--enable-bulk-memory",
            "--enable-extended-const",
            "--enable-multivalue",
            "--enable-mutable-globals",
            "--enable-nontrapping-float-to-int",
            "--enable-reference-types",
            "--enable-sign-ext",
        ])
        .arg(&module)
        .arg("-o")
        .arg(&optimized)
        .status()
        .is_ok_and(|s| s.success());
    if wasm_opt {
        variants.push(Variant {
            name: "header role, wasm-opt -Oz".into(),
            filters: vec![envoy::wasm_plugin("oz", &roles[0].config, &optimized)],
        });
    }
    for (i, r) in roles.iter().enumerate() {
        variants.push(Variant {
            name: r.name.into(),
            filters: vec![envoy::wasm_plugin(&format!("role{i}"), &r.config, &module)],
        });
    }
    // The HTTP roles again, as the Envoy dynamic module (`libwasm_filter.so`).
    for r in roles
        .iter()
        .filter(|r| !r.name.starts_with("stats-aggregator"))
    {
        variants.push(Variant {
            name: format!("{DYNAMIC}{}", r.name),
            filters: vec![envoy::dynamic_module(&r.config)],
        });
    }
    // Other builds of the module (or other modules, `.wat` too) beside this one, with the
    // header role's configuration: `WASM_FILTER_BENCH_MODULES=label=a.wasm,label2=b.wat`.
    for (label, path) in std::env::var("WASM_FILTER_BENCH_MODULES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|m| m.split_once('='))
    {
        let code = if path.ends_with(".wat") {
            let wasm = dir.path().join(format!("m-{label}.wasm"));
            std::fs::write(&wasm, wat::parse_file(path).unwrap()).unwrap();
            wasm
        } else {
            PathBuf::from(path)
        };
        variants.push(Variant {
            name: format!("header role, {label}"),
            filters: vec![envoy::wasm_plugin(
                &format!("m-{label}"),
                &roles[0].config,
                &code,
            )],
        });
    }
    // `WASM_FILTER_BENCH_VARIANTS=Lua,header`: only the variants whose names start with one of
    // these (and no filter, the baseline).
    if let Ok(keep) = std::env::var("WASM_FILTER_BENCH_VARIANTS") {
        let keep: Vec<&str> = keep.split(',').filter(|k| !k.is_empty()).collect();
        variants.retain(|v| v.name == "no filter" || keep.iter().any(|k| v.name.starts_with(k)));
    }
    let workers: Vec<usize> = std::env::var("WASM_FILTER_BENCH_WORKERS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8]);
    match envoy::envoy_bin() {
        None => println!("== real Envoy: skipped (not found; `make envoy` or ENVOY_BIN)"),
        Some(bin) => {
            for &n in &workers {
                println!("== real Envoy 1.40 (V8), {n} worker(s), {n} keep-alive connection(s) per listener");
                match envoy::measure(&bin, dir.path(), &variants, n) {
                    None => println!("  (Envoy did not answer)"),
                    Some(m) => report(&variants, &m, n, &mut check),
                }
            }
        }
    }

    let keys: usize = std::env::var("WASM_FILTER_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    if let (Some(bin), true) = (envoy::envoy_bin(), keys > 0) {
        println!("== real Envoy, 1 worker: RSS with a header-keyed rate limit across {keys} distinct keys");
        match envoy::rss_across_keys(&bin, dir.path(), &module, keys) {
            None => println!("  (Envoy did not answer)"),
            Some((before, after)) => {
                println!("  {before:.1} MiB after one key, {after:.1} MiB after {keys} keys");
                check(
                    format!(
                        "Envoy RSS grew {:.1} MiB across {keys} keys (target: under 2 MiB)",
                        after - before
                    ),
                    after - before < 2.0,
                );
            }
        }
    }

    if std::env::var_os("WASM_FILTER_BENCH_ENVOY_ONLY").is_some() {
        finish(&missed);
    }
    println!("== harness, time per request (1 worker)");
    for r in &roles {
        let t = us(harness_per_request(&r.config));
        println!("  {:<28} {t:.2} us", r.name);
        if r.name == "http-header-operation" {
            check(
                format!("header role {t:.2} us per request in the harness (target < 5 us)"),
                t < 5.0,
            );
        }
    }

    println!("== guest linear memory of worker 0's VM, after 10k and 100k requests");
    for r in &roles {
        let (at_10k, at_100k) = memory_after(&r.config);
        println!("  {:<28} {at_10k} KiB -> {at_100k} KiB", r.name);
        check(
            format!(
                "{}: {at_100k} KiB, under 2 MiB and flat from 10k to 100k",
                r.name
            ),
            at_100k < 2048 && at_100k == at_10k,
        );
    }
    finish(&missed);
}

/// One worker count's table, and the targets: the header role within 5 us of the do-nothing
/// module's added time (V8's cost per call is every module's; Lua stays in the table for the
/// record), and Envoy's memory with the module at one worker within 8 MiB of the SDK-minimal
/// module's.
fn report(
    variants: &[Variant],
    m: &[Measured],
    workers: usize,
    check: &mut impl FnMut(String, bool),
) {
    println!(
        "  {:<44} {:>9} {:>8} {:>7} {:>10} {:>7} {:>17}",
        "", "median us", "added us", "req/s", "CPU us/req", "RSS MiB", "heap / live MiB"
    );
    for (v, r) in variants.iter().zip(m) {
        println!(
            "  {:<44} {:>9.1} {:>+8.1} {:>7.0} {:>10.1} {:>7.1} {:>8.1} / {:>5.1}",
            v.name,
            r.median_us,
            r.added_us,
            r.rps,
            r.cpu_us,
            r.memory.rss,
            r.memory.heap,
            r.memory.live
        );
    }
    // Where the memory is: tcmalloc's heap split into live, free pages and cached objects, its
    // peak; and the same Envoy with its allocator release on, when measured.
    let release = m.iter().any(|r| r.released.is_some());
    println!(
        "  {:<44} {:>7} {:>7} {:>7} {:>9} {:>7} {:>7}{}",
        "memory, MiB",
        "RSS",
        "heap",
        "live",
        "page free",
        "cached",
        "peak",
        if release {
            "  | released: RSS page free  cached"
        } else {
            ""
        }
    );
    for (v, r) in variants.iter().zip(m) {
        let a = r.memory;
        let released = r.released.map_or(String::new(), |b| {
            format!("  | {:>12.1} {:>9.1} {:>7.1}", b.rss, b.page_free, b.cached)
        });
        println!(
            "  {:<44} {:>7.1} {:>7.1} {:>7.1} {:>9.1} {:>7.1} {:>7.1}{released}",
            v.name, a.rss, a.heap, a.live, a.page_free, a.cached, a.peak
        );
    }
    let added = |name: &str| {
        variants
            .iter()
            .position(|v| v.name == name)
            .map(|i| m[i].added_us)
    };
    // Each HTTP role's added time as a dynamic module over its added time as Wasm.
    for v in variants {
        let Some(role) = v.name.strip_prefix(DYNAMIC) else {
            continue;
        };
        if let (Some(native), Some(wasm)) = (added(&v.name), added(role)) {
            println!(
                "  {role}: the dynamic module adds {native:.1} us, the Wasm module {wasm:.1} us ({:.2}x)",
                native / wasm
            );
        }
    }
    if let (Some(header), Some(floor)) =
        (added("http-header-operation"), added("do-nothing module"))
    {
        let lua = added("Lua (header edits)").map_or(String::new(), |l| format!(", Lua {l:.1} us"));
        check(
            format!("{workers} worker(s): header role adds {header:.1} us, do-nothing module {floor:.1} us{lua} (target: within 5 us of the do-nothing module)"),
            header - floor <= 5.0,
        );
    }
    if workers == 1 {
        let rss = |name: &str| {
            variants
                .iter()
                .position(|v| v.name == name)
                .map(|i| m[i].memory.rss)
        };
        if let (Some(ours), Some(floor)) = (rss("http-header-operation"), rss(SDK_MINIMAL)) {
            check(
                format!("1 worker: Envoy RSS with the module {ours:.1} MiB, SDK-minimal module {floor:.1} MiB (target: within 8 MiB)"),
                ours - floor <= 8.0,
            );
        }
        let released = |name: &str| {
            variants
                .iter()
                .position(|v| v.name == name)
                .and_then(|i| m[i].released)
                .map(|r| r.rss)
        };
        if let (Some(ours), Some(floor)) =
            (released("http-header-operation"), released(SDK_MINIMAL))
        {
            println!("  with Envoy's allocator release: the module {ours:.1} MiB, SDK-minimal module {floor:.1} MiB ({:+.1} MiB)", ours - floor);
        }
    }
}

fn finish(missed: &[String]) -> ! {
    if !missed.is_empty() {
        println!("{} target(s) missed", missed.len());
        std::process::exit(1);
    }
    std::process::exit(0);
}
