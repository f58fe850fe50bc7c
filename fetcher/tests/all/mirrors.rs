//! Pulls through registry mirrors configured in containerd's hosts.toml
//! (`--registry-config-dir`): a real `docker-registry` pull-through cache in front of another,
//! the fallback to the upstream, the credential rule, and the files refused.

use std::path::Path;

use oci_client::secrets::RegistryAuth;

use crate::oci_registry::{Options, Registry};
use crate::support::*;

const WASM: &str = "application/wasm";
const CNCF_CONFIG: &str = "application/vnd.wasm.config.v0+json";

fn hosts_toml(dir: &Path, registry: &str, text: &str) -> std::path::PathBuf {
    let d = dir.join(registry);
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("hosts.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_pull_goes_through_the_mirror_and_falls_back_to_the_upstream_when_it_is_down() {
    let upstream = Registry::start(false);
    let module = module("mirrored");
    upstream.push(
        "mods/m:v1",
        vec![(WASM, module.clone())],
        CNCF_CONFIG,
        &RegistryAuth::Anonymous,
    );
    let mut mirror = Registry::start_with(Options {
        proxy_remote: Some(format!("http://{}", upstream.host)),
        ..Default::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    hosts_toml(
        &config,
        &upstream.host,
        &format!(
            "server = \"http://{up}\"\n\n[host.\"http://{m}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            up = upstream.host,
            m = mirror.host
        ),
    );
    let url = format!("oci://{}/mods/m:v1", upstream.host);
    let dir = config.to_str().unwrap();

    let o = pull(
        &tmp.path().join("c1"),
        &["--registry-config-dir", dir, "--json", &url],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    assert_eq!(mirror.requests("GET", "/v2/mods/m/manifests/v1"), 1);
    assert_eq!(mirror.requests("GET", "/v2/mods/m/blobs/"), 1);

    mirror.stop();
    let before = upstream.requests("GET", "/v2/mods/m/manifests/v1");
    let o = pull_env(
        &tmp.path().join("c2"),
        &[("WASM_REGISTRY_CONFIG_DIR", dir)],
        &["--json", &url],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    assert_eq!(
        upstream.requests("GET", "/v2/mods/m/manifests/v1"),
        before + 1,
        "the upstream served the pull the mirror could not"
    );
}

#[test]
fn a_mirror_gets_no_upstream_credentials_and_its_404_falls_through() {
    let upstream = Registry::start(true);
    let module = module("private");
    let basic = RegistryAuth::Basic("user".into(), "pass".into());
    upstream.push(
        "mods/p:v1",
        vec![(WASM, module.clone())],
        CNCF_CONFIG,
        &basic,
    );
    let mirror = Server::start(vec![]);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    hosts_toml(
        &config,
        &upstream.host,
        &format!("[host.\"{}\"]\n", mirror.base),
    );
    let secret = docker_config(tmp.path(), &upstream.host);
    let o = pull(
        &tmp.path().join("c"),
        &[
            "--registry-config-dir",
            config.to_str().unwrap(),
            "--pull-secret",
            secret.to_str().unwrap(),
            "--json",
            &format!("oci://{}/mods/p:v1", upstream.host),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    let seen = mirror.seen();
    assert!(!seen.is_empty(), "the mirror was asked first");
    assert!(
        seen.iter().all(|s| s.header("authorization").is_none()),
        "{seen:?}"
    );
}

#[test]
fn a_malformed_or_oversized_hosts_toml_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    let registry = "127.0.0.1:9";
    let url = format!("oci://{registry}/mods/m:v1");
    for (text, words) in [
        ("[host.\"http://127.0.0.1:8\"\n".to_string(), "not valid"),
        (
            "[host.\"http://127.0.0.1:8\"]\nmirror = true\n".to_string(),
            "unknown field `mirror`",
        ),
        (format!("# {}\n", "x".repeat(70 << 10)), "65536"),
    ] {
        let path = hosts_toml(&config, registry, &text);
        let o = pull(
            &tmp.path().join("c"),
            &["--registry-config-dir", config.to_str().unwrap(), &url],
        );
        let err = stderr(&o);
        assert!(!o.status.success());
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains(words),
            "{words}: {err}"
        );
    }
}

fn stdout_json_path(o: &std::process::Output) -> std::path::PathBuf {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["path"].as_str().unwrap().into()
}
