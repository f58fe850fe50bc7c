//! Pulls Wasm modules for Envoy the way Istio's agent does, into a verified,
//! content-addressed cache, and rewrites Envoy configuration to load the cached file.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wasm_fetcher::FetchError> {
//! use wasm_fetcher::{pull, Cache, PullRequest, Settings};
//! let cache = Cache::open("/var/cache/wasm".as_ref())?;
//! let pulled = pull(
//!     &PullRequest { url: "https://example.com/filter.wasm".into(), sha256: None },
//!     &cache,
//!     &Settings::from_env()?,
//! ).await?;
//! println!("{}", pulled.path.display());
//! # Ok(()) }
//! ```

pub mod bootstrap;
pub mod cache;
pub mod error;
pub mod settings;
pub mod source;
pub mod verify;

use std::path::PathBuf;

pub use cache::Cache;
pub use error::FetchError;
pub use settings::Settings;
pub use verify::Sha256;

#[derive(Debug, Clone)]
pub struct PullRequest {
    pub url: String,
    /// The sha256 the module must have (the module's bytes, for file and HTTP sources).
    pub sha256: Option<Sha256>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Pulled {
    pub path: PathBuf,
    pub sha256: String,
    pub from_cache: bool,
}

/// Serves a pinned module from the cache when present; otherwise fetches, verifies and stores.
pub async fn pull(
    req: &PullRequest,
    cache: &Cache,
    settings: &Settings,
) -> Result<Pulled, FetchError> {
    let url = url::Url::parse(&req.url).map_err(|e| FetchError::BadUrl {
        reason: e.to_string(),
    })?;
    if !matches!(url.scheme(), "file" | "http" | "https") {
        return Err(FetchError::UnsupportedScheme {
            scheme: url.scheme().to_string(),
        });
    }
    if let Some(sha) = &req.sha256 {
        if let Some(path) = cache.lookup(sha) {
            return Ok(Pulled {
                path,
                sha256: sha.hex(),
                from_cache: true,
            });
        }
    }
    let mut staging = cache.staging(settings.max_size)?;
    source::fetch(&url, &mut staging, settings).await?;
    let (path, sha) = cache.commit(staging, req.sha256.as_ref())?;
    Ok(Pulled {
        path,
        sha256: sha.hex(),
        from_cache: false,
    })
}
