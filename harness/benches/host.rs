//! `make bench` for the harness: the time of one HTTP request through a header-only filter
//! (single worker; the project's filter with envoy-config/bootstrap.yaml, and the minimal
//! `add-header.wat` guest), and the time to start a worker VM from a compiled module
//! (instantiate from `InstancePre` with the pooling allocator + `_initialize` + `on_vm_start` +
//! `on_configure`). Medians of batches; exits 1 when a target is missed. Also counts heap
//! allocations per request, a figure that does not move with the machine's load.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasm_harness::engine::compiled_cache::CompiledCache;
use wasm_harness::engine::host::Shared;
use wasm_harness::engine::precompiled_section as precompiled;
use wasm_harness::engine::runtime::Runtime;
use wasm_harness::engine::vm::Vm;
use wasm_harness::envoy::bootstrap::Bootstrap;
use wasm_harness::envoy::proxy::{Proxy, ProxyOptions};
use wasm_harness::http::{Request, UpstreamReply};

/// The system allocator, counting allocations: the time per request swings by 2x with the load
/// of this shared machine, the number of allocations does not, so a change that adds work to
/// every request shows here even on a busy day. It also tracks the bytes live and their peak,
/// for what a large body costs.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes as u64, Relaxed) + bytes as u64;
    PEAK.fetch_max(live, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        grew(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        grew(new_size);
        LIVE.fetch_sub(layout.size() as u64, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BATCH: u32 = 2000;
const BATCHES: usize = 21;
const VM_STARTS: usize = 501;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.2} us", d.as_secs_f64() * 1e6)
}

/// The project's bootstrap, or the same with the module swapped for `code`.
fn bootstrap(code: Option<&str>) -> Bootstrap {
    Bootstrap::load(&bootstrap_file(code).1).unwrap_or_else(|e| {
        panic!("{e} (build the filter first: make filter)");
    })
}

fn bootstrap_file(code: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    let root = repo_root();
    let text =
        std::fs::read_to_string(root.join("testdata/scenarios/header-ops.bootstrap.yaml")).unwrap();
    let text = match code {
        Some(code) => text.replace(
            "target/wasm32-wasip1/wasm-release/wasm_filter.wasm",
            &root.join(code).display().to_string(),
        ),
        None => text.replace(
            "target/wasm32-wasip1/wasm-release/wasm_filter.wasm",
            &root
                .join("target/wasm32-wasip1/wasm-release/wasm_filter.wasm")
                .display()
                .to_string(),
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bootstrap.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn request() -> Request {
    let mut request = Request::get("/api/items")
        .header("x-internal-secret", "s3cret")
        .header("user-agent", "bench");
    request.authority = "demo.local".into();
    request
}

/// The same request through real Envoy (one worker, V8) and a loopback upstream, for scale:
/// a whole HTTP/1.1 round trip on a new connection, not comparable term by term.
fn envoy_round_trip() -> Option<Duration> {
    let envoy = wasm_harness::real_envoy::find_envoy().ok()?;
    let (_dir, path) = bootstrap_file(None);
    let mut real = wasm_harness::real_envoy::RealEnvoy::start(&envoy, &path, 1).ok()?;
    let reply = UpstreamReply::new(200).header("x-backend-version", "7");
    let mut times = Vec::new();
    for _ in 0..201 {
        let start = Instant::now();
        real.send(None, &request(), &reply).ok()?;
        times.push(start.elapsed());
    }
    Some(median(times))
}

/// Median time per request, and heap allocations (and reallocations) per request, counting
/// the bench's own upstream reply.
fn per_request(label: &str, bootstrap: Bootstrap, adds: &str) -> (Duration, f64) {
    let mut proxy = Proxy::new(bootstrap, &ProxyOptions::with_workers(1)).unwrap();
    let request = request();
    let mut upstream = |_: &wasm_harness::http::SeenRequest| {
        UpstreamReply::new(200).header("x-backend-version", "7")
    };
    // Warm up, and check the filter did its work (a bench of a broken filter is no bench):
    // the upstream must see the header the filter adds to requests.
    let exchange = proxy.send(None, None, &request, &mut upstream).unwrap();
    assert!(
        exchange.response().is_some_and(|r| r.status == 200)
            && exchange.upstream_header(adds).is_some(),
        "{label} did not add {adds}: {exchange:?}"
    );
    let before = ALLOCATIONS.load(Relaxed);
    for _ in 0..BATCH {
        proxy.send(None, None, &request, &mut upstream).unwrap();
    }
    let allocations = (ALLOCATIONS.load(Relaxed) - before) as f64 / f64::from(BATCH);
    let mut batches = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let start = Instant::now();
        for _ in 0..BATCH {
            proxy.send(None, None, &request, &mut upstream).unwrap();
        }
        batches.push(start.elapsed() / BATCH);
    }
    (median(batches), allocations)
}

/// The body size for [`big_bodies`].
const BIG_BODY: usize = 100 << 20;

/// Peak heap while one request with a 100 MiB body goes through the filter and its upstream
/// answers with a 100 MiB body, above what the caller already held (its request), in bodies:
/// what a large body costs the harness, copies included. The exchange it returns holds the
/// body the upstream saw and the response's, two bodies that are the point of the exchange.
fn big_bodies() -> f64 {
    let mut proxy = Proxy::new(bootstrap(None), &ProxyOptions::with_workers(1)).unwrap();
    let mut request = request();
    request.body = vec![b'q'; BIG_BODY];
    let mut upstream =
        |_: &wasm_harness::http::SeenRequest| UpstreamReply::new(200).body(vec![b'r'; BIG_BODY]);
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let exchange = proxy.send(None, None, &request, &mut upstream).unwrap();
    let peak = PEAK.load(Relaxed) - base;
    assert_eq!(
        exchange.response().map(|r| r.body.len()),
        Some(BIG_BODY),
        "the response lost its body"
    );
    peak as f64 / BIG_BODY as f64
}

fn vm_start(bootstrap: Bootstrap) -> (Duration, Duration) {
    let runtime = Runtime::new().unwrap();
    let plugin = Arc::new(bootstrap.listeners[0].plugins()[0].clone());
    let load_start = Instant::now();
    let module = runtime.load(&plugin.code, None).unwrap();
    let load = load_start.elapsed();
    let shared = Arc::new(Shared::default());
    let clusters = Arc::new(
        bootstrap
            .clusters
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>(),
    );
    let mut times = Vec::with_capacity(VM_STARTS);
    for _ in 0..VM_STARTS {
        let start = Instant::now();
        let mut vm = Vm::start(
            &runtime,
            &module,
            shared.clone(),
            Some(0),
            &plugin,
            clusters.clone(),
        )
        .unwrap();
        vm.start_plugin(plugin.clone()).unwrap();
        times.push(start.elapsed());
        drop(vm);
    }
    (median(times), load)
}

/// Loading the filter's code three ways (median of 7 each): compiling its bytecode, from the
/// harness's compiled-code cache, and from a section precompiled into the module
/// (`allow_precompiled` with the wasmtime runtime).
fn module_loads() -> (Duration, Duration, Duration) {
    let filter = repo_root().join("target/wasm32-wasip1/wasm-release/wasm_filter.wasm");
    let dir = tempfile::tempdir().unwrap();
    let mut runtime = Runtime::new().unwrap();
    let bytes = std::fs::read(&filter).unwrap();
    let precompiled_file = dir.path().join("precompiled.wasm");
    std::fs::write(
        &precompiled_file,
        precompiled::embed(runtime.engine(), &bytes).unwrap(),
    )
    .unwrap();
    let section = precompiled::section_name().unwrap();
    let time = |runtime: &Runtime, path: &Path, section: Option<&str>| {
        median(
            (0..7)
                .map(|_| {
                    let start = Instant::now();
                    runtime.load(path, section).unwrap();
                    start.elapsed()
                })
                .collect(),
        )
    };
    runtime.compiled = None;
    let compile = time(&runtime, &filter, None);
    runtime.compiled = Some(CompiledCache::open(&dir.path().join("cache")).unwrap());
    runtime.load(&filter, None).unwrap();
    let cached = time(&runtime, &filter, None);
    let from_section = time(&runtime, &precompiled_file, Some(&section));
    (compile, cached, from_section)
}

fn main() {
    // `cargo bench --bench host -- big-body`: just the large-body measurement.
    if std::env::args().any(|a| a == "big-body") {
        println!(
            "a 100 MiB request body and a 100 MiB response body: peak heap {:.1} bodies above the caller's request (target < 6)",
            big_bodies()
        );
        return;
    }
    let mut missed = false;
    let mut check = |what: &str, ok: bool| {
        println!("  {what}: {}", if ok { "ok" } else { "MISSED" });
        missed |= !ok;
    };
    println!("wasm-harness ({BATCHES} batches of {BATCH} requests, {VM_STARTS} VM starts; median)");
    let (filter, filter_allocations) = per_request("wasm-filter", bootstrap(None), "x-added-by");
    // `cargo bench --bench host -- requests-only`: just the request loop (for profiling).
    if std::env::args().any(|a| a == "requests-only") {
        println!(
            "one request, wasm-filter: {}, {filter_allocations:.1} allocations",
            us(filter)
        );
        return;
    }
    let (wat, wat_allocations) = per_request(
        "add-header.wat",
        bootstrap(Some("testdata/guests/add-header.wat")),
        "x-wat",
    );
    println!(
        "one request, header-only filter, 1 worker: wasm-filter {}, add-header.wat {} (target < 5 us)",
        us(filter),
        us(wat)
    );
    println!(
        "heap allocations per request: wasm-filter {filter_allocations:.1}, add-header.wat {wat_allocations:.1}"
    );
    check("request", filter < Duration::from_micros(5));
    match envoy_round_trip() {
        Some(d) => println!(
            "the same request through real Envoy (1 worker, V8, loopback upstream, new connection each): {}",
            us(d)
        ),
        None => println!("real Envoy not found (make envoy): no comparison"),
    }
    let (start, load) = vm_start(bootstrap(None));
    println!(
        "worker VM start from the compiled module (instantiate + _initialize + on_vm_start + on_configure): {} (target < 100 us); module load from the compiled-code cache: {:.1} ms",
        us(start),
        load.as_secs_f64() * 1e3
    );
    check("VM start", start < Duration::from_micros(100));
    let bodies = big_bodies();
    println!(
        "a 100 MiB request body and a 100 MiB response body: peak heap {bodies:.1} bodies above the caller's request (target < 6)"
    );
    check("large bodies", bodies < 6.0);
    let (compile, cached, from_section) = module_loads();
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    println!(
        "loading the filter's code: compiling the bytecode {}, from the compiled-code cache {}, from its precompiled section {}",
        ms(compile),
        ms(cached),
        ms(from_section)
    );
    if missed {
        std::process::exit(1);
    }
}
