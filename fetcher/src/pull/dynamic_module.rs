//! `pull --envoy-version`: one dynamic module out of an image index, by platform and Envoy
//! version, into `<cache>/dynamic-modules/<sha256>/lib<name>.so` (0644: `dlopen` needs read,
//! not execute, and an Envoy running as another user reads it).

use std::io::Read;
use std::path::{Path, PathBuf};

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde_json::Value;

use crate::digest::{parse_digest, Digest, Sha256};
use crate::error::FetchError;
use crate::oci::cosign::Requirement;
use crate::oci::distribution::Distribution;
use crate::oci::manifest::{accept_manifests, parse_manifest, ImageDigests};
use crate::oci::registry::{Registry, Resolved};
use crate::pull::PullRequest;
use crate::reference::oci::OciRef;
use crate::reference::Source;
use crate::settings::Settings;
use crate::shown::shown;
use crate::store::cache::Cache;
use crate::store::cache::DynamicModuleFile;
use crate::store::envoy_abi::EnvoyAbi;
use crate::store::load_check::{self, Refused};
use crate::store::shared_object::{self as elf, module_name, ENVOY_VERSIONS, LAYER, TITLE};

#[derive(Debug, Clone, serde::Serialize)]
pub struct DynamicPulled {
    /// The directory to name in `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`.
    pub dir: PathBuf,
    /// `dir/lib<name>.so`.
    pub path: PathBuf,
    /// What Envoy's `dynamic_module_config.name` says.
    pub name: String,
    pub sha256: Sha256,
    pub platform: String,
    pub envoy_version: String,
    pub manifest_digest: Digest,
    pub index_digest: Digest,
    /// No module bytes were downloaded.
    pub from_cache: bool,
}

/// The module for `envoy_version` on `req.platform` (default this host's). A pin
/// (`req.sha256`) may name the index, the chosen manifest or the module itself. Nothing is
/// cached unless every check passes: the signature ([`keys`]), every digest from the pin to
/// the blob, and whether that Envoy can load the module ([`load_check`]).
pub async fn pull(
    req: &PullRequest,
    envoy_version: &str,
    cache: &Cache,
    settings: &Settings,
) -> Result<DynamicPulled, FetchError> {
    let source = Source::parse(&req.url)?;
    let key = source.key();
    let r = match source {
        Source::Oci(r) => r,
        _ => {
            return Err(FetchError::BadUrl {
                reason: "a dynamic module is pulled from oci://REGISTRY/REPO[:TAG][@sha256:…]"
                    .into(),
            })
        }
    };
    // Both refusals come before anything is fetched.
    let abi = EnvoyAbi::of(envoy_version).map_err(|reason| FetchError::NotLoadable {
        envoy_version: shown(envoy_version),
        reason,
    })?;
    let keys = keys(req, settings)?;
    let platform = req.platform.clone().unwrap_or_else(elf::host_platform);
    let creds = crate::oci::auth::credentials(req.pull_secret.as_deref(), &r.registry).await?;
    let registry = Registry::new(&r, creds, settings);
    let (d, chosen) = registry
        .on_hosts(&r, |d, r| {
            let platform = &platform;
            async move { choose(d, &r, platform, envoy_version, req.sha256).await }
        })
        .await?;
    let Chosen {
        manifest,
        layer,
        index_digest,
        manifest_digest,
        sha256,
    } = chosen;
    let image = ImageDigests {
        manifest: manifest_digest,
        index: Some(index_digest),
    };
    crate::oci::cosign::verify(&d, &image, &keys).await?;
    let file_name = layer
        .annotations
        .as_ref()
        .and_then(|a| a.get(TITLE))
        .map(String::as_str)
        .unwrap_or_default();
    let name = module_name(file_name)
        .map_err(|reason| not_module(&platform, reason))?
        .to_string();
    let path = cache.dynamic_module_path(&sha256, file_name);
    let dir = path.parent().map(PathBuf::from).unwrap_or_default();
    let kept = DynamicModuleFile {
        file: file_name.to_string(),
        platform: platform.clone(),
    };
    let pulled = |from_cache| DynamicPulled {
        dir: dir.clone(),
        path: path.clone(),
        name: name.clone(),
        sha256,
        platform: platform.clone(),
        envoy_version: envoy_version.to_string(),
        manifest_digest,
        index_digest,
        from_cache,
    };
    let done = |from_cache| {
        let entry = Kept {
            key: &key,
            sha256,
            manifest_digest,
            index_digest,
            file: kept.clone(),
            path: &path,
        };
        record(cache, entry).map(|()| pulled(from_cache))
    };
    // A module cached for one Envoy is checked again for this one.
    if let Ok(cached) = read_bounded(&path, settings.max_size) {
        if Sha256::of(&cached) == sha256 {
            loadable(&cached, &platform, &abi)?;
            return done(true);
        }
    }
    let resolved = Resolved {
        manifest,
        digests: image,
    };
    let staging = cache.staging(settings.max_size)?;
    let mut staging = registry.download(&d, cache, &resolved, staging).await?;
    let module = read_all(staging.reopen()?, settings.max_size, &path)?;
    // The bytes are the layer's digest, which the manifest named, which the index named.
    let actual = Sha256::of(&module);
    if actual != sha256 {
        return Err(FetchError::ChecksumMismatch {
            expected: sha256.hex(),
            actual: actual.hex(),
        });
    }
    loadable(&module, &platform, &abi)?;
    write_module(&dir, &path, &module)?;
    done(false)
}

/// What every dynamic module's signature must meet: the operator's verify key or keyless
/// identity (the settings'), and the request's. Without the operator's, a module is refused
/// unless the operator opted out by name (`--allow-unsigned-dynamic-modules`): it runs
/// unsandboxed inside Envoy, so a key or identity that came with the resource (chosen by
/// whoever wrote it) adds a check but never stands in for the operator's.
fn keys(req: &PullRequest, settings: &Settings) -> Result<Vec<Requirement>, FetchError> {
    let operators = settings.verify_key.is_some() || settings.verify_identity.is_some();
    if !operators && !settings.allow_unsigned_dynamic_modules {
        return Err(FetchError::UnsignedDynamicModule);
    }
    req.requirements(settings)
}

/// The module is one the target Envoy can load on `platform`.
fn loadable(module: &[u8], platform: &str, abi: &EnvoyAbi) -> Result<(), FetchError> {
    let found = load_check::check(module, abi).map_err(|refused| match refused {
        Refused::Malformed(reason) => not_module(platform, reason),
        Refused::Abi(reason) => FetchError::NotLoadable {
            envoy_version: abi.envoy_version.clone(),
            reason,
        },
    })?;
    if found.platform != platform {
        return Err(not_module(
            platform,
            format!("built for {}", found.platform),
        ));
    }
    Ok(())
}

/// What the index and the child manifest for `platform` and `envoy_version` name, with every
/// pin checked against the index, the manifest and the module digests.
struct Chosen {
    manifest: OciImageManifest,
    layer: OciDescriptor,
    index_digest: Digest,
    manifest_digest: Digest,
    sha256: Sha256,
}

async fn choose(
    d: Distribution,
    r: &OciRef,
    platform: &str,
    envoy_version: &str,
    pin: Option<Sha256>,
) -> Result<(Distribution, Chosen), FetchError> {
    let reference = match (r.digest, &r.tag) {
        (Some(digest), _) => Digest(digest).to_string(),
        (None, Some(tag)) => tag.clone(),
        (None, None) => "latest".into(),
    };
    let accept = accept_manifests();
    let (bytes, index_digest) = d.manifest(&reference, &accept).await?;
    let index: Value = serde_json::from_slice(&bytes).map_err(|e| FetchError::Registry {
        message: format!("index is not JSON: {e}"),
    })?;
    let child = pick(&index, platform, envoy_version)?;
    let (bytes, manifest_digest) = d.manifest(&child.to_string(), &accept).await?;
    let manifest = parse_manifest(&bytes)?;
    let layer = match manifest.layers.as_slice() {
        [only] if only.media_type == LAYER => only.clone(),
        layers => {
            return Err(FetchError::UnsupportedLayout {
                found: layers.iter().map(|l| l.media_type.clone()).collect(),
            })
        }
    };
    let sha256 = parse_digest(&layer.digest)?.0;
    if let Some(pin) = pin {
        if ![index_digest.0, manifest_digest.0, sha256].contains(&pin) {
            return Err(FetchError::ChecksumMismatch {
                expected: pin.hex(),
                actual: format!(
                    "index {index_digest}, manifest {manifest_digest}, module sha256:{}",
                    sha256.hex()
                ),
            });
        }
    }
    let chosen = Chosen {
        manifest,
        layer,
        index_digest,
        manifest_digest,
        sha256,
    };
    Ok((d, chosen))
}

/// Writes the module whole into its own directory of the cache, readable by an Envoy running
/// as another user, and on disk before its name is: an ECDS file written after it must never
/// name a file a crash left short (Envoy dies mapping one).
fn write_module(dir: &Path, path: &Path, module: &[u8]) -> Result<(), FetchError> {
    let io = |e: std::io::Error| FetchError::Cache {
        path: dir.to_path_buf(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    wasm_common::fs::write_whole(
        dir,
        ".lib",
        path,
        module,
        wasm_common::fs::Mode::WorldReadable,
        true,
    )
    .map_err(io)
}

/// A dynamic module just pulled or found, as the index records it.
struct Kept<'a> {
    key: &'a str,
    sha256: Sha256,
    manifest_digest: Digest,
    index_digest: Digest,
    file: DynamicModuleFile,
    path: &'a std::path::Path,
}

/// Lists the module in the cache index beside the Wasm modules (`ls` shows it, `purge`
/// expires and evicts it) and marks it used now. The index's sources are left alone: one
/// reference names a different module per platform.
fn record(cache: &Cache, k: Kept) -> Result<(), FetchError> {
    let now = crate::store::index::now();
    let stamp = crate::store::cache::Stamp::of_file(k.path);
    crate::store::index::IndexFile::new(cache).update(|idx| {
        let entry = idx
            .modules
            .entry(k.sha256)
            .or_insert_with(|| crate::store::index::ModuleEntry::pulled(k.key, now));
        entry.verified(k.key, now, stamp);
        entry.manifest_digest = Some(k.manifest_digest);
        entry.index_digest = Some(k.index_digest);
        entry.dynamic_module = Some(k.file);
    })
}

fn not_module(platform: &str, reason: String) -> FetchError {
    FetchError::NotDynamicModule {
        platform: platform.to_string(),
        reason,
    }
}

/// The child for `platform` whose annotation lists `envoy_version`: its digest, checked as
/// every digest from a registry is before it reaches a URL; a child named by anything else
/// (a tag, a path) is refused.
fn pick(index: &Value, platform: &str, envoy_version: &str) -> Result<Digest, FetchError> {
    let children = index["manifests"].as_array().ok_or_else(|| FetchError::NotFound {
        what: "an image index (the reference names a single manifest; push with --layout dynamic-module)".into(),
    })?;
    let platform_of = |c: &Value| {
        format!(
            "{}/{}",
            c["platform"]["os"].as_str().unwrap_or_default(),
            c["platform"]["architecture"].as_str().unwrap_or_default()
        )
    };
    let versions_of = |c: &Value| {
        c["annotations"][ENVOY_VERSIONS]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let on_platform: Vec<&Value> = children
        .iter()
        .filter(|c| platform_of(c) == platform)
        .collect();
    if on_platform.is_empty() {
        return Err(FetchError::NotFound {
            what: format!(
                "no dynamic module for platform {} in the index (it has: {})",
                crate::shown::shown(platform),
                crate::shown::listed(children.iter().map(platform_of))
            ),
        });
    }
    let child = on_platform
        .iter()
        .find(|c| versions_of(c).split(',').any(|v| v.trim() == envoy_version))
        .ok_or_else(|| FetchError::NotFound {
            what: format!(
                "no dynamic module for Envoy {} on {} (the index has Envoy versions: {})",
                crate::shown::shown(envoy_version),
                crate::shown::shown(platform),
                crate::shown::listed(on_platform.iter().flat_map(|c| {
                    versions_of(c)
                        .split(',')
                        .map(|v| v.trim().to_string())
                        .collect::<Vec<_>>()
                }))
            ),
        })?;
    let named = child["digest"].as_str().unwrap_or_default();
    parse_digest(named).map_err(|_| FetchError::Registry {
        message: format!(
            "the index names its child for {} by {:?}, not by a sha256 digest: refused",
            crate::shown::shown(platform),
            crate::shown::shown(named)
                .chars()
                .take(100)
                .collect::<String>()
        ),
    })
}

fn read_bounded(path: &std::path::Path, limit: u64) -> std::io::Result<Vec<u8>> {
    read_all(std::fs::File::open(path)?, limit, path).map_err(std::io::Error::other)
}

fn read_all(
    file: std::fs::File,
    limit: u64,
    path: &std::path::Path,
) -> Result<Vec<u8>, FetchError> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| FetchError::Cache {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if bytes.len() as u64 > limit {
        return Err(FetchError::TooLarge { limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_picked_by_platform_then_envoy_version_or_refused_by_name() {
        let index = serde_json::json!({"manifests": [
            {"digest": format!("sha256:{}", "a".repeat(64)), "platform": {"os": "linux", "architecture": "arm64"},
             "annotations": {ENVOY_VERSIONS: "1.40,1.41"}},
            {"digest": format!("sha256:{}", "b".repeat(64)), "platform": {"os": "linux", "architecture": "amd64"},
             "annotations": {ENVOY_VERSIONS: "1.40"}},
        ]});
        assert_eq!(
            pick(&index, "linux/arm64", "1.41").unwrap().to_string(),
            format!("sha256:{}", "a".repeat(64))
        );
        assert_eq!(
            pick(&index, "linux/amd64", "1.40").unwrap().to_string(),
            format!("sha256:{}", "b".repeat(64))
        );
        let e = pick(&index, "linux/amd64", "1.41").unwrap_err().to_string();
        assert!(e.contains("Envoy 1.41 on linux/amd64"), "{e}");
        let e = pick(&index, "linux/s390x", "1.40").unwrap_err().to_string();
        assert!(e.contains("platform linux/s390x"), "{e}");
    }

    /// A key that came with the resource never stands in for the operator's: whoever wrote
    /// the resource could sign a module with it.
    #[test]
    fn only_the_operators_key_or_the_opt_out_admits_a_dynamic_module() {
        let key = |n: u8| {
            crate::keys::SignKey::from_scalar(&[n; 32])
                .verify_key()
                .unwrap()
        };
        let own = PullRequest {
            verify_key: Some(key(1)),
            ..Default::default()
        };
        let mut settings = Settings::default();
        assert!(matches!(
            keys(&own, &settings),
            Err(FetchError::UnsignedDynamicModule)
        ));
        settings.verify_key = Some(key(2));
        assert_eq!(keys(&own, &settings).unwrap().len(), 2);
        settings.verify_key = None;
        settings.allow_unsigned_dynamic_modules = true;
        assert_eq!(keys(&PullRequest::default(), &settings).unwrap().len(), 0);
        // An identity the resource names is the resource's, like its key; the operator's
        // identity is the operator's.
        settings.allow_unsigned_dynamic_modules = false;
        let policy = crate::keyless::IdentityPolicy {
            subject: crate::keyless::Matcher::Exact("me@example.com".into()),
            issuer: crate::keyless::Matcher::Exact("https://issuer.example".into()),
        };
        let named = PullRequest {
            verify_identity: Some(policy.clone()),
            ..Default::default()
        };
        assert!(matches!(
            keys(&named, &settings),
            Err(FetchError::UnsignedDynamicModule)
        ));
        let root = std::sync::Arc::new(test_root());
        settings.verify_identity = Some(policy);
        settings.trusted_root = Some(root);
        assert_eq!(keys(&named, &settings).unwrap().len(), 2);
    }

    /// A child named by a path or a tag never reaches a URL.
    #[test]
    fn a_child_not_named_by_a_digest_is_refused() {
        for named in [
            "../../../v2/other/repo/manifests/x",
            "v1",
            "sha256:aa",
            "sha512:ab",
        ] {
            let index = serde_json::json!({"manifests": [
                {"digest": named, "platform": {"os": "linux", "architecture": "amd64"},
                 "annotations": {ENVOY_VERSIONS: "1.40"}},
            ]});
            let e = pick(&index, "linux/amd64", "1.40").unwrap_err().to_string();
            assert!(e.contains("not by a sha256 digest"), "{named}: {e}");
        }
    }

    /// Thousands of platforms and versions, with newlines and terminal escapes in them: one
    /// short line.
    #[test]
    fn a_huge_hostile_index_gives_one_short_line() {
        let children: Vec<Value> = (0..5000)
            .map(|i| serde_json::json!({
                "digest": format!("sha256:{}", "c".repeat(64)),
                "platform": {"os": "linux", "architecture": format!("\u{1b}[31mx{i}\n{}", "y".repeat(50))},
                "annotations": {ENVOY_VERSIONS: (0..20).map(|v| format!("1.{i}{v}\u{1b}]0;t\u{7}")).collect::<Vec<_>>().join(",")},
            }))
            .chain((0..5000).map(|i| serde_json::json!({
                "digest": format!("sha256:{}", "d".repeat(64)),
                "platform": {"os": "linux", "architecture": "amd64"},
                "annotations": {ENVOY_VERSIONS: format!("2.{i}\n\u{1b}[2J")},
            })))
            .collect();
        let index = serde_json::json!({"manifests": children});
        for (platform, version) in [("linux/s390x", "1.40"), ("linux/amd64", "1.40")] {
            let e = pick(&index, platform, version).unwrap_err().to_string();
            assert!(e.len() < 1000, "{}", e.len());
            assert!(
                !e.contains('\n') && !e.contains('\u{1b}') && !e.contains('\u{7}'),
                "{e}"
            );
        }
    }

    /// The smallest trusted root that loads: one log, one CT log, one CA.
    fn test_root() -> crate::keyless::TrustedRoot {
        use base64::Engine;
        use p256::pkcs8::EncodePublicKey;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let spki = p256::ecdsa::SigningKey::from_slice(&[7; 32])
            .unwrap()
            .verifying_key()
            .to_public_key_der()
            .unwrap();
        let log = serde_json::json!({
            "publicKey": {"rawBytes": b64(spki.as_bytes())},
            "logId": {"keyId": b64(&[0; 32])},
        });
        // A self-signed P-256 certificate (openssl req -x509), only parsed here.
        let ca = include_str!("../../../testdata/sigstore/test-ca.der.b64").trim();
        let root = serde_json::json!({
            "mediaType": crate::keyless::TRUSTED_ROOT_MEDIA_TYPE,
            "tlogs": [log], "ctlogs": [log],
            "certificateAuthorities": [{"certChain": {"certificates": [{"rawBytes": ca}]}}],
        });
        crate::keyless::TrustedRoot::from_json(root.to_string().as_bytes()).unwrap()
    }
}
