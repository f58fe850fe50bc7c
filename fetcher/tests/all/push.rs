//! `push` to a real `docker-registry`, read back by this fetcher (by tag, by digest, pinned)
//! and by `skopeo`, with the project's own filter (`make filter`) as the module.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::oci_registry::Registry;
use crate::support::*;

/// The project's filter, built by `make filter`.
pub fn filter_wasm() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/wasm32-wasip1/wasm-release/wasm_filter.wasm");
    assert!(
        p.is_file(),
        "{} is missing: run `make filter` (or `make test`)",
        p.display()
    );
    p
}

/// `wasm-fetcher push ARGS` with `home` as the home directory and no Docker config but the
/// one a test passes.
pub fn push(home: &Path, args: &[&str]) -> Output {
    fetcher()
        .env("HOME", home)
        .env_remove("DOCKER_CONFIG")
        .arg("push")
        .args(args)
        .output()
        .unwrap()
}

pub fn push_json(home: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let o = push(home, &all);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn pulled(cache: &Path, args: &[&str]) -> (Vec<u8>, serde_json::Value) {
    let mut all = args.to_vec();
    all.push("--json");
    let o = pull(cache, &all);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    (std::fs::read(v["path"].as_str().unwrap()).unwrap(), v)
}

fn skopeo(args: &[&str]) -> Output {
    let o = Command::new("skopeo")
        .args(args)
        .output()
        .expect("skopeo is needed");
    assert!(o.status.success(), "skopeo {args:?}: {}", stderr(&o));
    o
}

/// Every request the registry logged, the `/v2/` ping included.
fn requests_to_v2(reg: &Registry) -> usize {
    ["GET", "HEAD", "POST", "PUT", "PATCH"]
        .iter()
        .map(|m| reg.requests(m, "/v2/"))
        .sum()
}

/// `plugin.wasm` out of a compat layer (a tar.gz).
fn plugin_wasm(layer: &[u8]) -> Vec<u8> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().file_name().and_then(|n| n.to_str()) == Some("plugin.wasm") {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut out).unwrap();
            return out;
        }
    }
    panic!("no plugin.wasm in the layer");
}

#[test]
fn both_layouts_come_back_byte_for_byte_through_this_fetcher_and_skopeo() {
    let reg = Registry::start(false);
    let module_path = filter_wasm();
    let module = std::fs::read(&module_path).unwrap();
    let module_str = module_path.to_str().unwrap();
    let home = tempfile::tempdir().unwrap();
    for (layout, layers) in [("wasm", 2), ("compat", 1)] {
        let url = format!("oci://{}/filters/{layout}:1.0", reg.host);
        let p = push_json(
            home.path(),
            &[module_str, &url, "--layout", layout, "--check-abi"],
        );
        assert_eq!(p["outcome"], "pushed", "{layout}");
        assert_eq!(p["sha256"], sha256_hex(&module), "{layout}");
        assert_eq!(p["layout"], layout);
        assert_eq!(p["abi_versions"][0], "proxy_abi_version_0_2_1");
        let digest = p["manifest_digest"].as_str().unwrap();
        let digest_hex = digest.trim_start_matches("sha256:");

        // This fetcher: by tag, by digest, and by tag pinned to either digest.
        let (bytes, v) = pulled(tempfile::tempdir().unwrap().path(), &[&url]);
        assert_eq!(bytes, module, "{layout} by tag");
        assert_eq!(v["manifest_digest"], digest);
        let (bytes, _) = pulled(
            tempfile::tempdir().unwrap().path(),
            &[p["digest_url"].as_str().unwrap()],
        );
        assert_eq!(bytes, module, "{layout} by digest");
        let (bytes, v) = pulled(
            tempfile::tempdir().unwrap().path(),
            &[&url, "--sha256", digest_hex],
        );
        assert_eq!(
            (bytes == module, &v["pin"]),
            (true, &"manifest_digest".into())
        );
        let (bytes, v) = pulled(
            tempfile::tempdir().unwrap().path(),
            &[&url, "--sha256", &sha256_hex(&module)],
        );
        assert_eq!(
            (bytes == module, &v["pin"]),
            (true, &"module_sha256".into())
        );

        // skopeo: the manifest it reads is the one pushed, and so are the module's bytes.
        let source = format!("docker://{}/filters/{layout}:1.0", reg.host);
        let raw = skopeo(&["inspect", "--tls-verify=false", "--raw", &source]).stdout;
        assert_eq!(format!("sha256:{}", sha256_hex(&raw)), digest, "{layout}");
        let manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(manifest["layers"].as_array().unwrap().len(), layers);
        let out = tempfile::tempdir().unwrap();
        let dest = format!("dir:{}", out.path().join("image").display());
        skopeo(&["copy", "--src-tls-verify=false", &source, &dest]);
        let last = manifest["layers"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        let blob = std::fs::read(
            out.path().join("image").join(
                last["digest"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches("sha256:"),
            ),
        )
        .unwrap();
        match layout {
            "wasm" => {
                assert_eq!(
                    last["mediaType"],
                    "application/vnd.module.wasm.content.layer.v1+wasm"
                );
                assert_eq!(blob, module);
            }
            _ => {
                assert_eq!(
                    last["mediaType"],
                    "application/vnd.oci.image.layer.v1.tar+gzip"
                );
                assert_eq!(plugin_wasm(&blob), module);
            }
        }
    }
}

#[test]
fn pushing_the_same_module_again_sends_nothing_and_says_so() {
    let reg = Registry::start(false);
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.wasm");
    std::fs::write(&m, module("again")).unwrap();
    let url = format!("oci://{}/again/filter:1", reg.host);
    let first = push_json(dir.path(), &[m.to_str().unwrap(), &url]);
    assert_eq!(first["outcome"], "pushed");
    let uploads = reg.requests("POST", "/v2/again/filter/blobs/uploads/");
    let puts = reg.requests("PUT", "/v2/again/filter/");
    assert_eq!((uploads, puts), (2, 3), "2 blobs and a manifest");
    let o = push(dir.path(), &[m.to_str().unwrap(), &url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("unchanged "), "{text}");
    assert!(
        text.contains(first["manifest_digest"].as_str().unwrap()),
        "{text}"
    );
    assert_eq!(
        (
            reg.requests("POST", "/v2/again/filter/blobs/uploads/"),
            reg.requests("PUT", "/v2/again/filter/")
        ),
        (uploads, puts),
        "an unchanged push uploaded something"
    );
    // A changed module under the same tag is pushed, and only its new blob is uploaded.
    std::fs::write(&m, module("changed")).unwrap();
    let second = push_json(dir.path(), &[m.to_str().unwrap(), &url]);
    assert_eq!(second["outcome"], "pushed");
    assert_ne!(second["manifest_digest"], first["manifest_digest"]);
    assert_eq!(
        reg.requests("POST", "/v2/again/filter/blobs/uploads/"),
        uploads + 1,
        "the config blob the registry had was uploaded again"
    );
}

#[test]
fn a_registry_with_auth_takes_a_push_with_the_pull_secret_and_refuses_one_without() {
    let reg = Registry::start(true);
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.wasm");
    let module = module("private push");
    std::fs::write(&m, &module).unwrap();
    let url = format!("oci://{}/priv/filter:1.0", reg.host);
    let o = push(dir.path(), &[m.to_str().unwrap(), &url]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!(
            "wasm-fetcher: {url}: unauthorized: registry {}",
            reg.host
        )),
        "{err}"
    );
    assert!(err.contains("--pull-secret"), "{err}");
    assert!(o.stdout.is_empty());
    assert_eq!(reg.requests("PUT", "/v2/priv/"), 0);

    let secret = docker_config(dir.path(), &reg.host);
    let secret = secret.to_str().unwrap();
    let p = push_json(
        dir.path(),
        &[m.to_str().unwrap(), &url, "--pull-secret", secret],
    );
    assert_eq!(p["outcome"], "pushed");
    let cache = dir.path().join("cache");
    let (bytes, _) = pulled(&cache, &[&url, "--pull-secret", secret]);
    assert_eq!(bytes, module);
}

#[test]
fn bad_input_gets_a_clear_error_and_nothing_is_sent() {
    let reg = Registry::start(false);
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "not a module at all").unwrap();
    let component = dir.path().join("component.wasm");
    std::fs::write(&component, b"\0asm\x0d\0\x01\0").unwrap();
    let cut = dir.path().join("cut.wasm");
    let whole = std::fs::read(filter_wasm()).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let plain = dir.path().join("plain.wasm");
    std::fs::write(&plain, module("no abi")).unwrap();
    let missing = dir.path().join("missing.wasm");
    let good = filter_wasm();
    let url = format!("oci://{}/bad/filter:1.0", reg.host);
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let digest_ref = format!("oci://{}/bad/filter@sha256:{}", reg.host, "a".repeat(64));
    let untagged = format!("oci://{}/bad/filter", reg.host);
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (vec![p(&text), url.clone()], 1, "not a Wasm module"),
        (vec![p(&component), url.clone()], 1, "component"),
        (vec![p(&cut), url.clone()], 1, "malformed"),
        (
            vec![p(&plain), url.clone(), "--check-abi".into()],
            1,
            "not a proxy-wasm module",
        ),
        (vec![p(&missing), url.clone()], 1, "no such file"),
        (vec![p(dir.path()), url.clone()], 1, "not a regular file"),
        (vec![p(&good), untagged.clone()], 2, "name a tag"),
        (vec![p(&good), digest_ref.clone()], 2, "not a digest"),
        (
            vec![p(&good), "https://example.com/f.wasm".into()],
            2,
            "push needs oci://",
        ),
        (
            vec![p(&good), format!("oci://{}/Bad/Filter:1", reg.host)],
            2,
            "lower-case",
        ),
    ];
    for (args, code, words) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = push(dir.path(), &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.starts_with("wasm-fetcher: "), "{err}");
        assert!(err.contains(words), "{args:?}: expected {words:?} in {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    // Larger than any puller takes.
    let o = fetcher()
        .env("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", "100")
        .args(["push", good.to_str().unwrap(), &url])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("ISTIO_WASM_MAX_BINARY_SIZE_BYTES"), "{err}");
    assert_eq!(
        requests_to_v2(&reg),
        0,
        "a refused push reached the registry"
    );
}

#[test]
fn the_wasmplugin_it_prints_pulls_the_module_by_digest() {
    let reg = Registry::start(false);
    let home = tempfile::tempdir().unwrap();
    let module_path = filter_wasm();
    let config = home.path().join("header-ops.yaml");
    std::fs::write(
        &config,
        "role: http-header-operation\nrequest:\n  add: [{name: x-added-by, value: wasm-filter}]\n",
    )
    .unwrap();
    let url = format!("oci://{}/filters/wasm-filter:dev", reg.host);
    let push_with_config = |url: &str| {
        push(
            home.path(),
            &[
                module_path.to_str().unwrap(),
                url,
                "--wasmplugin",
                "wasm-filter",
                "--plugin-config",
                config.to_str().unwrap(),
            ],
        )
    };
    let o = push_with_config(&url);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: serde_json::Value = serde_norway::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["kind"], "WasmPlugin");
    assert_eq!(doc["apiVersion"], "extensions.istio.io/v1alpha1");
    assert_eq!(doc["metadata"]["name"], "wasm-filter");
    assert_eq!(doc["spec"]["url"], url.as_str());
    assert_eq!(doc["spec"]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(doc["spec"]["pluginConfig"]["role"], "http-header-operation");
    assert_eq!(
        doc["spec"]["pluginConfig"]["request"]["add"][0]["value"],
        "wasm-filter"
    );
    let sha = doc["spec"]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64, "{sha}");
    // Pulled the way Istio's agent would: the URL, pinned by the resource's sha256.
    let (bytes, v) = pulled(home.path(), &[&url, "--sha256", sha]);
    assert_eq!(bytes, std::fs::read(&module_path).unwrap());
    assert_eq!(v["pin"], "manifest_digest");

    // A plugin configuration that is not an object fails the command before any push.
    std::fs::write(&config, "[1, 2]").unwrap();
    let o = push_with_config(&format!("oci://{}/filters/other:dev", reg.host));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--plugin-config") && err.contains("expected an object"),
        "{err}"
    );
    assert_eq!(reg.requests("PUT", "/v2/filters/other/"), 0);
}

/// Built alongside this crate by `make build` (`cargo build --release --workspace`).
fn harness_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/wasm-harness");
    assert!(
        p.is_file(),
        "{} is missing: run `make build` (or `make test`)",
        p.display()
    );
    p
}

#[test]
fn a_pushed_filter_pulled_back_by_digest_runs_in_real_envoy() {
    let reg = Registry::start(false);
    let dir = tempfile::tempdir().unwrap();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let url = format!("oci://{}/filters/wasm-filter:envoy", reg.host);
    let p = push_json(dir.path(), &[filter_wasm().to_str().unwrap(), &url]);
    let digest = p["manifest_digest"].as_str().unwrap();
    let cache = dir.path().join("cache");
    let (_, pulled) = pulled(
        &cache,
        &[&url, "--sha256", digest.trim_start_matches("sha256:")],
    );
    let module = pulled["path"].as_str().unwrap();
    assert!(module.starts_with(cache.to_str().unwrap()), "{module}");
    let bootstrap = dir.path().join("bootstrap.yaml");
    let o = fetcher()
        .arg("rewrite")
        .arg(workspace.join("envoy-config/bootstrap.yaml"))
        .args(["--module", module, "--output"])
        .arg(&bootstrap)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&bootstrap).unwrap();
    assert!(
        !text.contains("wasm_filter.wasm"),
        "the build's path is left in {text}"
    );
    // The demo scenario's expectations are the filter's behaviour in every role; the harness
    // runs it through real Envoy too.
    let (o, _) = run_within(
        Command::new(harness_bin())
            .current_dir(&workspace)
            .env("ENVOY_BIN", wasm_common::envoy::envoy())
            .args(["run", "--envoy", "--bootstrap"])
            .arg(&bootstrap)
            .arg("testdata/scenarios/demo.yaml"),
        std::time::Duration::from_secs(120),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    assert!(out.contains(" passed, 0 failed"), "{out}");
    assert!(out.contains("envoy: 200"), "{out}");
}

#[test]
fn the_library_reports_the_modules_upload_as_progress() {
    use std::sync::{Arc, Mutex};
    use wasm_fetcher::ProgressEvent as Event;
    let reg = Registry::start(false);
    let module_path = filter_wasm();
    let size = std::fs::metadata(&module_path).unwrap().len();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let req = wasm_fetcher::push::PushRequest {
        modules: vec![module_path.into()],
        url: format!("oci://{}/progress/filter:1", reg.host),
        progress: wasm_fetcher::Progress::new(move |e| seen.lock().unwrap().push(e)),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pushed = rt
        .block_on(wasm_fetcher::push::push(
            &req,
            &wasm_fetcher::Settings::default(),
        ))
        .unwrap();
    assert_eq!(pushed.outcome, wasm_fetcher::push::Outcome::Pushed);
    assert_eq!(pushed.size, Some(size));
    let events = events.lock().unwrap().clone();
    assert_eq!(events.first(), Some(&Event::Started { total: Some(size) }));
    let sent: u64 = events
        .iter()
        .map(|e| match e {
            Event::Advanced(n) => *n,
            Event::Started { .. } => 0,
        })
        .sum();
    assert_eq!(sent, size, "progress adds up to the module's size");
    assert!(
        events.len() > 2,
        "the upload is reported in steps: {}",
        events.len()
    );
}

#[test]
fn a_tls_registry_is_verified_unless_trusted_by_ca_file_or_listed_insecure() {
    let reg = Registry::start_with(crate::oci_registry::Options {
        tls: true,
        ..Default::default()
    });
    let home = tempfile::tempdir().unwrap();
    let m = home.path().join("m.wasm");
    let module = module("over tls");
    std::fs::write(&m, &module).unwrap();
    let m = m.to_str().unwrap();
    let url = format!("oci://{}/tls/filter:1", reg.host);
    let o = push(home.path(), &[m, &url]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("untrusted certificate"), "{err}");
    assert!(
        err.contains("--ca-file") && err.contains("WASM_INSECURE_REGISTRIES"),
        "{err}"
    );
    assert_eq!(reg.requests("PUT", "/v2/tls/"), 0);
    // Listing another registry does not help; listing this one does, as does its CA.
    let o = push(
        home.path(),
        &[m, &url, "--insecure-registry", "127.0.0.1:1"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let p = push_json(home.path(), &[m, &url, "--insecure-registry", &reg.host]);
    assert_eq!(p["outcome"], "pushed");
    let ca = reg.ca_file();
    let again = format!("oci://{}/tls/other:1", reg.host);
    let p = push_json(home.path(), &[m, &again, "--ca-file", ca.to_str().unwrap()]);
    assert_eq!(p["outcome"], "pushed");
    let (bytes, _) = pulled(
        &home.path().join("cache"),
        &[&again, "--ca-file", ca.to_str().unwrap()],
    );
    assert_eq!(bytes, module);
}

/// `envoy-config/wasmplugins/`: each example names the module the way `make publish` prints it
/// (same repository path and tag, with `make publish`'s flags), and once its `sha256` is the
/// digest that push printed, the example pulls the filter by digest.
#[test]
fn the_shipped_wasmplugins_name_the_module_as_make_publish_prints_it() {
    let reg = Registry::start(false);
    let home = tempfile::tempdir().unwrap();
    let module_path = filter_wasm();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy-config/wasmplugins");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let name = path.display().to_string();
        let example: serde_json::Value =
            serde_norway::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let spec = &example["spec"];
        let url = spec["url"].as_str().unwrap();
        // oci://REGISTRY/REPO:TAG, as `make publish` builds it; REPO defaults to wasm-filter.
        let (_, repo_and_tag) = url
            .strip_prefix("oci://")
            .and_then(|rest| rest.split_once('/'))
            .unwrap_or_else(|| panic!("{name}: {url} is not oci://REGISTRY/REPO:TAG"));
        assert!(
            repo_and_tag.contains("wasm-filter:"),
            "{name}: {url} does not name make publish's default repository"
        );
        let local = format!("oci://{}/{repo_and_tag}", reg.host);
        let config = home.path().join("plugin-config.json");
        std::fs::write(&config, spec["pluginConfig"].to_string()).unwrap();
        let plugin = example["metadata"]["name"].as_str().unwrap();
        let o = push(
            home.path(),
            &[
                module_path.to_str().unwrap(),
                &local,
                "--layout",
                "wasm",
                "--check-abi",
                "--wasmplugin",
                plugin,
                "--plugin-config",
                config.to_str().unwrap(),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let printed: serde_json::Value = serde_norway::from_slice(&o.stdout).unwrap();
        assert_eq!(printed["spec"]["url"], local.as_str(), "{name}");
        assert_eq!(printed["metadata"]["name"], plugin, "{name}");
        assert_eq!(
            printed["spec"]["pluginConfig"], spec["pluginConfig"],
            "{name}"
        );
        let digest = printed["spec"]["sha256"].as_str().unwrap();
        let (bytes, pulled) = pulled(home.path(), &[&local, "--sha256", digest]);
        assert_eq!(bytes, std::fs::read(&module_path).unwrap(), "{name}");
        assert_eq!(pulled["pin"], "manifest_digest", "{name}");
        checked += 1;
    }
    assert!(checked >= 5, "one example per role, found {checked}");
}
