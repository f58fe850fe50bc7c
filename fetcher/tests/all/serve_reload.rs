//! `serve` beside real Envoy: a WasmPlugin change reaches Envoy through the ECDS file it
//! watches, without a restart and without dropping a request in flight.

use std::path::Path;
use std::time::Duration;

use crate::oci_registry::Registry;
use crate::real_envoy::Envoy;
use crate::serve_support::*;
use crate::support::{fetcher, stderr, Behaviour, Server};

/// `wasm-fetcher push FILE URL` (the fetcher's own push), with no Docker config around.
pub fn push(home: &Path, file: &Path, url: &str) {
    let o = fetcher()
        .env("HOME", home)
        .env_remove("DOCKER_CONFIG")
        .arg("push")
        .arg(file)
        .arg(url)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "push {url}: {}", stderr(&o));
}

pub fn filter_wasm() -> std::path::PathBuf {
    crate::push::filter_wasm()
}

/// A second module with other behaviour: the hand-written guest that adds `x-wat: 1` to
/// every request (and no response header).
pub fn add_header_guest(dir: &Path) -> std::path::PathBuf {
    let wat = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/guests/add-header.wat");
    let bytes = wat::parse_file(&wat).unwrap();
    let path = dir.join("add-header.wasm");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn envoy_follows_plugin_config_then_module_changes_without_restart_or_dropped_requests() {
    let d = dirs();
    let (dir, plugins, ecds) = (&d.tmp, &d.plugins, &d.ecds);
    let reg = Registry::start(false);
    push(
        dir.path(),
        &filter_wasm(),
        &format!("oci://{}/filters/hot:v1", reg.host),
    );
    let upstream = Server::start(vec![
        ("/", Behaviour::Ok(b"hello".to_vec())),
        (
            "/slow",
            Behaviour::Slow(Duration::from_secs(3), b"slow".to_vec()),
        ),
    ]);
    let v1 = format!("oci://{}/filters/hot:v1", reg.host);
    let text = wasm_plugin("hot", &v1, &header_role("one"));
    let file = plugins.join("hot.yaml");
    write_plugin(&file, &text);
    let serve = d.serve_ready(&[], &[]);
    assert!(ecds.join("test.hot.yaml").is_file(), "{}", serve.log());

    let mut envoy = Envoy::start(&ecds_bootstrap(dir.path(), ecds, &[&text], upstream.host()));
    let addr = format!("127.0.0.1:{}", envoy.port("main"));
    let served_by = || {
        http_get(&addr, "/")
            .ok()
            .and_then(|(_, r)| header(&r, "x-served-by").map(String::from))
    };
    wait_for(
        "envoy serves the filter's header",
        Duration::from_secs(30),
        || served_by().as_deref() == Some("one"),
    );

    // The plugin's configuration changes: the same module, a new header value.
    write_plugin(&file, &wasm_plugin("hot", &v1, &header_role("two")));
    wait_for(
        "envoy serves the new pluginConfig",
        Duration::from_secs(10),
        || served_by().as_deref() == Some("two"),
    );

    // A request in flight while the module changes (a new tag, another module).
    let slow = {
        let addr = addr.clone();
        std::thread::spawn(move || get(&addr, "/slow"))
    };
    wait_for(
        "the slow request reached the upstream",
        Duration::from_secs(10),
        || upstream.hits("/slow") == 1,
    );
    push(
        dir.path(),
        &add_header_guest(dir.path()),
        &format!("oci://{}/filters/hot:v2", reg.host),
    );
    let v2 = format!("oci://{}/filters/hot:v2", reg.host);
    write_plugin(&file, &wasm_plugin("hot", &v2, &header_role("two")));
    wait_for("envoy runs the new module", Duration::from_secs(10), || {
        let before = upstream.seen().len();
        let answer = http_get(&addr, "/");
        let seen = upstream.seen();
        answer.is_ok_and(|(status, r)| status == 200 && header(&r, "x-served-by").is_none())
            && seen[before..]
                .iter()
                .any(|s| s.header("x-wat") == Some("1"))
    });
    let slow = slow.join().unwrap().unwrap();
    assert_eq!(
        (slow.0, slow.1.as_str()),
        (200, "slow"),
        "the request in flight was dropped"
    );
    // Hot restart is off: the same process still running is the same Envoy, never restarted.
    assert!(envoy.running(), "envoy exited: {}", envoy.log());
    assert!(serve.stop().success());
}
