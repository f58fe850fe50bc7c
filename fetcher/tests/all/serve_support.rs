//! Running `wasm-fetcher serve` and real Envoy in tests: start, wait for, ask, stop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
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

pub use crate::real_envoy::{body, http_get};

/// The value of header `name` (lower case) in a whole HTTP/1.1 response.
pub fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// GET `path` on `addr` (`host:port`): status and body.
pub fn get(addr: &str, path: &str) -> Result<(u16, String), String> {
    http_get(addr, path).map(|(status, text)| (status, body(&text)))
}

/// A directory for plugins, one for ECDS files, a cache dir, in a temp dir.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
    pub plugins: PathBuf,
    pub ecds: PathBuf,
    pub cache: PathBuf,
}

impl Dirs {
    /// `serve` on these directories.
    pub fn serve(&self, env: &[(&str, &str)], args: &[&str]) -> Serve {
        Serve::start(&self.plugins, &self.ecds, &self.cache, env, args)
    }

    /// `serve` on these plugins and ECDS directories with the cache `cache`, for a start that
    /// must fail: its exit status (`None` if it still ran after 10 s; it is then killed) and
    /// its log.
    pub fn serve_to_exit(&self, cache: &Path) -> (Option<std::process::ExitStatus>, String) {
        let err = cache.with_extension("log");
        let mut child = fetcher()
            .arg("serve")
            .arg("--plugins")
            .arg(&self.plugins)
            .arg("--ecds-dir")
            .arg(&self.ecds)
            .arg("--cache-dir")
            .arg(cache)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let status = loop {
            let status = child.try_wait().unwrap();
            if status.is_some() || start.elapsed() > Duration::from_secs(10) {
                break status;
            }
            std::thread::sleep(Duration::from_millis(25));
        };
        let _ = child.kill();
        let _ = child.wait();
        (status, std::fs::read_to_string(&err).unwrap_or_default())
    }

    /// [`Dirs::serve`], once `/readyz` answers 200.
    pub fn serve_ready(&self, env: &[(&str, &str)], args: &[&str]) -> Serve {
        let serve = self.serve(env, args);
        serve.wait_ready();
        serve
    }
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let d = Dirs {
        plugins: tmp.path().join("plugins"),
        ecds: tmp.path().join("ecds"),
        cache: tmp.path().join("cache"),
        tmp,
    };
    std::fs::create_dir_all(&d.plugins).unwrap();
    std::fs::create_dir_all(&d.ecds).unwrap();
    d
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
        get(&self.addr, "/readyz").is_ok_and(|(status, _)| status == 200)
    }

    pub fn wait_ready(&self) {
        wait_for("serve ready", Duration::from_secs(60), || self.ready());
    }

    /// The value of one sample line of /metrics (`name{labels}` exactly as written).
    pub fn metric(&self, sample: &str) -> u64 {
        let (_, text) = get(&self.addr, "/metrics").unwrap();
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

/// An Envoy bootstrap (written into `dir`) with one HTTP listener, `main`, whose filters are
/// the ECDS entries of `plugin_texts` (through the fetcher's own renderer) and the router to
/// `upstream` (`host:port`).
pub fn ecds_bootstrap(dir: &Path, ecds: &Path, plugin_texts: &[&str], upstream: &str) -> PathBuf {
    use wasm_fetcher::envoy::render::filter_entry;
    use wasm_fetcher::envoy::wasmplugin::WasmPlugin;
    let filters: Vec<serde_json::Value> = plugin_texts
        .iter()
        .flat_map(|t| WasmPlugin::parse_all(t).unwrap())
        .map(|p| filter_entry(&p, ecds))
        .collect();
    filters_bootstrap(dir, filters, upstream)
}

/// An Envoy bootstrap (written into `dir`) with one HTTP listener, `main`, whose filters are
/// `filters` and the router to `upstream` (`host:port`).
pub fn filters_bootstrap(
    dir: &Path,
    mut filters: Vec<serde_json::Value>,
    upstream: &str,
) -> PathBuf {
    filters.push(serde_json::json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    let (host, port) = upstream.split_once(':').unwrap();
    let bootstrap = serde_json::json!({
        "node": {"id": "sidecar", "cluster": "sidecar"},
        "static_resources": {
            "listeners": [{
                "name": "main",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
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
    let file = dir.join("bootstrap.json");
    std::fs::write(&file, bootstrap.to_string()).unwrap();
    file
}
