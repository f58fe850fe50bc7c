//! The image index `push --layout dynamic-module` writes, byte-for-byte reproducible.

use std::collections::BTreeMap;

use oci_client::manifest::{OciDescriptor, OciImageManifest};

use super::layout::{Blob, Image};
use crate::oci::manifest as media;
use crate::shared_object::{self as elf, module_name, CONFIG, ENVOY_VERSIONS, LAYER, TITLE};
use crate::verify::Sha256;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256::of(bytes).hex())
}

/// The index for one shared object: its platform from the ELF header, its Envoy versions
/// in the annotations. The child manifest is the second element of `Image::children`' list.
pub fn build(module: &[u8], file_name: &str, envoy_versions: &[String]) -> Result<Image, String> {
    module_name(file_name)?;
    let platform = elf::platform(module)?;
    if envoy_versions.is_empty() {
        return Err("name the Envoy versions it loads on (--envoy-versions 1.40)".into());
    }
    let versions = envoy_versions.join(",");
    let (os, arch) = platform.split_once('/').unwrap_or((platform, ""));
    let config = serde_json::to_vec(&serde_json::json!({
        "os": os, "architecture": arch, "envoyVersions": envoy_versions,
    }))
    .map_err(|e| e.to_string())?;
    let annotations = BTreeMap::from([(ENVOY_VERSIONS.to_string(), versions.clone())]);
    let layer = OciDescriptor {
        media_type: LAYER.into(),
        digest: digest_of(module),
        size: module.len() as i64,
        annotations: Some(BTreeMap::from([(TITLE.to_string(), file_name.to_string())])),
        ..Default::default()
    };
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(media::OCI_MANIFEST.to_string()),
        config: OciDescriptor {
            media_type: CONFIG.into(),
            digest: digest_of(&config),
            size: config.len() as i64,
            ..Default::default()
        },
        layers: vec![layer],
        subject: None,
        artifact_type: None,
        annotations: Some(annotations.clone()),
    };
    let manifest = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{
            "mediaType": media::OCI_MANIFEST,
            "digest": digest_of(&manifest),
            "size": manifest.len(),
            "platform": {"os": os, "architecture": arch},
            "annotations": annotations,
        }],
        "annotations": {ENVOY_VERSIONS: versions},
    }))
    .map_err(|e| e.to_string())?;
    Ok(Image {
        blobs: vec![
            Blob {
                digest: digest_of(&config),
                bytes: config.into(),
                is_module: false,
            },
            Blob {
                digest: digest_of(module),
                bytes: module.to_vec().into(),
                is_module: true,
            },
        ],
        children: vec![(digest_of(&manifest), manifest)],
        manifest_digest: digest_of(&index),
        manifest: index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn so(machine: u16) -> Vec<u8> {
        let mut h = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0".to_vec();
        h.extend(3u16.to_le_bytes());
        h.extend(machine.to_le_bytes());
        h.extend([0; 44]);
        h
    }

    #[test]
    fn the_index_names_the_platform_from_the_elf_header_and_the_envoy_versions() {
        let versions = vec!["1.40".to_string(), "1.41".to_string()];
        let image = build(&so(183), "libwasm_filter.so", &versions).unwrap();
        let index: serde_json::Value = serde_json::from_slice(&image.manifest).unwrap();
        let child = &index["manifests"][0];
        assert_eq!(child["platform"]["architecture"], "arm64");
        assert_eq!(child["annotations"][ENVOY_VERSIONS], "1.40,1.41");
        assert_eq!(child["digest"], image.children[0].0.as_str());
        let again = build(&so(183), "libwasm_filter.so", &versions).unwrap();
        assert_eq!(image.manifest_digest, again.manifest_digest);
        let e = build(b"\0asm\x01\0\0\0", "libwasm_filter.so", &versions).unwrap_err();
        assert!(e.contains("shorter"), "{e}");
        let e = build(&so(62), "wasm_filter.so", &versions).unwrap_err();
        assert!(e.contains("lib<name>.so"), "{e}");
        assert!(build(&so(62), "libx.so", &[]).is_err());
    }
}
