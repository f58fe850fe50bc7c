//! `oci://` sources, over the distribution API (`super::distribution`): the manifest first
//! (so an unchanged digest costs no layer download), an image index resolved by platform, then
//! the one layer that holds the module, in any of the layouts in use:
//! - a Wasm artifact with exactly one Wasm-typed layer (CNCF, wasm-to-oci, OCI 1.1), whatever
//!   its config;
//! - Istio's 2-layer artifact (`application/vnd.module.wasm.content.layer.v1+wasm`);
//! - a Docker or OCI image whose last layer is a tar.gz holding `plugin.wasm`.

use futures_util::StreamExt;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

use crate::cache::{Cache, Staging};
use crate::error::FetchError;
use crate::pin::{ImageDigests, Pins};
use crate::reference::OciRef;
use crate::settings::Settings;
use crate::source::distribution::{Access, Distribution, PingFailure, Scheme};
use crate::source::{Body, Fetched, Target};
use crate::verify::{parse_digest, Digest};
use crate::PullRequest;

/// Resolves the image, checks the pins against it, and downloads the module unless the
/// manifest it resolved to is one whose module the cache holds (a tag that did not move).
pub async fn fetch(
    r: &OciRef,
    req: &PullRequest,
    pins: &Pins,
    target: &Target<'_>,
    staging: Staging,
) -> Result<Fetched, FetchError> {
    let creds = crate::auth::credentials(req.pull_secret.as_deref(), &r.registry)?;
    let registry = Registry::new(r, creds, target.settings);
    let (connection, resolved) = registry.resolve(r, req.platform.as_deref()).await?;
    let image = resolved.digests;
    let pin = pins.check(Some(&image))?;
    let keys: Vec<_> = target
        .settings
        .verify_key
        .iter()
        .chain(req.verify_key.iter())
        .cloned()
        .collect();
    crate::signature::verify(&connection, &image, &keys).await?;
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
    })
}

/// Media types, in one place.
pub mod media {
    pub const WASM_LAYERS: &[&str] = &[
        "application/wasm",
        "application/vnd.wasm.content.layer.v1+wasm",
        "application/vnd.module.wasm.content.layer.v1+wasm",
    ];
    pub const ISTIO_WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
    /// The config of Istio's Wasm artifact, also its second layer (`crate::push`).
    pub const ISTIO_WASM_CONFIG: &str = "application/vnd.module.wasm.config.v1+json";
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const OCI_TAR_GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const TAR_GZIP_LAYERS: &[&str] = &[
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    ];
    pub const INDEXES: &[&str] = &[
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ];
    pub const MANIFESTS: &[&str] = &[
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ];

    /// The `Accept` header of a manifest request: any manifest or index.
    pub fn accept_manifests() -> String {
        MANIFESTS
            .iter()
            .chain(INDEXES)
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A resolved image: the manifest of the module's image, its digest, and the index digest
/// when the reference named an index.
pub struct Resolved {
    pub manifest: OciImageManifest,
    pub digests: ImageDigests,
}

pub struct Registry {
    registry: String,
    repository: String,
    credentials: RegistryAuth,
    transport: Transport,
    settings: Settings,
    access: Access,
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

    /// The protocols to try, in order.
    fn schemes(self) -> &'static [Scheme] {
        match self {
            Transport::Verified => &[Scheme::Https],
            Transport::Loopback => &[Scheme::Http, Scheme::Https],
            Transport::Insecure => &[Scheme::Https, Scheme::Http],
        }
    }
}

/// Whether a failed ping over `scheme` is a sign the server speaks the other protocol: a TLS
/// handshake answered in plain HTTP, or a plain request turned away with 400 or a dropped
/// connection.
fn other_protocol(scheme: Scheme, failure: &PingFailure) -> bool {
    match (scheme, failure) {
        (Scheme::Https, PingFailure::Send(e)) => matches!(
            crate::error::tls_error_in(e),
            Some(rustls::Error::InvalidMessage(_))
        ),
        (Scheme::Http, PingFailure::BadRequest) => true,
        (Scheme::Http, PingFailure::Send(e)) => !e.is_timeout(),
        _ => false,
    }
}

impl Registry {
    pub fn new(r: &OciRef, credentials: RegistryAuth, settings: &Settings) -> Self {
        Self {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            credentials,
            transport: Transport::for_registry(r, settings),
            settings: settings.clone(),
            access: Access::Pull,
        }
    }

    /// A registry to push to: a token realm is asked for `pull,push`.
    pub fn for_push(mut self) -> Self {
        self.access = Access::Push;
        self
    }

    /// The first request of a pull, which settles the protocol and the authentication.
    pub(crate) async fn connect(&self) -> Result<Distribution, FetchError> {
        let insecure = self.transport == Transport::Insecure;
        let mut first: Option<FetchError> = None;
        let schemes = self.transport.schemes();
        for (i, scheme) in schemes.iter().enumerate() {
            let mut d = Distribution::new(
                &self.registry,
                &self.repository,
                *scheme,
                insecure,
                self.credentials.clone(),
                &self.settings,
            )?
            .with_access(self.access);
            let failure = match d.ping().await {
                Ok(()) => return Ok(d),
                Err(f) => f,
            };
            let switch = i + 1 < schemes.len() && other_protocol(*scheme, &failure);
            // A server that speaks plain HTTP after all: its first answer is the one to report.
            let speaks_plain = *scheme == Scheme::Https && other_protocol(*scheme, &failure);
            let error = match failure {
                PingFailure::Send(e) => d.send_error(e),
                PingFailure::BadRequest => FetchError::Registry {
                    message: format!(
                        "{}://{}/v2/ answered HTTP 400",
                        if *scheme == Scheme::Http {
                            "http"
                        } else {
                            "https"
                        },
                        self.registry
                    ),
                },
                PingFailure::Other(e) => e,
            };
            if !switch {
                return Err(match first {
                    Some(f) if speaks_plain => f,
                    _ => error,
                });
            }
            tracing::debug!(registry = %self.registry, "switching protocol after: {error}");
            first.get_or_insert(error);
        }
        Err(first.unwrap_or(FetchError::Registry {
            message: format!("no protocol to reach {}", self.registry),
        }))
    }

    /// Fetches the manifest (and, for an index, the chosen child's); returns the connection
    /// for the layer download.
    pub async fn resolve(
        &self,
        r: &OciRef,
        platform: Option<&str>,
    ) -> Result<(Distribution, Resolved), FetchError> {
        let d = self.connect().await?;
        let accepted = media::accept_manifests();
        let pinned = r.digest.map(Digest);
        let reference = match (pinned, &r.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_string(),
        };
        let (bytes, digest) = d.manifest(&reference, &accepted).await?;
        let doc = parse_json(&bytes)?;
        if doc.get("manifests").is_some() {
            let pin = pinned.map(|p| p.to_string());
            let child = parse_digest(&pick_child(&doc, platform, pin.as_deref())?)?;
            let (bytes, child_digest) = d.manifest(&child.to_string(), &accepted).await?;
            let resolved = Resolved {
                manifest: parse_manifest(&bytes)?,
                digests: ImageDigests {
                    manifest: child_digest,
                    index: Some(digest),
                },
            };
            return Ok((d, resolved));
        }
        let resolved = Resolved {
            manifest: parse_manifest(&bytes)?,
            digests: ImageDigests {
                manifest: digest,
                index: None,
            },
        };
        Ok((d, resolved))
    }

    /// Streams the module out of the image; returns the staging file that holds it.
    pub async fn download(
        &self,
        d: &Distribution,
        cache: &Cache,
        resolved: &Resolved,
        mut staging: Staging,
    ) -> Result<Staging, FetchError> {
        let layers = &resolved.manifest.layers;
        let wasm: Vec<&OciDescriptor> = layers
            .iter()
            .filter(|l| media::WASM_LAYERS.contains(&l.media_type.as_str()))
            .collect();
        let istio = layers
            .iter()
            .find(|l| l.media_type == media::ISTIO_WASM_LAYER);
        let module_layer = match (layers.len(), wasm.as_slice(), istio) {
            (1, [only], _) => Some(*only),
            (2, _, Some(l)) => Some(l),
            _ => None,
        };
        if let Some(layer) = module_layer {
            self.stream_layer(d, layer, &mut staging).await?;
            return Ok(staging);
        }
        if let Some(last) = layers
            .last()
            .filter(|l| media::TAR_GZIP_LAYERS.contains(&l.media_type.as_str()))
        {
            // The layer is kept whole in the staging file (checked against its digest), then
            // plugin.wasm is streamed out of it into a second one.
            self.stream_layer(d, last, &mut staging).await?;
            return crate::unbox::extract_plugin_wasm(cache, staging, &last.media_type);
        }
        Err(FetchError::UnsupportedLayout {
            found: layers.iter().map(|l| l.media_type.clone()).collect(),
        })
    }

    /// One layer into `staging`, checked against its declared size and digest.
    async fn stream_layer(
        &self,
        d: &Distribution,
        layer: &OciDescriptor,
        staging: &mut Staging,
    ) -> Result<(), FetchError> {
        let digest = parse_digest(&layer.digest)?;
        let declared = u64::try_from(layer.size).map_err(|_| FetchError::Registry {
            message: format!("layer {} declares a negative size", layer.digest),
        })?;
        if declared > staging.max_size() {
            return Err(FetchError::TooLarge {
                limit: staging.max_size(),
            });
        }
        let foreign = if self.settings.allow_foreign_layers {
            layer.urls.as_deref().unwrap_or_default()
        } else {
            &[]
        };
        let mut last = None;
        for url in foreign {
            match d.foreign(url).await {
                Ok(resp) => match copy_checked(resp, &digest, declared, staging, d).await {
                    Ok(()) => return Ok(()),
                    Err(e @ (FetchError::Refused(_) | FetchError::TooLarge { .. })) => {
                        return Err(e)
                    }
                    Err(e) => last = Some(e),
                },
                Err(e @ FetchError::Refused(_)) => return Err(e),
                Err(e) => last = Some(e),
            }
            tracing::debug!(%url, "foreign layer URL failed: {last:?}");
            staging.reset()?;
        }
        match d.blob(&digest).await {
            Ok(resp) => copy_checked(resp, &digest, declared, staging, d).await,
            Err(e) => Err(last.unwrap_or(e)),
        }
    }
}

/// Streams a blob into `staging`: never past its declared size, and exactly its digest.
async fn copy_checked(
    resp: reqwest::Response,
    digest: &Digest,
    declared: u64,
    staging: &mut Staging,
    d: &Distribution,
) -> Result<(), FetchError> {
    staging.started(Some(declared));
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // The connection ended early: what arrived is short of what was declared.
            Err(e) if !e.is_timeout() && crate::net::refused(&e).is_none() => {
                return Err(FetchError::Truncated {
                    got: staging.size(),
                    expected: declared,
                })
            }
            Err(e) => return Err(d.send_error(e)),
        };
        if staging.size() + chunk.len() as u64 > declared {
            return Err(FetchError::TooLong { expected: declared });
        }
        staging.write(&chunk)?;
    }
    if staging.size() != declared {
        return Err(FetchError::Truncated {
            got: staging.size(),
            expected: declared,
        });
    }
    let actual = Digest(staging.digest_so_far());
    if actual != *digest {
        return Err(FetchError::ChecksumMismatch {
            expected: digest.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}

fn parse_json(bytes: &[u8]) -> Result<Value, FetchError> {
    serde_json::from_slice(bytes).map_err(|e| FetchError::Registry {
        message: format!("manifest is not JSON: {e}"),
    })
}

/// An image manifest, from bytes already bounded by the manifest size limit.
pub fn parse_manifest(bytes: &[u8]) -> Result<OciImageManifest, FetchError> {
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

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn descriptor() -> impl Strategy<Value = Value> {
            (
                "[a-z0-9:./]{0,80}",
                prop::option::of(("[a-z0-9]{0,8}", "[a-z0-9]{0,8}")),
                any::<i64>(),
            )
                .prop_map(|(digest, platform, size)| {
                    let mut d = serde_json::json!({"digest": digest, "size": size,
                        "mediaType": "application/vnd.oci.image.manifest.v1+json"});
                    if let Some((os, arch)) = platform {
                        d["platform"] = serde_json::json!({"os": os, "architecture": arch});
                    }
                    d
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn arbitrary_bytes_never_panic_the_manifest_parser(
                bytes in prop::collection::vec(any::<u8>(), 0..600),
            ) {
                let _ = parse_manifest(&bytes);
                if let Ok(doc) = serde_json::from_slice::<Value>(&bytes) {
                    let _ = pick_child(&doc, None, None);
                }
            }

            #[test]
            fn an_index_yields_one_of_its_children_or_a_named_error(
                children in prop::collection::vec(descriptor(), 0..12),
                platform in prop::option::of("[a-z0-9]{1,6}/[a-z0-9]{1,6}"),
            ) {
                let index = serde_json::json!({"schemaVersion": 2, "manifests": children});
                match pick_child(&index, platform.as_deref(), None) {
                    Ok(d) => prop_assert!(children.iter().any(|c| c["digest"] == d.as_str())),
                    Err(e) => {
                        let not_found = matches!(e, FetchError::NotFound { .. });
                        prop_assert!(not_found, "{}", e);
                    }
                }
                let bytes = serde_json::to_vec(&serde_json::json!({
                    "schemaVersion": 2, "config": children.first(), "layers": children,
                })).unwrap();
                // A layer's digest and size are checked when it is downloaded, not trusted here.
                if let Ok(m) = parse_manifest(&bytes) {
                    for l in &m.layers {
                        let checked = crate::verify::parse_digest(&l.digest);
                        prop_assert_eq!(checked.is_ok(), l.digest.len() == 71
                            && l.digest.starts_with("sha256:")
                            && l.digest[7..].bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
                    }
                }
            }
        }
    }
}
