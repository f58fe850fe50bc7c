//! Cosign signatures, key-based and offline: what a module must carry before it is cached
//! when a verify key is set, and what `push --sign-key` writes.
//!
//! Cosign stores a signature in one of two formats and three places, and each is read:
//! a Sigstore bundle (cosign 3's default; `bundle`) attached as an OCI 1.1 referrer, listed by
//! the referrers API or, on a registry without it, by the fallback tag `sha256-<hex>`
//! (`referrers`); and the legacy simple-signing payload under the tag `sha256-<hex>.sig`
//! (`legacy`). Bundles are looked for first, as `cosign verify` does, and the `.sig` tag only
//! when none verifies. Everything is read through the pull's own `Distribution` (the address
//! guard, that registry's credentials, the per-read deadline), each part within a bound
//! checked before it is read.

pub use crate::error::SignatureError;

mod bundle;
mod legacy;
pub mod referrers;

pub use bundle::{pae, statement, IN_TOTO, SIGN_PREDICATE};
pub use legacy::{payload, signature_tag, LAYERS_LIMIT, SIGNATURE_ANNOTATION, SIMPLE_SIGNING};

use crate::digest::Digest;
use crate::error::FetchError;
use crate::keys::VerifyKey;
use crate::oci::distribution::Distribution;
use crate::oci::manifest::ImageDigests;

pub use crate::signed::{Format, Signer, Storage, Verified};

/// Checks one Sigstore bundle by key, as a pull checks each bundle it finds: the CPU side of a
/// verification, without the registry (what `make bench` times).
pub fn verify_bundle(
    key: &VerifyKey,
    digest: &Digest,
    bundle: &[u8],
) -> Result<Format, SignatureError> {
    bundle::verify(key, digest, "the bundle", bundle)
}

/// Checks that the image `image` resolved to is signed by every key in `keys`, and says what
/// verified (`None` when `keys` is empty: nothing is read then). The manifest's signature,
/// or (for an image chosen from an index) the index's, which covers the manifest by its
/// digest. A caller that only needs the check can discard the outcome (`verify(..).await?;`).
pub async fn verify(
    d: &Distribution,
    image: &ImageDigests,
    keys: &[VerifyKey],
) -> Result<Option<Verified>, FetchError> {
    if keys.is_empty() {
        return Ok(None);
    }
    let first = check_digest(d, &image.manifest, keys).await;
    let verified = match (first, image.index) {
        (Err(FetchError::Signature(SignatureError::Missing { .. })), Some(index)) => {
            check_digest(d, &index, keys).await
        }
        (outcome, _) => outcome,
    }?;
    for s in &verified.signers {
        tracing::info!(
            digest = %verified.digest,
            key = %s.key,
            storage = ?s.storage,
            format = ?s.format,
            at = %s.at,
            "cosign signature verified"
        );
    }
    Ok(Some(verified))
}

async fn check_digest(
    d: &Distribution,
    digest: &Digest,
    keys: &[VerifyKey],
) -> Result<Verified, FetchError> {
    let (storage, candidates) = referrers::list(d, digest).await?;
    let mut bundles = Vec::with_capacity(candidates.len());
    let mut legacy_referrers = Vec::new();
    for c in &candidates {
        let at = format!("referrer {}", c.digest);
        if c.legacy {
            if let Some(entries) = legacy::read_entries(d, &c.digest.to_string()).await? {
                legacy_referrers.push((at, entries));
            }
        } else {
            bundles.push((at, referrers::read_bundle(d, digest, c).await?));
        }
    }
    let tag = signature_tag(digest);
    let mut legacy_entries = None;
    let mut signers = Vec::with_capacity(keys.len());
    for key in keys {
        let mut first = None;
        for (at, bundle) in &bundles {
            let outcome = bundle
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|b| bundle::verify(key, digest, at, b));
            match outcome {
                Ok(format) => {
                    signers.push(Signer {
                        key: key.spki_id(),
                        storage,
                        format,
                        at: at.clone(),
                    });
                    break;
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        for (at, entries) in &legacy_referrers {
            if signed_by(&signers, key) {
                break;
            }
            match legacy::check(key, digest, at, entries) {
                Ok(()) => signers.push(Signer {
                    key: key.spki_id(),
                    storage,
                    format: Format::SimpleSigning,
                    at: at.clone(),
                }),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        if signed_by(&signers, key) {
            continue;
        }
        if legacy_entries.is_none() {
            legacy_entries = Some(legacy::read_entries(d, &tag).await?);
        }
        let refusal = match legacy_entries.as_ref().and_then(Option::as_ref) {
            Some(entries) => match legacy::check(key, digest, &tag, entries) {
                Ok(()) => {
                    signers.push(Signer {
                        key: key.spki_id(),
                        storage: Storage::SignatureTag,
                        format: Format::SimpleSigning,
                        at: tag.clone(),
                    });
                    continue;
                }
                // A bundle's reason first: it is what cosign 3 wrote.
                Err(e) => first.unwrap_or(e),
            },
            None => first.unwrap_or_else(|| SignatureError::Missing {
                repository: format!("{}/{}", d.registry(), d.repository()),
                digest: digest.to_string(),
                searched: match storage {
                    Storage::ReferrersApi => "the referrers API".into(),
                    _ => format!("the tag {}", referrers::fallback_tag(digest)),
                },
                tag: tag.clone(),
            }),
        };
        return Err(refusal.into());
    }
    Ok(Verified {
        digest: *digest,
        signers,
    })
}

fn signed_by(signers: &[Signer], key: &VerifyKey) -> bool {
    signers.iter().any(|s| s.key == key.spki_id())
}
