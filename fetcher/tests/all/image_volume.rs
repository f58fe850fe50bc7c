//! Modules as image volumes, as the kubelet delivers them: `push --layout compat` to a loopback
//! `docker-registry`, `render --image-volumes` plans the pod (checked field by field against
//! the Kubernetes API's types), containerd pulls the pinned reference and mounts it where the
//! pod mounts it (what the kubelet asks of CRI), then `serve --image-volume-root` names the
//! mounted module and real Envoy runs it. A pin the mounted module does not match gets the plugin's fallback.

use std::path::Path;

use serde::Deserialize;

use crate::containerd::{kubelet_mounts, Containerd};
use crate::oci_registry::Registry;
use crate::push::{filter_wasm, push_json};
use crate::real_envoy::Envoy;
use crate::serve_support::{dirs, ecds_bootstrap, header_role, wasm_plugin, write_plugin};
use crate::support::*;

// The Kubernetes API's fields the patch may carry (core/v1, apps/v1), and nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Patch {
    spec: WorkloadSpec,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadSpec {
    template: PodTemplateSpec,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PodTemplateSpec {
    spec: PodSpec,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PodSpec {
    volumes: Vec<Volume>,
    init_containers: Vec<Container>,
    containers: Vec<Container>,
    #[serde(default)]
    image_pull_secrets: Vec<LocalObjectReference>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LocalObjectReference {
    name: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Volume {
    name: String,
    image: ImageVolumeSource,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImageVolumeSource {
    reference: String,
    pull_policy: PullPolicy,
}
#[derive(Deserialize, Debug, PartialEq)]
enum PullPolicy {
    Always,
    Never,
    IfNotPresent,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Container {
    name: String,
    volume_mounts: Vec<VolumeMount>,
}
#[derive(Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct VolumeMount {
    name: String,
    mount_path: String,
    read_only: bool,
}

/// The module path the ECDS file at `path` names.
pub fn ecds_module(path: &Path) -> String {
    let doc: serde_json::Value = serde_norway::from_slice(&std::fs::read(path).unwrap()).unwrap();
    doc.pointer("/resources/0/typed_config/config/vm_config/code/local/filename")
        .and_then(|f| f.as_str())
        .unwrap_or_else(|| panic!("no module in {doc}"))
        .to_string()
}

#[test]
fn a_compat_image_mounted_as_the_kubelet_would_is_served_to_real_envoy_uncached() {
    let reg = Registry::start(false);
    let d = dirs();
    let module = std::fs::read(filter_wasm()).unwrap();
    let url = format!("oci://{}/filters/wasm-filter:v1", reg.host);
    let pushed = push_json(
        d.tmp.path(),
        &[filter_wasm().to_str().unwrap(), &url, "--layout", "compat"],
    );
    let digest = pushed["manifest_digest"].as_str().unwrap().to_string();

    let pinned = format!("  sha256: {}\n", sha256_hex(&module));
    let good = wasm_plugin(
        "mounted",
        &url,
        &format!(
            "{}  imagePullPolicy: Always\n  imagePullSecret: regcred\n{pinned}",
            header_role("image-volume")
        ),
    );
    let wrong = wasm_plugin(
        "wrong-pin",
        &url,
        &format!(
            "  failStrategy: FAIL_CLOSE\n  sha256: {}\n",
            sha256_hex(b"other")
        ),
    );
    write_plugin(&d.plugins.join("mounted.yaml"), &good);
    write_plugin(&d.plugins.join("wrong.yaml"), &wrong);

    // The plan: the pod's volumes, mounts and pull secrets, and the ECDS files.
    let root = d.tmp.path().join("image-volumes");
    let (rendered, patch) = (
        d.tmp.path().join("rendered"),
        d.tmp.path().join("patch.yaml"),
    );
    let o = fetcher()
        .arg("render")
        .arg(d.plugins.join("mounted.yaml"))
        .arg("-o")
        .arg(&rendered)
        .arg("--image-volume-root")
        .arg(&root)
        .arg("--image-volumes")
        .arg(&patch)
        .arg("--cache-dir")
        .arg(d.tmp.path().join("render-cache"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&patch).unwrap();
    let pod: Patch = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let pod = pod.spec.template.spec;
    assert_eq!(pod.volumes.len(), 1, "{text}");
    let volume = &pod.volumes[0];
    assert_eq!(
        volume.image.reference,
        format!("{}/filters/wasm-filter@{digest}", reg.host)
    );
    assert_eq!(volume.image.pull_policy, PullPolicy::Always);
    let mount_path = root.join(&volume.name);
    let mounts = vec![VolumeMount {
        name: volume.name.clone(),
        mount_path: mount_path.display().to_string(),
        read_only: true,
    }];
    let containers: Vec<(&str, &Vec<VolumeMount>)> = pod
        .init_containers
        .iter()
        .chain(&pod.containers)
        .map(|c| (c.name.as_str(), &c.volume_mounts))
        .collect();
    assert_eq!(containers, [("wasm-fetcher", &mounts), ("envoy", &mounts)]);
    assert_eq!(
        pod.init_containers.len(),
        1,
        "the fetcher is a native sidecar: {text}"
    );
    let secrets: Vec<&str> = pod
        .image_pull_secrets
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["regcred"]);
    let module_path = mount_path.join("plugin.wasm");
    assert_eq!(
        ecds_module(&rendered.join("test.mounted.yaml")),
        module_path.display().to_string()
    );

    // The kubelet: containerd pulls the reference the pod pins and mounts it read-only.
    let containerd = Containerd::start();
    kubelet_mounts(&containerd, &volume.image.reference, &mount_path);
    assert_eq!(std::fs::read(&module_path).unwrap(), module);
    let write = std::fs::write(mount_path.join("other.wasm"), b"x");
    assert!(write.is_err(), "the image volume is writable");

    // The node: serve reads the mount in place; Envoy runs the module from it.
    let serve = d.serve_ready(&[], &["--image-volume-root", root.to_str().unwrap()]);
    let served = d.ecds.join("test.mounted.yaml");
    assert_eq!(ecds_module(&served), module_path.display().to_string());
    let refused = std::fs::read_to_string(d.ecds.join("test.wrong-pin.yaml")).unwrap();
    assert!(refused.contains("rbac.v3.RBAC"), "{refused}");
    assert!(serve.log().contains("checksum mismatch"), "{}", serve.log());
    let cached: Vec<_> = files_under(&d.cache)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    assert!(
        cached.is_empty(),
        "a mounted module was copied into the cache: {cached:?}"
    );

    let boot = ecds_bootstrap(d.tmp.path(), &d.ecds, &[&good], "127.0.0.1:1");
    let envoy = Envoy::start(&boot);
    let (status, response) = envoy
        .eventually("main", |r| {
            r.as_ref().is_ok_and(|(_, t)| t.contains("x-served-by"))
        })
        .unwrap();
    assert_eq!(status, 503, "no upstream listens: {response}");
    assert!(
        response.contains("x-served-by: image-volume"),
        "{response}\n{}",
        envoy.log()
    );

    // Nothing a purge does reaches the mount.
    let o = fetcher()
        .env("WASM_MODULE_EXPIRY", "1ms")
        .args(["purge", "--cache-dir"])
        .arg(&d.cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(&module_path).unwrap(), module);
    assert!(serve.stop().success());
}
