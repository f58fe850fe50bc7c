//! `push --layout dynamic-module` of the real `target/release/libwasm_filter.so` (`make
//! build`) to a loopback `docker-registry`, `pull --envoy-version` by platform into the
//! cache, and real Envoy loading it from there on envoy-config/dynamic-module.yaml. The
//! wrong platform, the wrong Envoy version are refused by name with nothing cached; a
//! non-ELF body is refused at push.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::oci_registry::Registry;
use crate::push::push_json;
use crate::real_envoy::{http_get, Envoy};
use crate::support::*;

fn shared_object() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/libwasm_filter.so");
    assert!(p.is_file(), "{} is missing: run `make build`", p.display());
    p
}

fn host_platform() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "linux/arm64",
        _ => "linux/amd64",
    }
}

#[test]
fn a_pushed_dynamic_module_is_pulled_by_platform_and_envoy_version_and_loads_in_envoy() {
    let reg = Registry::start(false);
    let home = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/filters/dynamic:1", reg.host);
    let so = shared_object();
    let pushed = push_json(
        home.path(),
        &[
            so.to_str().unwrap(),
            &url,
            "--layout",
            "dynamic-module",
            "--envoy-versions",
            "1.40,1.41",
        ],
    );
    assert_eq!(pushed["layout"], "dynamic_module");
    let module = std::fs::read(&so).unwrap();
    assert_eq!(pushed["sha256"], sha256_hex(&module));

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
    ] {
        let mut all = vec![url.as_str()];
        all.extend(args);
        let o = pull(cache.path(), &all);
        assert_failed(&o, cache.path(), &url, words);
    }

    let manifest_pin = pushed["manifest_digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let o = pull(
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
    let again = pull(cache.path(), &[&url, "--envoy-version", "1.41", "--json"]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (again["from_cache"].as_bool(), again["dir"].clone()),
        (Some(true), v["dir"].clone())
    );

    // Envoy searches ENVOY_DYNAMIC_MODULES_SEARCH_PATH for lib<name>.so: the pulled directory.
    std::env::set_var(
        "ENVOY_DYNAMIC_MODULES_SEARCH_PATH",
        v["dir"].as_str().unwrap(),
    );
    let run = tempfile::tempdir().unwrap();
    let bootstrap = run.path().join("dynamic-module.yaml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy-config/dynamic-module.yaml"),
        &bootstrap,
    )
    .unwrap();
    let envoy = Envoy::start(&bootstrap);
    let (status, text) =
        http_get(&format!("127.0.0.1:{}", envoy.port("headers")), "/healthz").unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("x-served-by: wasm-filter"),
        "{text}"
    );
}

#[test]
fn a_body_that_is_not_an_elf_shared_object_is_refused_at_push() {
    let reg = Registry::start(false);
    let home = tempfile::tempdir().unwrap();
    let wasm = home.path().join("libwasm_filter.so");
    std::fs::write(&wasm, module("not elf")).unwrap();
    let url = format!("oci://{}/filters/fake:1", reg.host);
    let o = crate::push::push(
        home.path(),
        &[
            wasm.to_str().unwrap(),
            &url,
            "--layout",
            "dynamic-module",
            "--envoy-versions",
            "1.40",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not an Envoy dynamic module"),
        "{}",
        stderr(&o)
    );
}
