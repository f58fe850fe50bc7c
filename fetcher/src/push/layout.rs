//! The two images `push` writes, built in memory and byte-for-byte reproducible (no
//! timestamps), so pushing the same module again yields the same manifest digest:
//! - `wasm`: Istio's Wasm artifact. Istio and Envoy Gateway extract the module from an
//!   artifact only when it has exactly two layers, one of them
//!   `application/vnd.module.wasm.content.layer.v1+wasm` (the raw module); the other is the
//!   artifact's config (`application/vnd.module.wasm.config.v1+json`), which is also the
//!   manifest's config. This fetcher takes it by the same rule.
//! - `compat`: a plain OCI image whose one layer is a tar.gz holding `plugin.wasm`, the
//!   layout every image tool and registry takes, and that Istio, Envoy Gateway and this
//!   fetcher unpack.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use oci_client::manifest::{OciDescriptor, OciImageManifest};

use crate::digest::Sha256;
use crate::oci::manifest as media;

/// Which image `push` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Istio's Wasm artifact (2 layers: the artifact config and the raw module).
    #[default]
    Wasm,
    /// A single-layer OCI image whose layer is a tar.gz holding `plugin.wasm`.
    Compat,
    /// Envoy dynamic modules (`lib<name>.so`), one per os/arch: an image index with a manifest
    /// per file (`crate::pull::dynamic_module`).
    DynamicModule,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Wasm => "wasm",
            Layout::Compat => "compat",
            Layout::DynamicModule => "dynamic-module",
        })
    }
}

/// One blob of an image, to upload unless the registry has it.
#[derive(Debug, Clone)]
pub struct Blob {
    pub digest: String,
    /// Shared, not copied: a module read from disk is moved in whole (`Arc::new(vec)`).
    pub bytes: Arc<Vec<u8>>,
    /// The blob is (or carries) the module: its upload is what progress reports.
    pub is_module: bool,
}

/// An image ready to push: its blobs (each digest once) and its manifest.
#[derive(Debug, Clone)]
pub struct Image {
    pub blobs: Vec<Blob>,
    /// Manifests an index names, `(digest, bytes)`, pushed by digest before it.
    pub children: Vec<(String, Vec<u8>)>,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
}

/// The file name Istio, Envoy Gateway and this fetcher look for in a compat image's layer.
pub const PLUGIN_WASM: &str = "plugin.wasm";

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256::of(bytes).hex())
}

fn descriptor(media_type: &str, bytes: &[u8], title: Option<&str>) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.to_string(),
        digest: digest_of(bytes),
        size: bytes.len() as i64,
        annotations: title.map(|t| {
            BTreeMap::from([("org.opencontainers.image.title".to_string(), t.to_string())])
        }),
        ..Default::default()
    }
}

/// The image for `module` in `layout`; `abi_versions` (the module's `proxy_abi_version_*`
/// exports) go into the Wasm artifact's config.
pub fn build(layout: Layout, module: &[u8], abi_versions: &[String]) -> Result<Image, String> {
    let (config_type, config, layers, module_blob) = match layout {
        Layout::Wasm => {
            let config = serde_json::to_vec(&serde_json::json!({
                "type": "envoy_proxy",
                "abiVersions": abi_versions,
            }))
            .map_err(|e| e.to_string())?;
            let layers = vec![
                descriptor(media::ISTIO_WASM_CONFIG, &config, None),
                descriptor(media::ISTIO_WASM_LAYER, module, Some(PLUGIN_WASM)),
            ];
            (media::ISTIO_WASM_CONFIG, config, layers, module.to_vec())
        }
        Layout::Compat => {
            let tar = tar_with_plugin(module).map_err(|e| format!("packing {PLUGIN_WASM}: {e}"))?;
            let layer = gzip(&tar).map_err(|e| format!("compressing the layer: {e}"))?;
            let config = serde_json::to_vec(&serde_json::json!({
                "architecture": "wasm",
                "os": "wasip1",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [digest_of(&tar)]},
            }))
            .map_err(|e| e.to_string())?;
            let layers = vec![descriptor(media::OCI_TAR_GZIP_LAYER, &layer, None)];
            (media::OCI_IMAGE_CONFIG, config, layers, layer)
        }
        Layout::DynamicModule => {
            return Err("a dynamic module's image is built by push::dynamic_module::build".into())
        }
    };
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(media::OCI_MANIFEST.to_string()),
        config: descriptor(config_type, &config, None),
        layers,
        subject: None,
        artifact_type: None,
        annotations: None,
    };
    let manifest = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
    let mut blobs = vec![Blob {
        digest: digest_of(&config),
        bytes: config.into(),
        is_module: false,
    }];
    let module_digest = digest_of(&module_blob);
    if !blobs.iter().any(|b| b.digest == module_digest) {
        blobs.push(Blob {
            digest: module_digest,
            bytes: module_blob.into(),
            is_module: true,
        });
    }
    Ok(Image {
        blobs,
        children: Vec::new(),
        manifest_digest: digest_of(&manifest),
        manifest,
    })
}

/// A tar holding `plugin.wasm` (mode 0644, owned by root, time 0).
fn tar_with_plugin(module: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(module.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, PLUGIN_WASM, module)?;
    builder.into_inner()
}

fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    // The gzip header's time stays 0: the same module always makes the same layer.
    let mut encoder = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(image: &Image) -> serde_json::Value {
        serde_json::from_slice(&image.manifest).unwrap()
    }

    #[test]
    fn the_wasm_layout_is_istios_two_layer_artifact() {
        let module = b"\0asm\x01\0\0\0".to_vec();
        let image = build(Layout::Wasm, &module, &["proxy_abi_version_0_2_1".into()]).unwrap();
        let m = manifest(&image);
        assert_eq!(m["mediaType"], media::OCI_MANIFEST);
        assert_eq!(m["config"]["mediaType"], media::ISTIO_WASM_CONFIG);
        let layers = m["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 2, "Istio and Envoy Gateway need exactly 2");
        assert_eq!(layers[1]["mediaType"], media::ISTIO_WASM_LAYER);
        assert_eq!(layers[1]["digest"], digest_of(&module));
        assert_eq!(layers[0]["digest"], m["config"]["digest"]);
        assert_eq!(image.blobs.len(), 2, "the config blob is uploaded once");
        assert_eq!(&*image.blobs[1].bytes, module.as_slice());
        assert_eq!(image.manifest_digest, digest_of(&image.manifest));
    }

    #[test]
    fn the_compat_layout_holds_plugin_wasm_and_is_reproducible() {
        let module = b"\0asm\x01\0\0\0compat".to_vec();
        let image = build(Layout::Compat, &module, &[]).unwrap();
        let again = build(Layout::Compat, &module, &[]).unwrap();
        assert_eq!(image.manifest_digest, again.manifest_digest);
        let m = manifest(&image);
        let layers = m["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0]["mediaType"], media::OCI_TAR_GZIP_LAYER);
        let layer = &image.blobs[1].bytes;
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&layer[..]));
        let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(entry.path().unwrap().to_str(), Some(PLUGIN_WASM));
        let mut inside = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut inside).unwrap();
        assert_eq!(inside, module);
    }
}
