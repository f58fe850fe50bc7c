//! `push --layout dynamic-module` of the real `target/release/libwasm_filter.so` (`make
//! build`) and of the same filter built for the other Linux architecture (`make
//! module-cross`) as one image index to a loopback `docker-registry`, `pull --envoy-version
//! --platform` of each into the cache, and real Envoy loading the host's from there on
//! envoy-config/dynamic-module.yaml; `ls` lists it and `purge` removes it like a Wasm module.
//! The wrong platform, the wrong Envoy version are refused by name with nothing cached; a
//! non-ELF body, or a file given as a platform its ELF header does not name, is refused at
//! push, and at pull when a registry serves one, as is an ELF for another platform.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::OciImageIndex;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use wasm_fetcher::dynamic_module::{CONFIG, ENVOY_VERSIONS, LAYER, TITLE};

use crate::cache_integrity::{ls_json, purge};
use crate::oci_registry::Registry;
use crate::push::push_json;
use crate::real_envoy::{http_get, validate, Envoy};
use crate::support::*;

pub fn shared_object() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/libwasm_filter.so");
    assert!(p.is_file(), "{} is missing: run `make build`", p.display());
    p
}

pub fn host_platform() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "linux/arm64",
        _ => "linux/amd64",
    }
}

/// The other architecture: its platform, its ELF machine, and the filter's `.so` built for it
/// by `make module-cross`.
pub fn cross_shared_object() -> (&'static str, u16, PathBuf) {
    let (platform, machine, target) = match host_platform() {
        "linux/amd64" => ("linux/arm64", 183, "aarch64-unknown-linux-gnu"),
        _ => ("linux/amd64", 62, "x86_64-unknown-linux-gnu"),
    };
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(target)
        .join("release/libwasm_filter.so");
    assert!(
        p.is_file(),
        "{} is missing: run `make module-cross`",
        p.display()
    );
    (platform, machine, p)
}

/// `pull` of a dynamic module taken unsigned: these tests are about what is pulled, the
/// signature's are in `dynamic_module_trust`.
pub fn pull_unsigned(cache: &Path, args: &[&str]) -> std::process::Output {
    let mut all = args.to_vec();
    all.push("--allow-unsigned-dynamic-modules");
    pull(cache, &all)
}

/// `e_machine` of an ELF file.
fn elf_machine(bytes: &[u8]) -> u16 {
    u16::from_le_bytes([bytes[18], bytes[19]])
}

#[test]
fn a_pushed_dynamic_module_is_pulled_by_platform_and_envoy_version_and_loads_in_envoy() {
    let reg = Registry::start(false);
    let home = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/filters/dynamic:1", reg.host);
    let so = shared_object();
    let (cross_platform, cross_machine, cross) = cross_shared_object();
    // One push, both platforms: the host's file by its ELF header, the other given as its
    // platform (and checked against its header).
    let pushed = push_json(
        home.path(),
        &[
            so.to_str().unwrap(),
            &format!("{cross_platform}={}", cross.display()),
            &url,
            "--layout",
            "dynamic-module",
            "--envoy-versions",
            "1.40,1.41",
        ],
    );
    assert_eq!(pushed["layout"], "dynamic_module");
    let module = std::fs::read(&so).unwrap();
    let cross_module = std::fs::read(&cross).unwrap();
    assert_eq!(pushed["sha256"], serde_json::Value::Null, "{pushed}");
    let mut by_platform: Vec<(String, String)> = pushed["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["platform"].as_str().unwrap().to_string(),
                m["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    by_platform.sort();
    let mut want = vec![
        (host_platform().to_string(), sha256_hex(&module)),
        (cross_platform.to_string(), sha256_hex(&cross_module)),
    ];
    want.sort();
    assert_eq!(by_platform, want);

    let cache = tempfile::tempdir().unwrap();
    for (args, words) in [
        (
            vec!["--platform", "linux/s390x", "--envoy-version", "1.40"],
            "platform linux/s390x",
        ),
        (
            vec!["--platform", host_platform(), "--envoy-version", "1.39"],
            "Envoy 1.39",
        ),
        // Listed in the index, but this fetcher cannot check a module against its ABI.
        (
            vec!["--platform", host_platform(), "--envoy-version", "1.41"],
            "not loadable by Envoy 1.41: this wasm-fetcher has no dynamic-module ABI table for Envoy 1.41 (it knows 1.40)",
        ),
    ] {
        let mut all = vec![url.as_str()];
        all.extend(args);
        let o = pull_unsigned(cache.path(), &all);
        assert_failed(&o, cache.path(), &url, words);
    }

    let manifest_pin = pushed["manifest_digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let o = pull_unsigned(
        cache.path(),
        &[
            &url,
            "--platform",
            host_platform(),
            "--envoy-version",
            "1.40",
            "--sha256",
            &manifest_pin,
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["name"], "wasm_filter");
    assert_eq!(v["from_cache"], false);
    let path = PathBuf::from(v["path"].as_str().unwrap());
    assert_eq!(path.file_name().unwrap(), "libwasm_filter.so");
    assert_eq!(std::fs::read(&path).unwrap(), module);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(
        elf_machine(&std::fs::read(&path).unwrap()),
        elf_machine(&module)
    );
    let again = pull_unsigned(cache.path(), &[&url, "--envoy-version", "1.40", "--json"]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (again["from_cache"].as_bool(), again["dir"].clone()),
        (Some(true), v["dir"].clone())
    );
    // The other platform's child, by --platform, into a cache of its own (so `ls` below
    // sees the host's alone): the bytes pushed, its ELF machine the platform's.
    let cross_cache = tempfile::tempdir().unwrap();
    let o = pull_unsigned(
        cross_cache.path(),
        &[
            &url,
            "--platform",
            cross_platform,
            "--envoy-version",
            "1.40",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(c["platform"], cross_platform);
    assert_eq!(c["sha256"], sha256_hex(&cross_module));
    assert_ne!(c["manifest_digest"], v["manifest_digest"]);
    assert_eq!(c["index_digest"], v["index_digest"]);
    let pulled = std::fs::read(c["path"].as_str().unwrap()).unwrap();
    assert_eq!(sha256_hex(&pulled), sha256_hex(&cross_module));
    assert_eq!(elf_machine(&pulled), cross_machine);

    // `rewrite` points every dynamic-module filter at the cached file: Envoy loads it from
    // there, with nothing on its search path.
    let run = tempfile::tempdir().unwrap();
    std::env::set_var("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", run.path());
    let bootstrap = run.path().join("dynamic-module.yaml");
    let o = fetcher()
        .arg("rewrite")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy-config/dynamic-module.yaml"))
        .args(["--module", v["path"].as_str().unwrap(), "-o"])
        .arg(&bootstrap)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rewritten = std::fs::read_to_string(&bootstrap).unwrap();
    assert_eq!(
        rewritten.matches(v["path"].as_str().unwrap()).count(),
        5,
        "the five dynamic-module filters (four HTTP, one network): {rewritten}"
    );
    // `convert` pulls a dynamic-module filter's oci:// module for the Envoy version asked for
    // and points the filter at it; without a version it refuses, naming the filter.
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy-config/dynamic-module.yaml"),
    )
    .unwrap();
    let remote = format!(
        "{{name: wasm_filter, module: {{remote: {{http_uri: {{uri: \"{url}\", cluster: none, timeout: 5s}}, sha256: {}}}}}}}",
        v["sha256"].as_str().unwrap()
    );
    let input = run.path().join("remote.yaml");
    std::fs::write(&input, source.replace("{name: wasm_filter}", &remote)).unwrap();
    let converted = run.path().join("converted.yaml");
    let convert = |extra: &[&str]| {
        fetcher()
            .arg("convert")
            .arg(&input)
            .arg("-o")
            .arg(&converted)
            .arg("--cache-dir")
            .arg(cache.path())
            .arg("--allow-unsigned-dynamic-modules")
            .args(extra)
            .output()
            .unwrap()
    };
    let o = convert(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("http_filters[0].typed_config: a dynamic module from a registry is pulled for one Envoy: pass --envoy-version"),
        "{}",
        stderr(&o)
    );
    let o = convert(&["--envoy-version", "1.40"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&converted).unwrap();
    assert_eq!(
        text.matches(v["path"].as_str().unwrap()).count(),
        5,
        "{text}"
    );
    assert!(!text.contains("oci://"), "{text}");
    validate(&converted).unwrap();

    let envoy = Envoy::start(&bootstrap);
    let (status, text) =
        http_get(&format!("127.0.0.1:{}", envoy.port("headers")), "/healthz").unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("x-served-by: wasm-filter"),
        "{text}"
    );
    drop(envoy);

    let listed = ls_json(cache.path(), &[]);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["sha256"], v["sha256"]);
    assert_eq!(listed[0]["path"], v["path"]);
    assert_eq!(listed[0]["source"], url.as_str());
    assert_eq!(listed[0]["size"], module.len());
    assert_eq!(
        listed[0]["dynamic_module"],
        serde_json::json!({"file": "libwasm_filter.so", "platform": host_platform()})
    );
    let kept = purge(cache.path(), "24h");
    assert_eq!(kept.status.code(), Some(0), "{}", stderr(&kept));
    assert!(path.is_file(), "used within the expiry: kept");
    let purged = purge(cache.path(), "1ms");
    assert_eq!(purged.status.code(), Some(0), "{}", stderr(&purged));
    assert_eq!(
        String::from_utf8_lossy(&purged.stdout).trim(),
        format!("purged sha256:{}", v["sha256"].as_str().unwrap())
    );
    assert!(!Path::new(v["dir"].as_str().unwrap()).exists());
    assert_eq!(ls_json(cache.path(), &[]), Vec::<serde_json::Value>::new());
}

/// Puts `filters/<repo_tag>` in the registry: an image index naming one module for
/// `platform`, whose body is `body` as is. `push` refuses such bodies; a registry someone
/// else fills may still serve them.
pub fn serve_index(reg: &Registry, repo_tag: &str, platform: &str, body: Vec<u8>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let auth = RegistryAuth::Anonymous;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let child = format!("{}/filters/{}", reg.host, repo_tag.replace(':', ":child-"));
    let child: Reference = child.parse().unwrap();
    let title = BTreeMap::from([(TITLE.to_string(), "libwasm_filter.so".to_string())]);
    let layer = ImageLayer::new(body, LAYER.into(), Some(title));
    let config = Config::new(b"{}".to_vec(), CONFIG.into(), None);
    rt.block_on(client.push(&child, &[layer], config, &auth, None))
        .unwrap();
    let oci_manifest = "application/vnd.oci.image.manifest.v1+json";
    let (bytes, digest) = rt
        .block_on(client.pull_manifest_raw(&child, &auth, &[oci_manifest]))
        .unwrap();
    let (os, arch) = platform.split_once('/').unwrap();
    let index: OciImageIndex = serde_json::from_value(serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": oci_manifest, "digest": digest, "size": bytes.len(),
            "platform": {"os": os, "architecture": arch},
            "annotations": {ENVOY_VERSIONS: "1.40"},
        }],
    }))
    .unwrap();
    let reference: Reference = format!("{}/filters/{repo_tag}", reg.host).parse().unwrap();
    rt.block_on(client.push_manifest_list(&reference, &auth, index))
        .unwrap();
}

#[test]
fn a_registry_serving_a_non_elf_body_or_an_elf_for_another_platform_is_refused_at_pull() {
    let reg = Registry::start(false);
    let so = std::fs::read(shared_object()).unwrap();
    // The same shared object, its ELF header naming the other architecture.
    let (other_machine, other_platform) = match host_platform() {
        "linux/amd64" => (183u16, "linux/arm64"),
        _ => (62u16, "linux/amd64"),
    };
    let mut other = so;
    other[18..20].copy_from_slice(&other_machine.to_le_bytes());
    let cache = tempfile::tempdir().unwrap();
    for (repo_tag, body, words) in [
        ("bad:notelf", module("not elf"), "no ELF magic"),
        ("bad:other", other, &*format!("built for {other_platform}")),
    ] {
        serve_index(&reg, repo_tag, host_platform(), body);
        let url = format!("oci://{}/filters/{repo_tag}", reg.host);
        let o = pull_unsigned(cache.path(), &[&url, "--envoy-version", "1.40"]);
        assert_failed(&o, cache.path(), &url, words);
        assert!(
            stderr(&o).contains("not an Envoy dynamic module"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn a_file_that_is_not_an_elf_shared_object_or_not_for_the_platform_given_is_refused_at_push() {
    let reg = Registry::start(false);
    let home = tempfile::tempdir().unwrap();
    let fake = home.path().join("libwasm_filter.so");
    std::fs::write(&fake, module("not elf")).unwrap();
    let so = shared_object();
    let (cross_platform, _, _) = cross_shared_object();
    let url = format!("oci://{}/filters/fake:1", reg.host);
    let given = |arg: &str| format!("{arg}={}", so.display());
    for (files, words) in [
        (vec![fake.display().to_string()], format!("not an Envoy dynamic module: {}", fake.display())),
        // The host's build, given as the other platform: refused naming the file.
        (
            vec![given(cross_platform)],
            format!(
                "not an Envoy dynamic module: {} (given as {cross_platform}, but its ELF header says {}",
                so.display(),
                host_platform()
            ),
        ),
        (
            vec![so.display().to_string(), given(host_platform())],
            format!("a second module for {}", host_platform()),
        ),
    ] {
        let mut args: Vec<&str> = files.iter().map(String::as_str).collect();
        args.extend([url.as_str(), "--layout", "dynamic-module", "--envoy-versions", "1.40"]);
        let o = crate::push::push(home.path(), &args);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(&words), "{words}: {}", stderr(&o));
    }
    // A Wasm layout takes one file, with no platform: a usage error.
    let so = so.display().to_string();
    let o = crate::push::push(home.path(), &[&so, &so, &url]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--layout wasm pushes one module file"),
        "{}",
        stderr(&o)
    );
    // Nothing was pushed: the registry has no such repository, and a pull says so.
    let (status, tags) = http_get(&reg.host, "/v2/filters/fake/tags/list").unwrap();
    assert_eq!(status, 404, "{tags}");
    assert!(tags.contains("NAME_UNKNOWN"), "{tags}");
    let o = pull_unsigned(home.path(), &[&url, "--envoy-version", "1.40"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "{url}: not found: http://{}/v2/filters/fake/manifests/1",
            reg.host
        )),
        "{}",
        stderr(&o)
    );
}
