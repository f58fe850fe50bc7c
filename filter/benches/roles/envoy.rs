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
/// Envoy's allocator release setting as the bench measures it (`WASM_FILTER_BENCH_RELEASE`):
/// the bootstrap's `memory_allocator_manager`, returning up to this many free bytes of the
/// heap to the system every interval, and the time waited before reading the memory (more
/// than one interval, so one release has run).
const RELEASE_BYTES: u64 = 16 << 20;
const RELEASE_INTERVAL: &str = "1s";
const RELEASE_WAIT: Duration = Duration::from_millis(2500);

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
    /// Envoy's memory with this variant alone (the sample whose RSS is the median).
    pub memory: Memory,
    /// The same with Envoy's allocator release on (`WASM_FILTER_BENCH_RELEASE`).
    pub released: Option<Memory>,
}

/// Envoy's resident memory and where its allocator's part of it is, MiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// VmRSS.
    pub rss: f64,
    /// The heap tcmalloc holds from the system (`/memory`'s `heap_size`)...
    pub heap: f64,
    /// ...the bytes allocated in it (`allocated`)...
    pub live: f64,
    /// ...and, of the rest (`/memory/tcmalloc`): free pages in its page heap, free objects in
    /// its caches (per thread, transfer, central); and its peak (`Actual memory used at
    /// peak`, metadata included).
    pub page_free: f64,
    pub cached: f64,
    pub peak: f64,
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
        release: bool,
    ) -> Option<Self> {
        let listeners: Vec<Value> = variants
            .iter()
            .zip(ports)
            .map(|(v, port)| listener(&v.name, *port, &v.filters))
            .collect();
        let admin = free_port();
        let mut bootstrap = json!({"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
            "static_resources": {"listeners": listeners, "clusters": [{
            "name": "backend", "connect_timeout": "1s", "type": "STATIC",
            "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [{"endpoint":
                {"address": {"socket_address": {"address": "127.0.0.1", "port_value": backend}}}}]}]}}]}});
        if release {
            bootstrap["memory_allocator_manager"] = json!({
                "bytes_to_release": RELEASE_BYTES.to_string(),
                "memory_release_interval": RELEASE_INTERVAL});
        }
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

    /// An admin page's body (`connection: close`, so read to the end).
    fn admin(&self, path: &str) -> Option<String> {
        let mut c = TcpStream::connect(("127.0.0.1", self.1)).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .ok()?;
        let mut text = String::new();
        c.take(1 << 20).read_to_string(&mut text).ok()?;
        Some(text)
    }

    /// Envoy's memory now. The heap tcmalloc holds beyond what is allocated is memory freed
    /// but kept (after V8 compiled a module, for one).
    fn memory(&self) -> Memory {
        const MIB: f64 = 1048576.0;
        // First, before the admin pages below cost Envoy memory of their own.
        let rss = self.rss_mib();
        // `/memory`'s body is chunked: the JSON object between the first `{` and the last `}`.
        let json = self
            .admin("/memory")
            .and_then(|t| serde_json::from_str::<Value>(t.get(t.find('{')?..=t.rfind('}')?)?).ok());
        let field = |key: &str| {
            json.as_ref()
                .and_then(|v| v[key].as_str()?.parse::<f64>().ok())
                .unwrap_or(0.0)
                / MIB
        };
        // `MALLOC: +      6471680 (    6.2 MiB) Bytes in page heap freelist`: the bytes of
        // each line whose label ends so, summed.
        let stats = self.admin("/memory/tcmalloc").unwrap_or_default();
        let sum = |labels: &[&str]| {
            stats
                .lines()
                .filter_map(|l| l.strip_prefix("MALLOC:"))
                .filter(|l| labels.iter().any(|label| l.trim_end().ends_with(label)))
                .filter_map(|l| {
                    l.trim_start_matches([' ', '+', '='])
                        .split_whitespace()
                        .next()?
                        .parse::<f64>()
                        .ok()
                })
                .sum::<f64>()
                / MIB
        };
        Memory {
            rss,
            heap: field("heap_size"),
            live: field("allocated"),
            page_free: sum(&["Bytes in page heap freelist"]),
            cached: sum(&[
                "Bytes in central cache freelist",
                "Bytes in per-CPU cache freelist",
                "Bytes in Sharded cache freelist",
                "Bytes in transfer cache freelist",
                "Bytes in thread cache freelists",
            ]),
            peak: sum(&["Actual memory used at peak"]),
        }
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
    let together = Envoy::start(envoy, dir, &all, &ports, backend, workers, false)?;
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
    // With the allocator release measured too, each variant's two Envoys run back to back.
    let release = std::env::var_os("WASM_FILTER_BENCH_RELEASE").is_some();
    let mut rss: Vec<[Vec<Memory>; 2]> = vec![[Vec::new(), Vec::new()]; variants.len()];
    for _ in 0..rss_samples(workers) {
        for (i, v) in variants.iter().enumerate() {
            for (k, on) in [false, true].into_iter().enumerate() {
                if on && !release {
                    continue;
                }
                let port = free_port();
                let alone = Envoy::start(envoy, dir, &[v], &[port], backend, workers, on)?;
                let mut c = connect(port, workers)?;
                batch(&mut c, RSS_WARM_UP)?;
                if on {
                    std::thread::sleep(RELEASE_WAIT);
                }
                rss[i][k].push(alone.memory());
            }
        }
    }
    let median_sample = |mut samples: Vec<Memory>| {
        samples.sort_by(|a, b| a.rss.total_cmp(&b.rss));
        samples.get(samples.len() / 2).copied()
    };
    let out = rss
        .into_iter()
        .enumerate()
        .map(|(i, [without, with])| Measured {
            median_us: median(std::mem::take(&mut times[i])).as_secs_f64() * 1e6,
            rps: requests / walls[i].as_secs_f64(),
            added_us: added[i].0,
            cpu_us: cpu_base + added[i].1,
            memory: median_sample(without).unwrap_or_default(),
            released: median_sample(with),
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
    let running = Envoy::start(envoy, dir, &[&variant], &[port], backend, 1, false)?;
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
