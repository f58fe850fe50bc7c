//! `push --sign-key`: the signature, written as cosign writes it: by default as cosign 3 does
//! (a Sigstore bundle with a DSSE envelope, attached as an OCI 1.1 referrer of the image, and
//! listed under the referrers fallback tag when the registry has no referrers API), or in the
//! legacy format under the `.sig` tag, as cosign 2 does.

use base64::Engine;
use serde_json::Value;

use crate::digest::Digest;
use crate::error::FetchError;
use crate::keys::SignKey;
use crate::oci::cosign::referrers::{fallback_tag, BUNDLE_V03, EMPTY_TYPE, INDEX_TYPE};
use crate::oci::cosign::{pae, statement, Storage, IN_TOTO};
use crate::oci::cosign::{
    payload, signature_tag, LAYERS_LIMIT, SIGNATURE_ANNOTATION, SIMPLE_SIGNING,
};
use crate::oci::distribution::Distribution;

/// The format `push --sign-key` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum SignFormat {
    /// A Sigstore bundle v0.3 referrer, as cosign 3 writes by default.
    #[default]
    Bundle,
    /// The simple-signing payload under `sha256-<hex>.sig`, as cosign 2 writes.
    SimpleSigning,
}

/// The image just pushed, as a referrer's `subject` names it.
pub struct Subject<'a> {
    pub digest: &'a Digest,
    pub media_type: String,
    pub size: usize,
}

/// Writes `key`'s bundle for `subject`: the bundle blob, the empty config, the referrer
/// manifest (pushed by its digest), and, unless the registry lists referrers itself, the
/// referrer added to the fallback tag's index.
pub async fn sign_bundle(
    d: &Distribution,
    subject: &Subject<'_>,
    key: &SignKey,
) -> Result<(), super::PushError> {
    use super::upload;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let payload = statement(subject.digest);
    let signature = key.sign(&pae(IN_TOTO, &payload));
    let public = key.verify_key().map_err(|reason| FetchError::Registry {
        message: format!("cannot derive the signing key's public key: {reason}"),
    })?;
    let hint = public.spki_sha256();
    let bundle = serde_json::to_vec(&serde_json::json!({
        "mediaType": BUNDLE_V03,
        "verificationMaterial": {"publicKey": {"hint": b64(&hint)}},
        "dsseEnvelope": {
            "payload": b64(&payload),
            "payloadType": IN_TOTO,
            "signatures": [{"sig": signature}],
        },
    }))
    .unwrap_or_default();
    let bundle_digest = Digest(crate::digest::Sha256::of(&bundle));
    let config = b"{}".to_vec();
    let config_digest = Digest(crate::digest::Sha256::of(&config));
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": crate::oci::manifest::OCI_MANIFEST,
        "artifactType": BUNDLE_V03,
        "config": {"mediaType": EMPTY_TYPE, "size": config.len(), "digest": config_digest.to_string()},
        "layers": [{"mediaType": BUNDLE_V03, "size": bundle.len(), "digest": bundle_digest.to_string()}],
        "subject": {
            "mediaType": subject.media_type,
            "size": subject.size,
            "digest": subject.digest.to_string(),
        },
        "annotations": {"dev.sigstore.bundle.content": "dsse-envelope",
                        "dev.sigstore.bundle.predicateType": crate::oci::cosign::SIGN_PREDICATE},
    }))
    .unwrap_or_default();
    let manifest_digest = Digest(crate::digest::Sha256::of(&manifest)).to_string();
    put_blobs(d, [(bundle, bundle_digest), (config, config_digest)]).await?;
    upload::put_manifest(d, &manifest_digest, &manifest, &manifest_digest).await?;
    let (storage, _) = crate::oci::cosign::referrers::list(d, subject.digest).await?;
    if storage == Storage::ReferrersApi {
        return Ok(());
    }
    let tag = fallback_tag(subject.digest);
    let mut index = match d.manifest(&tag, INDEX_TYPE).await {
        Ok((bytes, _)) => serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(|v| v.get("manifests").is_some_and(Value::is_array))
            .ok_or_else(|| FetchError::Registry {
                message: format!("the referrers tag {tag} holds something other than an image index; delete it and sign again"),
            })?,
        Err(FetchError::NotFound { .. }) => serde_json::json!({
            "schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [],
        }),
        Err(e) => return Err(e.into()),
    };
    let entry = serde_json::json!({
        "mediaType": crate::oci::manifest::OCI_MANIFEST,
        "artifactType": BUNDLE_V03,
        "size": manifest.len(),
        "digest": manifest_digest,
        "annotations": {"dev.sigstore.bundle.content": "dsse-envelope"},
    });
    if let Some(list) = index.get_mut("manifests").and_then(Value::as_array_mut) {
        if list.iter().any(|m| m.get("digest") == entry.get("digest")) {
            return Ok(());
        }
        list.push(entry);
    }
    let bytes = serde_json::to_vec(&index).unwrap_or_default();
    let digest = Digest(crate::digest::Sha256::of(&bytes)).to_string();
    upload::put_manifest(d, &tag, &bytes, &digest).await
}

/// Writes `key`'s signature of `digest` (the image just pushed to `d`'s repository) under the
/// cosign tag, keeping the signatures already there. Signing is deterministic, so a signature
/// the manifest already holds is not added twice.
pub async fn sign(
    d: &Distribution,
    digest: &Digest,
    key: &SignKey,
) -> Result<(), super::PushError> {
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
    put_blobs(d, [(payload, payload_digest), (config, config_digest)]).await?;
    upload::put_manifest(d, &tag, &manifest, &manifest_digest).await
}

/// Uploads a signature's blobs (its payload or bundle, and its config) the repository does
/// not hold yet.
async fn put_blobs(
    d: &Distribution,
    blobs: [(Vec<u8>, Digest); 2],
) -> Result<(), super::PushError> {
    for (bytes, digest) in blobs {
        let blob = super::layout::Blob {
            digest: digest.to_string(),
            bytes: bytes.into(),
            is_module: false,
        };
        super::upload::ensure_blob(d, &blob, &Default::default()).await?;
    }
    Ok(())
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
