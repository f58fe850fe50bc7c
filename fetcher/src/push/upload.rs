//! The push half of the distribution API, on the connection `Registry::connect` made for push
//! (the guarded client, the protocol and the `pull,push` authorization its ping settled):
//! a blob is uploaded in two requests (`POST` opens an upload, `PUT ?digest=` sends it whole),
//! unless `HEAD` says the registry has it; the manifest goes last, under its tag.

use futures_util::StreamExt;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::{Method, StatusCode};

use super::layout::Blob;
use super::PushError;
use crate::error::FetchError;
use crate::net;
use crate::oci::distribution::{Distribution, MANIFEST_LIMIT};
use crate::oci::manifest as media;
use crate::progress::{Event, Progress};

/// How much of a blob one piece of the upload body holds: one progress step.
const PIECE: usize = 64 * 1024;

/// The manifest digest `tag` names now, if it names one.
pub async fn current_digest(d: &Distribution, tag: &str) -> Result<Option<String>, PushError> {
    match d.manifest(tag, &media::accept_manifests()).await {
        Ok((_, digest)) => Ok(Some(digest.to_string())),
        // Only a shortcut: a registry that cannot say (an odd answer to a GET) gets the push.
        Err(FetchError::NotFound { .. } | FetchError::Registry { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether the repository already holds `digest`.
pub async fn has_blob(d: &Distribution, digest: &str) -> Result<bool, PushError> {
    let rest = format!("{}/blobs/{digest}", d.repository());
    let resp = send(d, d.request(Method::HEAD, &rest)).await?;
    match resp.status() {
        s if s.is_success() => Ok(true),
        StatusCode::NOT_FOUND => Ok(false),
        _ => Err(refusal(d, resp, &format!("/v2/{rest}"), "a blob").await),
    }
}

/// Uploads `blob` unless the repository already holds it.
pub async fn ensure_blob(
    d: &Distribution,
    blob: &Blob,
    progress: &Progress,
) -> Result<(), PushError> {
    if !has_blob(d, &blob.digest).await? {
        put_blob(d, blob, progress).await?;
    }
    Ok(())
}

/// Uploads one blob; the module's upload reports to `progress`.
pub async fn put_blob(d: &Distribution, blob: &Blob, progress: &Progress) -> Result<(), PushError> {
    let open = format!("{}/blobs/uploads/", d.repository());
    let resp = send_upload(
        d,
        d.upload(Method::POST, &format!("/v2/{open}"))?
            .header(CONTENT_LENGTH, "0"),
        "the upload's opening POST",
    )
    .await?;
    if resp.status() != StatusCode::ACCEPTED {
        return Err(refusal(d, resp, &format!("/v2/{open}"), "an upload").await);
    }
    let location = resp
        .headers()
        .get(LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| FetchError::Registry {
            message: format!(
                "{} opened an upload without a Location to send it to",
                d.registry()
            ),
        })?;
    let shown: String = location.chars().take(200).collect();
    let mut req = d.upload(Method::PUT, &location)?;
    req = req
        .query(&[("digest", blob.digest.as_str())])
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, blob.bytes.len());
    req = if blob.is_module {
        progress.emit(Event::Started {
            total: Some(blob.bytes.len() as u64),
        });
        req.body(reqwest::Body::wrap_stream(pieces(blob, progress.clone())))
    } else {
        req.body(blob.bytes.to_vec())
    };
    let resp = send_upload(d, req, "a blob's PUT").await?;
    if !resp.status().is_success() {
        return Err(refusal(d, resp, &shown, "a blob").await);
    }
    Ok(())
}

/// The blob in pieces, each reported to `progress` as it is handed to the connection.
fn pieces(
    blob: &Blob,
    progress: Progress,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    let bytes = blob.bytes.clone();
    let count = bytes.len().div_ceil(PIECE);
    futures_util::stream::iter(0..count).map(move |i| {
        let piece = bytes[i * PIECE..((i + 1) * PIECE).min(bytes.len())].to_vec();
        progress.emit(Event::Advanced(piece.len() as u64));
        Ok(piece)
    })
}

/// Puts the manifest under `tag`; a digest the registry reports must be the one computed.
pub async fn put_manifest(
    d: &Distribution,
    tag: &str,
    manifest: &[u8],
    digest: &str,
) -> Result<(), PushError> {
    if manifest.len() > MANIFEST_LIMIT {
        return Err(FetchError::ResponseTooLarge {
            what: "manifest",
            limit: MANIFEST_LIMIT,
        }
        .into());
    }
    let rest = format!("{}/manifests/{tag}", d.repository());
    let req = d
        .upload(Method::PUT, &format!("/v2/{rest}"))?
        .header(CONTENT_TYPE, media_type_of(manifest))
        .body(manifest.to_vec());
    let resp = send_upload(d, req, "the manifest's PUT").await?;
    if !resp.status().is_success() {
        return Err(refusal(d, resp, &format!("/v2/{rest}"), "the manifest").await);
    }
    let reported = resp
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok());
    if let Some(reported) = reported.filter(|r| *r != digest) {
        return Err(FetchError::ChecksumMismatch {
            expected: digest.to_string(),
            actual: reported.chars().take(100).collect(),
        }
        .into());
    }
    Ok(())
}

/// The document's own `mediaType` (an index says it is one), else an OCI image manifest.
pub(super) fn media_type_of(manifest: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(manifest)
        .ok()
        .and_then(|v| v["mediaType"].as_str().map(str::to_string))
        .filter(|t| media::MANIFESTS.contains(&t.as_str()) || media::INDEXES.contains(&t.as_str()))
        .unwrap_or_else(|| media::OCI_MANIFEST.to_string())
}

async fn send(
    d: &Distribution,
    req: reqwest::RequestBuilder,
) -> Result<reqwest::Response, PushError> {
    let resp = req.send().await.map_err(|e| d.send_error(e))?;
    if let Some(e) = net::unfollowed_redirect(&resp) {
        return Err(e.into());
    }
    Ok(resp)
}

/// [`send`] for an upload request, whose client follows no redirect: a redirect is refused
/// ([`PushError::UploadRedirected`]).
async fn send_upload(
    d: &Distribution,
    req: reqwest::RequestBuilder,
    what: &'static str,
) -> Result<reqwest::Response, PushError> {
    let resp = req.send().await.map_err(|e| d.send_error(e))?;
    let status = resp.status();
    if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
        let to = resp
            .headers()
            .get(LOCATION)
            // Without its query, where an upload's session state goes.
            .map(|l| {
                let l = String::from_utf8_lossy(l.as_bytes());
                crate::shown::shown(l.split('?').next().unwrap_or_default())
            })
            .unwrap_or_else(|| "nowhere (no Location)".into());
        return Err(PushError::UploadRedirected {
            registry: d.registry().to_string(),
            what,
            status: status.as_u16(),
            to,
        });
    }
    Ok(resp)
}

/// A registry's no to a push request: the credentials lack write access, the registry does
/// not take this kind of content, or what its error says.
async fn refusal(
    d: &Distribution,
    resp: reqwest::Response,
    url: &str,
    what: &'static str,
) -> PushError {
    let status = resp.status().as_u16();
    if matches!(status, 401 | 403) {
        return PushError::Denied {
            registry: d.registry().to_string(),
            repository: d.repository().to_string(),
            status,
        };
    }
    let error = d.status_error(resp, url).await;
    let text = error.to_string();
    // 415, or the distribution spec's MANIFEST_INVALID / unsupported media type answers.
    if status == 415
        || text.contains("MANIFEST_INVALID")
        || text.contains("ManifestInvalid")
        || text.to_ascii_lowercase().contains("media type")
    {
        return PushError::MediaTypeRefused {
            registry: d.registry().to_string(),
            what,
            detail: text,
        };
    }
    match error {
        FetchError::Unauthorized { .. } => PushError::Denied {
            registry: d.registry().to_string(),
            repository: d.repository().to_string(),
            status,
        },
        other => other.into(),
    }
}
