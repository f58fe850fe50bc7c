//! The pod's side of image-volume delivery (`render --image-volumes`): for each `oci://`
//! WasmPlugin, an image volume (KEP-4639) whose reference is pinned by the digest the tag
//! resolved to, pulled by the plugin's `imagePullPolicy`, with the plugin's
//! `imagePullSecret` among the pod's `imagePullSecrets`, and mounted read-only at the path
//! [`crate::image_volume::Mount`] gives, in every container that reads modules (the fetcher
//! checks them, Envoy loads them). A module change is a new digest, so a new pod template:
//! the kubelet pulls it through the node's runtime, credentials and mirrors.
//!
//! The output is a strategic-merge patch of a workload's pod template (`kubectl patch
//! --type strategic`, or a kustomize `patches:` entry): it merges volumes, mounts and pull
//! secrets by name into a DaemonSet or Deployment as written.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;

use super::wasmplugin::WasmPlugin;
use crate::image_volume::Mount;
use crate::reference::Source;
use crate::{FetchError, PullPolicy, Pulled};

/// One image volume, as the pod spec declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Volume {
    pub name: String,
    pub image: ImageSource,
}

/// `volumes[].image` (core/v1 `ImageVolumeSource`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSource {
    /// `registry/repository@sha256:…`, the digest the tag resolved to.
    pub reference: String,
    pub pull_policy: PullPolicy,
}

/// `volumeMounts[]` (core/v1 `VolumeMount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub read_only: bool,
}

/// The image volume for `plugin`, whose module `pulled` is (pulled from the registry, so its
/// manifest digest is known), and the pull with its path moved into the mount: what the ECDS
/// file names. `None` for a plugin whose module is not `oci://`.
pub fn volume(
    plugin: &WasmPlugin,
    pulled: &Pulled,
    root: &Path,
    pull_policy: Option<PullPolicy>,
) -> Result<Option<(Volume, Mount, Pulled)>, FetchError> {
    let source = Source::parse(&plugin.url)?;
    let (Source::Oci(r), Some(mount)) = (&source, Mount::of(&source, root)) else {
        return Ok(None);
    };
    let digest = pulled.manifest_digest.ok_or_else(|| FetchError::Registry {
        message: format!(
            "{}: the pull did not report the image's manifest digest",
            plugin.url
        ),
    })?;
    let volume = Volume {
        name: mount.name.clone(),
        image: ImageSource {
            reference: format!("{}/{}@{digest}", r.registry, r.repository),
            pull_policy: pull_policy
                .or(plugin.image_pull_policy)
                .unwrap_or(PullPolicy::IfNotPresent),
        },
    };
    let mut in_mount = pulled.clone();
    in_mount.path = mount.module();
    in_mount.from_cache = true;
    Ok(Some((volume, mount, in_mount)))
}

/// The strategic-merge patch that adds `volumes` to a pod template, mounted read-only under
/// `root` in each of `containers` (`init:NAME` names an init container, such as a native
/// sidecar), with the pull secrets the plugins name. A volume two plugins share is declared
/// once.
pub fn pod_patch(
    plugins: &[WasmPlugin],
    volumes: &[Volume],
    root: &Path,
    containers: &[String],
) -> serde_json::Value {
    let mut seen = BTreeSet::new();
    let volumes: Vec<&Volume> = volumes
        .iter()
        .filter(|v| seen.insert(v.name.clone()))
        .collect();
    let mounts: Vec<VolumeMount> = volumes
        .iter()
        .map(|v| VolumeMount {
            name: v.name.clone(),
            mount_path: root.join(&v.name).display().to_string(),
            read_only: true,
        })
        .collect();
    let secrets: BTreeSet<&str> = plugins
        .iter()
        .filter(|p| {
            volumes
                .iter()
                .any(|v| Some(v.name.as_str()) == mount_name(p, root).as_deref())
        })
        .filter_map(|p| p.image_pull_secret.as_deref())
        .collect();
    let mounted = |init: bool| -> Vec<serde_json::Value> {
        containers
            .iter()
            .filter_map(|c| match c.strip_prefix("init:") {
                Some(name) if init => Some(name),
                None if !init => Some(c.as_str()),
                _ => None,
            })
            .map(|name| serde_json::json!({"name": name, "volumeMounts": mounts}))
            .collect()
    };
    let mut spec = serde_json::json!({"volumes": volumes});
    for (key, init) in [("initContainers", true), ("containers", false)] {
        let list = mounted(init);
        if !list.is_empty() {
            spec[key] = list.into();
        }
    }
    if !secrets.is_empty() {
        spec["imagePullSecrets"] = secrets
            .iter()
            .map(|s| serde_json::json!({"name": s}))
            .collect();
    }
    serde_json::json!({"spec": {"template": {"spec": spec}}})
}

fn mount_name(p: &WasmPlugin, root: &Path) -> Option<String> {
    let source = Source::parse(&p.url).ok()?;
    Mount::of(&source, root).map(|m| m.name)
}
