//! Cosign's legacy storage: the signature of the image whose manifest digest is `sha256:H`
//! is the manifest tagged `sha256-H.sig` in the same repository; each of its layers is a
//! simple-signing payload (JSON naming the signed digest under
//! `critical.image.docker-manifest-digest`) whose ECDSA P-256 / SHA-256 signature, DER in
//! base64, is the layer's `dev.cosignproject.cosign/signature` annotation. Signing again with
//! another key adds a layer.

use base64::Engine;
use oci_client::manifest::OciDescriptor;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use serde_json::Value;

use super::bundle::Refusal;
use super::{keyless, Requirement, SignatureError};
use crate::digest::{parse_digest, Digest};
use crate::error::FetchError;
use crate::keyless::Identity;
use crate::net;
use crate::oci::distribution::Distribution;
use crate::shown::shown;

/// The media type of a simple-signing payload layer.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation that holds the signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` cosign writes and checks.
pub const PAYLOAD_TYPE: &str = "cosign container image signature";
/// A payload is a few hundred bytes of JSON; cosign's optional claims leave it far below this.
pub const PAYLOAD_LIMIT: u64 = 64 << 10;
/// The base64 of a DER ECDSA P-256 signature is at most 96 characters.
pub const SIGNATURE_TEXT_LIMIT: usize = 1 << 10;
/// Signatures read from one signature manifest (one per key that signed).
pub const LAYERS_LIMIT: usize = 32;

/// The tag cosign stores the signature of `digest` under.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.0.hex())
}

/// The simple-signing payload for `digest` of the image at `reference` (`registry/repo`),
/// as cosign writes it.
pub fn payload(reference: &str, digest: &Digest) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest.to_string()},
            "type": PAYLOAD_TYPE,
        },
        "optional": null,
    }))
    .unwrap_or_default()
}

/// The layer annotation that holds a keyless signature's certificate (PEM).
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
/// The layer annotation that holds a keyless signature's Rekor entry (cosign's JSON).
pub const REKOR_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
/// A certificate's PEM, or a Rekor entry (a certificate and a signature in base64 twice
/// over), is a few KiB.
pub const KEYLESS_ANNOTATION_LIMIT: usize = 64 << 10;

/// One layer of a signature manifest, read and parsed as far as it could be.
pub(super) struct Entry {
    payload: Vec<u8>,
    signature: Signature,
    /// The signature's DER as given, which a log entry records.
    raw_signature: Vec<u8>,
    certificate: Option<String>,
    rekor: Option<String>,
}

/// Whether one of `entries` is a signature of `digest` that meets `requirement` (and, for a
/// keyless one, who signed); if none is, the first entry's reason (a signature manifest
/// usually holds one).
pub(super) fn check(
    requirement: &Requirement,
    digest: &Digest,
    tag: &str,
    entries: &[Result<Entry, SignatureError>],
) -> Result<Option<String>, SignatureError> {
    let mut first = None;
    for entry in entries {
        let outcome = entry.as_ref().map_err(Clone::clone).and_then(|e| {
            match requirement {
                Requirement::Key(key) => signed_payload(key.key(), digest, e).map(|()| None),
                Requirement::Identity(policy) => check_keyless(policy, digest, e).map(Some),
            }
            .map_err(|r| r.into_error(tag, requirement, digest))
        });
        match outcome {
            Ok(who) => return Ok(who),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| SignatureError::Malformed {
        tag: tag.to_string(),
        reason: "the signature manifest has no layers".into(),
    }))
}

/// The signature first, then the payload it covers: nothing unauthenticated is parsed.
fn signed_payload(key: &VerifyingKey, digest: &Digest, entry: &Entry) -> Result<(), Refusal> {
    // Go's ecdsa (cosign) and OpenSSL accept either s; RustCrypto only the low one.
    let signature = entry.signature.normalize_s().unwrap_or(entry.signature);
    key.verify(&entry.payload, &signature)
        .map_err(|_| Refusal::WrongKey)?;
    let signed = signed_digest(&entry.payload).map_err(Refusal::Malformed)?;
    if signed != digest.to_string() {
        return Err(Refusal::OtherDigest(shown(&signed)));
    }
    Ok(())
}

/// A keyless layer (cosign 2's): the signature with its certificate's key, the payload's
/// digest, then the Rekor entry the layer carries and what `keyless::check` adds.
fn check_keyless(policy: &Identity, digest: &Digest, entry: &Entry) -> Result<String, Refusal> {
    let pem = entry.certificate.as_deref().ok_or_else(|| {
        Refusal::Malformed(format!(
            "the layer carries no {CERTIFICATE_ANNOTATION}: it was signed with a key, not keyless; verify it with --verify-key"
        ))
    })?;
    let der = x509_cert::der::pem::decode_vec(pem.as_bytes())
        .map(|(_, der)| der)
        .map_err(|_| {
            Refusal::Malformed(format!(
                "the {CERTIFICATE_ANNOTATION} annotation is not PEM"
            ))
        })?;
    let leaf = keyless::Leaf::parse(&der).map_err(Refusal::Malformed)?;
    signed_payload(&leaf.key().map_err(Refusal::Malformed)?, digest, entry)?;
    let rekor = entry.rekor.as_deref().ok_or_else(|| {
        Refusal::Untrusted(format!(
            "the layer carries no transparency log entry ({REKOR_ANNOTATION})"
        ))
    })?;
    let log_entry = keyless::TlogEntry::from_legacy(rekor).map_err(Refusal::Untrusted)?;
    let recorded = keyless::Recorded::Hashed {
        sha256: crate::digest::Sha256::of(&entry.payload).0,
        signature: &entry.raw_signature,
    };
    Ok(keyless::check(policy, &leaf, &der, &log_entry, &recorded)?)
}

/// `critical.image.docker-manifest-digest` of a simple-signing payload of cosign's type.
pub fn signed_digest(payload: &[u8]) -> Result<String, String> {
    let doc: Value = serde_json::from_slice(payload)
        .map_err(|e| format!("the signed payload is not JSON ({})", shown(&e.to_string())))?;
    let critical = doc
        .get("critical")
        .ok_or("the signed payload has no \"critical\" section")?;
    match critical.get("type").and_then(Value::as_str) {
        Some(PAYLOAD_TYPE) => {}
        other => {
            return Err(format!(
                "the signed payload's critical.type is {:?}, not {PAYLOAD_TYPE:?}",
                other.map(shown)
            ))
        }
    }
    critical
        .pointer("/image/docker-manifest-digest")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "the signed payload has no critical.image.docker-manifest-digest".into())
}

/// The signature manifest's layers, each read within its bounds or refused with its reason;
/// `None` when there is no signature manifest. Only a failure to reach the registry at all is
/// a `FetchError` of its own.
pub(super) async fn read_entries(
    d: &Distribution,
    tag: &str,
) -> Result<Option<Vec<Result<Entry, SignatureError>>>, FetchError> {
    let accept = crate::oci::manifest::accept_image_manifests();
    let malformed = |reason: String| SignatureError::Malformed {
        tag: tag.to_string(),
        reason,
    };
    let bytes = match d.manifest(tag, &accept).await {
        Ok((bytes, _)) => bytes,
        Err(FetchError::NotFound { .. }) => return Ok(None),
        Err(FetchError::ResponseTooLarge { limit, .. }) => {
            return Err(SignatureError::Oversized {
                tag: tag.to_string(),
                what: "signature manifest",
                size: limit as u64 + 1,
                limit: limit as u64,
            }
            .into())
        }
        Err(e) => return Err(e),
    };
    let manifest = crate::oci::manifest::parse_manifest(&bytes)
        .map_err(|e| malformed(format!("not an image manifest ({})", shown(&e.to_string()))))?;
    if manifest.layers.len() > LAYERS_LIMIT {
        return Err(SignatureError::Oversized {
            tag: tag.to_string(),
            what: "signature manifest's layer list",
            size: manifest.layers.len() as u64,
            limit: LAYERS_LIMIT as u64,
        }
        .into());
    }
    let mut entries = Vec::with_capacity(manifest.layers.len());
    for layer in &manifest.layers {
        entries.push(read_entry(d, tag, layer).await?);
    }
    Ok(Some(entries))
}

/// One layer: its signature parsed, then its payload read (only if the signature parsed).
async fn read_entry(
    d: &Distribution,
    tag: &str,
    layer: &OciDescriptor,
) -> Result<Result<Entry, SignatureError>, FetchError> {
    let malformed = |reason: String| SignatureError::Malformed {
        tag: tag.to_string(),
        reason,
    };
    let oversized = |what, size, limit| SignatureError::Oversized {
        tag: tag.to_string(),
        what,
        size,
        limit,
    };
    if layer.media_type != SIMPLE_SIGNING {
        return Ok(Err(malformed(format!(
            "a layer has media type {:?}, not {SIMPLE_SIGNING}",
            shown(&layer.media_type)
        ))));
    }
    let Some(text) = layer
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIGNATURE_ANNOTATION))
    else {
        return Ok(Err(malformed(format!(
            "a layer has no {SIGNATURE_ANNOTATION} annotation"
        ))));
    };
    if text.len() > SIGNATURE_TEXT_LIMIT {
        return Ok(Err(oversized(
            "signature annotation",
            text.len() as u64,
            SIGNATURE_TEXT_LIMIT as u64,
        )));
    }
    let der = match base64::engine::general_purpose::STANDARD.decode(text.trim()) {
        Ok(der) => der,
        Err(e) => return Ok(Err(malformed(format!("the signature is not base64 ({e})")))),
    };
    let signature = match Signature::from_der(&der) {
        Ok(s) => s,
        Err(_) => {
            return Ok(Err(malformed(
                "the signature is not a DER ECDSA P-256 signature".into(),
            )))
        }
    };
    let annotation = |name: &'static str| -> Result<Option<String>, SignatureError> {
        match layer.annotations.as_ref().and_then(|a| a.get(name)) {
            Some(text) if text.len() > KEYLESS_ANNOTATION_LIMIT => Err(oversized(
                name,
                text.len() as u64,
                KEYLESS_ANNOTATION_LIMIT as u64,
            )),
            other => Ok(other.cloned()),
        }
    };
    let (certificate, rekor) = match (
        annotation(CERTIFICATE_ANNOTATION),
        annotation(REKOR_ANNOTATION),
    ) {
        (Ok(c), Ok(r)) => (c, r),
        (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
    };
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > PAYLOAD_LIMIT {
        return Ok(Err(oversized("signed payload", size, PAYLOAD_LIMIT)));
    }
    let blob_digest = match parse_digest(&layer.digest) {
        Ok(digest) => digest,
        Err(e) => return Ok(Err(malformed(e.to_string()))),
    };
    let resp = match d.blob(&blob_digest).await {
        Ok(resp) => resp,
        Err(FetchError::NotFound { .. }) => {
            return Ok(Err(malformed(format!(
                "its payload {blob_digest} is not in the repository"
            ))))
        }
        Err(e) => return Err(e),
    };
    let payload = match net::read_limited(resp, size as usize, "signed payload").await {
        Ok(p) => p,
        Err(FetchError::ResponseTooLarge { .. }) => {
            return Ok(Err(malformed(format!(
                "the payload is longer than the {size} bytes its descriptor declares"
            ))))
        }
        Err(e) => return Err(e),
    };
    if Digest(crate::digest::Sha256::of(&payload)) != blob_digest {
        return Ok(Err(malformed(format!(
            "the payload does not match its digest {blob_digest}"
        ))));
    }
    Ok(Ok(Entry {
        payload,
        signature,
        raw_signature: der,
        certificate,
        rekor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{SignKey, VerifyKey};

    fn key(n: u8) -> SignKey {
        SignKey::from_scalar(&[n; 32])
    }

    /// A key's layer, worded for `tag` as `check` words it.
    fn check_entry(
        key: &VerifyKey,
        digest: &Digest,
        tag: &str,
        entry: &Entry,
    ) -> Result<(), SignatureError> {
        signed_payload(key.key(), digest, entry)
            .map_err(|r| r.into_error(tag, &Requirement::Key(key.clone()), digest))
    }

    fn digest(n: u8) -> Digest {
        Digest(crate::digest::Sha256([n; 32]))
    }

    fn entry(payload: &[u8], signature_b64: &str) -> Entry {
        let der = base64::engine::general_purpose::STANDARD
            .decode(signature_b64)
            .unwrap();
        Entry {
            payload: payload.to_vec(),
            signature: Signature::from_der(&der).unwrap(),
            raw_signature: der,
            certificate: None,
            rekor: None,
        }
    }

    #[test]
    fn a_payload_verifies_only_with_its_key_its_bytes_and_its_digest() {
        let signer = key(7);
        let public = signer.verify_key().unwrap();
        let payload = payload("127.0.0.1:5000/f", &digest(1));
        let good = entry(&payload, &signer.sign(&payload));
        assert_eq!(check_entry(&public, &digest(1), "t", &good), Ok(()));

        let other = key(8).verify_key().unwrap();
        assert!(matches!(
            check_entry(&other, &digest(1), "t", &good),
            Err(SignatureError::WrongKey { .. })
        ));
        let mut tampered = good.payload.clone();
        tampered[10] ^= 1;
        let tampered = entry(&tampered, &signer.sign(&payload));
        assert!(matches!(
            check_entry(&public, &digest(1), "t", &tampered),
            Err(SignatureError::WrongKey { .. })
        ));
        let e = check_entry(&public, &digest(2), "t", &good).unwrap_err();
        assert!(matches!(e, SignatureError::OtherDigest { .. }), "{e}");
        assert!(e.to_string().contains(&digest(1).to_string()), "{e}");
    }

    #[test]
    fn a_high_s_signature_as_openssl_may_write_verifies() {
        let signer = key(9);
        let payload = payload("r/f", &digest(3));
        let low = entry(&payload, &signer.sign(&payload)).signature;
        let (r, s) = (low.r(), low.s());
        let high = Signature::from_scalars(r, -*s.as_ref()).unwrap();
        let e = Entry {
            payload,
            signature: high,
            raw_signature: high.to_der().as_bytes().to_vec(),
            certificate: None,
            rekor: None,
        };
        assert_eq!(
            check_entry(&signer.verify_key().unwrap(), &digest(3), "t", &e),
            Ok(())
        );
    }

    #[test]
    fn a_payload_must_be_cosigns_and_name_a_digest() {
        for (bad, words) in [
            (&b"nope"[..], "not JSON"),
            (br#"{"optional":{}}"#, "no \"critical\""),
            (
                br#"{"critical":{"type":"x","image":{"docker-manifest-digest":"sha256:a"}}}"#,
                "critical.type",
            ),
            (
                br#"{"critical":{"type":"cosign container image signature"}}"#,
                "docker-manifest-digest",
            ),
        ] {
            let e = signed_digest(bad).unwrap_err();
            assert!(e.contains(words), "{e}");
        }
    }
}
