//! The OCI 1.1 referrers API in front of the real `docker-registry`, which (2.8, from Debian)
//! does not implement it and answers `GET /v2/<name>/referrers/<digest>` with 404. The front
//! forwards every request to the registry unchanged, one connection per request, and answers
//! the referrers API itself from the manifests with a `subject` that were pushed through it,
//! listing each with its `artifactType` (else its config's media type) and annotations, as
//! the distribution spec's "Listing Referrers" says. Every request it saw is counted.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

#[derive(Default)]
struct State {
    /// (repository, subject digest) → listed descriptors.
    referrers: HashMap<(String, String), Vec<Value>>,
    /// Request lines seen, in order.
    seen: Vec<String>,
}

pub struct Front {
    pub host: String,
    state: Arc<Mutex<State>>,
}

impl Front {
    pub fn start(registry: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
        let state = Arc::new(Mutex::new(State::default()));
        let (s, upstream) = (state.clone(), registry.to_string());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, upstream) = (s.clone(), upstream.clone());
                std::thread::spawn(move || serve(conn, &upstream, &s));
            }
        });
        Self { host, state }
    }

    /// The request lines seen so far that start with `prefix` (`GET /v2/`).
    pub fn requests(&self, prefix: &str) -> Vec<String> {
        let seen = &self.state.lock().unwrap().seen;
        seen.iter()
            .filter(|l| l.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub fn clear(&self) {
        self.state.lock().unwrap().seen.clear();
    }
}

fn serve(mut conn: TcpStream, upstream: &str, state: &Mutex<State>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let request_line = head.lines().next().unwrap_or_default().to_string();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    state.lock().unwrap().seen.push(request_line.clone());
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method == "GET" {
        if let Some((name, digest)) = path
            .strip_prefix("/v2/")
            .and_then(|p| p.split_once("/referrers/"))
        {
            let key = (name.to_string(), digest.to_string());
            let listed = state.lock().unwrap().referrers.get(&key).cloned();
            let index = serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": listed.unwrap_or_default(),
            }))
            .unwrap();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.index.v1+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                index.len()
            );
            let _ = conn.write_all(&index);
            return;
        }
    }
    if method == "PUT" && path.contains("/manifests/") {
        remember(state, path, &body);
    }
    // Forwarded as it came, on a connection of its own that the registry closes.
    let mut up = TcpStream::connect(upstream).unwrap();
    let mut forwarded = String::new();
    for line in head.lines().filter(|l| !l.is_empty()) {
        if line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        forwarded.push_str(line);
        forwarded.push_str("\r\n");
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    up.write_all(forwarded.as_bytes()).unwrap();
    up.write_all(&body).unwrap();
    let mut answer = Vec::new();
    let _ = up.read_to_end(&mut answer);
    let _ = conn.write_all(&answer);
}

/// A manifest with a `subject` pushed through the front is listed as its subject's referrer.
fn remember(state: &Mutex<State>, path: &str, body: &[u8]) {
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let Some(subject) = doc.pointer("/subject/digest").and_then(Value::as_str) else {
        return;
    };
    let name = path
        .strip_prefix("/v2/")
        .and_then(|p| p.split_once("/manifests/"))
        .map(|(n, _)| n.to_string())
        .unwrap_or_default();
    let artifact_type = doc
        .get("artifactType")
        .or_else(|| doc.pointer("/config/mediaType"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut descriptor = json!({
        "mediaType": doc.get("mediaType").cloned().unwrap_or(Value::Null),
        "digest": format!("sha256:{}", crate::support::sha256_hex(body)),
        "size": body.len(),
        "artifactType": artifact_type,
    });
    if let Some(a) = doc.get("annotations") {
        descriptor["annotations"] = a.clone();
    }
    let mut s = state.lock().unwrap();
    let list = s.referrers.entry((name, subject.to_string())).or_default();
    if !list.iter().any(|d| d["digest"] == descriptor["digest"]) {
        list.push(descriptor);
    }
}
