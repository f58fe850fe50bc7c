//! Real Envoy 1.40 (`.venv/bin/envoy`, V8) for the sidecar tests: started on a bootstrap whose
//! listeners and admin bind loopback port 0 (Envoy's admin API says which ports it got),
//! stopped when dropped; a plain HTTP/1.1 GET through a listener by name.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn envoy_bin() -> PathBuf {
    wasm_common::envoy::envoy()
}

/// `envoy --mode validate` on `bootstrap`; the log tail when it refuses.
pub fn validate(bootstrap: &Path) -> Result<(), String> {
    let o = Command::new(envoy_bin())
        .args(["--mode", "validate", "-l", "warning", "-c"])
        .arg(bootstrap)
        .output()
        .unwrap();
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

pub struct Envoy {
    child: Child,
    admin_path: PathBuf,
    pub log_path: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener on loopback port 0 named `name` whose filter chain is `filters` (YAML list).
pub fn listener(name: &str, filters: &str) -> String {
    let indented: String = filters.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "  - name: {name}\n    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}\n    filter_chains:\n    - filters:\n{indented}"
    )
}

/// A connection manager answering 200 `ok` itself, with `http_filters` (YAML list) before
/// the router.
pub fn http_manager(http_filters: &str) -> String {
    let indented: String = http_filters.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        r#"- name: envoy.filters.network.http_connection_manager
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
    stat_prefix: m
    route_config:
      virtual_hosts:
      - name: all
        domains: ["*"]
        routes:
        - match: {{prefix: "/"}}
          direct_response: {{status: 200, body: {{inline_string: ok}}}}
    http_filters:
{indented}    - name: envoy.filters.http.router
      typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
"#
    )
}

/// A bootstrap holding `listeners` (each from [`listener`]).
pub fn bootstrap(listeners: &[String]) -> String {
    format!(
        "node: {{id: test, cluster: test}}\nstatic_resources:\n  listeners:\n{}",
        listeners.concat()
    )
}

impl Envoy {
    /// Starts Envoy on the bootstrap at `path` (its admin is put on port 0) and waits until
    /// every listener is bound.
    pub fn start(path: &Path) -> Self {
        Self::start_in(path, Path::new("."))
    }

    /// [`Envoy::start`] with `cwd` as Envoy's working directory (relative paths in the
    /// bootstrap and its ECDS files resolve against it). Every listener is moved to port 0.
    pub fn start_in(path: &Path, cwd: &Path) -> Self {
        let mut doc: serde_json::Value =
            serde_norway::from_slice(&std::fs::read(path).unwrap()).unwrap();
        doc["admin"] = serde_json::json!({"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}});
        for l in doc["static_resources"]["listeners"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            l["address"]["socket_address"]["port_value"] = 0.into();
        }
        let dir = path.parent().unwrap();
        let config = dir.join("envoy-run.json");
        std::fs::write(&config, serde_json::to_vec(&doc).unwrap()).unwrap();
        let wanted = doc["static_resources"]["listeners"]
            .as_array()
            .map_or(0, Vec::len);
        let admin_path = dir.join("admin-address");
        let log_path = dir.join("envoy.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(envoy_bin())
            .current_dir(cwd)
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut envoy = Self {
            child,
            admin_path,
            log_path,
        };
        let start = Instant::now();
        while envoy.listeners().len() < wanted {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited with {status}:\n{}", envoy.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "envoy did not bind its listeners:\n{}",
                envoy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        envoy
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Whether the process still runs: with hot restart off, the same process is the same
    /// Envoy, never restarted.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port` of the admin API.
    pub fn admin_address(&self) -> String {
        std::fs::read_to_string(&self.admin_path)
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    fn admin(&self, path: &str) -> Option<String> {
        let address = std::fs::read_to_string(&self.admin_path).ok()?;
        let (_, text) = http_get(address.trim(), path).ok()?;
        Some(body(&text))
    }

    /// Bound listeners: name and port.
    fn listeners(&self) -> Vec<(String, u16)> {
        let Some(body) = self.admin("/listeners?format=json") else {
            return Vec::new();
        };
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        doc["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| {
                let port = l
                    .pointer("/local_address/socket_address/port_value")?
                    .as_u64()?;
                Some((l["name"].as_str()?.to_string(), port as u16))
            })
            .filter(|(_, port)| *port > 0)
            .collect()
    }

    pub fn port(&self, listener: &str) -> u16 {
        self.listeners()
            .into_iter()
            .find(|(n, _)| n == listener)
            .unwrap_or_else(|| panic!("no listener {listener}"))
            .1
    }

    /// GET `/` through `listener`: the status and the response head and body as text, or
    /// the error when Envoy closed the connection without an answer.
    pub fn get(&self, listener: &str) -> Result<(u16, String), String> {
        http_get(&format!("127.0.0.1:{}", self.port(listener)), "/")
    }

    /// Waits (up to 10 s) until `check` holds for a GET through `listener`: ECDS files are
    /// watched, and a change takes a moment to apply.
    pub fn eventually(
        &self,
        listener: &str,
        check: impl Fn(&Result<(u16, String), String>) -> bool,
    ) -> Result<(u16, String), String> {
        let start = Instant::now();
        loop {
            let r = self.get(listener);
            if check(&r) || start.elapsed() > Duration::from_secs(10) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One HTTP/1.1 GET with `connection: close`, read to the end (5 s deadline per read).
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let _ = s.take(1 << 20).read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP answer (connection closed): {text:?}"))?;
    Ok((status, text))
}

/// The body of a whole HTTP/1.1 response, de-chunked when it came in chunks.
pub fn body(response: &str) -> String {
    let Some((head, rest)) = response.split_once("\r\n\r\n") else {
        return String::new();
    };
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return rest.to_string();
    }
    let mut out = String::new();
    let mut rest = rest;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
