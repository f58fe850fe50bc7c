//! `push --sign-key`: the signature manifest, written as cosign writes it.

use serde_json::Value;

use crate::digest::Digest;
use crate::error::FetchError;
use crate::keys::SignKey;
use crate::oci::cosign::{
    payload, signature_tag, LAYERS_LIMIT, SIGNATURE_ANNOTATION, SIMPLE_SIGNING,
};
use crate::oci::distribution::Distribution;

/// Writes `key`'s signature of `digest` (the image just pushed to `d`'s repository) under the
/// cosign tag, keeping the signatures already there. Signing is deterministic, so a signature
/// the manifest already holds is not added twice.
pub async fn sign(
    d: &Distribution,
    digest: &Digest,
    key: &SignKey,
) -> Result<(), super::PushError> {
    use super::layout::Blob;
    use super::upload;
    let tag = signature_tag(digest);
    let reference = format!("{}/{}", d.registry(), d.repository());
    let payload = payload(&reference, digest);
    let payload_digest = Digest(crate::digest::Sha256::of(&payload));
    let signature = key.sign(&payload);
    let ours = serde_json::json!({
        "mediaType": SIMPLE_SIGNING,
        "size": payload.len(),
        "digest": payload_digest.to_string(),
        "annotations": {SIGNATURE_ANNOTATION: signature},
    });
    let mut layers = existing_layers(d, &tag).await?;
    let already = layers.iter().any(|l| {
        l.get("digest") == ours.get("digest")
            && l.pointer("/annotations")
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                == Some(&Value::String(signature.clone()))
    });
    if already {
        return Ok(());
    }
    layers.push(ours);
    let diff_ids: Vec<&Value> = layers.iter().filter_map(|l| l.get("digest")).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "", "os": "", "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap_or_default();
    let config_digest = Digest(crate::digest::Sha256::of(&config));
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": crate::oci::manifest::OCI_MANIFEST,
        "config": {
            "mediaType": crate::oci::manifest::OCI_IMAGE_CONFIG,
            "size": config.len(),
            "digest": config_digest.to_string(),
        },
        "layers": layers,
    }))
    .unwrap_or_default();
    let manifest_digest = Digest(crate::digest::Sha256::of(&manifest)).to_string();
    for (bytes, digest) in [(payload, payload_digest), (config, config_digest)] {
        let blob = Blob {
            digest: digest.to_string(),
            bytes: bytes.into(),
            is_module: false,
        };
        if !upload::has_blob(d, &blob.digest).await? {
            upload::put_blob(d, &blob, &Default::default()).await?;
        }
    }
    upload::put_manifest(d, &tag, &manifest, &manifest_digest).await
}

/// The layers of the signature manifest already under `tag`, kept as they are.
async fn existing_layers(d: &Distribution, tag: &str) -> Result<Vec<Value>, FetchError> {
    let accept = crate::oci::manifest::accept_image_manifests();
    let bytes = match d.manifest(tag, &accept).await {
        Ok((bytes, _)) => bytes,
        Err(FetchError::NotFound { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let doc: Value = serde_json::from_slice(&bytes).map_err(|e| FetchError::Registry {
        message: format!(
            "the signature manifest {tag} is not JSON ({e}); delete it and sign again"
        ),
    })?;
    let layers: Vec<Value> = doc
        .get("layers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // Only signatures are kept: anything else under the tag is not cosign's.
    let kept: Vec<Value> = layers
        .into_iter()
        .filter(|l| l.get("mediaType").and_then(Value::as_str) == Some(SIMPLE_SIGNING))
        .take(LAYERS_LIMIT - 1)
        .collect();
    Ok(kept)
}
