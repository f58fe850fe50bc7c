//! `render`, `convert` and `prefetch`: WasmPlugins and remote Wasm config made local, run in
//! real Envoy with the filter the build made; fallbacks when a module cannot be fetched; bad
//! input refused by field with nothing written; a warmed cache serving `Never` offline.

use std::path::Path;
use std::process::Output;

use crate::oci_registry::Registry;
use crate::push::filter_wasm;
use crate::real_envoy::{bootstrap, http_manager, listener, validate, Envoy};
use crate::support::*;

fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A WasmPlugin named `name` pulling `url`, with more `spec` lines (indented two spaces).
fn wasmplugin(name: &str, url: &str, spec: &str) -> String {
    format!(
        "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {{name: {name}, namespace: edge}}\nspec:\n  url: {url}\n{spec}"
    )
}

/// The header role adding `x-served-by: VALUE` to responses.
fn adds_header(value: &str) -> String {
    format!(
        "  pluginConfig: {{role: http-header-operation, response: {{add: [{{name: x-served-by, value: {value}}}]}}}}\n"
    )
}

fn run(cache: &Path, args: &[&str]) -> Output {
    fetcher()
        .env("WASM_HTTP_REQUEST_MAX_RETRIES", "1")
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

/// `render` into `out`: the filter-chain entries it prints, by name.
fn render(
    cache: &Path,
    files: &[&Path],
    out: &Path,
    extra: &[&str],
) -> (serde_json::Value, String) {
    let mut args = vec!["render"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    args.extend(["-o", out.to_str().unwrap()]);
    args.extend(extra);
    let o = run(cache, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    (serde_norway::from_slice(&o.stdout).unwrap(), stderr(&o))
}

fn entry(chain: &serde_json::Value, list: &str, plugin: &str) -> String {
    let name = format!("extensions.istio.io/wasmplugin/edge.{plugin}");
    let e = chain[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no {name} in {chain}"));
    format!("- {e}\n")
}

#[test]
fn rendered_plugins_run_in_real_envoy_with_fallbacks_and_reload_on_change() {
    let module = std::fs::read(filter_wasm()).unwrap();
    let server = Server::start(vec![
        ("/filter.wasm", Behaviour::Ok(module.clone())),
        ("/forbidden.wasm", Behaviour::Status(403)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (cache, out) = (dir.path().join("cache"), dir.path().join("ecds"));
    let good = server.url("/filter.wasm");
    let bad = server.url("/forbidden.wasm");
    let headers = |value: &str| {
        wasmplugin(
            "headers",
            &good,
            &format!(
                "  sha256: {}\n  phase: AUTHN\n{}",
                sha256_hex(&module),
                adds_header(value)
            ),
        )
    };
    let plugins = dir.path().join("plugins.yaml");
    let write_plugins = |value: &str| {
        let docs = [
            headers(value),
            wasmplugin("closed-http", &bad, "  failStrategy: FAIL_CLOSE\n"),
            wasmplugin("open-http", &bad, "  failStrategy: FAIL_OPEN\n"),
            wasmplugin("closed-tcp", &bad, "  type: NETWORK\n"),
            wasmplugin(
                "open-tcp",
                &bad,
                "  type: NETWORK\n  failStrategy: FAIL_OPEN\n",
            ),
        ];
        std::fs::write(&plugins, docs.join("---\n")).unwrap();
    };
    write_plugins("render");
    let (chain, warnings) = render(&cache, &[&plugins], &out, &[]);
    assert_eq!(
        warnings.matches("fail-closed: deny-all").count(),
        2,
        "{warnings}"
    );
    assert_eq!(
        warnings.matches("fail-open: allow-all").count(),
        2,
        "{warnings}"
    );
    assert!(warnings.contains("HTTP 403"), "{warnings}");
    let mut files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    // They hold pluginConfig and env values: owner and group only, as `serve` writes them.
    for f in &files {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640, "{f}: {mode:o}");
    }
    assert_eq!(
        files,
        [
            "edge.closed-http.yaml",
            "edge.closed-tcp.yaml",
            "edge.headers.yaml",
            "edge.open-http.yaml",
            "edge.open-tcp.yaml"
        ]
    );

    let boot = dir.path().join("bootstrap.yaml");
    let tcp = |plugin: &str| {
        format!(
            "{}{}",
            entry(&chain, "network_filters", plugin),
            http_manager("")
        )
    };
    std::fs::write(
        &boot,
        bootstrap(&[
            listener(
                "headers",
                &http_manager(&entry(&chain, "http_filters", "headers")),
            ),
            listener(
                "closed-http",
                &http_manager(&entry(&chain, "http_filters", "closed-http")),
            ),
            listener(
                "open-http",
                &http_manager(&entry(&chain, "http_filters", "open-http")),
            ),
            listener("closed-tcp", &tcp("closed-tcp")),
            listener("open-tcp", &tcp("open-tcp")),
        ]),
    )
    .unwrap();
    let envoy = Envoy::start(&boot);
    let (status, text) = envoy.get("headers").unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("x-served-by: render"), "{text}");
    assert_eq!(envoy.get("closed-http").map(|r| r.0), Ok(403));
    let (status, text) = envoy.get("open-http").unwrap();
    assert_eq!(
        (status, text.contains("x-served-by")),
        (200, false),
        "{text}"
    );
    assert!(
        envoy.get("closed-tcp").is_err(),
        "a denied connection is closed"
    );
    assert_eq!(envoy.get("open-tcp").map(|r| r.0), Ok(200));

    // A changed resource, rendered again: Envoy swaps the filter without a restart.
    write_plugins("render-2");
    render(&cache, &[&plugins], &out, &[]);
    let r = envoy.eventually("headers", |r| {
        r.as_ref()
            .is_ok_and(|(_, t)| t.contains("x-served-by: render-2"))
    });
    assert!(
        r.as_ref()
            .is_ok_and(|(_, t)| t.contains("x-served-by: render-2")),
        "{r:?}\n{}",
        envoy.log()
    );
    assert_eq!(
        server.hits("/filter.wasm"),
        1,
        "the module came from the cache"
    );
}

#[test]
fn converted_config_runs_in_real_envoy_with_fallbacks() {
    let module = std::fs::read(filter_wasm()).unwrap();
    let server = Server::start(vec![
        ("/filter.wasm", Behaviour::Ok(module.clone())),
        ("/forbidden.wasm", Behaviour::Status(403)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // The forbidden URL is pinned to other bytes: a pin the cache holds is served from it.
    let wasm = |kind: &str, uri: &str, extra: &str| {
        let sha = if uri.ends_with("/filter.wasm") {
            sha256_hex(&module)
        } else {
            sha256_hex(b"not cached")
        };
        format!(
            r#"- name: envoy.filters.{kind}.wasm
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.{kind}.wasm.v3.Wasm
    config:
      {extra}
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: '{{"role": "http-header-operation", "response": {{"add": [{{"name": "x-served-by", "value": "convert"}}]}}}}'
      vm_config:
        runtime: envoy.wasm.runtime.v8
        environment_variables:
          key_values: {{ISTIO_META_WASM_IMAGE_PULL_POLICY: IfNotPresent, KEEP: "1"}}
        code:
          remote:
            http_uri: {{uri: "{uri}", timeout: 10s, cluster: _}}
            sha256: "{sha}"
"#
        )
    };
    let good = server.url("/filter.wasm");
    let bad = server.url("/forbidden.wasm");
    let input = dir.path().join("bootstrap-remote.yaml");
    std::fs::write(
        &input,
        bootstrap(&[
            listener("wasm", &http_manager(&wasm("http", &good, "name: good"))),
            listener(
                "closed",
                &http_manager(&wasm("http", &bad, "fail_open: false")),
            ),
            listener(
                "open-tcp",
                &format!(
                    "{}{}",
                    wasm("network", &bad, "failure_policy: FAIL_OPEN"),
                    http_manager("")
                ),
            ),
        ]),
    )
    .unwrap();
    let out = dir.path().join("bootstrap.yaml");
    let o = run(
        &cache,
        &[
            "convert",
            input.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("fail-closed: deny-all") && err.contains("fail-open: allow-all"),
        "{err}"
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        !text.contains("remote") && !text.contains("ISTIO_META"),
        "{text}"
    );
    assert!(text.contains("KEEP"), "other variables stay: {text}");

    // An ECDS resource (JSON in, JSON out) converted into a file Envoy watches.
    let ecds = dir.path().join("ecds");
    std::fs::create_dir(&ecds).unwrap();
    let resource = serde_json::json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": "converted",
        "typed_config": serde_norway::from_str::<serde_json::Value>(&wasm("http", &good, "name: ecds"))
            .unwrap()[0]["typed_config"],
    }]});
    let remote = dir.path().join("ecds-remote.json");
    std::fs::write(&remote, resource.to_string()).unwrap();
    let converted = ecds.join("converted.json");
    let o = run(
        &cache,
        &[
            "convert",
            remote.to_str().unwrap(),
            "-o",
            converted.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let back: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&converted).unwrap()).unwrap();
    assert_eq!(back["resources"][0]["name"], "converted");
    let watched = format!(
        "- name: converted\n  config_discovery:\n    config_source: {{path_config_source: {{path: {}, watched_directory: {{path: {}}}}}}}\n    type_urls: [type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC]\n",
        converted.display(),
        ecds.display()
    );
    let mut doc: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let extra: serde_json::Value =
        serde_norway::from_str(&bootstrap(&[listener("ecds", &http_manager(&watched))])).unwrap();
    doc["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
        .push(extra["static_resources"]["listeners"][0].clone());
    std::fs::write(&out, serde_norway::to_string(&doc).unwrap()).unwrap();

    let envoy = Envoy::start(&out);
    let (status, text) = envoy.get("wasm").unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("x-served-by: convert"), "{text}");
    assert_eq!(envoy.get("closed").map(|r| r.0), Ok(403));
    assert_eq!(envoy.get("open-tcp").map(|r| r.0), Ok(200));
    let (status, text) = envoy.get("ecds").unwrap();
    assert!(
        status == 200 && text.contains("x-served-by: convert"),
        "{text}"
    );
    assert_eq!(server.hits("/filter.wasm"), 1, "one download for every use");
}

#[test]
fn malformed_input_is_refused_by_field_and_nothing_is_written() {
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(module("m")))]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let url = server.url("/m.wasm");
    let plugins = dir.path().join("plugins.yaml");
    std::fs::write(
        &plugins,
        format!(
            "{}---\n{}",
            wasmplugin("fine", &url, ""),
            wasmplugin("bad", &url, "  sha256: ABC\n")
        ),
    )
    .unwrap();
    let out = dir.path().join("ecds");
    let o = run(
        &cache,
        &[
            "render",
            plugins.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("document 2: spec.sha256: in body should match"),
        "{err}"
    );
    assert!(err.contains("plugins.yaml"), "{err}");
    assert!(!out.exists(), "nothing written");

    let input = dir.path().join("remote.yaml");
    std::fs::write(
        &input,
        format!(
            "\"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\nconfig:\n  vm_config:\n    code: {{remote: {{http_uri: {{uri: \"{url}\"}}, sha256: xyz}}}}\n"
        ),
    )
    .unwrap();
    let target = dir.path().join("out.yaml");
    std::fs::write(&target, "old\n").unwrap();
    let convert_to_target = || {
        let (i, t) = (input.to_str().unwrap(), target.to_str().unwrap());
        run(&cache, &["convert", i, "-o", t])
    };
    let o = convert_to_target();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("config.vm_config.code.remote.sha256: \"xyz\" is not a sha256"),
        "{}",
        stderr(&o)
    );
    // No remote Wasm: passed through unchanged, byte for byte, as Istio's agent does.
    let plain = "static_resources:   {listeners: []}  # no Wasm here\n";
    std::fs::write(&input, plain).unwrap();
    let o = convert_to_target();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), plain);
    std::fs::write(&target, "old\n").unwrap();
    std::fs::write(&input, "a: [b\n").unwrap();
    let o = convert_to_target();
    assert!(
        stderr(&o).contains("not valid YAML or JSON"),
        "{}",
        stderr(&o)
    );
    // A few KiB of anchors standing for millions of values is refused before it is built.
    let bomb = format!(
        "a: &a [{}]\nb: [{}]\n",
        vec!["0"; 10_000].join(","),
        vec!["*a"; 2_000].join(",")
    );
    std::fs::write(&input, bomb).unwrap();
    let o = convert_to_target();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("aliases expand to more than"),
        "{}",
        stderr(&o)
    );

    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "old\n",
        "left as it was"
    );
    assert_eq!(server.hits("/m.wasm"), 0, "nothing fetched");
    assert_eq!(files_under(&cache), Vec::<std::path::PathBuf>::new());
}

/// Every shipped example, pointed at a loopback registry holding the filter, renders to an
/// ECDS file naming the module, in Istio's order; the ECDS bootstrap on those files passes
/// `envoy --mode validate`.
#[test]
fn each_shipped_wasmplugin_renders_and_the_ecds_bootstrap_validates() {
    let reg = Registry::start(false);
    let module = std::fs::read(filter_wasm()).unwrap();
    let digest = reg.push(
        "platform/wasm-filter:0.1.0",
        vec![(
            "application/vnd.module.wasm.content.layer.v1+wasm",
            module.clone(),
        )],
        "application/vnd.module.wasm.config.v1+json",
        &oci_client::secrets::RegistryAuth::Anonymous,
    );
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets");
    // The plugins are in istio-system: their secret is looked up there only.
    std::fs::create_dir_all(secrets.join("istio-system/wasm-registry-credentials")).unwrap();
    std::fs::write(
        secrets.join("istio-system/wasm-registry-credentials/.dockerconfigjson"),
        format!(
            r#"{{"auths":{{"{}":{{"auth":"dXNlcjpwYXNz"}}}}}}"#,
            reg.host
        ),
    )
    .unwrap();
    let examples = workspace().join("envoy-config/wasmplugins");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&examples).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "yaml") {
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("registry.example.com", &reg.host)
                .replace("WASM_FILTER_SHA256", digest.trim_start_matches("sha256:"));
            let copy = dir.path().join(path.file_name().unwrap());
            std::fs::write(&copy, text).unwrap();
            files.push(copy);
        }
    }
    assert_eq!(files.len(), 5);
    let out = dir.path().join("ecds");
    let cache = dir.path().join("cache");
    let refs: Vec<&Path> = files.iter().map(|f| f.as_path()).collect();
    let (chain, warnings) = render(
        &cache,
        &refs,
        &out,
        &["--pull-secrets", secrets.to_str().unwrap()],
    );
    assert_eq!(warnings, "", "every module fetched");
    let names = |list: &str| -> Vec<String> {
        chain[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e["name"]
                    .as_str()
                    .unwrap()
                    .rsplit('.')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        names("http_filters"),
        [
            "wasm-filter-header-ops",
            "wasm-filter-rate-limit",
            "wasm-filter-body-ops",
            "wasm-filter-stats-recorder"
        ],
        "AUTHN, AUTHZ, then STATS by priority"
    );
    assert_eq!(names("network_filters"), ["wasm-filter-tcp-counter"]);
    let shipped = workspace().join("envoy-config/ecds");
    let mut rendered = 0;
    for f in std::fs::read_dir(&out).unwrap() {
        let f = f.unwrap();
        let mut doc: serde_json::Value =
            serde_norway::from_slice(&std::fs::read(f.path()).unwrap()).unwrap();
        let resources = doc["resources"].as_array().unwrap();
        assert_eq!(resources.len(), 1, "one resource per file");
        let vm = &resources[0]["typed_config"]["config"]["vm_config"];
        let path = vm["code"]["local"]["filename"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(path.starts_with(cache.to_str().unwrap()), "{path}");
        assert_eq!(std::fs::read(&path).unwrap(), module);
        assert_eq!(
            vm["environment_variables"]["host_env_keys"],
            serde_json::json!(["POD_NAME"])
        );
        // The shipped ECDS files are this, with the module the build makes.
        doc["resources"][0]["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
            "target/wasm32-wasip1/wasm-release/wasm_filter.wasm".into();
        doc["version_info"] = "shipped".into();
        let ours: serde_json::Value =
            serde_norway::from_slice(&std::fs::read(shipped.join(f.file_name())).unwrap()).unwrap();
        assert_eq!(doc, ours, "envoy-config/ecds/{:?} is stale", f.file_name());
        rendered += 1;
    }
    assert_eq!(rendered, 5);
    assert_eq!(
        reg.requests("GET", "/v2/platform/wasm-filter/blobs/"),
        1,
        "one layer download for five plugins"
    );

    let text = std::fs::read_to_string(workspace().join("envoy-config/bootstrap-ecds.yaml"))
        .unwrap()
        .replace("envoy-config/ecds", out.to_str().unwrap());
    let boot = dir.path().join("bootstrap-ecds.yaml");
    std::fs::write(&boot, text).unwrap();
    validate(&boot).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn prefetch_then_never_renders_offline() {
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(module("offline")))]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let plugins = dir.path().join("p.yaml");
    std::fs::write(&plugins, wasmplugin("p", &server.url("/m.wasm"), "")).unwrap();
    let o = run(&cache, &["prefetch", plugins.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    let cached = line.trim().strip_prefix("edge.p ").unwrap().to_string();
    assert_eq!(std::fs::read(&cached).unwrap(), module("offline"));
    assert_eq!(server.hits("/m.wasm"), 1);

    let out = dir.path().join("ecds");
    let (_, warnings) = render(&cache, &[&plugins], &out, &["--pull-policy", "Never"]);
    assert_eq!(warnings, "");
    let file = std::fs::read_to_string(out.join("edge.p.yaml")).unwrap();
    assert!(file.contains(&cached), "{file}");
    assert_eq!(
        server.hits("/m.wasm"),
        1,
        "Never does not touch the network"
    );

    // A cache that was not warmed: Never cannot serve, and the plugin fails closed.
    let cold = dir.path().join("cold");
    let (_, warnings) = render(&cold, &[&plugins], &out, &["--pull-policy", "Never"]);
    assert!(
        warnings.contains("not in cache") && warnings.contains("deny-all"),
        "{warnings}"
    );
    assert_eq!(server.hits("/m.wasm"), 1);

    // A prefetch that cannot pull says which plugin and fails.
    std::fs::write(&plugins, wasmplugin("gone", &server.url("/gone.wasm"), "")).unwrap();
    let o = run(&cache, &["prefetch", plugins.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("1 of 1 modules not cached: edge.gone: HTTP 404"),
        "{}",
        stderr(&o)
    );
}

/// The shipped ECDS bootstrap runs as shipped, from the repository root, on the shipped ECDS
/// files and the module the build makes: the header role answers through it.
#[test]
fn the_shipped_ecds_bootstrap_runs_the_filter_in_real_envoy() {
    filter_wasm();
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("bootstrap-ecds.yaml");
    std::fs::copy(workspace().join("envoy-config/bootstrap-ecds.yaml"), &boot).unwrap();
    let envoy = Envoy::start_in(&boot, &workspace());
    // No backend listens: the router's 503 goes back through the header role.
    let (status, text) = envoy.get("headers").unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("x-served-by: wasm-filter"),
        "{text}\n{}",
        envoy.log()
    );
}

/// Istio's agent variables in a converted ECDS resource: the pull secret's Docker config
/// reaches a registry that asks for credentials, and none of the variables reaches Envoy; an
/// empty secret (istiod could not read it) is a failed fetch, so the fallback.
#[test]
fn convert_uses_the_pull_secret_istiod_sends_and_strips_it() {
    let reg = Registry::start(true);
    let auth = oci_client::secrets::RegistryAuth::Basic("user".into(), "pass".into());
    let digest = reg.push(
        "private/f:1",
        vec![(
            "application/vnd.module.wasm.content.layer.v1+wasm",
            module("private"),
        )],
        "application/vnd.module.wasm.config.v1+json",
        &auth,
    );
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let resource = |secret: &str| {
        serde_json::json!({"resources": [{
            "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            "name": "extensions.istio.io/wasmplugin/edge.private",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {"vm_config": {
                    "environment_variables": {"key_values": {
                        "ISTIO_META_WASM_IMAGE_PULL_SECRET": secret,
                        "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "7",
                    }},
                    "code": {"remote": {
                        "http_uri": {"uri": format!("oci://{}/private/f:1", reg.host), "timeout": "20s"},
                        "sha256": digest.trim_start_matches("sha256:"),
                    }},
                }},
            },
        }]})
        .to_string()
    };
    let input = dir.path().join("in.json");
    let docker_config = format!(
        r#"{{"auths":{{"{}":{{"auth":"dXNlcjpwYXNz"}}}}}}"#,
        reg.host
    );
    std::fs::write(&input, resource(&docker_config)).unwrap();
    let o = fetcher()
        .env("HOME", dir.path())
        .env_remove("DOCKER_CONFIG")
        .args([
            "convert",
            input.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "fetched with the secret's credentials");
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let vm = &out["resources"][0]["typed_config"]["config"]["vm_config"];
    let path = vm["code"]["local"]["filename"].as_str().unwrap();
    assert_eq!(std::fs::read(path).unwrap(), module("private"));
    assert!(vm.get("environment_variables").is_none(), "{vm}");

    std::fs::write(&input, resource("")).unwrap();
    let o = fetcher()
        .env("HOME", dir.path())
        .args([
            "convert",
            input.to_str().unwrap(),
            "--cache-dir",
            dir.path().join("other").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("missing image pulling secret") && stderr(&o).contains("deny-all"),
        "{}",
        stderr(&o)
    );
}
