//! `oci://` sources: the image resolved through `crate::oci`'s registry client, the pins
//! checked against its digests, and the module's layer downloaded unless the cache already
//! holds the module the manifest names.

use crate::error::FetchError;
use crate::oci::cosign::Requirement;
use crate::oci::registry::Registry;
use crate::pull::pin::Pins;
use crate::pull::source::{Body, Fetched, Target};
use crate::pull::PullRequest;
use crate::reference::oci::OciRef;
use crate::store::cache::Staging;

/// Resolves the image, checks the pins against it, and downloads the module unless the
/// manifest it resolved to is one whose module the cache holds (a tag that did not move).
pub async fn fetch(
    r: &OciRef,
    req: &PullRequest,
    pins: &Pins,
    target: &Target<'_>,
    staging: Staging,
) -> Result<Fetched, FetchError> {
    let creds = crate::oci::auth::credentials(req.pull_secret.as_deref(), &r.registry).await?;
    let registry = Registry::new(r, creds, target.settings);
    let (connection, resolved) = registry.resolve(r, req.platform.as_deref()).await?;
    let image = resolved.digests;
    let pin = pins.check(Some(&image))?;
    pin.check_declared(resolved.module_sha256()?)?;
    let keys = req.requirements(target.settings)?;
    let ids: Vec<String> = keys.iter().map(Requirement::id).collect();
    // A manifest verified before with these keys is not checked at the registry again.
    let remembered = match keys.is_empty() {
        true => None,
        false => target
            .index
            .load()?
            .modules
            .values()
            .filter(|m| m.manifest_digest == Some(image.manifest))
            .find_map(|m| m.signed_by(&ids).cloned()),
    };
    let signature = match remembered {
        Some(v) => Some(v),
        None => crate::oci::cosign::verify(&connection, &image, &keys).await?,
    };
    let unchanged = target
        .index
        .load()?
        .module_of_manifest(target.cache, image.manifest, pins.any())
        .filter(|sha| pin.accepts(sha));
    let body = match unchanged {
        Some(sha) => Body::Cached(sha),
        None => Body::Staged(
            registry
                .download(&connection, target.cache, &resolved, staging)
                .await?,
        ),
    };
    Ok(Fetched {
        image: Some(image),
        pin,
        body,
        signature,
    })
}
