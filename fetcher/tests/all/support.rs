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
}

pub struct Server {
    pub base: String,
    hits: Arc<Mutex<HashMap<String, u32>>>,
}

impl Server {
    pub fn start(routes: Vec<(&str, Behaviour)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Arc<HashMap<String, Behaviour>> = Arc::new(
            routes
                .into_iter()
                .map(|(p, b)| (p.to_string(), b))
                .collect(),
        );
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let routes = routes.clone();
                let hits = h.clone();
                std::thread::spawn(move || serve(conn, &routes, &hits));
            }
        });
        Self { base, hits }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn hits(&self, path: &str) -> u32 {
        *self.hits.lock().unwrap().get(path).unwrap_or(&0)
    }
}

fn serve(conn: TcpStream, routes: &HashMap<String, Behaviour>, hits: &Mutex<HashMap<String, u32>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
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
    fetcher()
        .arg("pull")
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
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
