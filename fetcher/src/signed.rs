//! What a cosign signature check found: kept on the ground floor because the check
//! (`oci::cosign`) reports it, a pull returns it, and the index (`store::index`) remembers it,
//! so that a module verified once is served from the cache without asking the registry again.

use crate::digest::Digest;

/// Where a signature was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Storage {
    /// Listed by the registry's referrers API.
    ReferrersApi,
    /// Listed by the referrers fallback tag `sha256-<hex>`.
    ReferrersTag,
    /// The legacy signature tag `sha256-<hex>.sig`.
    SignatureTag,
}

/// What was signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// A bundle with a DSSE envelope around an in-toto statement (cosign 3's default).
    DsseBundle,
    /// A bundle with a signature over the image manifest's digest.
    MessageBundle,
    /// The simple-signing payload (cosign 2's default).
    SimpleSigning,
}

/// One requirement's signature (a key's, or a keyless identity's), as it was found and checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Signer {
    /// `sha256:` of the key's SPKI DER in full, or a keyless policy's `identity:sha256:` id:
    /// what a later pull compares its requirements with.
    pub key: String,
    pub storage: Storage,
    pub format: Format,
    /// The referrer manifest or signature tag that held it.
    pub at: String,
    /// For a keyless signature, who its certificate names (subject and issuer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// An image whose signatures verified: the digest they sign (the manifest's, or the index's
/// that holds it) and one signature per key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Verified {
    pub digest: Digest,
    pub signers: Vec<Signer>,
}

impl Verified {
    /// Whether every key in `keys` (full `sha256:` SPKI ids) signed.
    pub fn covers(&self, keys: &[String]) -> bool {
        keys.iter()
            .all(|k| self.signers.iter().any(|s| &s.key == k))
    }

    /// Adds `other`'s signers for the same digest (a module verified with another key too).
    pub fn merge(&mut self, other: &Verified) {
        for s in &other.signers {
            if !self.signers.iter().any(|o| o.key == s.key) {
                self.signers.push(s.clone());
            }
        }
    }
}
