//! A Sigstore bundle v0.3 checked against a pinned key: what `cosign sign --key` writes by
//! default from cosign 3 (a DSSE envelope around an in-toto statement naming the image's
//! digest), and the message-signature form (a signature over the image manifest's digest).
//! The bundle's `publicKey.hint` is unauthenticated and ignored, as cosign ignores it; a
//! bundle carrying a certificate was signed keyless and does not verify by key. The bundle's
//! transparency-log entry is not checked by key, as `cosign verify --key
//! --insecure-ignore-tlog` does not: the key alone vouches for the signature.

use base64::Engine;
use p256::ecdsa::signature::hazmat::PrehashVerifier;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use serde::Deserialize;
use serde_json::Value;

use super::{keyless, Format, Requirement, SignatureError};
use crate::digest::Digest;
use crate::keyless::Identity;
use crate::keys::VerifyKey;
use crate::shown::shown;

/// The DSSE payload type of an in-toto statement.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";
/// The statement types read (cosign 3 writes v1).
pub const STATEMENT_TYPES: &[&str] = &[
    "https://in-toto.io/Statement/v1",
    "https://in-toto.io/Statement/v0.1",
];
/// The predicate type of `cosign sign`: an attestation of another kind (an SBOM, provenance)
/// on the same image is not a signature of it.
pub const SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    #[serde(default)]
    verification_material: Material,
    dsse_envelope: Option<Envelope>,
    message_signature: Option<MessageSignature>,
}

#[derive(Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Envelope {
    pub payload: String,
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize, serde::Serialize)]
pub(crate) struct EnvelopeSignature {
    pub sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageSignature {
    message_digest: Option<MessageDigest>,
    signature: String,
}

#[derive(Deserialize)]
struct MessageDigest {
    algorithm: String,
    digest: String,
}

/// DSSE's pre-authentication encoding: what the envelope's signature covers.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The in-toto statement `cosign sign` signs for `digest`.
pub fn statement(digest: &Digest) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "_type": STATEMENT_TYPES[0],
        "subject": [{"digest": {"sha256": digest.0.hex()}, "annotations": {}}],
        "predicateType": SIGN_PREDICATE,
        "predicate": {},
    }))
    .unwrap_or_default()
}

/// What a bundle holds beside its signature: a key's hint, or a certificate and its log entry.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Material {
    public_key: Option<Value>,
    certificate: Option<RawBytes>,
    /// Older bundles' form, refused in v0.3: only its presence is read.
    x509_certificate_chain: Option<Value>,
    #[serde(default)]
    tlog_entries: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBytes {
    raw_bytes: String,
}

/// What verified in one bundle.
#[derive(Debug)]
pub(super) struct Checked {
    pub format: Format,
    /// For a keyless signature, who the certificate names.
    pub identity: Option<String>,
}

/// Checks that `bytes`, a bundle from referrer `at`, is a signature of `digest` that meets
/// `requirement`.
pub(super) fn verify(
    requirement: &Requirement,
    digest: &Digest,
    at: &str,
    bytes: &[u8],
) -> Result<Checked, SignatureError> {
    let malformed = |reason: String| SignatureError::Malformed {
        tag: at.to_string(),
        reason,
    };
    let bundle: Bundle = serde_json::from_slice(bytes).map_err(|e| {
        malformed(format!(
            "the bundle is not Sigstore bundle JSON ({})",
            shown(&e.to_string())
        ))
    })?;
    if !super::referrers::BUNDLE_TYPES.contains(&bundle.media_type.as_str()) {
        return Err(malformed(format!(
            "the bundle's mediaType is {:?}, not a Sigstore bundle v0.3",
            shown(&bundle.media_type)
        )));
    }
    let material = &bundle.verification_material;
    let outcome = match requirement {
        Requirement::Key(key) => by_key(key, &bundle, material, digest),
        Requirement::Identity(policy) => by_identity(policy, &bundle, material, digest),
    };
    outcome.map_err(|e| e.into_error(at, requirement, digest))
}

fn by_key(
    key: &VerifyKey,
    bundle: &Bundle,
    material: &Material,
    digest: &Digest,
) -> Result<Checked, Refusal> {
    if material.public_key.is_none() {
        let kind = match (&material.certificate, &material.x509_certificate_chain) {
            (Some(_), _) => {
                "the bundle carries a certificate (signed keyless), not a key's signature"
            }
            (None, Some(_)) => {
                "the bundle carries a x509CertificateChain (signed keyless), not a key's signature"
            }
            (None, None) => "the bundle names no verification material",
        };
        return Err(Refusal::Malformed(kind.into()));
    }
    let format = match (&bundle.dsse_envelope, &bundle.message_signature) {
        (Some(envelope), None) => {
            let (payload, _) = check_envelope(key.key(), envelope)?;
            check_statement(&payload, digest)?;
            Format::DsseBundle
        }
        (None, Some(message)) => {
            check_message(key.key(), message, digest)?;
            Format::MessageBundle
        }
        _ => return Err(neither()),
    };
    Ok(Checked {
        format,
        identity: None,
    })
}

fn neither() -> Refusal {
    Refusal::Malformed(
        "the bundle holds neither exactly one DSSE envelope nor one message signature".into(),
    )
}

/// The leaf (a v0.3 bundle's `certificate`; the chain comes from the trusted root), its
/// signature, then what `keyless::check` adds.
fn by_identity(
    policy: &Identity,
    bundle: &Bundle,
    material: &Material,
    digest: &Digest,
) -> Result<Checked, Refusal> {
    let leaf_b64 = match (&material.certificate, &material.x509_certificate_chain) {
        (Some(c), None) => &c.raw_bytes,
        (_, Some(_)) => {
            return Err(Refusal::Malformed(
                "the bundle carries an x509CertificateChain, which a v0.3 bundle does not (its leaf is `certificate`; the chain comes from the trusted root)".into(),
            ))
        }
        (None, None) => {
            return Err(Refusal::Malformed(match material.public_key {
                Some(_) => "the bundle was signed with a key (publicKey), not keyless: verify it with --verify-key".into(),
                None => "the bundle names no verification material".into(),
            }))
        }
    };
    let leaf_der = decode(leaf_b64, "certificate")?;
    let leaf = keyless::Leaf::parse(&leaf_der).map_err(Refusal::Malformed)?;
    let leaf_key = leaf.key().map_err(Refusal::Malformed)?;
    let [entry] = material.tlog_entries.as_slice() else {
        return Err(Refusal::Untrusted(format!(
            "the bundle has {} transparency log entries, where keyless needs exactly one",
            material.tlog_entries.len()
        )));
    };
    let entry = keyless::TlogEntry::deserialize(entry).map_err(|e| {
        Refusal::Malformed(format!(
            "the bundle's transparency log entry does not parse ({})",
            shown(&e.to_string())
        ))
    })?;
    let (format, checked) = match (&bundle.dsse_envelope, &bundle.message_signature) {
        (Some(envelope), None) => {
            let (payload, signature) = check_envelope(&leaf_key, envelope)?;
            check_statement(&payload, digest)?;
            let recorded = keyless::Recorded::Dsse {
                payload_sha256: crate::digest::Sha256::of(&payload).0,
                signature: &signature,
            };
            (
                Format::DsseBundle,
                keyless::check(policy, &leaf, &leaf_der, &entry, &recorded),
            )
        }
        (None, Some(message)) => {
            let signature = check_message(&leaf_key, message, digest)?;
            let recorded = keyless::Recorded::Hashed {
                sha256: digest.0 .0,
                signature: &signature,
            };
            (
                Format::MessageBundle,
                keyless::check(policy, &leaf, &leaf_der, &entry, &recorded),
            )
        }
        _ => return Err(neither()),
    };
    Ok(Checked {
        format,
        identity: Some(checked?),
    })
}

/// Why one check failed, before it is worded for its referrer.
pub(super) enum Refusal {
    Malformed(String),
    WrongKey,
    OtherDigest(String),
    Untrusted(String),
    OtherIdentity(String),
}

impl From<keyless::Refused> for Refusal {
    fn from(r: keyless::Refused) -> Self {
        match r {
            keyless::Refused::Untrusted(why) => Refusal::Untrusted(why),
            keyless::Refused::OtherIdentity(who) => Refusal::OtherIdentity(who),
        }
    }
}

impl Refusal {
    pub(super) fn into_error(
        self,
        at: &str,
        requirement: &Requirement,
        digest: &Digest,
    ) -> SignatureError {
        match self {
            Refusal::Malformed(reason) => SignatureError::Malformed {
                tag: at.to_string(),
                reason,
            },
            Refusal::WrongKey => match requirement {
                Requirement::Key(key) => SignatureError::WrongKey {
                    tag: at.to_string(),
                    key: key.id().to_string(),
                },
                Requirement::Identity(_) => SignatureError::Untrusted {
                    tag: at.to_string(),
                    reason: "the signature does not verify with its certificate's key: what it signs was altered".into(),
                },
            },
            Refusal::Untrusted(reason) => SignatureError::Untrusted {
                tag: at.to_string(),
                reason,
            },
            Refusal::OtherIdentity(found) => SignatureError::OtherIdentity {
                tag: at.to_string(),
                found,
                wanted: match requirement {
                    Requirement::Identity(policy) => policy.to_string(),
                    Requirement::Key(key) => key.id().to_string(),
                },
            },
            Refusal::OtherDigest(signed) => SignatureError::OtherDigest {
                tag: at.to_string(),
                signed,
                digest: digest.to_string(),
            },
        }
    }
}

/// Standard or URL-safe base64, padded or not, as DSSE asks verifiers to accept.
fn decode(text: &str, what: &str) -> Result<Vec<u8>, Refusal> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
    let t = text.trim();
    STANDARD
        .decode(t)
        .or_else(|_| URL_SAFE.decode(t))
        .or_else(|_| URL_SAFE_NO_PAD.decode(t.trim_end_matches('=')))
        .map_err(|e| Refusal::Malformed(format!("the {what} is not base64 ({e})")))
}

fn signature(der: &[u8]) -> Result<Signature, Refusal> {
    let s = Signature::from_der(der).map_err(|_| {
        Refusal::Malformed("the signature is not a DER ECDSA P-256 signature".into())
    })?;
    // Go's ecdsa (cosign) and OpenSSL accept either s; RustCrypto only the low one.
    Ok(s.normalize_s().unwrap_or(s))
}

/// The envelope's one signature over its PAE, then its payload (only once it verified).
fn check_envelope(key: &VerifyingKey, e: &Envelope) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
    if e.payload_type != IN_TOTO {
        return Err(Refusal::Malformed(format!(
            "the envelope's payloadType is {:?}, not {IN_TOTO}",
            shown(&e.payload_type)
        )));
    }
    let [one] = e.signatures.as_slice() else {
        return Err(Refusal::Malformed(format!(
            "the envelope has {} signatures, not one",
            e.signatures.len()
        )));
    };
    let raw = decode(&one.sig, "signature")?;
    let sig = signature(&raw)?;
    let payload = decode(&e.payload, "envelope's payload")?;
    key.verify(&pae(&e.payload_type, &payload), &sig)
        .map_err(|_| Refusal::WrongKey)?;
    Ok((payload, raw))
}

/// A verified statement must be `cosign sign`'s and name `digest` among its subjects.
fn check_statement(payload: &[u8], digest: &Digest) -> Result<(), Refusal> {
    let doc: Value = serde_json::from_slice(payload).map_err(|e| {
        Refusal::Malformed(format!(
            "the signed statement is not JSON ({})",
            shown(&e.to_string())
        ))
    })?;
    let text = |k: &str| doc.get(k).and_then(Value::as_str);
    if !text("_type").is_some_and(|t| STATEMENT_TYPES.contains(&t)) {
        return Err(Refusal::Malformed(format!(
            "the signed statement's _type is {:?}, not an in-toto statement",
            text("_type").map(shown)
        )));
    }
    if text("predicateType") != Some(SIGN_PREDICATE) {
        return Err(Refusal::Malformed(format!(
            "the signed statement's predicateType is {:?}, not {SIGN_PREDICATE} (an attestation, not a signature)",
            text("predicateType").map(shown)
        )));
    }
    let named: Vec<&str> = doc
        .get("subject")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|s| s.pointer("/digest/sha256").and_then(Value::as_str))
        .collect();
    if named.contains(&digest.0.hex().as_str()) {
        return Ok(());
    }
    Err(Refusal::OtherDigest(match named.first() {
        Some(first) => format!("sha256:{}", shown(first)),
        None => "no sha256 subject".into(),
    }))
}

/// A message signature is over the image manifest itself, so its digest is `digest`.
/// Returns the signature as given.
fn check_message(
    key: &VerifyingKey,
    m: &MessageSignature,
    digest: &Digest,
) -> Result<Vec<u8>, Refusal> {
    let raw = decode(&m.signature, "signature")?;
    let sig = signature(&raw)?;
    let named = match &m.message_digest {
        Some(d) if d.algorithm == "SHA2_256" => decode(&d.digest, "message digest")?,
        Some(d) => {
            return Err(Refusal::Malformed(format!(
                "the message digest's algorithm is {:?}, not SHA2_256",
                shown(&d.algorithm)
            )))
        }
        None => digest.0 .0.to_vec(),
    };
    key.verify_prehash(&named, &sig)
        .map_err(|_| Refusal::WrongKey)?;
    if named != digest.0 .0 {
        return Err(Refusal::OtherDigest(format!(
            "sha256:{}",
            named.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )));
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SignKey;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn digest(n: u8) -> Digest {
        Digest(crate::digest::Sha256([n; 32]))
    }

    fn dsse(key: &SignKey, statement: &[u8], material: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "mediaType": super::super::referrers::BUNDLE_V03,
            "verificationMaterial": material,
            "dsseEnvelope": {"payload": b64(statement), "payloadType": IN_TOTO,
                             "signatures": [{"sig": key.sign(&pae(IN_TOTO, statement))}]},
        }))
        .unwrap()
    }

    fn key_material() -> Value {
        serde_json::json!({"publicKey": {"hint": ""}})
    }

    #[test]
    fn pae_is_the_dsse_protocols() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }

    #[test]
    fn a_dsse_bundle_verifies_with_its_key_for_its_digest_only() {
        let key = SignKey::from_scalar(&[3; 32]);
        let public = key.verify_key().unwrap();
        let bundle = dsse(&key, &statement(&digest(1)), key_material());
        assert_eq!(
            verify(&Requirement::Key(public.clone()), &digest(1), "r", &bundle).map(|c| c.format),
            Ok(Format::DsseBundle)
        );
        let e = verify(&Requirement::Key(public.clone()), &digest(2), "r", &bundle).unwrap_err();
        assert!(matches!(e, SignatureError::OtherDigest { .. }), "{e}");
        let other = SignKey::from_scalar(&[4; 32]).verify_key().unwrap();
        let e = verify(&Requirement::Key(other.clone()), &digest(1), "r", &bundle).unwrap_err();
        assert!(matches!(e, SignatureError::WrongKey { .. }), "{e}");
        let keyless = dsse(
            &key,
            &statement(&digest(1)),
            serde_json::json!({"certificate": {"rawBytes": ""}}),
        );
        let e = verify(&Requirement::Key(public.clone()), &digest(1), "r", &keyless).unwrap_err();
        assert!(e.to_string().contains("keyless"), "{e}");
    }

    #[test]
    fn an_attestation_is_not_a_signature_and_a_message_signature_is() {
        let key = SignKey::from_scalar(&[5; 32]);
        let public = key.verify_key().unwrap();
        let mut st: Value = serde_json::from_slice(&statement(&digest(1))).unwrap();
        st["predicateType"] = "https://slsa.dev/provenance/v1".into();
        let bundle = dsse(&key, &serde_json::to_vec(&st).unwrap(), key_material());
        let e = verify(&Requirement::Key(public.clone()), &digest(1), "r", &bundle).unwrap_err();
        assert!(e.to_string().contains("predicateType"), "{e}");

        use p256::ecdsa::signature::hazmat::PrehashSigner;
        let signing = p256::ecdsa::SigningKey::from_slice(&[5; 32]).unwrap();
        let sig: Signature = signing.sign_prehash(&digest(1).0 .0).unwrap();
        let message = serde_json::to_vec(&serde_json::json!({
            "mediaType": super::super::referrers::BUNDLE_V03,
            "verificationMaterial": key_material(),
            "messageSignature": {"messageDigest": {"algorithm": "SHA2_256", "digest": b64(&[1; 32])},
                                 "signature": b64(sig.to_der().as_bytes())},
        }))
        .unwrap();
        assert_eq!(
            verify(&Requirement::Key(public.clone()), &digest(1), "r", &message).map(|c| c.format),
            Ok(Format::MessageBundle)
        );
        let e = verify(&Requirement::Key(public.clone()), &digest(2), "r", &message).unwrap_err();
        assert!(matches!(e, SignatureError::OtherDigest { .. }), "{e}");
    }
}
