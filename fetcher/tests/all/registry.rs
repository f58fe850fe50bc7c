//! `pull oci://...` against a real `docker-registry` (CNCF distribution) started on a free
//! loopback port, with images pushed through the registry's HTTP API by `oci-client`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::support::*;

pub struct Registry {
    pub host: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Registry {
    /// Starts `docker-registry`; with `htpasswd`, basic auth for `user:pass`.
    pub fn start(htpasswd: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
            dir.path().join("data").display()
        );
        if htpasswd {
            let out = Command::new("htpasswd")
                .args(["-Bbn", "user", "pass"])
                .output()
                .expect("htpasswd (apache2-utils) is needed");
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, out.stdout).unwrap();
            config.push_str(&format!(
                "auth: {{htpasswd: {{realm: test, path: {}}}}}\n",
                file.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian package docker-registry) is needed");
        let host = format!("127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "docker-registry did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            host,
            child,
            _dir: dir,
        }
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Pushes an image with these layers and config; returns the manifest digest.
    pub fn push(
        &self,
        repo_tag: &str,
        layers: Vec<(&str, Vec<u8>)>,
        config_type: &str,
        auth: &RegistryAuth,
    ) -> String {
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..Default::default()
        });
        let reference: Reference = format!("{}/{repo_tag}", self.host).parse().unwrap();
        let layers: Vec<ImageLayer> = layers
            .into_iter()
            .map(|(t, data)| ImageLayer::new(data, t.to_string(), None))
            .collect();
        let config = Config::new(b"{}".to_vec(), config_type.to_string(), None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let resp = rt
            .block_on(client.push(&reference, &layers, config, auth, None))
            .unwrap();
        let digest = resp.manifest_url.rsplit('/').next().unwrap().to_string();
        if digest.starts_with("sha256:") {
            return digest;
        }
        rt.block_on(client.fetch_manifest_digest(&reference, auth))
            .unwrap()
    }
}

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

const WASM: &str = "application/wasm";
const CNCF_CONFIG: &str = "application/vnd.wasm.config.v0+json";

#[test]
fn the_three_layouts_are_accepted() {
    let reg = Registry::start(false);
    let anon = RegistryAuth::Anonymous;
    let single = module("single");
    reg.push(
        "cncf/filter:1.0",
        vec![(WASM, single.clone())],
        CNCF_CONFIG,
        &anon,
    );
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
    reg.push(
        "p/filter:1.0",
        vec![(WASM, m.clone())],
        CNCF_CONFIG,
        &RegistryAuth::Anonymous,
    );
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
    reg.push(
        "a/filter:latest",
        vec![(WASM, v1.clone())],
        CNCF_CONFIG,
        &anon,
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/a/filter:latest", reg.host);
    let (_, first) = json_pull(
        dir.path(),
        &[&url, "--resource", "r", "--resource-version", "1"],
    );
    assert_eq!(read(&first), v1);
    let v2 = module("v2");
    reg.push(
        "a/filter:latest",
        vec![(WASM, v2.clone())],
        CNCF_CONFIG,
        &anon,
    );
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
    let (o, again) = json_pull(dir.path(), &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(read(&again), v2);
    assert_eq!(again["from_cache"], true);
    assert_eq!(again["manifest_digest"], newer["manifest_digest"]);
}

#[test]
fn a_pin_may_be_the_manifest_digest_or_the_module_sha256() {
    let reg = Registry::start(false);
    let m = module("pinned");
    let digest = reg.push(
        "pin/filter:1.0",
        vec![(WASM, m.clone())],
        CNCF_CONFIG,
        &RegistryAuth::Anonymous,
    );
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
    let third = tempfile::tempdir().unwrap();
    let o = pull(
        third.path(),
        &[&url, "--sha256", &sha256_hex(b"something else")],
    );
    assert_failed(&o, third.path(), &url, "checksum mismatch");
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
    reg.push(
        "priv/filter:1.0",
        vec![(WASM, m.clone())],
        CNCF_CONFIG,
        &creds,
    );
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
    let secret = dir.path().join("dockerconfig.json");
    std::fs::write(
        &secret,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"dXNlcjpwYXNz"}}}}}}"#,
            reg.host
        ),
    )
    .unwrap();
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
