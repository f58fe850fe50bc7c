//! A Rekor (v1) log entry, checked offline against the trusted root's log keys: its signed
//! entry timestamp (SET, the log's promise and the only source of a verified time), its
//! inclusion proof and signed checkpoint when present, and that its body records this very
//! signature by this very certificate (otherwise a valid entry proves only that *something*
//! was logged). Rekor v2 entries carry no SET and need an RFC 3161 timestamp for time, which
//! is not read: they are refused by name.

use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use crate::digest::Sha256;
use crate::keyless::{Hash, LogKey, TrustedRoot};
use crate::shown::shown;

/// A canonicalized body is a few KiB (a certificate and a signature).
const BODY_LIMIT: usize = 64 << 10;
/// Hashes in an inclusion proof: a tree of 2^64 entries needs 64.
const PROOF_LIMIT: usize = 64;
/// A checkpoint is a few lines.
const CHECKPOINT_LIMIT: usize = 8 << 10;

/// protobuf JSON writes int64 as a string; older writers (and cosign's annotation) a number.
#[derive(Deserialize, Clone, Copy)]
#[serde(untagged)]
enum Int {
    Text(#[serde(deserialize_with = "int_text")] i64),
    Number(i64),
}

fn int_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

impl Int {
    fn get(self) -> i64 {
        match self {
            Int::Text(n) | Int::Number(n) => n,
        }
    }
}

/// `verificationMaterial.tlogEntries[]` of a bundle.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlogEntry {
    log_index: Int,
    log_id: LogId,
    kind_version: KindVersion,
    integrated_time: Option<Int>,
    inclusion_promise: Option<Promise>,
    inclusion_proof: Option<Proof>,
    canonicalized_body: String,
    /// A bundle (v0.2 on) must carry an inclusion proof: without it, a log key that signed
    /// an entry it never published would go unseen. cosign 2's annotation has only a SET.
    #[serde(skip, default = "proof_required")]
    proof_required: bool,
}

fn proof_required() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogId {
    key_id: String,
}

#[derive(Deserialize)]
struct KindVersion {
    kind: String,
    version: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Promise {
    signed_entry_timestamp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Proof {
    log_index: Int,
    root_hash: String,
    tree_size: Int,
    hashes: Vec<String>,
    checkpoint: Option<Checkpoint>,
}

#[derive(Deserialize)]
struct Checkpoint {
    envelope: String,
}

/// cosign's legacy `dev.sigstore.cosign/bundle` annotation.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LegacyBundle {
    signed_entry_timestamp: String,
    payload: LegacyPayload,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LegacyPayload {
    body: String,
    integrated_time: Int,
    log_index: Int,
    #[serde(rename = "logID")]
    log_id: String,
}

/// What the entry's body must record: the signature, and what it covers.
pub(in crate::oci::cosign) enum Recorded<'a> {
    /// A DSSE envelope (Rekor `dsse` 0.0.1): its payload's hash and its one signature.
    Dsse {
        payload_sha256: [u8; 32],
        signature: &'a [u8],
    },
    /// A signature over an artifact's SHA-256 (`hashedrekord` 0.0.1).
    Hashed {
        sha256: [u8; 32],
        signature: &'a [u8],
    },
}

fn b64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("the log entry's {what} is not base64 ({e})"))
}

impl TlogEntry {
    /// From cosign's legacy annotation, which holds a SET and no proof.
    pub fn from_legacy(annotation: &str) -> Result<Self, String> {
        let b: LegacyBundle = serde_json::from_str(annotation).map_err(|e| {
            format!(
                "the Rekor bundle annotation is not cosign's ({})",
                shown(&e.to_string())
            )
        })?;
        let id = hex::decode(&b.payload.log_id)
            .map_err(|_| "the Rekor bundle's logID is not hex".to_string())?;
        let body = b64(&b.payload.body, "body")?;
        let doc: Value = serde_json::from_slice(&body)
            .map_err(|_| "the log entry's body is not JSON".to_string())?;
        let text = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Ok(Self {
            log_index: b.payload.log_index,
            log_id: LogId {
                key_id: base64::engine::general_purpose::STANDARD.encode(id),
            },
            kind_version: KindVersion {
                kind: text("kind"),
                version: text("apiVersion"),
            },
            integrated_time: Some(b.payload.integrated_time),
            inclusion_promise: Some(Promise {
                signed_entry_timestamp: b.signed_entry_timestamp,
            }),
            inclusion_proof: None,
            canonicalized_body: b.payload.body,
            proof_required: false,
        })
    }

    /// Checks the entry and returns the time the log vouches the signature was made (Unix
    /// seconds). `signer` is the DER certificate the body must name.
    pub(in crate::oci::cosign) fn check(
        &self,
        root: &TrustedRoot,
        recorded: &Recorded<'_>,
        signer: &[u8],
    ) -> Result<i64, String> {
        let kind = (
            self.kind_version.kind.as_str(),
            self.kind_version.version.as_str(),
        );
        match kind {
            ("dsse", "0.0.1") | ("hashedrekord", "0.0.1") => {}
            ("hashedrekord", "0.0.2") | ("dsse", "0.0.2") => {
                return Err("the log entry is Rekor v2's, whose time comes from an RFC 3161 timestamp, which is not verified here: sign against a Rekor v1 log".into())
            }
            (k, v) => {
                return Err(format!(
                    "the log entry is of kind {:?} version {:?}, where dsse and hashedrekord 0.0.1 are read",
                    shown(k),
                    shown(v)
                ))
            }
        }
        let id: [u8; 32] = b64(&self.log_id.key_id, "logId.keyId")?
            .try_into()
            .map_err(|_| "the log entry's logId is not 32 bytes".to_string())?;
        let log = root.tlogs.iter().find(|l| l.id == id).ok_or_else(|| {
            format!(
                "the transparency log {} is not in the trusted root",
                hex::encode(id)
            )
        })?;
        if self.canonicalized_body.len() > BODY_LIMIT * 4 / 3 + 4 {
            return Err(format!("the log entry's body is over {BODY_LIMIT} bytes"));
        }
        let body = b64(&self.canonicalized_body, "canonicalizedBody")?;
        if self.inclusion_promise.is_none() && self.inclusion_proof.is_none() {
            return Err("the transparency log entry has neither a signed entry timestamp nor an inclusion proof".into());
        }
        match &self.inclusion_proof {
            Some(proof) => check_proof(log, proof, &body)?,
            None if self.proof_required => {
                return Err("the transparency log entry has no inclusion proof, which a v0.3 bundle carries: without it the entry may never have been published".into())
            }
            None => {}
        }
        // The integrated time is the log's word only under its SET.
        let time = match (&self.inclusion_promise, self.integrated_time) {
            (Some(promise), Some(t)) => {
                check_set(log, promise, &body, t.get(), self.log_index.get(), &id)?;
                t.get()
            }
            _ => return Err("the transparency log entry has no signed entry timestamp, so the time of signing is unverified (and no RFC 3161 timestamp is read)".into()),
        };
        if !log.window.contains(time) {
            return Err(format!(
                "the transparency log's key was not valid at the entry's time {time}"
            ));
        }
        check_body(&body, kind.0, recorded, signer)?;
        Ok(time)
    }
}

/// The SET: the log's signature over the RFC 8785 JSON of the entry's body, time and place
/// (keys in lexical order, no spaces; each value a string or an integer, so the encoding is
/// exact).
fn check_set(
    log: &LogKey,
    promise: &Promise,
    body: &[u8],
    time: i64,
    index: i64,
    id: &[u8; 32],
) -> Result<(), String> {
    let signed = format!(
        "{{\"body\":\"{}\",\"integratedTime\":{time},\"logID\":\"{}\",\"logIndex\":{index}}}",
        base64::engine::general_purpose::STANDARD.encode(body),
        hex::encode(id)
    );
    let set = b64(&promise.signed_entry_timestamp, "signedEntryTimestamp")?;
    if log.key.verifies(Hash::Sha256, signed.as_bytes(), &set) {
        Ok(())
    } else {
        Err("the transparency log entry's signed entry timestamp does not verify with the log's key: the entry was altered or not made by that log".into())
    }
}

fn node(left: &[u8], right: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// RFC 9162 §2.1.3.2: the root an audit path leads to from `leaf` at `index` in `size`.
fn root_of(index: u64, size: u64, leaf: [u8; 32], path: &[[u8; 32]]) -> Option<[u8; 32]> {
    if index >= size {
        return None;
    }
    let (mut f, mut s, mut r) = (index, size - 1, leaf);
    for p in path {
        if s == 0 {
            return None;
        }
        if f & 1 == 1 || f == s {
            r = node(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    (s == 0).then_some(r)
}

fn check_proof(log: &LogKey, proof: &Proof, body: &[u8]) -> Result<(), String> {
    if proof.hashes.len() > PROOF_LIMIT {
        return Err(format!(
            "the inclusion proof has {} hashes, over {PROOF_LIMIT}",
            proof.hashes.len()
        ));
    }
    let hash32 = |t: &str, what: &str| -> Result<[u8; 32], String> {
        b64(t, what)?
            .try_into()
            .map_err(|_| format!("the inclusion proof's {what} is not 32 bytes"))
    };
    let path = proof
        .hashes
        .iter()
        .map(|h| hash32(h, "hash"))
        .collect::<Result<Vec<_>, _>>()?;
    let root = hash32(&proof.root_hash, "rootHash")?;
    let leaf = {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update([0u8]);
        h.update(body);
        <[u8; 32]>::from(h.finalize())
    };
    let (index, size) = (proof.log_index.get(), proof.tree_size.get());
    let fits = u64::try_from(index)
        .ok()
        .zip(u64::try_from(size).ok())
        .and_then(|(i, s)| root_of(i, s, leaf, &path));
    if fits != Some(root) {
        return Err("the transparency log entry's inclusion proof does not lead to its root hash: the entry is not in the log as claimed".into());
    }
    let checkpoint = proof
        .checkpoint
        .as_ref()
        .ok_or("the inclusion proof has no signed checkpoint")?;
    check_checkpoint(log, &checkpoint.envelope, &root, size)
}

/// A signed note: `origin\nsize\nbase64 root\n[extra lines]\n` then a blank line, then
/// `— name base64(4-byte key hint ‖ signature)` lines; one by this log must verify and name
/// the proof's root and size.
fn check_checkpoint(
    log: &LogKey,
    envelope: &str,
    root: &[u8; 32],
    size: i64,
) -> Result<(), String> {
    let bad = |why: &str| format!("the inclusion proof's checkpoint {why}");
    if envelope.len() > CHECKPOINT_LIMIT {
        return Err(bad(&format!("is over {CHECKPOINT_LIMIT} bytes")));
    }
    let (note, signatures) = envelope
        .split_once("\n\n")
        .ok_or_else(|| bad("is not a signed note"))?;
    let note = format!("{note}\n");
    let mut lines = note.lines();
    let (_origin, n, r) = (lines.next(), lines.next(), lines.next());
    if n != Some(size.to_string().as_str()) {
        return Err(bad("names another tree size than the proof"));
    }
    let named_root = r.and_then(|r| b64(r, "root").ok());
    if named_root.as_deref() != Some(root.as_slice()) {
        return Err(bad("names another root hash than the proof"));
    }
    let signed_by_log = signatures.lines().any(|line| {
        let Some(rest) = line.strip_prefix("\u{2014} ") else {
            return false;
        };
        let Some((_, sig)) = rest.rsplit_once(' ') else {
            return false;
        };
        match b64(sig, "checkpoint signature") {
            Ok(bytes) if bytes.len() > 4 && bytes[..4] == log.id[..4] => {
                log.key.verifies(Hash::Sha256, note.as_bytes(), &bytes[4..])
            }
            _ => false,
        }
    });
    if signed_by_log {
        Ok(())
    } else {
        Err(bad("carries no signature that verifies with the log's key"))
    }
}

/// The body records this signature, over this content, by this certificate.
fn check_body(
    body: &[u8],
    kind: &str,
    recorded: &Recorded<'_>,
    signer: &[u8],
) -> Result<(), String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|_| "the log entry's body is not JSON".to_string())?;
    let at = |p: &str| doc.pointer(p).and_then(Value::as_str);
    if doc.get("kind").and_then(Value::as_str) != Some(kind) {
        return Err("the log entry's body is not of the kind the entry names".into());
    }
    let differs = |what: &str| {
        Err(format!(
            "the transparency log entry records another {what} than the bundle carries: it is another signature's entry"
        ))
    };
    let (hash, signature, key) = match (kind, recorded) {
        (
            "dsse",
            Recorded::Dsse {
                payload_sha256,
                signature,
            },
        ) => {
            let sigs = doc
                .pointer("/spec/signatures")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let [one] = sigs else {
                return differs("number of signatures");
            };
            (
                (
                    at("/spec/payloadHash/algorithm"),
                    at("/spec/payloadHash/value"),
                    payload_sha256,
                ),
                (one.get("signature").and_then(Value::as_str), *signature),
                one.get("verifier").and_then(Value::as_str),
            )
        }
        ("hashedrekord", Recorded::Hashed { sha256, signature }) => (
            (
                at("/spec/data/hash/algorithm"),
                at("/spec/data/hash/value"),
                sha256,
            ),
            (at("/spec/signature/content"), *signature),
            at("/spec/signature/publicKey/content"),
        ),
        _ => return differs("kind of signature"),
    };
    if hash.0 != Some("sha256") || hash.1 != Some(Sha256(*hash.2).hex().as_str()) {
        return differs("signed content");
    }
    let logged_signature = signature.0.and_then(|s| b64(s, "signature").ok());
    if logged_signature.as_deref() != Some(signature.1) {
        return differs("signature");
    }
    let logged_signer = key.and_then(|k| b64(k, "verifier").ok()).and_then(|pem| {
        x509_cert::der::pem::decode_vec(&pem)
            .ok()
            .map(|(_, der)| der)
    });
    if logged_signer.as_deref() != Some(signer) {
        return differs("certificate");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(n: u8) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update([0u8, n]);
        h.finalize().into()
    }

    /// RFC 9162's MTH, to check the audit-path walk against for every index of small trees.
    fn mth(leaves: &[[u8; 32]]) -> [u8; 32] {
        if leaves.len() == 1 {
            return leaves[0];
        }
        let k = leaves.len().next_power_of_two() / 2;
        node(&mth(&leaves[..k]), &mth(&leaves[k..]))
    }

    fn path(leaves: &[[u8; 32]], m: usize) -> Vec<[u8; 32]> {
        if leaves.len() == 1 {
            return vec![];
        }
        let k = leaves.len().next_power_of_two() / 2;
        if m < k {
            let mut p = path(&leaves[..k], m);
            p.push(mth(&leaves[k..]));
            p
        } else {
            let mut p = path(&leaves[k..], m - k);
            p.push(mth(&leaves[..k]));
            p
        }
    }

    #[test]
    fn every_leaf_of_small_trees_proves_and_a_changed_hash_does_not() {
        for size in 1..=17u8 {
            let leaves: Vec<_> = (0..size).map(leaf).collect();
            let root = mth(&leaves);
            for m in 0..size as usize {
                let p = path(&leaves, m);
                assert_eq!(root_of(m as u64, size as u64, leaves[m], &p), Some(root));
                if let Some(first) = p.first() {
                    let mut bad = p.clone();
                    bad[0] = node(first, first);
                    assert_ne!(root_of(m as u64, size as u64, leaves[m], &bad), Some(root));
                }
                // The size is bound by the signed checkpoint; the index is bound here.
                if (m ^ 1) < size as usize {
                    assert_ne!(
                        root_of((m ^ 1) as u64, size as u64, leaves[m], &p),
                        Some(root)
                    );
                }
            }
        }
        assert_eq!(root_of(3, 3, leaf(0), &[]), None);
    }
}
