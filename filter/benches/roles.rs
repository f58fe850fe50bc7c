//! `make bench` for the filter: what each HTTP role costs.
//!
//! 1. Real Envoy 1.40 (V8, one worker, one keep-alive client connection per listener): the
//!    median time per request through a listener running the role, against the same listener
//!    without any filter, the listeners taken in turn within one run so load changes hit all
//!    alike; also the floor, a module that does nothing in each callback (`noop.wat`).
//! 2. The harness: time per request for each role.
//! 3. Guest linear memory per worker VM after 10k and 100k requests through each role (the
//!    filter logs its memory each time it grows).
//!
//! Prints each figure next to its target and exits 1 when one is missed.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wasm_harness::{Proxy, Request, UpstreamReply};

/// Requests per listener per round, and rounds, through real Envoy.
const ENVOY_BATCH: usize = 200;
const ENVOY_ROUNDS: usize = 25;
const WARM_UP: usize = 3000;
/// Requests per batch and batches in the harness.
const BATCH: u32 = 2000;
const BATCHES: usize = 11;

const JSON_REPLY: &str = r#"{"user":"al","password":"hunter2","items":[1,2,3]}"#;

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

// ---- real Envoy -----------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A keep-alive upstream answering every request with `JSON_REPLY`.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = conn.set_nodelay(true);
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut writer = conn;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{JSON_REPLY}",
                    JSON_REPLY.len()
                );
                while let Some(len) = read_head(&mut reader) {
                    let mut body = vec![0; len.unwrap_or(0)];
                    if reader.read_exact(&mut body).is_err()
                        || writer.write_all(answer.as_bytes()).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Reads a message head; `Some(content-length)` (None: chunked), `None` at end of stream.
fn read_head(r: &mut impl BufRead) -> Option<Option<usize>> {
    let mut len = Some(0);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            return Some(len);
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().ok();
        } else if l.starts_with("transfer-encoding:") && l.contains("chunked") {
            len = None;
        }
    }
}

fn read_response(r: &mut impl BufRead) -> Option<()> {
    match read_head(r)? {
        Some(n) => {
            let mut body = vec![0; n];
            r.read_exact(&mut body).ok()
        }
        None => loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                return Some(());
            }
        },
    }
}

fn plugin(name: &str, config: &Value, code: &Path) -> Value {
    json!({"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": name, "root_id": name,
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config.to_string()},
            "vm_config": {"vm_id": name, "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": code.display().to_string()}}}}}})
}

fn listener(name: &str, port: u16, filters: Vec<Value>) -> Value {
    let mut chain = filters;
    chain.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    json!({"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": name,
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]}]},
            "http_filters": chain}}]}]})
}

struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Median microseconds per request and requests per second, per listener, the listeners
/// taken in turn `ENVOY_ROUNDS` times.
fn envoy_latencies(dir: &Path, variants: &[(String, Vec<Value>)]) -> Option<Vec<(f64, f64)>> {
    let envoy = wasm_harness::real_envoy::find_envoy().ok()?;
    let backend = upstream();
    let ports: Vec<u16> = variants.iter().map(|_| free_port()).collect();
    let listeners: Vec<Value> = variants
        .iter()
        .zip(&ports)
        .map(|((name, filters), port)| listener(name, *port, filters.clone()))
        .collect();
    let bootstrap = json!({"static_resources": {"listeners": listeners, "clusters": [{
        "name": "backend", "connect_timeout": "1s", "type": "STATIC",
        "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": "127.0.0.1", "port_value": backend}}}}]}]}}]}});
    let path = dir.join("bench.json");
    std::fs::write(&path, bootstrap.to_string()).ok()?;
    let _envoy = Envoy(
        Command::new(envoy)
            .arg("-c")
            .arg(&path)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warning",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut clients = Vec::new();
    for port in &ports {
        let conn = loop {
            match TcpStream::connect(("127.0.0.1", *port)) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => panic!("envoy did not listen on {port}: {e}"),
            }
        };
        conn.set_nodelay(true).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        clients.push((BufReader::new(conn.try_clone().ok()?), conn));
    }
    let request = b"GET /api/items HTTP/1.1\r\nhost: bench\r\nx-internal-secret: s3cret\r\n\r\n";
    // Warm up: V8 compiles a module's functions quickly first and optimizes the hot ones
    // later, so the figures are taken once every listener's code has run a while.
    for (reader, writer) in clients.iter_mut() {
        for _ in 0..WARM_UP {
            writer.write_all(request).ok()?;
            read_response(reader)?;
        }
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut totals = vec![Duration::ZERO; variants.len()];
    for _ in 0..ENVOY_ROUNDS {
        for (i, (reader, writer)) in clients.iter_mut().enumerate() {
            let batch_start = Instant::now();
            for _ in 0..ENVOY_BATCH {
                let start = Instant::now();
                writer.write_all(request).ok()?;
                read_response(reader)?;
                times[i].push(start.elapsed());
            }
            totals[i] += batch_start.elapsed();
        }
    }
    let n = (ENVOY_BATCH * ENVOY_ROUNDS) as f64;
    Some(
        times
            .into_iter()
            .zip(totals)
            .map(|(t, total)| (us(median(t)), n / total.as_secs_f64()))
            .collect(),
    )
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

    println!("== real Envoy (V8, 1 worker, 1 keep-alive connection per listener, {ENVOY_ROUNDS} alternating rounds of {ENVOY_BATCH})");
    let dir = tempfile::tempdir().unwrap();
    let noop = dir.path().join("noop.wasm");
    std::fs::write(
        &noop,
        wat::parse_file(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/noop.wat")).unwrap(),
    )
    .unwrap();
    let mut variants = vec![
        ("no-filter".to_string(), Vec::new()),
        (
            "floor".to_string(),
            vec![plugin("floor", &json!({}), &noop)],
        ),
        (
            "sdk-floor".to_string(),
            vec![plugin(
                "sdk-floor",
                &json!({"role": "http-header-operation"}),
                &module,
            )],
        ),
    ];
    for (i, r) in roles.iter().enumerate() {
        variants.push((
            format!("role{i}"),
            vec![plugin(&format!("role{i}"), &r.config, &module)],
        ));
    }
    match envoy_latencies(dir.path(), &variants) {
        None => println!("  (skipped: real Envoy not found or not answering; `make envoy`)"),
        Some(results) => {
            assert_eq!(results.len(), variants.len());
            let (base_us, base_rps) = results[0];
            println!("  no filter: median {base_us:.1} us, {base_rps:.0} req/s");
            let floor = results[1].0 - base_us;
            println!(
                "  floor (noop module): +{floor:.1} us, throughput x{:.2}",
                results[1].1 / base_rps
            );
            println!(
                "  the module with no work (header role, no ops): +{:.1} us, throughput x{:.2}",
                results[2].0 - base_us,
                results[2].1 / base_rps
            );
            for (r, (t, rps)) in roles.iter().zip(&results[3..]) {
                let added = t - base_us;
                println!(
                    "  {:<28} +{added:.1} us (floor +{floor:.1}), throughput x{:.2}",
                    r.name,
                    rps / base_rps
                );
                if r.name == "http-header-operation" {
                    check(
                        format!("header role adds {added:.1} us: within 5 us of the floor ({floor:.1} us) and at most 15 us"),
                        added <= floor + 5.0 && added <= 15.0,
                    );
                }
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

fn finish(missed: &[String]) -> ! {
    if !missed.is_empty() {
        println!("{} target(s) missed", missed.len());
        std::process::exit(1);
    }
    std::process::exit(0);
}
