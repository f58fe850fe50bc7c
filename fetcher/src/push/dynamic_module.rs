//! The image index `push --layout dynamic-module` writes, byte-for-byte reproducible: one
//! child manifest per shared object, each under the platform its ELF header names, in
//! platform order (so the order of the files on the command line does not change the digest).

use std::collections::BTreeMap;
use std::sync::Arc;

use oci_client::manifest::{OciDescriptor, OciImageManifest};

use super::layout::{Blob, Image};
use crate::digest::Sha256;
use crate::oci::manifest as media;
use crate::store::shared_object::{self as elf, module_name, CONFIG, ENVOY_VERSIONS, LAYER, TITLE};

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// At most this many shared objects in one index: one per platform, and there are two
/// [`elf::platform`] knows.
pub const MAX_MODULES: usize = 8;

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256::of(bytes).hex())
}

/// The most bytes one push reads across its files, `max_size` being the most one file may
/// have: a file per platform [`elf::platform`] knows.
pub fn total_bound(max_size: u64) -> u64 {
    max_size.saturating_mul(2)
}

/// One shared object, checked by [`check`]. Its bytes become the layer's blob as they are.
pub struct Module<'a> {
    pub bytes: Arc<Vec<u8>>,
    pub file_name: &'a str,
    pub platform: &'static str,
}

/// The platform of one file: named `lib<name>.so`, an ELF shared object for a known
/// platform, and that platform the one `declared` (when the command line says one).
pub fn check(
    bytes: &[u8],
    file_name: &str,
    declared: Option<&str>,
) -> Result<&'static str, String> {
    module_name(file_name)?;
    let platform = elf::platform(bytes)?;
    match declared {
        Some(d) if d != platform => Err(format!(
            "given as {d}, but its ELF header says {platform}: build it for {d} (e.g. \
             cargo build --target {}), or name it {platform}=PATH",
            elf::rust_target(d).unwrap_or("<the target for that platform>")
        )),
        _ => Ok(platform),
    }
}

/// Why a set of checked modules cannot share one index: two for one platform, or
/// different file names (Envoy's configuration names one module, whatever the platform).
/// The error gives the index of the module at fault.
pub fn conflict(modules: &[Module]) -> Result<(), (usize, String)> {
    for (i, m) in modules.iter().enumerate() {
        let first = &modules[..i];
        if let Some(j) = first.iter().position(|o| o.platform == m.platform) {
            return Err((
                i,
                format!(
                    "a second module for {} (module {} is for it too): one file per platform",
                    m.platform,
                    j + 1
                ),
            ));
        }
        if let Some(o) = first.iter().find(|o| o.file_name != m.file_name) {
            return Err((
                i,
                format!(
                    "named {}, but {} before it: every platform's file has the one name Envoy's \
                     configuration searches for",
                    m.file_name, o.file_name
                ),
            ));
        }
    }
    Ok(())
}

/// The index for the shared objects, each a child for its platform, all annotated with the
/// Envoy versions they load on. Each child manifest is in `Image::children`.
pub fn build(modules: &[Module], envoy_versions: &[String]) -> Result<Image, String> {
    if envoy_versions.is_empty() {
        return Err("name the Envoy versions it loads on (--envoy-versions 1.40)".into());
    }
    if modules.is_empty() || modules.len() > MAX_MODULES {
        return Err(format!(
            "{} modules: push 1 to {MAX_MODULES}, one per platform",
            modules.len()
        ));
    }
    conflict(modules).map_err(|(_, reason)| reason)?;
    let mut sorted: Vec<&Module> = modules.iter().collect();
    sorted.sort_by_key(|m| m.platform);
    let versions = envoy_versions.join(",");
    let annotations = BTreeMap::from([(ENVOY_VERSIONS.to_string(), versions.clone())]);
    let mut blobs = Vec::new();
    let mut children = Vec::new();
    let mut entries = Vec::new();
    for m in sorted {
        let (os, arch) = m.platform.split_once('/').unwrap_or((m.platform, ""));
        let config = serde_json::to_vec(&serde_json::json!({
            "os": os, "architecture": arch, "envoyVersions": envoy_versions,
        }))
        .map_err(|e| e.to_string())?;
        let layer = OciDescriptor {
            media_type: LAYER.into(),
            digest: digest_of(&m.bytes),
            size: m.bytes.len() as i64,
            annotations: Some(BTreeMap::from([(
                TITLE.to_string(),
                m.file_name.to_string(),
            )])),
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
        entries.push(serde_json::json!({
            "mediaType": media::OCI_MANIFEST,
            "digest": digest_of(&manifest),
            "size": manifest.len(),
            "platform": {"os": os, "architecture": arch},
            "annotations": annotations,
        }));
        blobs.push(Blob {
            digest: digest_of(&config),
            bytes: config.into(),
            is_module: false,
        });
        blobs.push(Blob {
            digest: digest_of(&m.bytes),
            bytes: Arc::clone(&m.bytes),
            is_module: true,
        });
        children.push((digest_of(&manifest), manifest));
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": entries,
        "annotations": {ENVOY_VERSIONS: versions},
    }))
    .map_err(|e| e.to_string())?;
    Ok(Image {
        blobs,
        children,
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

    fn module<'a>(bytes: &[u8], file_name: &'a str) -> Module<'a> {
        let platform = check(bytes, file_name, None).unwrap();
        Module {
            bytes: Arc::new(bytes.to_vec()),
            file_name,
            platform,
        }
    }

    #[test]
    fn the_index_has_a_child_per_platform_from_the_elf_headers_and_the_envoy_versions() {
        let versions = vec!["1.40".to_string(), "1.41".to_string()];
        let (arm, x86) = (so(183), so(62));
        let both = [
            module(&arm, "libwasm_filter.so"),
            module(&x86, "libwasm_filter.so"),
        ];
        let image = build(&both, &versions).unwrap();
        let index: serde_json::Value = serde_json::from_slice(&image.manifest).unwrap();
        let children = index["manifests"].as_array().unwrap();
        assert_eq!(children.len(), 2);
        assert_eq!(children[0]["platform"]["architecture"], "amd64");
        assert_eq!(children[1]["platform"]["architecture"], "arm64");
        for (child, (digest, _)) in children.iter().zip(&image.children) {
            assert_eq!(child["annotations"][ENVOY_VERSIONS], "1.40,1.41");
            assert_eq!(child["digest"], digest.as_str());
        }
        assert_eq!(image.blobs.len(), 4);
        // Each layer's blob is its module's bytes, not a copy of them.
        for m in &both {
            assert!(image.blobs.iter().any(|b| Arc::ptr_eq(&b.bytes, &m.bytes)));
        }
        // The order of the files does not change the index.
        let swapped = [
            module(&x86, "libwasm_filter.so"),
            module(&arm, "libwasm_filter.so"),
        ];
        let again = build(&swapped, &versions).unwrap();
        assert_eq!(image.manifest_digest, again.manifest_digest);
        let one = build(&both[..1], &versions).unwrap();
        assert_ne!(one.manifest_digest, image.manifest_digest);
        assert!(build(&both, &[]).is_err());
    }

    #[test]
    fn a_file_is_refused_by_its_name_its_header_or_the_platform_it_was_given_as() {
        let e = check(b"\0asm\x01\0\0\0", "libwasm_filter.so", None).unwrap_err();
        assert!(e.contains("shorter"), "{e}");
        let e = check(&so(62), "wasm_filter.so", None).unwrap_err();
        assert!(e.contains("lib<name>.so"), "{e}");
        assert_eq!(
            check(&so(183), "libx.so", Some("linux/arm64")),
            Ok("linux/arm64")
        );
        let e = check(&so(62), "libx.so", Some("linux/arm64")).unwrap_err();
        assert!(
            e.starts_with("given as linux/arm64, but its ELF header says linux/amd64"),
            "{e}"
        );
        assert!(e.contains("aarch64-unknown-linux-gnu"), "{e}");
        let x86 = so(62);
        let twice = [module(&x86, "libx.so"), module(&x86, "libx.so")];
        let (at, e) = conflict(&twice).unwrap_err();
        assert_eq!(at, 1);
        assert!(e.contains("a second module for linux/amd64"), "{e}");
        let arm = so(183);
        let renamed = [module(&x86, "libx.so"), module(&arm, "liby.so")];
        let (at, e) = conflict(&renamed).unwrap_err();
        assert_eq!(at, 1);
        assert!(e.contains("named liby.so, but libx.so"), "{e}");
    }
}
