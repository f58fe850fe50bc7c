//! `pull oci://...` against a real `docker-registry` (CNCF distribution) started on a free
//! loopback port, with images pushed through the registry's HTTP API by `oci-client`.

use std::path::{Path, PathBuf};

use oci_client::secrets::RegistryAuth;

use crate::oci_registry::{Options, Registry, CNCF_CONFIG};
use crate::support::*;

pub fn tar_gz_with(name: &str, data: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, name, data).unwrap();
    builder.into_inner().unwrap().finish().unwrap()
}

fn json_pull(cache: &Path, args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let mut all = args.to_vec();
    all.push("--json");
    let o = pull(cache, &all);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_default();
    (o, v)
}

fn read(v: &serde_json::Value) -> Vec<u8> {
    std::fs::read(PathBuf::from(v["path"].as_str().unwrap())).unwrap()
}

#[test]
fn the_three_layouts_are_accepted() {
    let reg = Registry::start(false);
    let anon = RegistryAuth::Anonymous;
    let single = module("single");
    reg.push_module("cncf/filter:1.0", &single, &anon);
    let istio = module("istio");
    reg.push(
        "istio/filter:1.0",
        vec![
            ("application/vnd.module.wasm.config.v1+json", b"{}".to_vec()),
            (
                "application/vnd.module.wasm.content.layer.v1+wasm",
                istio.clone(),
            ),
        ],
        "application/vnd.oci.image.config.v1+json",
        &anon,
    );
    let image = module("image");
    reg.push(
        "image/filter:1.0",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            tar_gz_with("./plugin.wasm", &image),
        )],
        "application/vnd.oci.image.config.v1+json",
        &anon,
    );
    let dir = tempfile::tempdir().unwrap();
    for (repo, want) in [("cncf", &single), ("istio", &istio), ("image", &image)] {
        let url = format!("oci://{}/{repo}/filter:1.0", reg.host);
        let (o, v) = json_pull(dir.path(), &[&url]);
        assert_eq!(o.status.code(), Some(0), "{repo}: {}", stderr(&o));
        assert_eq!(&read(&v), want, "{repo}");
        assert_eq!(v["from_cache"], false);
        assert!(v["manifest_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
    }
}

#[test]
fn an_unsupported_layout_lists_what_it_found() {
    let reg = Registry::start(false);
    reg.push(
        "odd/filter:1.0",
        vec![("text/plain", b"hello".to_vec())],
        CNCF_CONFIG,
        &RegistryAuth::Anonymous,
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/odd/filter:1.0", reg.host);
    let o = pull(dir.path(), &[&url]);
    assert_failed(&o, dir.path(), &url, "unsupported layout");
    assert!(stderr(&o).contains("[text/plain]"), "{}", stderr(&o));
}

#[test]
fn a_missing_image_is_not_found() {
    let reg = Registry::start(false);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/nothing/here:1.0", reg.host);
    assert_failed(&pull(dir.path(), &[&url]), dir.path(), &url, "not found");
}

#[test]
fn if_not_present_and_never_serve_from_the_cache_without_the_registry() {
    let mut reg = Registry::start(false);
    let m = module("ifnp");
    reg.push_module("p/filter:1.0", &m, &RegistryAuth::Anonymous);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/p/filter:1.0", reg.host);
    let never_url = format!("oci://{}/p/other:1.0", reg.host);
    assert_eq!(pull(dir.path(), &[&url]).status.code(), Some(0));
    reg.stop();
    let (o, v) = json_pull(dir.path(), &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(v["from_cache"], true);
    assert_eq!(read(&v), m);
    let (o, v) = json_pull(dir.path(), &[&url, "--pull-policy", "Never"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(v["from_cache"], true);
    let o = pull(dir.path(), &[&never_url, "--pull-policy", "Never"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not in cache"), "{}", stderr(&o));
}

#[test]
fn always_rechecks_a_moving_tag_and_same_version_uses_the_cache() {
    let reg = Registry::start(false);
    let anon = RegistryAuth::Anonymous;
    let v1 = module("v1");
    reg.push_module("a/filter:latest", &v1, &anon);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/a/filter:latest", reg.host);
    let (_, first) = json_pull(
        dir.path(),
        &[&url, "--resource", "r", "--resource-version", "1"],
    );
    assert_eq!(read(&first), v1);
    let v2 = module("v2");
    reg.push_module("a/filter:latest", &v2, &anon);
    // Same resource version: Always serves the cache.
    let (_, same) = json_pull(
        dir.path(),
        &[&url, "--resource", "r", "--resource-version", "1"],
    );
    assert_eq!(read(&same), v1);
    assert_eq!(same["from_cache"], true);
    // New version: the tag is checked and the new module pulled.
    let (_, newer) = json_pull(
        dir.path(),
        &[&url, "--resource", "r", "--resource-version", "2"],
    );
    assert_eq!(read(&newer), v2);
    assert_eq!(newer["from_cache"], false);
    // No version: `latest` means Always, checked each time; unchanged digest, no layer download.
    let blobs = reg.requests("GET", "/v2/a/filter/blobs/");
    let manifests = reg.requests("GET", "/v2/a/filter/manifests/");
    assert!(
        blobs >= 2,
        "the access log shows no layer downloads: {blobs}"
    );
    let (o, again) = json_pull(dir.path(), &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        reg.requests("GET", "/v2/a/filter/manifests/") > manifests,
        "the tag was not checked"
    );
    assert_eq!(
        reg.requests("GET", "/v2/a/filter/blobs/"),
        blobs,
        "a layer was downloaded again for an unchanged digest"
    );
    assert_eq!(read(&again), v2);
    assert_eq!(again["from_cache"], true);
    assert_eq!(again["manifest_digest"], newer["manifest_digest"]);
}

#[test]
fn a_pin_may_be_the_manifest_digest_or_the_module_sha256() {
    let reg = Registry::start(false);
    let m = module("pinned");
    let digest = reg.push_module("pin/filter:1.0", &m, &RegistryAuth::Anonymous);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/pin/filter:1.0", reg.host);
    let (o, v) = json_pull(
        dir.path(),
        &[&url, "--sha256", digest.trim_start_matches("sha256:")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(v["pin"], "manifest_digest");
    let other = tempfile::tempdir().unwrap();
    let (o, v) = json_pull(other.path(), &[&url, "--sha256", &sha256_hex(&m)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(v["pin"], "module_sha256");
    // A pin the manifest already contradicts (the layer is the module, and its digest is
    // another) fails after the manifest, without downloading the layer, as Istio's agent does.
    let third = tempfile::tempdir().unwrap();
    let blobs = || reg.requests("GET", "/v2/pin/filter/blobs/");
    let before = blobs();
    let o = pull(
        third.path(),
        &[&url, "--sha256", &sha256_hex(b"something else")],
    );
    assert_failed(&o, third.path(), &url, "checksum mismatch");
    assert_eq!(blobs(), before, "no layer downloaded for a wrong pin");
    // A digest in the reference pins too.
    let by_digest = format!("oci://{}/pin/filter@{digest}", reg.host);
    let (o, v) = json_pull(third.path(), &[&by_digest]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(read(&v), m);
}

#[test]
fn a_registry_with_auth_says_unauthorized_then_accepts_the_pull_secret() {
    let reg = Registry::start(true);
    let creds = RegistryAuth::Basic("user".into(), "pass".into());
    let m = module("private");
    reg.push_module("priv/filter:1.0", &m, &creds);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/priv/filter:1.0", reg.host);
    let cache = dir.path().join("cache");
    let o = fetcher()
        .env("HOME", dir.path())
        .env_remove("DOCKER_CONFIG")
        .args(["pull", &url, "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_failed(&o, &cache, &url, "unauthorized");
    assert!(stderr(&o).contains(&reg.host), "{}", stderr(&o));
    let secret = docker_config(dir.path(), &reg.host);
    let o = fetcher()
        .env("HOME", dir.path())
        .args(["pull", &url, "--pull-secret"])
        .arg(&secret)
        .arg("--cache-dir")
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
}

#[test]
fn a_tls_registry_is_verified_unless_trusted_by_ca_file_or_listed_insecure() {
    let reg = Registry::start_with(Options {
        tls: true,
        ..Default::default()
    });
    let m = module("tls");
    reg.push_module("tls/filter:1.0", &m, &RegistryAuth::Anonymous);
    let url = format!("oci://{}/tls/filter:1.0", reg.host);
    // The same module over HTTPS: the registry's blob endpoint is a plain GET.
    let https = format!(
        "https://{}/v2/tls/filter/blobs/sha256:{}",
        reg.host,
        sha256_hex(&m)
    );
    let ca = reg.ca_file();
    let ca = ca.to_str().unwrap();
    for source in [&url, &https] {
        // Loopback or not, a certificate nobody vouched for is refused, with the way out.
        let dir = tempfile::tempdir().unwrap();
        let o = pull(dir.path(), &[source]);
        assert_failed(&o, dir.path(), source, "untrusted certificate");
        assert!(
            stderr(&o).contains("--ca-file") && stderr(&o).contains("WASM_INSECURE_REGISTRIES"),
            "{}",
            stderr(&o)
        );
        // Listing another registry does not help.
        let o = fetcher()
            .env("WASM_INSECURE_REGISTRIES", "127.0.0.1:1,other.example:5000")
            .args(["pull", source, "--cache-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert_failed(&o, dir.path(), source, "untrusted certificate");
        // Trusting its CA works.
        let o = pull(dir.path(), &[source, "--ca-file", ca]);
        assert_eq!(o.status.code(), Some(0), "{source}: {}", stderr(&o));
        assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
        // So does listing it (host:port) or `*` in WASM_INSECURE_REGISTRIES.
        for listed in [reg.host.as_str(), "*"] {
            let fresh = tempfile::tempdir().unwrap();
            let o = fetcher()
                .env("WASM_INSECURE_REGISTRIES", listed)
                .args(["pull", source, "--cache-dir"])
                .arg(fresh.path())
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{source} {listed}: {}",
                stderr(&o)
            );
            assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
        }
    }
}

#[test]
fn a_registry_that_never_answers_times_out_within_the_timeout() {
    // Accepts connections and says nothing: neither a TLS handshake nor HTTP completes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = silent.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().flatten().collect();
        drop(held);
    });
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{host}/stuck/filter:1.0");
    let start = std::time::Instant::now();
    let o = pull(dir.path(), &[&url, "--timeout", "1s"]);
    assert_failed(&o, dir.path(), &url, "timed out");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "--timeout 1s took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_plain_http_registry_listed_insecure_is_reached_after_the_tls_attempt() {
    let reg = Registry::start(false);
    let m = module("insecure-plain");
    reg.push_module("plain/filter:1.0", &m, &RegistryAuth::Anonymous);
    let url = format!("oci://{}/plain/filter:1.0", reg.host);
    let dir = tempfile::tempdir().unwrap();
    let o = pull_env(
        dir.path(),
        &[("WASM_INSECURE_REGISTRIES", reg.host.as_str())],
        &[&url],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
}
