//! `oci://` sources, through `oci-client`: the manifest first (so an unchanged digest costs no
//! layer download), an image index resolved by platform, then the one layer that holds the
//! module, in any of the layouts in use:
//! - a Wasm artifact with exactly one Wasm-typed layer (CNCF, wasm-to-oci, OCI 1.1), whatever
//!   its config;
//! - Istio's 2-layer artifact (`application/vnd.module.wasm.content.layer.v1+wasm`);
//! - a Docker or OCI image whose last layer is a tar.gz holding `plugin.wasm`.

use std::io::Read;

use futures_util::StreamExt;
use oci_client::client::{BlobResponse, ClientConfig, ClientProtocol};

use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::Value;

use crate::cache::Staging;
use crate::error::FetchError;
use crate::reference::OciRef;
use crate::settings::Settings;

/// Media types, in one place.
pub mod media {
    pub const WASM_LAYERS: &[&str] = &[
        "application/wasm",
        "application/vnd.wasm.content.layer.v1+wasm",
        "application/vnd.module.wasm.content.layer.v1+wasm",
    ];
    pub const ISTIO_WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
    pub const TAR_GZIP_LAYERS: &[&str] = &[
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.oci.image.layer.v1.tar+gzip",
    ];
    pub const INDEXES: &[&str] = &[
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ];
    pub const MANIFESTS: &[&str] = &[
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ];
}

/// A resolved image: the manifest of the module's image, its digest, and the index digest
/// when the reference named an index.
pub struct Resolved {
    pub reference: Reference,
    pub manifest: OciImageManifest,
    pub manifest_digest: String,
    pub index_digest: Option<String>,
}

pub struct Registry {
    client: Client,
    auth: RegistryAuth,
    registry: String,
    transport: Transport,
    settings: Settings,
}

/// How a registry may be spoken to, from its address and `WASM_INSECURE_REGISTRIES` alone.
/// As Istio (go-containerregistry): a registry is reached over verified HTTPS unless it is
/// listed (or `*` is), which allows unverified TLS and plain HTTP; a loopback registry may
/// speak either, but a certificate it presents is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// HTTPS with verification, nothing else.
    Verified,
    /// Plain HTTP first (what a local registry almost always speaks: no handshake, no roots to
    /// load), then verified HTTPS when the server turns plain HTTP away.
    Loopback,
    /// HTTPS without verification, then plain HTTP when the server answers the handshake in HTTP.
    Insecure,
}

impl Transport {
    pub fn for_registry(r: &OciRef, settings: &Settings) -> Self {
        if settings.is_insecure_registry(&r.registry) {
            Transport::Insecure
        } else if r.is_loopback() {
            Transport::Loopback
        } else {
            Transport::Verified
        }
    }
}

/// The TLS handshake met a server that answered in plain HTTP.
fn speaks_plain_http(e: &OciDistributionError) -> bool {
    let text = crate::error::chain(e);
    text.contains("InvalidContentType") || text.contains("corrupt message")
}

/// A plain HTTP request met a server that wants TLS: it says 400 ("Client sent an HTTP request
/// to an HTTPS server", Go; nginx alike) or drops the connection.
fn wants_tls(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ServerError { code: 400, .. } => true,
        OciDistributionError::RequestError(e) => !e.is_timeout(),
        other => crate::error::chain(other).contains("HTTPS server"),
    }
}

fn map_err(registry: &str, e: OciDistributionError) -> FetchError {
    match e {
        OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::UnauthorizedError { .. } => FetchError::Unauthorized {
            registry: registry.to_string(),
        },
        OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => FetchError::Unauthorized {
            registry: registry.to_string(),
        },
        OciDistributionError::ImageManifestNotFoundError(m) => FetchError::NotFound { what: m },
        OciDistributionError::ServerError { code: 404, url, .. } => {
            FetchError::NotFound { what: url }
        }
        OciDistributionError::RegistryError { envelope, url } => {
            let text = format!("{envelope:?}");
            if text.contains("Unauthorized") || text.contains("Denied") {
                FetchError::Unauthorized {
                    registry: registry.to_string(),
                }
            } else if text.contains("Unknown") || text.contains("NotFound") {
                FetchError::NotFound { what: url }
            } else {
                FetchError::Registry {
                    message: format!("{url}: {text}"),
                }
            }
        }
        OciDistributionError::RequestError(e) if e.is_timeout() => FetchError::TimedOut {
            attempts: 1,
            per_attempt: std::time::Duration::ZERO,
        },
        OciDistributionError::RequestError(e) => {
            let message = crate::error::chain(&e);
            crate::error::untrusted_certificate(registry, &message)
                .unwrap_or(FetchError::Registry { message })
        }
        other => FetchError::Registry {
            message: other.to_string(),
        },
    }
}

impl Registry {
    pub fn new(r: &OciRef, auth: RegistryAuth, settings: &Settings) -> Self {
        let transport = Transport::for_registry(r, settings);
        let plain_http = transport == Transport::Loopback;
        Self {
            client: client(&r.registry, transport, plain_http, settings),
            auth,
            registry: r.registry.clone(),
            transport,
            settings: settings.clone(),
        }
    }

    /// The first request of a pull, which settles the protocol for the ones after it.
    async fn first_manifest(
        &mut self,
        reference: &Reference,
    ) -> Result<(Vec<u8>, String), FetchError> {
        let first = self.raw_manifest(reference).await;
        let switch_to_plain = match (&first, self.transport) {
            (Err(e), Transport::Loopback) if wants_tls(e) => false,
            (Err(e), Transport::Insecure) if speaks_plain_http(e) => true,
            _ => return first.map_err(|e| map_err(&self.registry, e)),
        };
        tracing::debug!(registry = %self.registry, switch_to_plain, "switching protocol");
        self.client = client(
            &self.registry,
            self.transport,
            switch_to_plain,
            &self.settings,
        );
        match self.raw_manifest(reference).await {
            Ok(found) => Ok(found),
            // The server did speak plain HTTP after all: its first answer is the one to report.
            Err(e) if !switch_to_plain && speaks_plain_http(&e) => {
                first.map_err(|e| map_err(&self.registry, e))
            }
            Err(e) => Err(map_err(&self.registry, e)),
        }
    }

    async fn raw_manifest(
        &self,
        reference: &Reference,
    ) -> Result<(Vec<u8>, String), OciDistributionError> {
        let accepted: Vec<&str> = media::MANIFESTS
            .iter()
            .chain(media::INDEXES)
            .copied()
            .collect();
        let (bytes, digest) = self
            .client
            .pull_manifest_raw(reference, &self.auth, &accepted)
            .await?;
        Ok((bytes.to_vec(), digest))
    }

    /// Fetches the manifest (and, for an index, the chosen child's).
    pub async fn resolve(
        &mut self,
        r: &OciRef,
        platform: Option<&str>,
    ) -> Result<Resolved, FetchError> {
        let reference = r.to_reference();
        let (bytes, digest) = self.first_manifest(&reference).await?;
        let doc: Value = serde_json::from_slice(&bytes).map_err(|e| FetchError::Registry {
            message: format!("manifest is not JSON: {e}"),
        })?;
        if doc.get("manifests").is_some() {
            let child = pick_child(
                &doc,
                platform,
                r.digest
                    .as_ref()
                    .map(|d| format!("sha256:{}", d.hex()))
                    .as_deref(),
            )?;
            let child_ref =
                Reference::with_digest(r.registry.clone(), r.repository.clone(), child.clone());
            let (bytes, child_digest) = self
                .raw_manifest(&child_ref)
                .await
                .map_err(|e| map_err(&self.registry, e))?;
            let manifest = parse_manifest(&bytes)?;
            return Ok(Resolved {
                reference: child_ref,
                manifest,
                manifest_digest: child_digest,
                index_digest: Some(digest),
            });
        }
        Ok(Resolved {
            reference,
            manifest: parse_manifest(&bytes)?,
            manifest_digest: digest,
            index_digest: None,
        })
    }

    /// Streams the module out of the image into `staging`.
    pub async fn download(
        &self,
        resolved: &Resolved,
        staging: &mut Staging,
        max_size: u64,
    ) -> Result<(), FetchError> {
        let layers = &resolved.manifest.layers;
        let wasm: Vec<&OciDescriptor> = layers
            .iter()
            .filter(|l| media::WASM_LAYERS.contains(&l.media_type.as_str()))
            .collect();
        let istio = layers
            .iter()
            .find(|l| l.media_type == media::ISTIO_WASM_LAYER);
        if layers.len() == 1 && wasm.len() == 1 {
            return self.stream_layer(resolved, wasm[0], staging).await;
        }
        if layers.len() == 2 {
            if let Some(l) = istio {
                return self.stream_layer(resolved, l, staging).await;
            }
        }
        if let Some(last) = layers
            .last()
            .filter(|l| media::TAR_GZIP_LAYERS.contains(&l.media_type.as_str()))
        {
            return self
                .extract_plugin_wasm(resolved, last, staging, max_size)
                .await;
        }
        Err(FetchError::UnsupportedLayout {
            found: layers.iter().map(|l| l.media_type.clone()).collect(),
        })
    }

    async fn stream_layer(
        &self,
        resolved: &Resolved,
        layer: &OciDescriptor,
        staging: &mut Staging,
    ) -> Result<(), FetchError> {
        if layer.size as u64 > staging.max_size() {
            return Err(FetchError::TooLarge {
                limit: staging.max_size(),
            });
        }
        // A range from 0 lets the registry answer 206, which oci-client passes through without
        // hashing: the staging file hashes every byte already, and hashing twice is what made a
        // 50 MiB pull CPU-bound. A registry that answers 200 is verified by both, still correct.
        let stream = self
            .client
            .pull_blob_stream_partial(&resolved.reference, layer, 0, None)
            .await
            .map_err(|e| map_err(&self.registry, e))?;
        let mut stream = match stream {
            BlobResponse::Full(s) | BlobResponse::Partial(s) => s,
        };
        staging.started(Some(layer.size as u64));
        while let Some(chunk) = stream.stream.next().await {
            let chunk = chunk.map_err(|e| FetchError::Registry {
                message: format!("reading layer {}: {e}", layer.digest),
            })?;
            staging.write(&chunk)?;
        }
        if staging.size() != layer.size as u64 {
            return Err(FetchError::Truncated {
                got: staging.size(),
                expected: layer.size as u64,
            });
        }
        // For a raw Wasm layer the module is the blob, so the layer digest pins it too.
        let actual = format!("sha256:{}", staging.digest_so_far().hex());
        if layer.digest != actual {
            return Err(FetchError::ChecksumMismatch {
                expected: layer.digest.clone(),
                actual,
            });
        }
        Ok(())
    }

    async fn extract_plugin_wasm(
        &self,
        resolved: &Resolved,
        layer: &OciDescriptor,
        staging: &mut Staging,
        max_size: u64,
    ) -> Result<(), FetchError> {
        let mut blob = Vec::with_capacity(layer.size.max(0) as usize);
        self.client
            .pull_blob(&resolved.reference, layer, &mut blob)
            .await
            .map_err(|e| map_err(&self.registry, e))?;
        let gz = flate2::read::GzDecoder::new(blob.as_slice());
        let mut archive = tar::Archive::new(gz.take(max_size.saturating_mul(4)));
        let entries = archive.entries().map_err(|e| FetchError::NotWasm {
            reason: format!("layer {} is not a tar.gz: {e}", layer.digest),
        })?;
        for entry in entries {
            let mut entry = entry.map_err(|e| FetchError::NotWasm {
                reason: format!("layer {} is not a valid tar.gz: {e}", layer.digest),
            })?;
            let is_plugin = entry
                .path()
                .ok()
                .and_then(|p| p.file_name().map(|n| n == "plugin.wasm"))
                .unwrap_or(false);
            if !is_plugin {
                continue;
            }
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                let n = entry.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                staging.write(&buf[..n])?;
            }
        }
        Err(FetchError::UnsupportedLayout {
            found: vec![format!("{} without plugin.wasm", layer.media_type)],
        })
    }
}

fn client(registry: &str, transport: Transport, plain_http: bool, settings: &Settings) -> Client {
    crate::tls::ensure_provider();
    Client::new(ClientConfig {
        protocol: if plain_http {
            ClientProtocol::HttpsExcept(vec![registry.to_string()])
        } else {
            ClientProtocol::Https
        },
        accept_invalid_certificates: transport == Transport::Insecure,
        read_timeout: Some(settings.http_timeout),
        connect_timeout: Some(settings.http_timeout),
        extra_root_certificates: settings.extra_roots.clone(),
        ..Default::default()
    })
}

fn parse_manifest(bytes: &[u8]) -> Result<OciImageManifest, FetchError> {
    serde_json::from_slice(bytes).map_err(|e| FetchError::Registry {
        message: format!("cannot parse image manifest: {e}"),
    })
}

/// Picks an index child: the one the pin names, else `--platform`, else a Wasm platform
/// (`wasip1/wasm`, `wasi/wasm`), else `linux/amd64`, else one without a platform.
pub fn pick_child(
    index: &Value,
    platform: Option<&str>,
    pin: Option<&str>,
) -> Result<String, FetchError> {
    let children: Vec<(String, Option<String>)> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let digest = m.get("digest")?.as_str()?.to_string();
            let plat = m.get("platform").map(|p| {
                format!(
                    "{}/{}",
                    p.get("os").and_then(Value::as_str).unwrap_or_default(),
                    p.get("architecture")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                )
            });
            Some((digest, plat))
        })
        .collect();
    if let Some(pin) = pin {
        if let Some((d, _)) = children.iter().find(|(d, _)| d == pin) {
            return Ok(d.clone());
        }
    }
    let wanted: Vec<Option<&str>> = match platform {
        Some(p) => vec![Some(p)],
        None => vec![
            Some("wasip1/wasm"),
            Some("wasi/wasm"),
            Some("linux/amd64"),
            None,
        ],
    };
    for w in wanted {
        if let Some((d, _)) = children.iter().find(|(_, p)| p.as_deref() == w) {
            return Ok(d.clone());
        }
    }
    Err(FetchError::NotFound {
        what: format!(
            "no image for platform {} in the index (it has: {})",
            platform.unwrap_or("wasip1/wasm, wasi/wasm or linux/amd64"),
            children
                .iter()
                .map(|(_, p)| p.clone().unwrap_or_else(|| "none".into()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Value {
        serde_json::json!({"manifests": [
            {"digest": "sha256:aa", "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": "sha256:bb", "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": "sha256:cc", "platform": {"os": "wasip1", "architecture": "wasm"}},
        ]})
    }

    #[test]
    fn only_loopback_and_listed_registries_may_skip_tls() {
        let r = |u: &str| match crate::reference::Source::parse(u).unwrap() {
            crate::reference::Source::Oci(r) => r,
            _ => unreachable!(),
        };
        let none = Settings::default();
        let listed = Settings {
            insecure_registries: vec!["reg.example:5000".into()],
            ..Settings::default()
        };
        let all = Settings {
            insecure_registries: vec!["*".into()],
            ..Settings::default()
        };
        let of = Transport::for_registry;
        assert_eq!(
            of(&r("oci://reg.example:5000/a:1"), &none),
            Transport::Verified
        );
        assert_eq!(
            of(&r("oci://reg.example/a:1"), &listed),
            Transport::Verified,
            "the port is part of the match"
        );
        assert_eq!(
            of(&r("oci://reg.example:5000/a:1"), &listed),
            Transport::Insecure
        );
        assert_eq!(of(&r("oci://ghcr.io/a:1"), &all), Transport::Insecure);
        assert_eq!(
            of(&r("oci://127.0.0.1:5000/a:1"), &all),
            Transport::Insecure
        );
        for local in [
            "127.0.0.1:5000",
            "localhost:5000",
            "[::1]:5000",
            "127.0.0.2",
        ] {
            assert_eq!(
                of(&r(&format!("oci://{local}/a:1")), &none),
                Transport::Loopback
            );
        }
    }

    #[test]
    fn index_children_by_pin_platform_and_preference() {
        assert_eq!(pick_child(&index(), None, None).unwrap(), "sha256:cc");
        assert_eq!(
            pick_child(&index(), Some("linux/arm64"), None).unwrap(),
            "sha256:aa"
        );
        assert_eq!(
            pick_child(&index(), None, Some("sha256:bb")).unwrap(),
            "sha256:bb"
        );
        let e = pick_child(&index(), Some("windows/amd64"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not found") && e.contains("windows/amd64"),
            "{e}"
        );
        let no_wasm = serde_json::json!({"manifests": [{"digest": "sha256:dd"}]});
        assert_eq!(pick_child(&no_wasm, None, None).unwrap(), "sha256:dd");
    }
}
