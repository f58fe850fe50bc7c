//! `envoy-config/bootstrap-remote.yaml`: real Envoy fetches the module itself over HTTP from a
//! loopback server, checks its sha256 and runs every role; a wrong digest is refused.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::Digest;

use crate::support::{module, root, EnvoyProcess};

/// Serves `body` to every GET; counts requests.
fn serve(body: Vec<u8>) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            count.fetch_add(1, Ordering::SeqCst);
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/wasm\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            let _ = conn.write_all(&body);
        }
    });
    (port, served)
}

/// The remote bootstrap pointed at `port` with `sha256`, every listener and the admin on an
/// ephemeral loopback port.
fn bootstrap(dir: &Path, port: u16, sha256: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(root().join("envoy-config/bootstrap-remote.yaml")).unwrap();
    let mut text = text
        .replace("WASM_FILTER_SHA256", sha256)
        .replace("port_value: 8088", &format!("port_value: {port}"));
    for fixed in ["9901", "10000", "10001", "10002"] {
        text = text.replace(&format!("port_value: {fixed}"), "port_value: 0");
    }
    let path = dir.join("remote.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn envoy_fetches_the_module_itself_and_runs_every_role() {
    let bytes = std::fs::read(module()).unwrap();
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    let (port, served) = serve(bytes);
    let dir = tempfile::tempdir().unwrap();
    let envoy = EnvoyProcess::start(dir.path(), &bootstrap(dir.path(), port, &sha));
    for role in [
        "configured role stats-aggregator (aggregating)",
        "configured role rate-limit",
        "configured role http-header-operation",
        "configured role http-body-operation",
        "configured role tcp-total-data-size-counter",
    ] {
        assert!(envoy.wait_for(role), "{role}:\n{}", envoy.log());
    }
    assert!(served.load(Ordering::SeqCst) >= 1);
}

#[test]
fn envoy_refuses_a_module_whose_sha256_does_not_match() {
    let bytes = std::fs::read(module()).unwrap();
    let (port, served) = serve(bytes);
    let dir = tempfile::tempdir().unwrap();
    let envoy = EnvoyProcess::start(dir.path(), &bootstrap(dir.path(), port, &"ab".repeat(32)));
    assert!(envoy.wait_for("failed to load"), "{}", envoy.log());
    let deadline = Instant::now() + Duration::from_secs(30);
    while served.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        served.load(Ordering::SeqCst) >= 1,
        "Envoy never fetched the module"
    );
    // What it fetched never runs.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!envoy.log().contains("configured role"), "{}", envoy.log());
}
