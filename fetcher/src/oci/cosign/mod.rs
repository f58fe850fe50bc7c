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
mod keyless;
mod legacy;
pub mod referrers;

pub use bundle::{pae, statement, IN_TOTO, SIGN_PREDICATE};
pub use legacy::{payload, signature_tag, LAYERS_LIMIT, SIGNATURE_ANNOTATION, SIMPLE_SIGNING};

use crate::digest::Digest;
use crate::error::FetchError;
use crate::keyless::Identity;
use crate::keys::VerifyKey;
use crate::oci::distribution::Distribution;
use crate::oci::manifest::ImageDigests;

pub use crate::signed::{Format, Signer, Storage, Verified};

/// What a module's signature must meet: a key's, or a keyless identity's under a trusted root.
#[derive(Clone, Debug, PartialEq)]
pub enum Requirement {
    Key(VerifyKey),
    Identity(Identity),
}

impl Requirement {
    /// How the index and `--json` name it: a key's full SPKI id, or the policy's id.
    pub fn id(&self) -> String {
        match self {
            Requirement::Key(k) => k.spki_id(),
            Requirement::Identity(i) => i.id().to_string(),
        }
    }
}

/// Checks one Sigstore bundle, as a pull checks each bundle it finds: the CPU side of a
/// verification, without the registry (what `make bench` times).
pub fn verify_bundle(
    requirement: &Requirement,
    digest: &Digest,
    bundle: &[u8],
) -> Result<Format, SignatureError> {
    bundle::verify(requirement, digest, "the bundle", bundle).map(|c| c.format)
}

/// Checks that the image `image` resolved to is signed as every requirement asks, and says
/// what verified (`None` when `trust` is empty: nothing is read then). The manifest's
/// signature, or (for an image chosen from an index) the index's, which covers the manifest
/// by its digest. A caller that only needs the check can discard the outcome
/// (`verify(..).await?;`).
pub async fn verify(
    d: &Distribution,
    image: &ImageDigests,
    trust: &[Requirement],
) -> Result<Option<Verified>, FetchError> {
    if trust.is_empty() {
        return Ok(None);
    }
    let first = check_digest(d, &image.manifest, trust).await;
    let verified = match (first, image.index) {
        (Err(FetchError::Signature(SignatureError::Missing { .. })), Some(index)) => {
            check_digest(d, &index, trust).await
        }
        (outcome, _) => outcome,
    }?;
    for s in &verified.signers {
        tracing::info!(
            digest = %verified.digest,
            by = %s.key,
            identity = s.identity.as_deref().unwrap_or(""),
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
    trust: &[Requirement],
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
    let mut signers = Vec::with_capacity(trust.len());
    for requirement in trust {
        let id = requirement.id();
        let signer = |storage, format, at: &str, identity| Signer {
            key: id.clone(),
            storage,
            format,
            at: at.to_string(),
            identity,
        };
        let mut first = None;
        let mut found = None;
        for (at, bundle) in &bundles {
            let outcome = bundle
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|b| bundle::verify(requirement, digest, at, b));
            match outcome {
                Ok(c) => {
                    found = Some(signer(storage, c.format, at, c.identity));
                    break;
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        for (at, entries) in &legacy_referrers {
            if found.is_some() {
                break;
            }
            match legacy::check(requirement, digest, at, entries) {
                Ok(identity) => found = Some(signer(storage, Format::SimpleSigning, at, identity)),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        if let Some(s) = found {
            signers.push(s);
            continue;
        }
        if legacy_entries.is_none() {
            legacy_entries = Some(legacy::read_entries(d, &tag).await?);
        }
        let refusal = match legacy_entries.as_ref().and_then(Option::as_ref) {
            Some(entries) => match legacy::check(requirement, digest, &tag, entries) {
                Ok(identity) => {
                    signers.push(signer(
                        Storage::SignatureTag,
                        Format::SimpleSigning,
                        &tag,
                        identity,
                    ));
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
