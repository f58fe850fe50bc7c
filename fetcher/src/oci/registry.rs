//! A registry spoken to over the distribution API (`super::distribution`): the manifest first
//! (so an unchanged digest costs no layer download), an image index resolved by platform, then
//! the one layer that holds the module, in any of the layouts in use:
//! - a Wasm artifact with exactly one Wasm-typed layer (CNCF, wasm-to-oci, OCI 1.1), whatever
//!   its config;
//! - Istio's 2-layer artifact (`application/vnd.module.wasm.content.layer.v1+wasm`);
//! - a Docker or OCI image whose last layer is a tar.gz holding `plugin.wasm`.

use futures_util::StreamExt;
use oci_client::manifest::OciDescriptor;
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;

use super::distribution::{Access, Distribution, PingFailure, Scheme};
use super::hosts::{self, Endpoint, Hosts};
use super::manifest::ImageDigests;
use super::manifest::{self as media, parse_json, parse_manifest, pick_child};
use crate::digest::{parse_digest, Digest};
use crate::error::FetchError;
use crate::reference::oci::OciRef;
use crate::settings::Settings;
use crate::store::cache::{Cache, Staging};

/// A resolved image: the manifest of the module's image, its digest, and the index digest
/// when the reference named an index.
pub struct Resolved {
    pub manifest: OciImageManifest,
    pub digests: ImageDigests,
}

impl Resolved {
    /// The layer that is the module itself (one Wasm layer, or Istio's two-layer artifact),
    /// not one it is packed in (a `plugin.wasm` image): its digest is the module's sha256.
    pub fn module_layer(&self) -> Option<&OciDescriptor> {
        let layers = &self.manifest.layers;
        let wasm: Vec<&OciDescriptor> = layers
            .iter()
            .filter(|l| {
                media::WASM_LAYERS.contains(&l.media_type.as_str())
                    || l.media_type == crate::store::shared_object::LAYER
            })
            .collect();
        let istio = layers
            .iter()
            .find(|l| l.media_type == media::ISTIO_WASM_LAYER);
        match (layers.len(), wasm.as_slice(), istio) {
            (1, [only], _) => Some(*only),
            (2, _, Some(l)) => Some(l),
            _ => None,
        }
    }

    /// The module's sha256 when the manifest alone says it (see [`Self::module_layer`]).
    pub fn module_sha256(&self) -> Result<Option<crate::digest::Sha256>, FetchError> {
        self.module_layer()
            .map(|l| parse_digest(&l.digest).map(|d| d.0))
            .transpose()
    }
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
                self.access,
            )?;
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

    /// The first request to a host of hosts.toml: its scheme is the URL's, its roots the
    /// `ca` files beside the others, and only the registry itself gets its credentials.
    async fn connect_to(&self, e: &Endpoint) -> Result<Distribution, FetchError> {
        let settings = hosts::settings_for(e, &self.settings)?;
        let credentials = if e.upstream {
            self.credentials.clone()
        } else {
            RegistryAuth::Anonymous
        };
        let mut d = Distribution::new(
            &e.host,
            &self.repository,
            e.scheme,
            e.skip_verify,
            credentials,
            &settings,
            self.access,
        )?
        .at_root(&e.root);
        // A mirror is told which registry is meant, as containerd tells it (`?ns=`); the
        // registry itself is not.
        if !e.upstream && e.host != self.registry {
            d = d.for_upstream(&hosts::ns_value(&self.registry));
        }
        match d.ping().await {
            Ok(()) => Ok(d),
            Err(PingFailure::Send(err)) => Err(d.send_error(err)),
            Err(PingFailure::BadRequest) => Err(FetchError::Registry {
                message: format!("{}{}/ answered HTTP 400", e.host, e.root),
            }),
            Err(PingFailure::Other(err)) => Err(err),
        }
    }

    /// Fetches the manifest (and, for an index, the chosen child's); returns the connection
    /// for the layer download.
    pub async fn resolve(
        &self,
        r: &OciRef,
        platform: Option<&str>,
    ) -> Result<(Distribution, Resolved), FetchError> {
        self.on_hosts(
            r,
            |d, r| async move { self.resolve_on(d, &r, platform).await },
        )
        .await
    }

    /// Runs `resolve` (the manifest reads of a pull) on the first host that answers it: with
    /// `--registry-config-dir`, the mirrors of the registry's hosts.toml in order, each failure
    /// that another host could mend ([`hosts::falls_through`]) moving on to the next, and the
    /// server last; without, the registry itself. Every pull of an image goes through here,
    /// whatever it picks from the manifests. As containerd does, a tag is resolved only at a
    /// host that may `pull` and `resolve`, and content comes only from one that may `pull`:
    /// with a pull-only host listed, the first host that may do both and answers names the
    /// digest, and `resolve` is given the reference pinned to it. A resolve-only host is asked
    /// nothing (containerd resolves only at hosts that may do both, and would fetch no content
    /// from one that may not pull).
    pub async fn on_hosts<T, F, Fut>(
        &self,
        r: &OciRef,
        resolve: F,
    ) -> Result<(Distribution, T), FetchError>
    where
        F: Fn(Distribution, OciRef) -> Fut,
        Fut: std::future::Future<Output = Result<(Distribution, T), FetchError>>,
    {
        let hosts = match (&self.settings.registry_config_dir, self.access) {
            (Some(dir), Access::Pull) => hosts::load(dir, &self.registry, &self.settings)?,
            _ => Hosts::default(),
        };
        // A host that may pull but not resolve: the tag first, at the hosts that may do both;
        // then its image by digest, from the hosts that may pull.
        let split = r.digest.is_none() && hosts.mirrors.iter().any(|m| m.may == hosts::May::Pull);
        let pinned;
        let r = if split {
            pinned = OciRef {
                digest: Some(self.digest_at_resolvers(&hosts, r).await?),
                ..r.clone()
            };
            &pinned
        } else {
            r
        };
        for mirror in hosts.mirrors.iter().filter(|m| m.may.pull()) {
            let attempt = match self.connect_to(mirror).await {
                Ok(d) => resolve(d, r.clone()).await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(found) => return Ok(found),
                Err(e) if hosts::falls_through(&e) => {
                    tracing::warn!(mirror = %mirror.host, "trying the next host after: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        let d = self.connect_server(&hosts).await?;
        resolve(d, r.clone()).await
    }

    /// Whether these credentials may pull the manifest `reference` (a digest or a tag) at the
    /// registry itself, never a mirror (`crate::pull::recheck`).
    pub async fn may_pull(&self, reference: &str) -> Result<(), FetchError> {
        let d = self.connect().await?;
        d.manifest(reference, &media::accept_manifests()).await?;
        Ok(())
    }

    /// The server of `hosts`, or the registry as without a hosts.toml.
    async fn connect_server(&self, hosts: &Hosts) -> Result<Distribution, FetchError> {
        match &hosts.server {
            Some(server) => self.connect_to(server).await,
            None => self.connect().await,
        }
    }

    /// The digest `r`'s tag names, asked of the hosts that may `pull` and `resolve`, in order,
    /// then the server.
    async fn digest_at_resolvers(
        &self,
        hosts: &Hosts,
        r: &OciRef,
    ) -> Result<crate::digest::Sha256, FetchError> {
        let tag = r.tag.clone().unwrap_or_else(|| "latest".to_string());
        let accepted = media::accept_manifests();
        for mirror in hosts
            .mirrors
            .iter()
            .filter(|m| m.may == hosts::May::PullAndResolve)
        {
            let attempt = match self.connect_to(mirror).await {
                Ok(d) => d.manifest(&tag, &accepted).await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok((_, digest)) => return Ok(digest.0),
                Err(e) if hosts::falls_through(&e) => {
                    tracing::warn!(mirror = %mirror.host, "trying the next host after: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        let d = self.connect_server(hosts).await?;
        Ok(d.manifest(&tag, &accepted).await?.1 .0)
    }

    async fn resolve_on(
        &self,
        d: Distribution,
        r: &OciRef,
        platform: Option<&str>,
    ) -> Result<(Distribution, Resolved), FetchError> {
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
        if let Some(layer) = resolved.module_layer() {
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
            return crate::store::unbox::extract_plugin_wasm(cache, staging, &last.media_type);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_and_listed_registries_may_skip_tls() {
        let r = |u: &str| crate::reference::oci::parse(&u["oci://".len()..]).unwrap();
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
}
