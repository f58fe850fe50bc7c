//! Where modules come from: one module per scheme, each streaming into a cache `Staging`.

pub mod file;
pub mod http;

use crate::cache::Staging;
use crate::error::FetchError;
use crate::settings::Settings;

/// Streams the resource at `url` into `staging`.
pub async fn fetch(
    url: &url::Url,
    staging: &mut Staging,
    settings: &Settings,
) -> Result<(), FetchError> {
    match url.scheme() {
        "file" => file::fetch(url, staging).await,
        "http" | "https" => http::fetch(url, staging, settings).await,
        other => Err(FetchError::UnsupportedScheme {
            scheme: other.to_string(),
        }),
    }
}
