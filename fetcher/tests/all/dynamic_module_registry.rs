//! A dynamic module's pull reaches registries as a Wasm module's does: through the mirrors of
//! containerd's hosts.toml (`--registry-config-dir`, signature included) with the fallback to
//! the registry itself, with the pull secret's credentials, and never past the address guard.

use std::path::Path;

use crate::dynamic_module::{pull_unsigned, shared_object};
use crate::oci_registry::{Options, Registry};
use crate::support::*;

fn push_native(home: &Path, url: &str, extra: &[&str]) {
    let so = shared_object();
    let o = fetcher()
        .env("HOME", home)
        .arg("push")
        .arg(&so)
        .args([
            url,
            "--layout",
            "dynamic-module",
            "--envoy-versions",
            "1.40",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

fn pulled_bytes(o: &std::process::Output) -> Vec<u8> {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    std::fs::read(v["path"].as_str().unwrap()).unwrap()
}

#[test]
fn a_dynamic_module_and_its_signature_come_through_the_mirror_then_the_upstream() {
    let upstream = Registry::start(false);
    let tmp = tempfile::tempdir().unwrap();
    let (private, public) = crate::signature::key_pair(tmp.path(), "signer");
    let url = format!("oci://{}/native/m:1", upstream.host);
    push_native(tmp.path(), &url, &["--sign-key", private.to_str().unwrap()]);
    let mut mirror = Registry::start_with(Options {
        proxy_remote: Some(format!("http://{}", upstream.host)),
        ..Default::default()
    });
    let config = tmp.path().join("certs.d");
    let hosts = config.join(&upstream.host);
    std::fs::create_dir_all(&hosts).unwrap();
    std::fs::write(
        hosts.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            upstream.host, mirror.host
        ),
    )
    .unwrap();
    let module = std::fs::read(shared_object()).unwrap();
    let args = |cache: &str| {
        vec![
            url.clone(),
            "--envoy-version".into(),
            "1.40".into(),
            "--verify-key".into(),
            public.display().to_string(),
            "--registry-config-dir".into(),
            config.display().to_string(),
            "--json".into(),
            "--cache-dir".into(),
            tmp.path().join(cache).display().to_string(),
        ]
    };
    let run = |args: Vec<String>| fetcher().arg("pull").args(args).output().unwrap();
    assert_eq!(pulled_bytes(&run(args("c1"))), module);
    assert!(mirror.requests("GET", "/v2/native/m/manifests/1") >= 1);
    assert!(mirror.requests("GET", "/v2/native/m/manifests/sha256-") >= 1);
    assert!(mirror.requests("GET", "/v2/native/m/blobs/") >= 1);

    mirror.stop();
    let before = upstream.requests("GET", "/v2/native/m/manifests/1");
    assert_eq!(pulled_bytes(&run(args("c2"))), module);
    assert_eq!(
        upstream.requests("GET", "/v2/native/m/manifests/1"),
        before + 1,
        "the upstream served the pull the mirror could not"
    );
}

#[test]
fn a_dynamic_module_pull_takes_the_pull_secret_and_passes_the_address_guard() {
    let reg = Registry::start(true);
    let tmp = tempfile::tempdir().unwrap();
    let secret = docker_config(tmp.path(), &reg.host);
    let secret = secret.to_str().unwrap();
    let url = format!("oci://{}/native/private:1", reg.host);
    push_native(tmp.path(), &url, &["--pull-secret", secret]);
    let cache = tempfile::tempdir().unwrap();
    let o = pull_unsigned(cache.path(), &[&url, "--envoy-version", "1.40"]);
    assert_failed(&o, cache.path(), &url, "unauthorized");
    let o = pull_unsigned(
        cache.path(),
        &[
            &url,
            "--envoy-version",
            "1.40",
            "--pull-secret",
            secret,
            "--json",
        ],
    );
    assert_eq!(pulled_bytes(&o), std::fs::read(shared_object()).unwrap());

    // Loopback blocked: not even the ping is sent.
    let asked = reg.requests("GET", "/v2/");
    let blocked = tempfile::tempdir().unwrap();
    let o = pull_env(
        blocked.path(),
        &[("BLOCKED_CIDRS_IN_WASM_FETCH", "127.0.0.0/8")],
        &[
            &url,
            "--envoy-version",
            "1.40",
            "--allow-unsigned-dynamic-modules",
            "--pull-secret",
            secret,
        ],
    );
    assert_failed(&o, blocked.path(), &url, "blocked address");
    assert_eq!(reg.requests("GET", "/v2/"), asked);
}
