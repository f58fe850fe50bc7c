//! The OCI image vocabulary, media types first (as oci-client keeps them at the head of its
//! `manifest.rs`): what a manifest, an index and a Wasm layer are called, and how the
//! manifest or index a registry answered is read.

use oci_client::manifest::OciImageManifest;
use serde_json::Value;

use crate::digest::Digest;
use crate::error::FetchError;

pub const WASM_LAYERS: &[&str] = &[
    "application/wasm",
    "application/vnd.wasm.content.layer.v1+wasm",
    "application/vnd.module.wasm.content.layer.v1+wasm",
];
pub const ISTIO_WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
/// The config of Istio's Wasm artifact, also its second layer (`crate::push`).
pub const ISTIO_WASM_CONFIG: &str = "application/vnd.module.wasm.config.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_TAR_GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const TAR_GZIP_LAYERS: &[&str] = &[
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
];
pub const INDEXES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
pub const MANIFESTS: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// The `Accept` header of a manifest request: any manifest or index.
pub fn accept_manifests() -> String {
    MANIFESTS
        .iter()
        .chain(INDEXES)
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `Accept` header of a request for an image manifest only (no index): what a signature
/// or an existing image is read as.
pub fn accept_image_manifests() -> String {
    MANIFESTS.join(", ")
}

/// What an image resolved to before any layer is downloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageDigests {
    pub manifest: Digest,
    /// Present when the reference named an image index and a child was picked from it.
    pub index: Option<Digest>,
}

pub(super) fn parse_json(bytes: &[u8]) -> Result<Value, FetchError> {
    serde_json::from_slice(bytes).map_err(|e| FetchError::Registry {
        message: format!("manifest is not JSON: {e}"),
    })
}

/// An image manifest, from bytes already bounded by the manifest size limit.
pub fn parse_manifest(bytes: &[u8]) -> Result<OciImageManifest, FetchError> {
    serde_json::from_slice(bytes).map_err(|e| FetchError::Registry {
        message: format!("cannot parse image manifest: {e}"),
    })
}

/// Picks an index child: the one the pin names, else `--platform`, else a Wasm platform
/// (`wasip1/wasm`, `wasi/wasm`), else `linux/amd64`, else one without a platform.
pub fn pick_child(
    index: &Value,
    platform: Option<&str>,
    pin: Option<&str>,
) -> Result<String, FetchError> {
    let children: Vec<(String, Option<String>)> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let digest = m.get("digest")?.as_str()?.to_string();
            let plat = m.get("platform").map(|p| {
                format!(
                    "{}/{}",
                    p.get("os").and_then(Value::as_str).unwrap_or_default(),
                    p.get("architecture")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                )
            });
            Some((digest, plat))
        })
        .collect();
    if let Some(pin) = pin {
        if let Some((d, _)) = children.iter().find(|(d, _)| d == pin) {
            return Ok(d.clone());
        }
    }
    let wanted: Vec<Option<&str>> = match platform {
        Some(p) => vec![Some(p)],
        None => vec![
            Some("wasip1/wasm"),
            Some("wasi/wasm"),
            Some("linux/amd64"),
            None,
        ],
    };
    for w in wanted {
        if let Some((d, _)) = children.iter().find(|(_, p)| p.as_deref() == w) {
            return Ok(d.clone());
        }
    }
    Err(FetchError::NotFound {
        what: format!(
            "no image for platform {} in the index (it has: {})",
            crate::shown::shown(platform.unwrap_or("wasip1/wasm, wasi/wasm or linux/amd64")),
            crate::shown::listed(
                children
                    .iter()
                    .map(|(_, p)| p.clone().unwrap_or_else(|| "none".into()))
            )
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Value {
        serde_json::json!({"manifests": [
            {"digest": "sha256:aa", "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": "sha256:bb", "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": "sha256:cc", "platform": {"os": "wasip1", "architecture": "wasm"}},
        ]})
    }

    #[test]
    fn an_index_of_thousands_of_hostile_platforms_gives_one_short_line() {
        let children: Vec<Value> = (0..5000)
            .map(|i| serde_json::json!({"digest": "sha256:aa", "platform": {"os": "linux", "architecture": format!("\u{1b}[31m{i}\n{}", "z".repeat(50))}}))
            .collect();
        let index = serde_json::json!({"manifests": children});
        let e = pick_child(&index, Some("windows/\u{1b}[2J"), None)
            .unwrap_err()
            .to_string();
        assert!(e.len() < 1000, "{}", e.len());
        assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn index_children_by_pin_platform_and_preference() {
        assert_eq!(pick_child(&index(), None, None).unwrap(), "sha256:cc");
        assert_eq!(
            pick_child(&index(), Some("linux/arm64"), None).unwrap(),
            "sha256:aa"
        );
        assert_eq!(
            pick_child(&index(), None, Some("sha256:bb")).unwrap(),
            "sha256:bb"
        );
        let e = pick_child(&index(), Some("windows/amd64"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not found") && e.contains("windows/amd64"),
            "{e}"
        );
        let no_wasm = serde_json::json!({"manifests": [{"digest": "sha256:dd"}]});
        assert_eq!(pick_child(&no_wasm, None, None).unwrap(), "sha256:dd");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn descriptor() -> impl Strategy<Value = Value> {
            (
                "[a-z0-9:./]{0,80}",
                prop::option::of(("[a-z0-9]{0,8}", "[a-z0-9]{0,8}")),
                any::<i64>(),
            )
                .prop_map(|(digest, platform, size)| {
                    let mut d = serde_json::json!({"digest": digest, "size": size,
                        "mediaType": "application/vnd.oci.image.manifest.v1+json"});
                    if let Some((os, arch)) = platform {
                        d["platform"] = serde_json::json!({"os": os, "architecture": arch});
                    }
                    d
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn arbitrary_bytes_never_panic_the_manifest_parser(
                bytes in prop::collection::vec(any::<u8>(), 0..600),
            ) {
                let _ = parse_manifest(&bytes);
                if let Ok(doc) = serde_json::from_slice::<Value>(&bytes) {
                    let _ = pick_child(&doc, None, None);
                }
            }

            #[test]
            fn an_index_yields_one_of_its_children_or_a_named_error(
                children in prop::collection::vec(descriptor(), 0..12),
                platform in prop::option::of("[a-z0-9]{1,6}/[a-z0-9]{1,6}"),
            ) {
                let index = serde_json::json!({"schemaVersion": 2, "manifests": children});
                match pick_child(&index, platform.as_deref(), None) {
                    Ok(d) => prop_assert!(children.iter().any(|c| c["digest"] == d.as_str())),
                    Err(e) => {
                        let not_found = matches!(e, FetchError::NotFound { .. });
                        prop_assert!(not_found, "{}", e);
                    }
                }
                let bytes = serde_json::to_vec(&serde_json::json!({
                    "schemaVersion": 2, "config": children.first(), "layers": children,
                })).unwrap();
                // A layer's digest and size are checked when it is downloaded, not trusted here.
                if let Ok(m) = parse_manifest(&bytes) {
                    for l in &m.layers {
                        let checked = crate::digest::parse_digest(&l.digest);
                        prop_assert_eq!(checked.is_ok(), l.digest.len() == 71
                            && l.digest.starts_with("sha256:")
                            && l.digest[7..].bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
                    }
                }
            }
        }
    }
}
