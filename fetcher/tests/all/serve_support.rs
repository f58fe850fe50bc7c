//! Running `wasm-fetcher serve` and real Envoy in tests: start, wait for, ask, stop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fetcher;

/// Polls `cond` until it holds or `limit` passes; the panic says what was awaited.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "{what}: still not so after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// An answer to a plain HTTP/1.1 request.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` on `addr` (`host:port`), one request per connection, within 30 s.
pub fn get(addr: &str, path: &str) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

/// A running `wasm-fetcher serve`, killed when dropped.
pub struct Serve {
    pub child: Child,
    /// `host:port` of /metrics, /healthz, /readyz.
    pub addr: String,
    pub stderr: PathBuf,
}

impl Serve {
    /// `serve --plugins plugins --ecds-dir ecds --cache-dir cache ARGS`, with `env`; returns
    /// once it listens.
    pub fn start(
        plugins: &Path,
        ecds: &Path,
        cache: &Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stderr = cache.with_extension(format!("serve-{n}.log"));
        let mut child = fetcher()
            .envs(env.iter().copied())
            .env("WASM_FETCHER_LOG", "info")
            .arg("serve")
            .arg("--plugins")
            .arg(plugins)
            .arg("--ecds-dir")
            .arg(ecds)
            .arg("--cache-dir")
            .arg(cache)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(if args.contains(&"--poll-interval") {
                &[][..]
            } else {
                &["--poll-interval", "50ms"][..]
            })
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let addr = first
            .rsplit("http://")
            .next()
            .map(|a| a.trim().to_string())
            .filter(|a| a.starts_with("127.0.0.1:"))
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!(
                    "serve did not start: {first:?}; {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            });
        Self {
            child,
            addr,
            stderr,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn ready(&self) -> bool {
        get(&self.addr, "/readyz").is_ok_and(|a| a.status == 200)
    }

    pub fn wait_ready(&self) {
        wait_for("serve ready", Duration::from_secs(60), || self.ready());
    }

    /// The value of one sample line of /metrics (`name{labels}` exactly as written).
    pub fn metric(&self, sample: &str) -> u64 {
        let text = get(&self.addr, "/metrics").unwrap().body;
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{sample} not in\n{text}"))
    }

    pub fn signal(&self, signal: i32) {
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0);
    }

    /// SIGTERM, then the exit status (within 10 s).
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "serve still running 10 s after SIGTERM: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A WasmPlugin file's text.
pub fn wasm_plugin(name: &str, url: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata:\n  name: {name}\n  namespace: test\nspec:\n  url: {url}\n{spec_extra}"
    )
}

/// `pluginConfig` for the filter's header role, adding `x-served-by: VALUE` to responses.
pub fn header_role(value: &str) -> String {
    format!(
        "  pluginConfig:\n    role: http-header-operation\n    response:\n      add: [{{name: x-served-by, value: {value}}}]\n"
    )
}

/// Replaces `path` by a rename, as editors and ConfigMap volumes do.
pub fn write_plugin(path: &Path, text: &str) {
    let tmp = path.with_file_name(".incoming");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn envoy_bin() -> PathBuf {
    let p = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/envoy"));
    assert!(
        p.exists(),
        "envoy not found at {}: run `make envoy`",
        p.display()
    );
    p
}

/// Real Envoy with one HTTP listener whose filters are the ECDS entries of `plugin_texts`
/// (through the fetcher's own renderer) and the router to `upstream` (`host:port`).
pub struct Envoy {
    child: Child,
    pub addr: String,
    log: PathBuf,
}

impl Envoy {
    pub fn start(dir: &Path, ecds: &Path, plugin_texts: &[&str], upstream: &str) -> Self {
        use wasm_fetcher::render::filter_entry;
        use wasm_fetcher::wasmplugin::WasmPlugin;
        let mut filters: Vec<serde_json::Value> = plugin_texts
            .iter()
            .flat_map(|t| WasmPlugin::parse_all(t).unwrap())
            .map(|p| filter_entry(&p, ecds))
            .collect();
        filters.push(serde_json::json!({
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
        }));
        let (host, port) = upstream.split_once(':').unwrap();
        let listen = free_port();
        let bootstrap = serde_json::json!({
            "node": {"id": "sidecar", "cluster": "sidecar"},
            "static_resources": {
                "listeners": [{
                    "name": "main",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [{"filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "main",
                            "route_config": {"virtual_hosts": [{
                                "name": "all", "domains": ["*"],
                                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend", "timeout": "30s"}}]
                            }]},
                            "http_filters": filters,
                        }
                    }]}]
                }],
                "clusters": [{
                    "name": "backend",
                    "connect_timeout": "5s",
                    "type": "STATIC",
                    "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [{
                        "endpoint": {"address": {"socket_address": {"address": host, "port_value": port.parse::<u16>().unwrap()}}}
                    }]}]}
                }]
            }
        });
        let file = dir.join(format!("envoy-{listen}.json"));
        std::fs::write(&file, bootstrap.to_string()).unwrap();
        let log = dir.join(format!("envoy-{listen}.log"));
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&file)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"])
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let envoy = Self {
            child,
            addr: format!("127.0.0.1:{listen}"),
            log,
        };
        let start = Instant::now();
        while TcpStream::connect(&envoy.addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "envoy did not listen within 60 s: {}",
                envoy.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        envoy
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
