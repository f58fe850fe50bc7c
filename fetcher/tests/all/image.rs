//! The image `make image` builds (deploy/image/), checked as a node would take it. Its index holds
//! every platform; each platform's config runs the binary as user 65532 with the OCI labels;
//! its one layer is a static binary for that architecture, files owned by root and writable by
//! no one else; its compressed size stays under 15 MB. Then, as a kubelet would: `make
//! image-push` to a loopback `docker-registry`, a pull back with skopeo (the digest unchanged),
//! its layers unpacked into a root, and `serve` run from that root with `chroot` as user 65532,
//! the root mounted read-only and only the ECDS and cache directories writable: it pulls a
//! module from the registry, writes its ECDS file and answers /healthz and /readyz.
//!
//! Running containers does not work on these machines (crun refuses hybrid cgroups), hence
//! the unpack. Ignored by `make test` (the image needs minutes of musl builds): `make
//! test-image` builds the image and runs these.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use serde_json::Value;

use crate::oci_registry::Registry;
use crate::serve_support::{get, wait_for};
use crate::support::{module, run_within, stderr};

/// The issue's budget for the sum of one platform's compressed layers.
const MAX_COMPRESSED_BYTES: u64 = 15_000_000;
const USER: u32 = 65532;
const BINARY: &str = "usr/local/bin/wasm-fetcher";
const TOOL_DEADLINE: Duration = Duration::from_secs(300);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The layout `make image` writes, tagged with the workspace version.
fn built_layout() -> PathBuf {
    let layout = workspace().join("target/image/oci");
    assert!(
        layout.join("index.json").is_file(),
        "no image at {}: run `make image` (or `make test-image`)",
        layout.display()
    );
    layout
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn blob_path(layout: &Path, digest: &Value) -> PathBuf {
    let digest = digest.as_str().expect("a digest");
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    layout.join("blobs/sha256").join(hex)
}

pub fn blob(layout: &Path, descriptor: &Value) -> Value {
    read_json(&blob_path(layout, &descriptor["digest"]))
}

/// The descriptor the layout's index names `tag`.
pub fn tagged(layout: &Path, tag: &str) -> Value {
    let index = read_json(&layout.join("index.json"));
    index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("{}: no tag {tag}: {index}", layout.display()))
        .clone()
}

/// Unpacks a manifest's layers into `root` (as the runtime does: owners and modes kept) and
/// returns the sum of their compressed sizes.
pub fn unpack(layout: &Path, manifest: &Value, root: &Path) -> u64 {
    let mut compressed = 0;
    for layer in manifest["layers"].as_array().expect("layers") {
        assert_eq!(
            layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip",
            "layer type"
        );
        compressed += layer["size"].as_u64().expect("a layer size");
        let file = std::fs::File::open(blob_path(layout, &layer["digest"])).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().into_owned();
            let name = path.display().to_string();
            assert!(
                !name.contains(".wh."),
                "a whiteout in an image on scratch: {name}"
            );
            let header = entry.header();
            assert_eq!(header.uid().unwrap(), 0, "{name} is not root's");
            let mode = header.mode().unwrap();
            assert_eq!(mode & 0o022, 0, "{name} is writable by others: {mode:o}");
            entry.unpack_in(root).unwrap();
        }
    }
    compressed
}

/// The ELF machine of a file, and whether it asks for an interpreter (a dynamic binary does).
fn elf(path: &Path) -> (u16, bool) {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .take(1 << 30)
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{}: not ELF", path.display());
    assert_eq!(bytes[4], 2, "{}: not 64-bit", path.display());
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let interp = (0..phnum as usize).any(|i| {
        let o = phoff + i * phentsize as usize;
        u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) == 3 // PT_INTERP
    });
    (u16_at(0x12), interp)
}

fn git_head() -> String {
    let o = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(o.status.success(), "git rev-parse: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

#[test]
#[ignore = "needs `make image`: run by `make test-image`"]
fn every_platform_is_a_static_binary_for_user_65532_labelled_and_under_15_mb() {
    let layout = built_layout();
    let version = env!("CARGO_PKG_VERSION");
    let index = blob(&layout, &tagged(&layout, version));
    let mut platforms = Vec::new();
    for m in index["manifests"].as_array().expect("an image index") {
        let arch = m["platform"]["architecture"].as_str().unwrap().to_string();
        assert_eq!(m["platform"]["os"], "linux");
        let manifest = blob(&layout, m);
        let config = blob(&layout, &manifest["config"]);
        assert_eq!(config["architecture"], arch.as_str());
        let c = &config["config"];
        assert_eq!(c["User"], "65532:65532", "{arch}: the image's user");
        assert_eq!(c["Entrypoint"], serde_json::json!([format!("/{BINARY}")]));
        let labels = &c["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], version);
        let revision = labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap();
        assert!(
            revision.starts_with(&git_head()),
            "{arch}: revision {revision} is not this checkout's"
        );
        let source = labels["org.opencontainers.image.source"].as_str().unwrap();
        assert!(!source.is_empty(), "{arch}: no source label");

        let root = tempfile::tempdir().unwrap();
        let compressed = unpack(&layout, &manifest, root.path());
        println!(
            "linux/{arch}: {compressed} bytes compressed ({})",
            m["digest"]
        );
        assert!(
            compressed < MAX_COMPRESSED_BYTES,
            "linux/{arch}: {compressed} bytes compressed, over {MAX_COMPRESSED_BYTES}"
        );
        let (machine, dynamic) = elf(&root.path().join(BINARY));
        let wanted = match arch.as_str() {
            "amd64" => 0x3e,
            "arm64" => 0xb7,
            other => panic!("unexpected platform linux/{other}"),
        };
        assert_eq!(machine, wanted, "linux/{arch}: the binary's ELF machine");
        assert!(
            !dynamic,
            "linux/{arch}: the binary asks for a dynamic loader"
        );
        let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
        assert!(
            passwd.lines().any(|l| l.contains(":65532:65532:")),
            "{passwd}"
        );
        let cas = std::fs::metadata(root.path().join("etc/ssl/certs/ca-certificates.crt"));
        assert!(cas.is_ok_and(|m| m.len() > 0), "{arch}: no CA bundle");
        platforms.push(arch);
    }
    platforms.sort();
    println!("platforms: {platforms:?}");
    assert!(platforms.contains(&"amd64".to_string()), "{platforms:?}");
}

/// `make image-push REGISTRY=… TAG=…`: its stdout's last line, `REGISTRY/REPO@sha256:…`.
fn make_image_push(registry: &str, tag: &str) -> String {
    let (o, _) = run_within(
        Command::new("make")
            .args(["-s", "image-push", &format!("REGISTRY={registry}")])
            .arg(format!("TAG={tag}"))
            .current_dir(workspace()),
        TOOL_DEADLINE,
    );
    assert!(o.status.success(), "make image-push: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    out.lines().last().unwrap_or_default().to_string()
}

fn skopeo(args: &[&str]) {
    let (o, _) = run_within(Command::new("skopeo").args(args), TOOL_DEADLINE);
    assert!(o.status.success(), "skopeo {args:?}: {}", stderr(&o));
}

/// Directories a pod would mount, owned by the image's user (the pod's fsGroup does that).
fn volume(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    std::os::unix::fs::chown(path, Some(USER), Some(USER)).unwrap();
}

/// In a private mount namespace: `root` bound read-only, the plugins read-only at
/// /etc/wasm-fetcher/plugins, the ECDS and cache directories writable at /var/lib/wasm-fetcher/,
/// then `chroot --userspec=65532:65532 root ENTRYPOINT ARGS` with `env` alone.
fn run_from_root(root: &Path, volumes: [&Path; 3], env: &[String], args: &[&str]) -> Command {
    for at in [
        "etc/wasm-fetcher/plugins",
        "var/lib/wasm-fetcher/ecds",
        "var/lib/wasm-fetcher/cache",
    ] {
        // Mount points, as the runtime makes them before it makes the root read-only.
        std::fs::create_dir_all(root.join(at)).unwrap();
    }
    let script = r#"set -e
R=$0
mount --bind "$R" "$R"
mount --bind "$1" "$R/etc/wasm-fetcher/plugins"
mount -o remount,bind,ro "$R/etc/wasm-fetcher/plugins"
mount --bind "$2" "$R/var/lib/wasm-fetcher/ecds"
mount --bind "$3" "$R/var/lib/wasm-fetcher/cache"
mount -o remount,bind,ro "$R"
if touch "$R/.writable" 2>/dev/null; then echo "the root is writable" >&2; exit 90; fi
shift 3
exec chroot --userspec=65532:65532 "$R" "$@""#;
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", script])
        .arg(root)
        .args(volumes)
        .arg(format!("/{BINARY}"))
        .args(args)
        .env_clear()
        .envs(env.iter().filter_map(|kv| kv.split_once('=')));
    cmd
}

#[test]
#[ignore = "needs `make image`: run by `make test-image`"]
fn pushed_and_pulled_back_it_serves_as_user_65532_from_a_read_only_root() {
    let layout = built_layout();
    let version = env!("CARGO_PKG_VERSION");
    let built = tagged(&layout, version)["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let reg = Registry::start(false);

    let pushed = make_image_push(&reg.host, "test");
    assert_eq!(
        pushed,
        format!("{}/wasm-fetcher@{built}", reg.host),
        "the registry holds another index than the one built"
    );

    // What a kubelet does, with skopeo: pull this machine's platform, unpack its layers.
    let tmp = tempfile::tempdir().unwrap();
    let pulled = tmp.path().join("pulled");
    skopeo(&[
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        &format!("docker://{}/wasm-fetcher:test", reg.host),
        &format!("oci:{}:test", pulled.display()),
    ]);
    let manifest = blob(&pulled, &tagged(&pulled, "test"));
    let config = blob(&pulled, &manifest["config"]);
    assert_eq!(config["architecture"], "amd64");
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    unpack(&pulled, &manifest, &root);

    // A module in the same registry, and a WasmPlugin naming it.
    let wasm = module("image");
    reg.push(
        "filters/image:v1",
        vec![("application/wasm", wasm.clone())],
        "application/vnd.wasm.config.v0+json",
        &RegistryAuth::Anonymous,
    );
    let (plugins, ecds, cache) = (
        tmp.path().join("plugins"),
        tmp.path().join("ecds"),
        tmp.path().join("cache"),
    );
    for dir in [&plugins, &ecds, &cache] {
        volume(dir);
    }
    std::fs::write(
        plugins.join("image.yaml"),
        format!(
            "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\n\
             metadata: {{name: image, namespace: test}}\n\
             spec:\n  url: oci://{}/filters/image:v1\n  failStrategy: FAIL_CLOSE\n",
            reg.host
        ),
    )
    .unwrap();

    let env: Vec<String> = config["config"]["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .chain(["WASM_FETCHER_LOG=info".to_string()])
        .collect();
    let log = tmp.path().join("serve.log");
    let mut child = run_from_root(
        &root,
        [&plugins, &ecds, &cache],
        &env,
        &[
            "serve",
            "--plugins=/etc/wasm-fetcher/plugins",
            "--ecds-dir=/var/lib/wasm-fetcher/ecds",
            "--cache-dir=/var/lib/wasm-fetcher/cache",
            "--metrics-addr=127.0.0.1:0",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .expect("unshare (util-linux) is needed");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let Some(addr) = first
        .rsplit("http://")
        .next()
        .map(str::trim)
        .filter(|a| a.starts_with("127.0.0.1:"))
        .map(String::from)
    else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "serve did not start from the image: {first:?}; {}",
            log_text()
        );
    };

    assert_eq!(
        get(&addr, "/healthz").map(|(s, _)| s),
        Ok(200),
        "{}",
        log_text()
    );
    wait_for("serve ready", Duration::from_secs(60), || {
        get(&addr, "/readyz").is_ok_and(|(status, _)| status == 200)
    });
    let written = std::fs::read_to_string(ecds.join("test.image.yaml")).unwrap();
    assert!(
        written.contains("/var/lib/wasm-fetcher/cache/modules/sha256/"),
        "the ECDS file does not name the cached module: {written}"
    );
    let cached: Vec<_> = crate::support::files_under(&cache.join("modules"));
    assert!(
        cached
            .iter()
            .any(|p| std::fs::read(p).is_ok_and(|b| b == wasm)),
        "the module is not in the cache: {cached:?}"
    );
    for p in &cached {
        assert_eq!(std::fs::metadata(p).unwrap().uid(), USER, "{}", p.display());
    }

    // SIGTERM, as the kubelet stops a container: a clean exit within the grace period.
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: signalling our own child, which has not been waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let mut status = None;
    wait_for("serve to stop on SIGTERM", Duration::from_secs(30), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{}", log_text());
}
