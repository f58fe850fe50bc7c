//! `deploy/`: the Kubernetes manifests, checked offline. Every document parses; in every pod
//! template each mount names a declared volume and each ConfigMap volume a ConfigMap the file
//! defines; `wasm-fetcher` runs a subcommand this build has with flags its `--help` lists, its
//! directories are mounted, its probes ask `/healthz` and `/readyz` on the `--metrics-addr`
//! port, which listens beyond loopback (kubelet probes the pod's address); Envoy's `-c` file is
//! in its mounted ConfigMap and is `envoy-config/bootstrap-ecds.yaml` with the ECDS directory
//! the fetcher writes (listeners on 0.0.0.0); Envoy mounts that directory and the cache at the
//! fetcher's paths, read-only (an ECDS file names the module by the fetcher's path); the
//! WasmPlugins in the ConfigMap pass the fetcher's parser and are exactly the plugins whose ECDS
//! files the bootstrap reads. A fetcher reading image volumes (`--image-volume-root`) finds the
//! volume each plugin's URL maps to, pinned by digest and mounted read-only where it looks (in
//! an Envoy of the same pod too), and the plugins' pull secrets among the pod's
//! `imagePullSecrets`; an Envoy in another pod mounts no image and the fetcher copies
//! (`--copy-image-volumes`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;
use wasm_fetcher::envoy::{render, wasmplugin::WasmPlugin};

use crate::support::fetcher;

fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The flags `wasm-fetcher SUB --help` lists. `serve` is built on another branch: until it is
/// in this build, its flags are the ones issue 14 gives it.
fn known_flags(sub: &str) -> BTreeSet<String> {
    let o = fetcher().args([sub, "--help"]).output().unwrap();
    if !o.status.success() && sub == "serve" {
        return [
            "--plugins",
            "--ecds-dir",
            "--cache-dir",
            "--metrics-addr",
            "--pull-secrets",
            "--pull-policy",
        ]
        .map(String::from)
        .into();
    }
    assert!(o.status.success(), "wasm-fetcher has no {sub}");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter_map(|w| {
            let w = w.trim_end_matches(',');
            let flag = w.split(['=', '<', '[']).next()?;
            (flag.starts_with("--") && flag.len() > 2).then(|| flag.to_string())
        })
        .collect()
}

/// `--flag=value` or `--flag value` out of a container's args.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&format!("{name}=")).or_else(|| {
            (a == name)
                .then(|| args.get(i + 1).map(String::as_str))
                .flatten()
        })
    })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// Where `container` mounts the volume `volume`, and whether read-only.
fn mount(container: &Value, volume: &str) -> Option<(String, bool)> {
    container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == volume)
        .map(|m| {
            (
                m["mountPath"].as_str().unwrap_or("").to_string(),
                m["readOnly"] == true,
            )
        })
}

/// The volume mounted at or above `path` in `container`.
fn volume_at(container: &Value, path: &str) -> Option<String> {
    container["volumeMounts"].as_array()?.iter().find_map(|m| {
        let at = m["mountPath"].as_str()?;
        (path == at || path.starts_with(&format!("{at}/")))
            .then(|| m["name"].as_str().unwrap().to_string())
    })
}

#[test]
fn deploy_manifests_agree_with_the_cli_and_the_ecds_bootstrap() {
    let mut checked_files = 0;
    for entry in std::fs::read_dir(workspace().join("deploy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") || path.ends_with(KUSTOMIZATION) {
            continue;
        }
        check_file(&path);
        checked_files += 1;
    }
    assert_eq!(
        checked_files, 3,
        "deploy/sidecar.yaml, deploy/daemonset.yaml and deploy/image-volumes.yaml"
    );
}

const KUSTOMIZATION: &str = "kustomization.yaml";

/// The image `wasm-fetcher` is named in one place: the manifests name it by the bare name
/// `wasm-fetcher` and deploy/kustomization.yaml's `images` turns that into a registry
/// reference (`kustomize edit set image` changes it there). Its resources are every manifest.
#[test]
fn the_kustomization_names_every_manifest_and_the_one_fetcher_image() {
    let deploy = workspace().join("deploy");
    let k: Value =
        serde_norway::from_str(&std::fs::read_to_string(deploy.join(KUSTOMIZATION)).unwrap())
            .unwrap();
    assert_eq!(k["kind"], "Kustomization");
    let mut manifests: Vec<String> = std::fs::read_dir(&deploy)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != KUSTOMIZATION)
        .collect();
    manifests.sort();
    let mut resources = strings(&k["resources"]);
    resources.sort();
    assert_eq!(resources, manifests, "{KUSTOMIZATION}: resources");

    let images = k["images"].as_array().expect("images");
    let fetcher = images
        .iter()
        .find(|i| i["name"] == "wasm-fetcher")
        .expect("an images entry for wasm-fetcher");
    let target = fetcher["newName"].as_str().expect("newName");
    assert!(
        target.contains('/') && target.ends_with("/wasm-fetcher"),
        "newName {target}: a registry reference to the image `make image-push` pushes"
    );
    assert!(
        fetcher["newTag"].is_string() || fetcher["digest"].is_string(),
        "wasm-fetcher: a newTag or digest"
    );

    let mut named = BTreeSet::new();
    for m in &manifests {
        let text = std::fs::read_to_string(deploy.join(m)).unwrap();
        for line in text.lines() {
            if let Some(image) = line.trim().strip_prefix("image: ") {
                named.insert(image.to_string());
            }
        }
    }
    let fetchers: Vec<_> = named
        .iter()
        .filter(|i| i.contains("wasm-fetcher"))
        .collect();
    assert_eq!(
        fetchers,
        ["wasm-fetcher"],
        "the manifests name the fetcher's image only by the name the kustomization replaces"
    );
}

fn documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: {e}")))
        .filter(|d| !d.is_null())
        .collect()
}

/// The data of every ConfigMap in deploy/, by `namespace/name`: `kubectl apply -k deploy/`
/// applies them all, so a pod may use one another file defines in its namespace.
fn all_config_maps() -> BTreeMap<String, Value> {
    let mut maps = BTreeMap::new();
    for entry in std::fs::read_dir(workspace().join("deploy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") || path.ends_with(KUSTOMIZATION) {
            continue;
        }
        for d in documents(&path)
            .into_iter()
            .filter(|d| d["kind"] == "ConfigMap")
        {
            let key = format!(
                "{}/{}",
                d["metadata"]["namespace"].as_str().unwrap_or("default"),
                d["metadata"]["name"].as_str().unwrap()
            );
            maps.insert(key, d["data"].clone());
        }
    }
    maps
}

fn check_file(path: &Path) {
    let name = path.display().to_string();
    let docs = documents(path);
    let every_config_map = all_config_maps();
    let mut config_maps: BTreeMap<String, &Value> = BTreeMap::new();
    for d in &docs {
        for field in ["apiVersion", "kind"] {
            assert!(d[field].is_string(), "{name}: a document without {field}");
        }
        assert!(
            d["metadata"]["name"].is_string(),
            "{name}: a document without a name"
        );
        let namespace = d["metadata"]["namespace"].as_str().unwrap_or("default");
        for (key, data) in &every_config_map {
            if let Some(cm) = key.strip_prefix(&format!("{namespace}/")) {
                config_maps.insert(cm.to_string(), data);
            }
        }
    }
    let mut fetchers = 0;
    let mut envoys = 0;
    // What the fetcher writes (--ecds-dir, --cache-dir) and what Envoy must read.
    let mut written: Option<(String, String)> = None;
    let mut read: Vec<(Value, Value)> = Vec::new();
    let mut served_plugins: Option<String> = None;
    let mut pull_secret_mounts: BTreeSet<String> = BTreeSet::new();
    // With --image-volume-root: the root, and the pod (the kubelet pulls with its secrets).
    let mut image_volumes: Option<(String, &Value)> = None;
    let mut copies = false;
    for d in docs.iter().filter(|d| d["spec"]["template"].is_object()) {
        let pod = &d["spec"]["template"]["spec"];
        let volumes: BTreeMap<String, &Value> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["name"].as_str().unwrap().to_string(), v))
            .collect();
        let containers: Vec<&Value> = ["initContainers", "containers"]
            .iter()
            .flat_map(|k| pod[k].as_array().into_iter().flatten())
            .collect();
        for c in &containers {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let v = m["name"].as_str().unwrap();
                assert!(
                    volumes.contains_key(v),
                    "{name}: mount of undeclared volume {v}"
                );
            }
        }
        for v in volumes.values() {
            if let Some(cm) = v["configMap"]["name"].as_str() {
                assert!(config_maps.contains_key(cm), "{name}: no ConfigMap {cm}");
            }
        }
        for c in containers.iter().filter(|c| {
            c["image"]
                .as_str()
                .is_some_and(|i| i.contains("wasm-fetcher"))
        }) {
            let args = strings(&c["args"]);
            let sub = args.first().expect("a subcommand");
            let flags = known_flags(sub);
            for a in args.iter().skip(1).filter(|a| a.starts_with("--")) {
                let f = a.split('=').next().unwrap();
                assert!(
                    flags.contains(f),
                    "{name}: wasm-fetcher {sub} has no {f}: {flags:?}"
                );
            }
            for (f, writes) in [
                ("--plugins", false),
                ("--ecds-dir", true),
                ("--cache-dir", true),
            ] {
                let dir = flag(&args, f).unwrap_or_else(|| panic!("{name}: no {f}"));
                let v =
                    volume_at(c, dir).unwrap_or_else(|| panic!("{name}: {f} {dir} is not mounted"));
                let (_, read_only) = mount(c, &v).unwrap();
                assert_eq!(
                    read_only, !writes,
                    "{name}: {f} {dir} read-only must be {}",
                    !writes
                );
            }
            if let Some(root) = flag(&args, "--image-volume-root") {
                image_volumes = Some((root.to_string(), pod));
            }
            copies = args.iter().any(|a| a == "--copy-image-volumes");
            // imagePullSecret NAME is read from DIR/NAMESPACE/NAME/.dockerconfigjson: a Secret
            // volume.
            let secrets = flag(&args, "--pull-secrets")
                .or(image_volumes.as_ref().map(|_| "/nowhere"))
                .unwrap_or_else(|| panic!("{name}: no --pull-secrets"));
            pull_secret_mounts = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| {
                    let name = m["mountPath"]
                        .as_str()?
                        .strip_prefix(&format!("{secrets}/"))?;
                    let v = &volumes[m["name"].as_str()?];
                    (v["secret"]["secretName"].is_string() && m["readOnly"] == true)
                        .then(|| name.to_string())
                })
                .collect();
            let ecds = flag(&args, "--ecds-dir").unwrap().to_string();
            let cache = flag(&args, "--cache-dir").unwrap().to_string();
            written = Some((ecds, cache));
            let plugins_volume = volume_at(c, flag(&args, "--plugins").unwrap()).unwrap();
            served_plugins = volumes[&plugins_volume]["configMap"]["name"]
                .as_str()
                .map(String::from);
            let addr: std::net::SocketAddr =
                flag(&args, "--metrics-addr").unwrap().parse().unwrap();
            assert!(
                addr.ip().is_unspecified(),
                "{name}: kubelet cannot probe {addr}"
            );
            for (probe, wanted) in [
                ("startupProbe", "/readyz"),
                ("readinessProbe", "/readyz"),
                ("livenessProbe", "/healthz"),
            ] {
                let get = &c[probe]["httpGet"];
                assert_eq!(get["path"], wanted, "{name}: {probe}");
                assert_eq!(get["port"], addr.port(), "{name}: {probe} port");
            }
            fetchers += 1;
        }
        for c in containers.iter().filter(|c| {
            c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("envoyproxy/envoy"))
                && c["args"].is_array()
        }) {
            let args = strings(&c["args"]);
            let config = flag(&args, "-c").unwrap_or_else(|| panic!("{name}: envoy without -c"));
            let v = volume_at(c, config).unwrap_or_else(|| panic!("{name}: {config} not mounted"));
            let cm = volumes[&v]["configMap"]["name"].as_str().unwrap();
            let (at, _) = mount(c, &v).unwrap();
            let key = config.strip_prefix(&format!("{at}/")).unwrap();
            let bootstrap = config_maps[cm][key]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: {cm} has no {key}"));
            read.push((
                serde_norway::from_str(bootstrap).unwrap(),
                serde_json::json!({
                    "mounts": c["volumeMounts"],
                    "volumes": volumes.values().map(|v| (*v).clone()).collect::<Vec<_>>(),
                }),
            ));
            envoys += 1;
        }
    }
    assert_eq!((fetchers, envoys), (1, 1), "{name}: one fetcher, one Envoy");
    let (ecds, cache) = written.unwrap();
    let (bootstrap, envoy_pod) = &read[0];
    let shipped = std::fs::read_to_string(workspace().join("envoy-config/bootstrap-ecds.yaml"))
        .unwrap()
        .replace("envoy-config/ecds", &ecds)
        .replace(
            "address: 127.0.0.1, port_value: 1000",
            "address: 0.0.0.0, port_value: 1000",
        );
    let shipped: Value = serde_norway::from_str(&shipped).unwrap();
    assert_eq!(
        bootstrap, &shipped,
        "{name}: the bootstrap is not bootstrap-ecds.yaml with {ecds}"
    );

    // Envoy reads the fetcher's directories at the fetcher's paths, read-only, from the same
    // storage (the same emptyDir, or the same hostPath).
    let mounts = envoy_pod["mounts"].as_array().unwrap();
    for dir in [&ecds, &cache] {
        let m = mounts
            .iter()
            .find(|m| m["mountPath"] == dir.as_str())
            .unwrap_or_else(|| panic!("{name}: Envoy does not mount {dir}"));
        assert_eq!(m["readOnly"], true, "{name}: Envoy mounts {dir} writable");
        let v = envoy_pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        let fetcher_side = docs
            .iter()
            .filter_map(|d| d["spec"]["template"]["spec"]["volumes"].as_array())
            .flatten()
            .find(|w| {
                w["name"] == v["name"] && (w["emptyDir"].is_object() || w["hostPath"].is_object())
            })
            .unwrap();
        assert!(
            v["emptyDir"].is_object() || v["hostPath"]["path"] == fetcher_side["hostPath"]["path"],
            "{name}: Envoy's {dir} is not the fetcher's"
        );
    }

    // The plugins served are exactly those whose ECDS files the bootstrap reads.
    let plugins = config_maps[&served_plugins.unwrap()].as_object().unwrap();
    let mut files: BTreeSet<String> = BTreeSet::new();
    for (key, text) in plugins {
        for p in WasmPlugin::parse_all(text.as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: {key}: {e}"))
        {
            files.insert(format!("{ecds}/{}", render::file_name(&p)));
            if let Some((root, pod)) = &image_volumes {
                check_image_volume(&name, &p, root, pod);
                continue;
            }
            if let Some(secret) = &p.image_pull_secret {
                // Looked up in the plugin's own namespace: DIR/NAMESPACE/NAME.
                let at = format!("{}/{secret}", p.namespace);
                assert!(
                    pull_secret_mounts.contains(&at),
                    "{name}: {key} names pull secret {secret}, not mounted at --pull-secrets/{at}"
                );
            }
        }
    }
    // An image volume is seen only in its own pod: an Envoy in another pod reads copies.
    if image_volumes.is_some() {
        let envoy_mounts_images = envoy_pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["image"].is_object());
        assert_eq!(
            envoy_mounts_images, !copies,
            "{name}: an Envoy beside the image volumes reads them in place, one in its own pod reads the copies --copy-image-volumes makes"
        );
    }
    let text = bootstrap.to_string();
    let referenced: BTreeSet<String> = text
        .match_indices(&format!("{ecds}/"))
        .map(|(i, _)| text[i..].split('"').next().unwrap().to_string())
        .collect();
    assert_eq!(files, referenced, "{name}: plugins and ECDS files differ");
}

/// A plugin served from an image volume: the pod declares the volume the fetcher looks for
/// (its name from the plugin's URL), pinned by digest, with a pull policy Kubernetes knows;
/// every container of the pod that reads modules mounts it read-only at ROOT/NAME; the plugin's pull
/// secret is one of the pod's imagePullSecrets.
fn check_image_volume(file: &str, p: &WasmPlugin, root: &str, pod: &Value) {
    let source = wasm_fetcher::reference::Source::parse(&p.url).unwrap();
    let Some(m) = wasm_fetcher::image_volume::Mount::of(&source, Path::new(root)) else {
        return;
    };
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == m.name.as_str())
        .unwrap_or_else(|| panic!("{file}: no image volume {} for {}", m.name, p.url));
    let reference = volume["image"]["reference"].as_str().unwrap_or_default();
    let wasm_fetcher::reference::Source::Oci(r) = &source else {
        unreachable!()
    };
    let digest = reference
        .strip_prefix(&format!("{}/{}@sha256:", r.registry, r.repository))
        .unwrap_or_else(|| panic!("{file}: {reference} is not {} pinned by digest", p.url));
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{file}: {reference}"
    );
    assert!(
        ["Always", "IfNotPresent", "Never"]
            .contains(&volume["image"]["pullPolicy"].as_str().unwrap_or("")),
        "{file}: {volume}"
    );
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[k].as_array().into_iter().flatten())
        .filter(|c| c["args"].is_array())
        .collect();
    for c in containers {
        assert_eq!(
            mount(c, &m.name),
            Some((m.dir.display().to_string(), true)),
            "{file}: {} mounts {} read-only at {}",
            c["name"],
            m.name,
            m.dir.display()
        );
    }
    if let Some(secret) = &p.image_pull_secret {
        assert!(
            pod["imagePullSecrets"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"] == secret.as_str()),
            "{file}: {secret} is not among the pod's imagePullSecrets"
        );
    }
}
