//! Sigstore bundles attached to an image as OCI 1.1 referrers, as cosign 3 stores them: a
//! manifest whose `subject` is the image and whose one layer is the bundle. They are listed by
//! the registry's referrers API (`GET /v2/<name>/referrers/<digest>`), or, on a registry
//! without it, by the image index under the fallback tag `sha256-<hex>` that writers keep.
//!
//! The listing's `artifactType` is not trusted either way: cosign releases before 3.1 wrote
//! the empty type there for bundles (cosign#4422), and a listing may lie. An entry is read
//! unless it names a type that is neither a bundle nor that empty type, and what decides is
//! the referrer manifest itself: its own artifact type, its one layer, its subject.

use serde_json::Value;

use super::{SignatureError, Storage};
use crate::digest::{parse_digest, Digest};
use crate::error::FetchError;
use crate::net;
use crate::oci::distribution::Distribution;
use crate::shown::shown;

/// The bundle media type cosign 3 writes (the manifest's `artifactType`, its layer's type,
/// the bundle's own `mediaType`).
pub const BUNDLE_V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The bundle media types read from a registry: v0.3 in either spelling (cosign refuses older
/// ones from a registry too).
pub const BUNDLE_TYPES: &[&str] = &[
    BUNDLE_V03,
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
];
/// The artifact type of a legacy simple-signing manifest stored as a referrer
/// (`cosign sign --new-bundle-format=false --registry-referrers-mode=oci-1-1`).
pub const LEGACY_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// The artifact type cosign before 3.1 listed its bundles under (cosign#4422).
pub const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The media type of a referrers listing and of the fallback tag's index.
pub const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// A listing is a few hundred bytes per referrer.
pub const LISTING_LIMIT: usize = 1 << 20;
/// Bundle referrers read per image, newest (last listed) first: one per signer is usual.
pub const REFERRERS_LIMIT: usize = 8;
/// A bundle with a certificate and a log entry is a few KiB.
pub const BUNDLE_LIMIT: u64 = 256 << 10;

/// The fallback tag of `digest`'s referrers.
pub fn fallback_tag(digest: &Digest) -> String {
    format!("sha256-{}", digest.0.hex())
}

/// One listed referrer that may hold a signature.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub digest: Digest,
    /// Listed as a legacy simple-signing manifest, not a bundle.
    pub legacy: bool,
}

/// `digest`'s referrers that may be bundles, newest first, and where they were listed.
pub(crate) async fn list(
    d: &Distribution,
    digest: &Digest,
) -> Result<(Storage, Vec<Candidate>), FetchError> {
    let rest = format!("{}/referrers/{digest}", d.repository());
    let resp = d
        .request(reqwest::Method::GET, &rest)
        .header(reqwest::header::ACCEPT, INDEX_TYPE)
        .send()
        .await
        .map_err(|e| d.send_error(e))?;
    if let Some(e) = net::unfollowed_redirect(&resp) {
        return Err(e);
    }
    let (storage, bytes) = match resp.status().as_u16() {
        200..=299 => (
            Storage::ReferrersApi,
            net::read_limited(resp, LISTING_LIMIT, "referrers listing")
                .await
                .map_err(listing_error)?,
        ),
        // No referrers API: the fallback tag, which a 404 leaves empty.
        404 | 405 => {
            let tag = fallback_tag(digest);
            match d.manifest(&tag, INDEX_TYPE).await {
                Ok((bytes, _)) => (Storage::ReferrersTag, bytes),
                Err(FetchError::NotFound { .. }) => return Ok((Storage::ReferrersTag, vec![])),
                Err(e) => return Err(listing_error(e)),
            }
        }
        _ => return Err(d.status_error(resp, &format!("/v2/{rest}")).await),
    };
    Ok((storage, candidates(&bytes)))
}

fn listing_error(e: FetchError) -> FetchError {
    match e {
        FetchError::ResponseTooLarge { limit, .. } => SignatureError::Oversized {
            tag: "the referrers listing".into(),
            what: "referrers listing",
            size: limit as u64 + 1,
            limit: limit as u64,
        }
        .into(),
        e => e,
    }
}

/// The entries of a listing that may be bundles: image manifests whose listed type is a
/// bundle's, the empty type, or absent. Anything unreadable lists nothing.
fn candidates(bytes: &[u8]) -> Vec<Candidate> {
    let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
        tracing::warn!("the referrers listing is not JSON: no bundle read from it");
        return vec![];
    };
    let entries = doc
        .get("manifests")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out: Vec<Candidate> = entries
        .iter()
        .rev()
        .filter(|e| {
            let kind = e.get("artifactType").and_then(Value::as_str);
            let media = e.get("mediaType").and_then(Value::as_str);
            media == Some(crate::oci::manifest::OCI_MANIFEST)
                && kind.is_none_or(|k| {
                    k == EMPTY_TYPE || k == LEGACY_TYPE || BUNDLE_TYPES.contains(&k)
                })
        })
        .filter_map(|e| {
            let digest = parse_digest(e.get("digest")?.as_str()?).ok()?;
            let legacy = e.get("artifactType").and_then(Value::as_str) == Some(LEGACY_TYPE);
            Some(Candidate { digest, legacy })
        })
        .collect();
    if out.len() > REFERRERS_LIMIT {
        tracing::warn!(
            listed = out.len(),
            read = REFERRERS_LIMIT,
            "more bundle referrers than are read: the newest are"
        );
        out.truncate(REFERRERS_LIMIT);
    }
    out
}

/// The bundle a referrer holds, if its manifest is a bundle referrer of `subject`: the
/// refusal when it is not (which does not end the search).
pub(super) async fn read_bundle(
    d: &Distribution,
    subject: &Digest,
    c: &Candidate,
) -> Result<Result<Vec<u8>, SignatureError>, FetchError> {
    let at = format!("referrer {}", c.digest);
    let malformed = |reason: String| {
        Ok(Err(SignatureError::Malformed {
            tag: at.clone(),
            reason,
        }))
    };
    let accept = crate::oci::manifest::OCI_MANIFEST;
    let bytes = match d.manifest(&c.digest.to_string(), accept).await {
        Ok((bytes, _)) => bytes,
        Err(FetchError::NotFound { .. }) => return malformed("it is listed but absent".into()),
        Err(FetchError::ResponseTooLarge { .. }) => {
            return malformed("its manifest is over the manifest size limit".into())
        }
        Err(e @ FetchError::ChecksumMismatch { .. }) => return malformed(e.to_string()),
        Err(e) => return Err(e),
    };
    let Ok(doc) = serde_json::from_slice::<Value>(&bytes) else {
        return malformed("its manifest is not JSON".into());
    };
    let text = |p: &str| doc.pointer(p).and_then(Value::as_str);
    if let Some(kind) = text("/artifactType").filter(|k| !BUNDLE_TYPES.contains(k)) {
        return malformed(format!(
            "its manifest's artifactType is {:?}, not a Sigstore bundle v0.3",
            shown(kind)
        ));
    }
    if text("/subject/digest") != Some(&subject.to_string()) {
        return malformed(format!(
            "its subject is {:?}, not {subject}",
            text("/subject/digest").map(shown)
        ));
    }
    let layers = doc
        .get("layers")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let [layer] = layers else {
        return malformed(format!("it has {} layers, not one bundle", layers.len()));
    };
    let media = layer.get("mediaType").and_then(Value::as_str).unwrap_or("");
    if !BUNDLE_TYPES.contains(&media) {
        return malformed(format!(
            "its layer is {:?}, not a Sigstore bundle v0.3",
            shown(media)
        ));
    }
    let size = layer
        .get("size")
        .and_then(Value::as_u64)
        .unwrap_or(u64::MAX);
    if size > BUNDLE_LIMIT {
        return Ok(Err(SignatureError::Oversized {
            tag: at,
            what: "bundle",
            size,
            limit: BUNDLE_LIMIT,
        }));
    }
    let blob = match layer
        .get("digest")
        .and_then(Value::as_str)
        .map(parse_digest)
    {
        Some(Ok(digest)) => digest,
        _ => return malformed("its layer has no sha256 digest".into()),
    };
    let resp = match d.blob(&blob).await {
        Ok(resp) => resp,
        Err(FetchError::NotFound { .. }) => {
            return malformed(format!("its bundle {blob} is not in the repository"))
        }
        Err(e) => return Err(e),
    };
    let bundle = match net::read_limited(resp, size as usize, "bundle").await {
        Ok(b) => b,
        Err(FetchError::ResponseTooLarge { .. }) => {
            return malformed(format!(
                "its bundle is longer than the {size} bytes its descriptor declares"
            ))
        }
        Err(e) => return Err(e),
    };
    if Digest(crate::digest::Sha256::of(&bundle)) != blob {
        return malformed(format!("its bundle does not match its digest {blob}"));
    }
    Ok(Ok(bundle))
}
