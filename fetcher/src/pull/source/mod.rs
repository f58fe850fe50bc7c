//! Where modules come from: one module per scheme. Each streams the module into a cache
//! `Staging` and says what it resolved; the OCI source may instead answer that the image still
//! names a module the cache holds. `crate::pull` verifies, commits and records either way.

pub mod file;
pub mod http;
pub mod image_volume;
pub mod oci;

use crate::digest::Sha256;
use crate::error::FetchError;
use crate::oci::manifest::ImageDigests;
use crate::pull::pin::{Checked, Pins};
use crate::pull::PullRequest;
use crate::reference::Source;
use crate::settings::Settings;
use crate::store::cache::{Cache, Staging};
use crate::store::index::IndexFile;

/// What a source produced.
pub struct Fetched {
    /// What an `oci://` reference resolved to; `None` for file and HTTP.
    pub image: Option<ImageDigests>,
    /// The pins, checked against `image`.
    pub pin: Checked,
    pub body: Body,
    /// What a verify key's signature check found, when one applied.
    pub signature: Option<crate::oci::cosign::Verified>,
}

pub enum Body {
    /// Downloaded bytes, not yet verified.
    Staged(Staging),
    /// The image resolved to a manifest whose module is cached and intact: nothing downloaded.
    Cached(Sha256),
}

/// What a source may consult and write while it fetches.
pub struct Target<'a> {
    pub cache: &'a Cache,
    pub index: &'a IndexFile,
    pub settings: &'a Settings,
}

/// Fetches `source` for `req`.
pub async fn fetch(
    source: &Source,
    req: &PullRequest,
    pins: &Pins,
    target: &Target<'_>,
    mut staging: Staging,
) -> Result<Fetched, FetchError> {
    let staged = |staging| -> Result<Fetched, FetchError> {
        Ok(Fetched {
            image: None,
            pin: pins.check(None)?,
            body: Body::Staged(staging),
            signature: None,
        })
    };
    match source {
        Source::File(url) => {
            file::fetch(url, &mut staging).await?;
            staged(staging)
        }
        Source::Http(url) => {
            http::fetch(url, &mut staging, target.settings).await?;
            staged(crate::store::unbox::unbox(target.cache, staging)?)
        }
        Source::Oci(r) => oci::fetch(r, req, pins, target, staging).await,
    }
}
