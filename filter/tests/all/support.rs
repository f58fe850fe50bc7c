//! The module under test, the repository's paths, and the shorthand the role tests share.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wasm_harness::{guest, Proxy, StartError};

/// The crate built for wasm32-wasip1 (a no-op when fresh).
pub fn module() -> PathBuf {
    guest::build(env!("CARGO_MANIFEST_DIR"), "wasm-release").unwrap_or_else(|e| panic!("{e}"))
}

pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A proxy running the module in `role` with the rest of `config`.
pub fn role(role: &str, config: serde_json::Value, workers: usize) -> Result<Proxy, StartError> {
    let mut config = config;
    config["role"] = role.into();
    Proxy::for_module(module())
        .configuration(config.to_string())
        .workers(workers)
        .build()
}

/// Log lines containing `needle`.
pub fn lines(proxy: &Proxy, needle: &str) -> Vec<String> {
    proxy
        .logs()
        .iter()
        .filter(|l| l.message.contains(needle))
        .map(|l| l.message.clone())
        .collect()
}

/// A copy of a bootstrap from the repository (`envoy-config/bootstrap.yaml`, ...) whose
/// module path is absolute (the harness and Envoy resolve relative ones against their
/// current directory, the repository root when run by hand).
pub fn bootstrap_copy(dir: &Path, relative: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join(relative)).unwrap();
    let text = text.replace(
        "target/wasm32-wasip1/wasm-release/wasm_filter.wasm",
        &module().display().to_string(),
    );
    let path = dir.join("bootstrap.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

pub use wasm_common::envoy::envoy;

/// Real Envoy's `wasm log` lines containing `needle`, waiting (up to 10 s) for at least
/// `want` of them: Envoy writes its log every 50 ms, ticks come on their own time.
pub fn envoy_lines(
    real: &wasm_harness::real_envoy::RealEnvoy,
    needle: &str,
    want: usize,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let found: Vec<String> = real
            .wasm_logs()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect();
        if found.len() >= want || std::time::Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Real Envoy started on a bootstrap as it is (no port rewriting), one worker unless told,
/// stopped when dropped.
pub struct EnvoyProcess {
    child: Child,
    log: std::path::PathBuf,
}

impl EnvoyProcess {
    pub fn start(dir: &Path, bootstrap: &Path) -> Self {
        Self::with_workers(dir, bootstrap, 1)
    }

    pub fn with_workers(dir: &Path, bootstrap: &Path, workers: usize) -> Self {
        let log = dir.join("envoy.log");
        let child = Command::new(envoy())
            .arg("-c")
            .arg(bootstrap)
            .args([
                "--concurrency",
                &workers.to_string(),
                "--disable-hot-restart",
                "-l",
                "info",
            ])
            .args(["--file-flush-interval-msec", "50", "--log-path"])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, log }
    }

    /// Waits (up to 30 s) for a log line containing `needle`.
    pub fn wait_for(&self, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The directory holding the crate's native build, `libwasm_filter.so` (the Envoy dynamic
/// module), built first with `cargo build --release --lib` (a no-op when fresh).
pub fn dynamic_module_dir() -> PathBuf {
    let manifest = root().join("filter/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--lib",
            "--features",
            "fault",
            "--manifest-path",
        ])
        .arg(&manifest)
        // Its own target directory: the `.so` in target/release (what `make build` ships)
        // stays without the fault switch.
        .arg("--target-dir")
        .arg(root().join("target/fault"))
        .args(["--message-format", "json-render-diagnostics"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.file_name().is_some_and(|n| n == "libwasm_filter.so"))
        .expect("cargo built no libwasm_filter.so");
    so.parent().unwrap().to_path_buf()
}

/// Five GETs through the `headers` listener of a bootstrap whose rate limit was cut to three
/// tokens (`"burst": 3, "refill_per_second": 0.01`): three pass and two get a 429 asking the
/// client to retry after 100 s, whichever worker each connection lands on, as one bucket
/// table serves them all. Returns the exchanges, for what else a caller checks.
pub fn assert_three_of_five_pass(
    real: &mut wasm_harness::real_envoy::RealEnvoy,
) -> Vec<wasm_harness::Exchange> {
    let exchanges: Vec<_> = (0..5)
        .map(|_| {
            real.send(
                Some("headers"),
                &wasm_harness::Request::get("/"),
                &wasm_harness::UpstreamReply::new(200),
            )
            .unwrap()
        })
        .collect();
    let codes: Vec<_> = exchanges.iter().map(|e| e.response_status()).collect();
    assert_eq!(
        codes,
        [Some(200), Some(200), Some(200), Some(429), Some(429)]
    );
    assert_eq!(exchanges[3].response_header("retry-after"), Some("100"));
    exchanges
}

/// One HTTP/1.1 GET on a fresh loopback connection; the whole response as text.
pub fn http_get(port: u16, path: &str, headers: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nhost: t\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// Real Envoy's `/stats/prometheus`. Its admin port is in the file `RealEnvoy` has Envoy
/// write beside its log (`--admin-address-path`).
pub fn prometheus(real: &wasm_harness::real_envoy::RealEnvoy) -> String {
    let file = real.log_path.with_file_name("admin-address");
    let address = std::fs::read_to_string(&file).unwrap();
    let port = address.trim().rsplit_once(':').unwrap().1.parse().unwrap();
    http_get(port, "/stats/prometheus", "")
}

/// The value of the series `name{plugin="...",role="..."}` in a Prometheus scrape.
pub fn series(scrape: &str, name: &str, plugin: &str, role: &str) -> Option<u64> {
    let head = format!("{name}{{plugin=\"{plugin}\",role=\"{role}\"}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&head)?.trim().parse().ok())
}

/// The two connections the TCP counter's tests drive through the `tcp` listener (the
/// counter in front of `tcp_proxy`): `hello` answered `hi`, then `0123456789` answered `x`,
/// each closed by the client, every byte getting through both ways. The counter then has
/// logged `in=5 out=2` and `in=10 out=1`: 15 bytes in, 3 out, 2 connections.
pub fn two_tcp_connections(real: &mut wasm_harness::real_envoy::RealEnvoy) {
    use wasm_harness::TcpEvent;
    for (data, reply) in [("hello", "hi"), ("0123456789", "x")] {
        let out = real
            .connect(
                Some("tcp"),
                &[
                    TcpEvent::Downstream(data.as_bytes().to_vec()),
                    TcpEvent::Upstream(reply.as_bytes().to_vec()),
                    TcpEvent::CloseDownstream,
                ],
            )
            .unwrap();
        assert_eq!(out.upstream_received, data.as_bytes());
        assert_eq!(out.downstream_received, reply.as_bytes());
    }
}
