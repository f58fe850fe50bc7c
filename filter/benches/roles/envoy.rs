//! The real-Envoy half of the roles bench: listeners for each variant in one Envoy, taken in
//! turn within one run (so load changes hit all alike), at several worker counts with as many
//! client connections as workers; and Envoy's resident memory with each variant alone. The
//! dynamic module is `target/release/libwasm_filter.so` as `make build` leaves it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Requests per connection per round, rounds (`WASM_FILTER_BENCH_ROUNDS` overrides), and
/// warm-up requests per connection.
const BATCH: usize = 200;
const ROUNDS: usize = 10;
const WARM_UP: usize = 500;
/// Requests per connection before Envoy's memory is read.
const RSS_WARM_UP: usize = 1000;

pub const JSON_REPLY: &str = r#"{"user":"al","password":"hunter2","items":[1,2,3]}"#;
const REQUEST: &[u8] =
    b"GET /api/items HTTP/1.1\r\nhost: bench\r\nx-internal-secret: s3cret\r\n\r\n";

/// One listener's filters, by name.
pub struct Variant {
    pub name: String,
    pub filters: Vec<Value>,
}

/// What one variant measured at one worker count.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Median microseconds per request.
    pub median_us: f64,
    /// Requests per second over all connections.
    pub rps: f64,
    /// The time this variant adds over the first variant (no filter): the median over the
    /// rounds of the difference between their batches' medians in the same round, so a
    /// change in the machine's load between rounds cancels out.
    pub added_us: f64,
    /// Envoy's CPU time per request (all its threads), microseconds: the first variant's
    /// median over the rounds plus this variant's paired difference with it, as `added_us`.
    /// What the variant costs Envoy itself, beside a latency a busy machine blurs.
    pub cpu_us: f64,
    /// Envoy's resident memory with this variant alone, MiB (median of the samples).
    pub rss_mib: f64,
    /// Envoy's allocator at the same moment: heap held from the system, and allocated in
    /// it (MiB, from the sample whose RSS is the median).
    pub heap_mib: (f64, f64),
}

/// `$ENVOY_BIN`, else the repository's `.venv/bin/envoy` (cargo runs a bench from its
/// package's directory, where the harness's own lookup would not see it), else the harness's
/// lookup.
pub fn envoy_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy");
    if venv.exists() {
        return std::fs::canonicalize(venv).ok();
    }
    wasm_harness::real_envoy::find_envoy().ok()
}

pub fn wasm_plugin(name: &str, config: &Value, code: &Path) -> Value {
    json!({"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": name, "root_id": name,
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config.to_string()},
            "vm_config": {"vm_id": name, "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": code.display().to_string()}}}}}})
}

/// Where Envoy finds the dynamic module (`libwasm_filter.so`, left by `make build`).
fn dynamic_module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release")
}

/// The filter as an Envoy dynamic module, with the same plugin configuration.
pub fn dynamic_module(config: &Value) -> Value {
    json!({"name": "envoy.filters.http.dynamic_modules", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
        "dynamic_module_config": {"name": "wasm_filter"},
        "filter_name": "wasm-filter",
        "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config.to_string()}}})
}

/// Envoy's Lua filter making the header role's four edits.
pub fn lua_headers() -> Value {
    let code = r#"
function envoy_on_request(handle)
  local h = handle:headers()
  h:remove("x-internal-secret")
  h:replace("x-env", "bench")
  h:add("x-added-by", "wasm-filter")
end
function envoy_on_response(handle)
  handle:headers():add("x-served-by", "wasm-filter")
end
"#;
    json!({"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": code}}})
}

/// Envoy's native `header_mutation` filter making the same four edits.
pub fn native_headers() -> Value {
    let append = |k: &str, v: &str, action: &str| json!({"append": {"header": {"key": k, "value": v}, "append_action": action}});
    json!({"name": "envoy.filters.http.header_mutation", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {
            "request_mutations": [
                {"remove": "x-internal-secret"},
                append("x-env", "bench", "OVERWRITE_IF_EXISTS_OR_ADD"),
                append("x-added-by", "wasm-filter", "APPEND_IF_EXISTS_OR_ADD"),
            ],
            "response_mutations": [append("x-served-by", "wasm-filter", "APPEND_IF_EXISTS_OR_ADD")]}}})
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .map(|l| l.local_addr().map(|a| a.port()).unwrap_or(0))
        .unwrap_or(0)
}

/// A keep-alive upstream answering every request with `JSON_REPLY`.
fn upstream() -> u16 {
    let Ok(listener) = TcpListener::bind("127.0.0.1:0") else {
        return 0;
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = conn.set_nodelay(true);
                let Ok(read) = conn.try_clone() else { return };
                let mut reader = BufReader::new(read);
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

fn listener(name: &str, port: u16, filters: &[Value]) -> Value {
    let mut chain = filters.to_vec();
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

/// A running Envoy and its admin port, killed when dropped.
struct Envoy(Child, u16);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Envoy {
    /// Envoy with one listener per variant (ports in order) in front of `backend`.
    fn start(
        envoy: &Path,
        dir: &Path,
        variants: &[&Variant],
        ports: &[u16],
        backend: u16,
        workers: usize,
    ) -> Option<Self> {
        let listeners: Vec<Value> = variants
            .iter()
            .zip(ports)
            .map(|(v, port)| listener(&v.name, *port, &v.filters))
            .collect();
        let admin = free_port();
        let bootstrap = json!({"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {"listeners": listeners, "clusters": [{
            "name": "backend", "connect_timeout": "1s", "type": "STATIC",
            "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [{"endpoint":
                {"address": {"socket_address": {"address": "127.0.0.1", "port_value": backend}}}}]}]}}]}});
        let path = dir.join(format!(
            "bench-{}.json",
            ports.first().copied().unwrap_or(0)
        ));
        std::fs::write(&path, bootstrap.to_string()).ok()?;
        let child = Command::new(envoy)
            .arg("-c")
            .arg(&path)
            .args(["--concurrency", &workers.to_string()])
            .args(["--disable-hot-restart", "-l", "warning"])
            .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dynamic_module_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(Self(child, admin))
    }

    /// CPU time of all Envoy's threads so far, nanoseconds (`schedstat`'s first field).
    fn cpu_ns(&self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.0.id())) else {
            return 0;
        };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Envoy's allocator (`/memory` on its admin port): the bytes its heap holds from the
    /// system and the bytes allocated in it, MiB. The difference is memory freed but kept
    /// (after V8 compiled a module, for one).
    fn heap_mib(&self) -> (f64, f64) {
        let read = || -> Option<Value> {
            let mut c = TcpStream::connect(("127.0.0.1", self.1)).ok()?;
            c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            c.write_all(b"GET /memory HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")
                .ok()?;
            let mut text = String::new();
            c.read_to_string(&mut text).ok()?;
            // The body is chunked: the JSON object between the first `{` and the last `}`.
            serde_json::from_str(text.get(text.find('{')?..=text.rfind('}')?)?).ok()
        };
        let mib = |v: &Value, key: &str| {
            v[key]
                .as_str()
                .and_then(|n| n.parse::<f64>().ok())
                .unwrap_or(0.0)
                / 1048576.0
        };
        read().map_or((0.0, 0.0), |v| (mib(&v, "heap_size"), mib(&v, "allocated")))
    }

    fn rss_mib(&self) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }
}

type Conn = (BufReader<TcpStream>, TcpStream);

/// `n` keep-alive connections to `port`, waiting up to 60 s for Envoy to listen.
fn connect(port: u16, n: usize) -> Option<Vec<Conn>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let conn = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(_) => return None,
            }
        };
        conn.set_nodelay(true).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        conns.push((BufReader::new(conn.try_clone().ok()?), conn));
    }
    Some(conns)
}

/// `count` requests on each connection, the connections in parallel: each request's time,
/// and the wall time of the whole batch.
fn batch(conns: &mut [Conn], count: usize) -> Option<(Vec<Duration>, Duration)> {
    let start = Instant::now();
    let results: Vec<Option<Vec<Duration>>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|(reader, writer)| {
                s.spawn(move || {
                    let mut times = Vec::with_capacity(count);
                    for _ in 0..count {
                        let t = Instant::now();
                        writer.write_all(REQUEST).ok()?;
                        read_response(reader)?;
                        times.push(t.elapsed());
                    }
                    Some(times)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let wall = start.elapsed();
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Some((all, wall))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Every variant at `workers` workers: latency and throughput from one Envoy running them
/// all, taken in turn; memory from an Envoy running each alone.
pub fn measure(
    envoy: &Path,
    dir: &Path,
    variants: &[Variant],
    workers: usize,
) -> Option<Vec<Measured>> {
    let backend = upstream();
    let ports: Vec<u16> = variants.iter().map(|_| free_port()).collect();
    let all: Vec<&Variant> = variants.iter().collect();
    let together = Envoy::start(envoy, dir, &all, &ports, backend, workers)?;
    let mut conns = ports
        .iter()
        .map(|p| connect(*p, workers))
        .collect::<Option<Vec<_>>>()?;
    // V8 compiles a module's functions quickly first and optimizes the hot ones later, so
    // the figures are taken once every listener's code has run a while.
    for c in conns.iter_mut() {
        batch(c, WARM_UP)?;
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut walls = vec![Duration::ZERO; variants.len()];
    // Per round and variant: the batch's median time and Envoy's CPU time per request, so
    // each variant is compared with the baseline's batch of the same round.
    let mut round_us: Vec<Vec<(f64, f64)>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds() {
        for (i, c) in conns.iter_mut().enumerate() {
            let before = together.cpu_ns();
            let (t, wall) = batch(c, BATCH)?;
            let spent = together.cpu_ns().saturating_sub(before) as f64 / 1e3;
            round_us[i].push((
                median(t.clone()).as_secs_f64() * 1e6,
                spent / (BATCH * workers) as f64,
            ));
            times[i].extend(t);
            walls[i] += wall;
        }
    }
    // Paired differences with variant 0 (no filter), round by round; their medians.
    let paired = |i: usize, pick: fn(&(f64, f64)) -> f64| {
        let mut d: Vec<f64> = round_us[i]
            .iter()
            .zip(&round_us[0])
            .map(|(v, b)| pick(v) - pick(b))
            .collect();
        d.sort_by(f64::total_cmp);
        d.get(d.len() / 2).copied().unwrap_or(0.0)
    };
    let added: Vec<(f64, f64)> = (0..variants.len())
        .map(|i| (paired(i, |r| r.0), paired(i, |r| r.1)))
        .collect();
    let cpu_base = {
        let mut c: Vec<f64> = round_us[0].iter().map(|r| r.1).collect();
        c.sort_by(f64::total_cmp);
        c.get(c.len() / 2).copied().unwrap_or(0.0)
    };
    drop(conns);
    drop(together);
    let requests = (BATCH * rounds() * workers) as f64;
    // Memory: each variant alone, the variants in turn, `rss_samples()` times; the median.
    let mut rss: Vec<Vec<(f64, (f64, f64))>> = vec![Vec::new(); variants.len()];
    for _ in 0..rss_samples(workers) {
        for (i, v) in variants.iter().enumerate() {
            let port = free_port();
            let alone = Envoy::start(envoy, dir, &[v], &[port], backend, workers)?;
            let mut c = connect(port, workers)?;
            batch(&mut c, RSS_WARM_UP)?;
            rss[i].push((alone.rss_mib(), alone.heap_mib()));
        }
    }
    let out = rss
        .into_iter()
        .enumerate()
        .map(|(i, mut samples)| {
            samples.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (rss_mib, heap_mib) = samples
                .get(samples.len() / 2)
                .copied()
                .unwrap_or((0.0, (0.0, 0.0)));
            Measured {
                median_us: median(std::mem::take(&mut times[i])).as_secs_f64() * 1e6,
                rps: requests / walls[i].as_secs_f64(),
                added_us: added[i].0,
                cpu_us: cpu_base + added[i].1,
                rss_mib,
                heap_mib,
            }
        })
        .collect();
    Some(out)
}

fn rounds() -> usize {
    std::env::var("WASM_FILTER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(ROUNDS)
}

/// How many times each variant's Envoy is started alone for its memory
/// (`WASM_FILTER_BENCH_RSS_SAMPLES`; by default 3 at one worker, where the memory target is
/// checked, and 1 at more, which keeps `make bench` to minutes).
fn rss_samples(workers: usize) -> usize {
    std::env::var("WASM_FILTER_BENCH_RSS_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(if workers == 1 { 3 } else { 1 })
}

/// Envoy's RSS (MiB) with a header-keyed rate limit at one worker: after 1 000 requests with
/// one key, then after `keys` requests each with a new key (spread over 4 connections).
pub fn rss_across_keys(envoy: &Path, dir: &Path, module: &Path, keys: usize) -> Option<(f64, f64)> {
    let config = json!({"role": "rate-limit", "key": {"header": "x-api-key"},
        "burst": 1_000_000, "refill_per_second": 1_000_000});
    let variant = Variant {
        name: "keys".into(),
        filters: vec![wasm_plugin("keys", &config, module)],
    };
    let backend = upstream();
    let port = free_port();
    let running = Envoy::start(envoy, dir, &[&variant], &[port], backend, 1)?;
    let mut conns = connect(port, 4)?;
    batch(&mut conns[..1], 1000)?;
    let before = running.rss_mib();
    let per_conn = keys.div_ceil(conns.len());
    std::thread::scope(|s| {
        for (c, (reader, writer)) in conns.iter_mut().enumerate() {
            s.spawn(move || {
                for i in 0..per_conn {
                    let request =
                        format!("GET / HTTP/1.1\r\nhost: bench\r\nx-api-key: key-{c}-{i}\r\n\r\n");
                    if writer.write_all(request.as_bytes()).is_err()
                        || read_response(reader).is_none()
                    {
                        return;
                    }
                }
            });
        }
    });
    Some((before, running.rss_mib()))
}
