//! Test helpers: a loopback HTTP/1.1 server with scripted misbehaviour, a cache dir, and a
//! runner for the `wasm-fetcher` binary.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A valid, tiny core module: header plus a custom section, so tests can tell modules apart.
pub fn module(tag: &str) -> Vec<u8> {
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    let payload = tag.as_bytes();
    m.push(0); // custom section
    m.push((1 + 4 + payload.len()) as u8);
    m.push(4);
    m.extend_from_slice(b"test");
    m.extend_from_slice(payload);
    m
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// How the server answers one path.
#[derive(Clone)]
pub enum Behaviour {
    Ok(Vec<u8>),
    Status(u16),
    /// Answer 503 this many times, then 200 with the body.
    FailThenOk(u32, Vec<u8>),
    /// Promise `Content-Length` of the whole body, send only the first `n` bytes, close.
    Truncate(Vec<u8>, usize),
    /// Wait before answering.
    Slow(Duration, Vec<u8>),
    /// Send the body in this many pieces with a pause before each.
    Trickle(Vec<u8>, usize, Duration),
    /// Any status with these headers (a redirect, a challenge, a manifest's content type).
    Respond(u16, Vec<(String, String)>, Vec<u8>),
}

/// A request as the server saw it: the request target and the headers, names lower-cased.
#[derive(Debug, Clone)]
pub struct Seen {
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub struct Server {
    pub base: String,
    hits: Arc<Mutex<HashMap<String, u32>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<Mutex<u32>>,
}

impl Server {
    pub fn start(routes: Vec<(&str, Behaviour)>) -> Self {
        Self::start_on("127.0.0.1", routes)
    }

    /// On another loopback address (127.0.0.2, ...): a host the tests can block alone.
    pub fn start_on(ip: &str, routes: Vec<(&str, Behaviour)>) -> Self {
        let routes = routes
            .into_iter()
            .map(|(p, b)| (p.to_string(), b))
            .collect();
        Self::listen(TcpListener::bind((ip, 0)).unwrap(), routes)
    }

    /// Routes that name the server itself (a token realm on the registry): `routes` gets the
    /// base URL.
    pub fn start_with_self(routes: impl FnOnce(&str) -> Vec<(String, Behaviour)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        Self::listen(listener, routes(&base))
    }

    fn listen(listener: TcpListener, routes: Vec<(String, Behaviour)>) -> Self {
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Arc<HashMap<String, Behaviour>> = Arc::new(routes.into_iter().collect());
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(0));
        let (h, s, c) = (hits.clone(), seen.clone(), connections.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                *c.lock().unwrap() += 1;
                let routes = routes.clone();
                let (hits, seen) = (h.clone(), s.clone());
                std::thread::spawn(move || serve(conn, &routes, &hits, &seen));
            }
        });
        Self {
            base,
            hits,
            seen,
            connections,
        }
    }

    /// `host:port`.
    pub fn host(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Connections accepted so far, whether or not a request followed.
    pub fn connections(&self) -> u32 {
        *self.connections.lock().unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn hits(&self, path: &str) -> u32 {
        *self.hits.lock().unwrap().get(path).unwrap_or(&0)
    }
}

fn serve(
    conn: TcpStream,
    routes: &HashMap<String, Behaviour>,
    hits: &Mutex<HashMap<String, u32>>,
    seen: &Mutex<Vec<Seen>>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((n, v)) = line.trim_end().split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    // The body is read (up to 1 MiB) before the answer: closing a connection with unread
    // data resets it, and the client could lose the answer.
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let _ = std::io::Read::read_exact(&mut reader, &mut vec![0; length.min(1 << 20)]);
    let target = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    seen.lock().unwrap().push(Seen {
        target: target.clone(),
        headers,
    });
    // A route names a path; the query, if any, does not take part.
    let path = if routes.contains_key(&target) {
        target
    } else {
        target.split('?').next().unwrap_or("/").to_string()
    };
    let n = {
        let mut h = hits.lock().unwrap();
        let e = h.entry(path.clone()).or_insert(0);
        *e += 1;
        *e
    };
    let mut out = conn;
    let respond = |out: &mut TcpStream, status: u16, body: &[u8]| {
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = out.write_all(head.as_bytes());
        let _ = out.write_all(body);
    };
    match routes.get(&path) {
        None => respond(&mut out, 404, b"not found"),
        Some(Behaviour::Ok(body)) => respond(&mut out, 200, body),
        Some(Behaviour::Status(s)) => respond(&mut out, *s, b"nope"),
        Some(Behaviour::FailThenOk(fails, body)) => {
            if n <= *fails {
                respond(&mut out, 503, b"busy")
            } else {
                respond(&mut out, 200, body)
            }
        }
        Some(Behaviour::Truncate(body, keep)) => {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            let _ = out.write_all(head.as_bytes());
            let _ = out.write_all(&body[..*keep]);
            let _ = out.shutdown(std::net::Shutdown::Both);
        }
        Some(Behaviour::Slow(d, body)) => {
            std::thread::sleep(*d);
            respond(&mut out, 200, body)
        }
        Some(Behaviour::Respond(status, headers, body)) => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (n, v) in headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = out.write_all(head.as_bytes());
            let _ = out.write_all(body);
        }
        Some(Behaviour::Trickle(body, pieces, pause)) => {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            let _ = out.write_all(head.as_bytes());
            for piece in body.chunks(body.len().div_ceil(*pieces)) {
                std::thread::sleep(*pause);
                let _ = out.write_all(piece);
                let _ = out.flush();
            }
        }
    }
}

pub fn fetcher() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_wasm-fetcher"));
    for v in [
        "WASM_CACHE_DIR",
        "WASM_HTTP_REQUEST_TIMEOUT",
        "WASM_HTTP_REQUEST_MAX_RETRIES",
        "ISTIO_WASM_MAX_BINARY_SIZE_BYTES",
        "BLOCKED_CIDRS_IN_WASM_FETCH",
        "WASM_INSECURE_REGISTRIES",
        "WASM_VERIFY_KEY",
        "WASM_TRUSTED_ROOT",
        "WASM_CERTIFICATE_IDENTITY",
        "WASM_CERTIFICATE_IDENTITY_REGEXP",
        "WASM_CERTIFICATE_OIDC_ISSUER",
        "WASM_CERTIFICATE_OIDC_ISSUER_REGEXP",
        "http_proxy",
        "HTTP_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        c.env_remove(v);
    }
    c
}

pub fn pull(cache: &Path, args: &[&str]) -> Output {
    pull_env(cache, &[], args)
}

/// `pull` with these environment variables set.
pub fn pull_env(cache: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    fetcher()
        .envs(env.iter().copied())
        .arg("pull")
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

/// The fetcher with every request sent through the HTTP proxy at `proxy`, no host exempted.
pub fn through_proxy(proxy: &str) -> Command {
    let mut c = fetcher();
    c.env("HTTP_PROXY", proxy)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    c
}

/// A Docker config JSON in `dir` holding `user:pass` for `registry`, as `--pull-secret` takes.
pub fn docker_config(dir: &Path, registry: &str) -> PathBuf {
    let path = dir.join("dockerconfig.json");
    std::fs::write(
        &path,
        format!(r#"{{"auths":{{"{registry}":{{"auth":"dXNlcjpwYXNz"}}}}}}"#),
    )
    .unwrap();
    path
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout_path(o: &Output) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// Every regular file under `dir` except lock files (left for `purge`, which removes only
/// those no one holds): after a failed pull there must be none.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "lock") {
                continue;
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Asserts a failed pull: exit 1, one stderr line naming the URL and the stable words, and an
/// empty cache.
pub fn assert_failed(o: &Output, cache: &Path, url: &str, words: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(
        err.starts_with(&format!("wasm-fetcher: {url}: ")),
        "stderr: {err}"
    );
    assert!(err.contains(words), "expected {words:?} in: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(o.stdout.is_empty(), "nothing on stdout on failure");
    assert_eq!(
        files_under(cache),
        Vec::<PathBuf>::new(),
        "the cache must stay empty"
    );
}

/// An HTTPS server on 127.0.0.1 that gives every request the same raw answer (`head`, an
/// HTTP/1.1 status line and headers), with a certificate signed by the CA at `ca`.
pub struct TlsServer {
    pub base: String,
    pub ca: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsServer {
    pub fn start(head: &str) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let dir = tempfile::tempdir().unwrap();
        crate::oci_registry::make_certs(dir.path());
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = CertificateDer::pem_file_iter(dir.path().join("server.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(dir.path().join("server.key")).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("https://{}", listener.local_addr().unwrap());
        let head = head.to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (config, head) = (config.clone(), head.clone());
                std::thread::spawn(move || {
                    let Ok(tls) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut stream = rustls::StreamOwned::new(tls, conn);
                    let mut request = Vec::new();
                    let mut byte = [0u8; 1];
                    while !request.ends_with(b"\r\n\r\n") && request.len() < 64 * 1024 {
                        match std::io::Read::read(&mut stream, &mut byte) {
                            Ok(1) => request.push(byte[0]),
                            _ => return,
                        }
                    }
                    let _ = stream.write_all(
                        format!("{head}content-length: 0\r\nconnection: close\r\n\r\n").as_bytes(),
                    );
                    stream.conn.send_close_notify();
                    let _ = stream.flush();
                });
            }
        });
        let ca = dir.path().join("ca.pem");
        Self {
            base,
            ca,
            _dir: dir,
        }
    }
}
/// Runs `cmd` to completion and how long it took; kills it and fails the test if it is still
/// running after `limit` (a hang must fail the test, not stall the suite).
pub fn run_within(cmd: &mut Command, limit: Duration) -> (Output, Duration) {
    use std::process::Stdio;
    let start = std::time::Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            let took = start.elapsed();
            return (child.wait_with_output().unwrap(), took);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} still running after {limit:?}; stderr: {}",
                stderr(&o)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `wasm-fetcher ARGS` in a private mount namespace, after `setup` (a shell snippet with the
/// cache as `$0`) ran there: root can make a directory read-only or tiny for this process
/// alone, so "cannot write" is real even for root.
pub fn fetcher_in_namespace(setup: &str, cache: &Path, args: &[&str]) -> Output {
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{setup} && shift && exec \"$@\""))
        .arg(cache)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_wasm-fetcher"))
        .args(args)
        .env_remove("WASM_CACHE_DIR")
        .output()
        .expect("unshare (util-linux) is needed")
}

/// The lock files under `<cache>/locks`.
pub fn lock_files(cache: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(cache.join("locks"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "lock"))
        .collect()
}
