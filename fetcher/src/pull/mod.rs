//! One pull, from the request to the recorded module: the policy, the cache, the source, the
//! locks that keep one download per source, and the index entry it leaves.
//!
//! Its rooms: the pull policy (`policy`), pins (`pin`), one source per scheme (`source/`), and
//! the dynamic-module pull (`dynamic_module`), which shares the registry and the cache but
//! picks a native file by platform and Envoy version.

pub mod dynamic_module;
pub(crate) mod pin;
pub(crate) mod policy;
pub mod recheck;
pub(crate) mod source;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

use crate::digest::{Digest, Sha256};
use crate::error::FetchError;
use crate::oci::cosign::Requirement;
use crate::progress::Progress;
use crate::reference::{self, Source};
use crate::settings::Settings;
use crate::store::cache::{self, Cache};
use crate::store::index::{self, Index, IndexFile, ModuleEntry, SourceEntry};
use crate::store::lifecycle;
use pin::{PinMatch, Pins};
use policy::PullPolicy;
use source::{image_volume, Body, Fetched};

#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    pub url: String,
    /// A pin: for file and HTTP the module's sha256; for OCI the image manifest digest, the
    /// index digest, or the module's sha256.
    pub sha256: Option<Sha256>,
    pub policy: Option<PullPolicy>,
    /// The resource the module is for (an Envoy extension config); defaults to the source.
    pub resource: Option<String>,
    /// Its version: `Always` re-pulls when it changes, and on every pull when absent.
    pub resource_version: Option<String>,
    /// `os/arch` to pick from an image index.
    pub platform: Option<String>,
    /// Docker config JSON with registry credentials.
    pub pull_secret: Option<PathBuf>,
    /// A key the module's cosign signature must verify with, beside `Settings::verify_key`
    /// (a plugin's own); with either, only an `oci://` module is accepted, and only after its
    /// signature is checked at the registry.
    pub verify_key: Option<crate::keys::VerifyKey>,
    /// An identity the module's keyless signature must name, beside
    /// `Settings::verify_identity` (a plugin's own), checked under `Settings::trusted_root`.
    pub verify_identity: Option<crate::keyless::IdentityPolicy>,
    /// Where download progress goes (the CLI draws a bar on a terminal).
    pub progress: Progress,
}

impl PullRequest {
    /// What the module's signature must meet: the operator's key and identity (the
    /// settings'), then the request's own (a plugin's); every identity is checked under the
    /// operator's trusted root as the settings hold it now.
    pub fn requirements(&self, settings: &Settings) -> Result<Vec<Requirement>, FetchError> {
        let mut out: Vec<Requirement> = settings
            .verify_key
            .iter()
            .chain(self.verify_key.iter())
            .cloned()
            .map(Requirement::Key)
            .collect();
        for (policy, whose) in [
            (&settings.verify_identity, "the operator"),
            (
                &self.verify_identity,
                self.resource.as_deref().unwrap_or(&self.url),
            ),
        ] {
            let Some(policy) = policy else { continue };
            let root = settings
                .trusted_root
                .clone()
                .ok_or_else(|| FetchError::Setting {
                    name: "WASM_TRUSTED_ROOT",
                    value: String::new(),
                    reason: format!(
                        "{}, where {whose} names a keyless identity",
                        crate::keyless::no_root("--trusted-root (WASM_TRUSTED_ROOT)"),
                    ),
                })?;
            out.push(Requirement::Identity(policy.under(root)));
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Pulled {
    pub path: PathBuf,
    /// The source's canonical key (`reference::Source::key`): how the index names it.
    pub source: String,
    pub sha256: Sha256,
    pub manifest_digest: Option<Digest>,
    pub pin: Option<PinMatch>,
    /// No module bytes were downloaded (a tag may still have been checked).
    pub from_cache: bool,
    /// The cosign signatures a verify key checked: where each was found, in which format.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::oci::cosign::Verified>,
}

/// One pull, as every step sees it.
struct Pull<'a> {
    req: &'a PullRequest,
    source: Source,
    /// `source.key()`.
    key: String,
    pins: Pins,
    policy: PullPolicy,
    /// The resource whose version `Always` compares.
    resource: String,
    /// A verify key applies: the cache answers only for a module the index remembers as
    /// verified with every one of `keys`.
    verified: bool,
    /// The verify keys' full ids (`VerifyKey::spki_id`).
    keys: Vec<String>,
}

impl<'a> Pull<'a> {
    fn new(req: &'a PullRequest, settings: &Settings) -> Result<Self, FetchError> {
        let source = Source::parse(&req.url)?;
        let key = source.key();
        let pins = Pins::new(req.sha256, &source);
        let policy = policy::effective(req.policy, &source, pins.any());
        let keys: Vec<String> = req
            .requirements(settings)?
            .iter()
            .map(Requirement::id)
            .collect();
        let verified = !keys.is_empty();
        if verified {
            policy::check_signable(&source, policy)?;
        }
        // A resource named by a URL is one resource however the URL is written.
        let resource = req
            .resource
            .as_deref()
            .map_or_else(|| key.clone(), reference::canonical_key);
        Ok(Self {
            req,
            source,
            key,
            pins,
            policy,
            resource,
            verified,
            keys,
        })
    }

    /// What the cache alone can answer, under the policy.
    fn cached(&self, idx: &Index, cache: &Cache) -> Option<Pulled> {
        // A verified pull is answered only for the image this source last resolved to: the
        // same module bytes in another image do not make this image signed.
        let resolved = idx.sources.get(&self.key).and_then(|s| s.manifest_digest);
        let hit = |sha: Sha256, pin: Option<PinMatch>| -> Option<Pulled> {
            let signature = match self.verified {
                true => {
                    let m = idx.modules.get(&sha)?;
                    (resolved.is_some() && m.manifest_digest == resolved).then_some(())?;
                    Some(m.signed_by(&self.keys)?.clone())
                }
                false => None,
            };
            let path = idx.intact(cache, &sha, pin.is_some())?;
            Some(Pulled {
                path,
                source: self.key.clone(),
                sha256: sha,
                manifest_digest: idx.modules.get(&sha).and_then(|m| m.manifest_digest),
                pin,
                from_cache: true,
                signature,
            })
        };
        if self.pins.any() {
            return self
                .pins
                .candidates(idx)
                .into_iter()
                .find_map(|(sha, matched)| hit(sha, Some(matched)));
        }
        let known = idx.sources.get(&self.key)?;
        match self.policy {
            PullPolicy::IfNotPresent | PullPolicy::Never => hit(known.sha256, None),
            PullPolicy::Always => {
                let version = self.req.resource_version.as_ref()?;
                (idx.resources.get(&self.resource) == Some(version))
                    .then(|| hit(known.sha256, None))?
            }
        }
    }

    /// Whether recording `p` would change nothing but a last-use time under a minute old.
    fn already_recorded(&self, idx: &Index, p: &Pulled) -> bool {
        let fresh = idx.modules.get(&p.sha256).is_some_and(|m| {
            index::now().saturating_sub(m.last_used) < 60
                && cache::Stamp::of_file(&p.path) == Some(m.stamp())
        });
        let source_known = idx
            .sources
            .get(&self.key)
            .is_some_and(|s| s.sha256 == p.sha256);
        let version_known = self
            .req
            .resource_version
            .as_ref()
            .is_none_or(|v| idx.resources.get(&self.resource) == Some(v));
        fresh && source_known && version_known
    }
}

/// Resolves the pull policy, serves from the cache when it may, otherwise fetches from the
/// source, commits the verified module and records the pull. A pull never deletes anything.
pub async fn pull(
    req: &PullRequest,
    cache: &Cache,
    settings: &Settings,
) -> Result<Pulled, FetchError> {
    let pull = Pull::new(req, settings)?;
    if let Some(mount) = settings
        .image_volume_root
        .as_deref()
        .and_then(|root| image_volume::Mount::of(&pull.source, root))
    {
        return mounted(&pull, &mount, cache, settings).await;
    }
    let index = IndexFile::new(cache);
    let idx = index.load()?;
    if let Some(p) = pull.cached(&idx, cache) {
        recheck_hit(&pull, &p, settings).await?;
        // A hit that would change nothing but a recent last-use time skips the locked index
        // rewrite: that keeps a warm lookup to a read and a stat.
        if pull.already_recorded(&idx, &p) {
            return Ok(p);
        }
        return match record(&index, &pull, p.clone(), None, false).await {
            // The module is there and checked; only the bookkeeping could not be written.
            Err(FetchError::CacheReadOnly { path, message }) => {
                tracing::warn!(path = %path.display(), %message, "cache is read-only; last use not recorded");
                Ok(p)
            }
            other => other,
        };
    }
    if pull.policy == PullPolicy::Never {
        return Err(FetchError::NotInCache);
    }
    // One download per source: within this process through an async mutex, across processes
    // through the file lock. Whoever waited finds the module cached below.
    let _in_process = in_flight(cache, &pull.key).lock_owned().await;
    let _lock = lock_source(cache, &pull.key).await?;
    if pull.policy != PullPolicy::Always || req.resource_version.is_some() {
        if let Some(p) = pull.cached(&index.load()?, cache) {
            recheck_hit(&pull, &p, settings).await?;
            return record(&index, &pull, p, None, false).await;
        }
    }
    let mut staging = cache.staging(settings.max_size)?;
    staging.report_to(req.progress.clone());
    let target = source::Target {
        cache,
        index: &index,
        settings,
    };
    let Fetched {
        image,
        pin,
        body,
        signature,
    } = source::fetch(&pull.source, req, &pull.pins, &target, staging).await?;
    let (path, sha, from_cache) = match body {
        Body::Cached(sha) => (cache.module_path(&sha), sha, true),
        Body::Staged(staging) => {
            let (path, sha) = cache.commit(staging, pin.module.as_ref())?;
            (path, sha, false)
        }
    };
    let pulled = Pulled {
        path,
        source: pull.key.clone(),
        sha256: sha,
        manifest_digest: image.map(|i| i.manifest),
        pin: pin.matched,
        from_cache,
        signature,
    };
    record(&index, &pull, pulled, image.and_then(|i| i.index), false).await
}

/// With `Settings::recheck_credentials`, a cached `oci://` module only for credentials the
/// registry accepts for it (`recheck`); every other hit as it is.
async fn recheck_hit(pull: &Pull<'_>, p: &Pulled, settings: &Settings) -> Result<(), FetchError> {
    match &pull.source {
        Source::Oci(r) if settings.recheck_credentials => {
            recheck::check(
                r,
                p.manifest_digest,
                pull.req.pull_secret.as_deref(),
                settings,
            )
            .await
        }
        _ => Ok(()),
    }
}

/// An `oci://` source the kubelet mounted as an image volume: read in place, or with
/// `Settings::copy_image_volumes` copied into the cache once (a copy already there and intact
/// is taken as is). The container runtime checked the image against the digest the pod pins;
/// here the module's bytes are checked against a `sha256` pin, which must name them (a
/// manifest digest is the pod's to pin).
async fn mounted(
    pull: &Pull<'_>,
    mount: &image_volume::Mount,
    cache: &Cache,
    settings: &Settings,
) -> Result<Pulled, FetchError> {
    if pull.verified {
        return Err(FetchError::Unsupported(
            "a cosign signature is checked at the registry, and an image volume is read without one; \
             pin the image volume's reference by digest instead, or drop --image-volume-root"
                .into(),
        ));
    }
    let pin = pull.req.sha256.as_ref();
    let (path, sha256) = image_volume::read(mount, pin, settings.max_size).await?;
    let mut pulled = Pulled {
        path,
        source: pull.key.clone(),
        sha256,
        manifest_digest: None,
        pin: pull.req.sha256.map(|_| PinMatch::ModuleSha256),
        from_cache: true,
        signature: None,
    };
    if !settings.copy_image_volumes {
        return Ok(pulled);
    }
    let index = IndexFile::new(cache);
    let recorded = index.load()?.modules.get(&sha256).map(ModuleEntry::stamp);
    // Marked as a copy only when copied here: a module a direct pull left keeps its expiry.
    match cache.lookup_intact(&sha256, cache::Verify::Stamp(recorded)) {
        Some(path) => pulled.path = path,
        None => {
            let staging = cache.staging(settings.max_size)?;
            let (staging, sha) = image_volume::copy(mount, pin, settings.max_size, staging).await?;
            // The file changed between the two reads: the bytes checked are not those copied.
            let (path, _) = cache.commit(staging, Some(&sha256)).map_err(|e| match e {
                FetchError::ChecksumMismatch { .. } => FetchError::Read {
                    what: "image volume module",
                    path: mount.module(),
                    reason: format!("it changed while read (now sha256 {sha})"),
                },
                other => other,
            })?;
            pulled.path = path;
            pulled.from_cache = false;
        }
    }
    let copied = !pulled.from_cache;
    record(&index, pull, pulled, None, copied).await
}

/// The cross-process lock on one source. Waiting polls instead of blocking a thread in the
/// kernel, so a caller's deadline (`--timeout`) ends the wait at once and leaves no thread
/// behind.
async fn lock_source(cache: &Cache, key: &str) -> Result<std::fs::File, FetchError> {
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        if let Some(lock) = cache.try_lock_source(key)? {
            return Ok(lock);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// The in-process lock for one source in one cache. Entries stay for the life of the process:
/// one small mutex per distinct source pulled.
fn in_flight(cache: &Cache, key: &str) -> Arc<tokio::sync::Mutex<()>> {
    type SourceLocks = HashMap<(PathBuf, String), Arc<tokio::sync::Mutex<()>>>;
    static IN_FLIGHT: LazyLock<Mutex<SourceLocks>> = LazyLock::new(Mutex::default);
    let mut map = wasm_common::sync::lock(&IN_FLIGHT);
    map.entry((cache.root().to_path_buf(), key.to_string()))
        .or_default()
        .clone()
}

/// [`record_now`] on a blocking thread: waiting for the index lock must not stall the
/// runtime, or a caller's deadline could not fire.
async fn record(
    index: &IndexFile,
    pull: &Pull<'_>,
    pulled: Pulled,
    index_digest: Option<Digest>,
    image_volume_copy: bool,
) -> Result<Pulled, FetchError> {
    let index = index.clone();
    let (key, resource) = (pull.key.clone(), pull.resource.clone());
    let version = pull.req.resource_version.clone();
    let root = index.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let recorded = Recorded {
            key: &key,
            resource: &resource,
            version: version.as_deref(),
            index_digest,
            image_volume_copy,
        };
        record_now(&index, &recorded, pulled)
    })
    .await
    .map_err(|e| FetchError::Cache {
        path: root,
        message: format!("recording the pull: {e}"),
    })?
}

/// What a successful pull writes to the index beside the module itself.
struct Recorded<'a> {
    key: &'a str,
    resource: &'a str,
    version: Option<&'a str>,
    index_digest: Option<Digest>,
    /// The module was just copied from an image volume (`ModuleEntry::image_volume_copy`).
    image_volume_copy: bool,
}

/// Records a successful pull: the module's use, what the source resolved to, and (only now,
/// after success) the resource version.
fn record_now(index: &IndexFile, r: &Recorded, pulled: Pulled) -> Result<Pulled, FetchError> {
    let now = index::now();
    let stamp = cache::Stamp::of_file(&pulled.path);
    index.update(|idx| {
        let entry = idx
            .modules
            .entry(pulled.sha256)
            .or_insert_with(|| ModuleEntry::pulled(r.key, now));
        entry.verified(r.key, now, stamp);
        // Set here, not only for a new entry: a missing index is rebuilt from the module
        // files, the one just copied included, before this update sees it.
        entry.image_volume_copy |= r.image_volume_copy;
        // The image this pull resolved to, index included or not: a signature remembered for
        // an index answers only while the manifest it led to is the module's.
        if pulled.manifest_digest.is_some() {
            entry.manifest_digest = pulled.manifest_digest;
            entry.index_digest = r.index_digest;
        }
        if let Some(v) = &pulled.signature {
            entry.signed(v);
        }
        idx.sources.insert(
            r.key.to_string(),
            SourceEntry {
                sha256: pulled.sha256,
                manifest_digest: pulled.manifest_digest,
            },
        );
        if let Some(v) = r.version {
            idx.resources.insert(r.resource.to_string(), v.to_string());
        }
    })?;
    Ok(pulled)
}

/// One cached module as `wasm-fetcher ls` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub sha256: Sha256,
    pub path: PathBuf,
    pub source: String,
    pub manifest_digest: Option<Digest>,
    /// Set for an Envoy dynamic module (`lib<name>.so` and its platform).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_module: Option<cache::DynamicModuleFile>,
    pub size: u64,
    /// Unix seconds.
    pub last_used: u64,
    /// Unix seconds after which `purge` removes it if unused.
    pub expires: u64,
}

/// Every module the index knows and whose file is present.
pub fn list(cache: &Cache, settings: &Settings) -> Result<Vec<Listed>, FetchError> {
    let idx = IndexFile::new(cache).load()?;
    Ok(idx
        .modules
        .iter()
        .filter_map(|(sha, m)| {
            let path = m.path(cache, sha);
            path.is_file().then_some(())?;
            Some(Listed {
                sha256: *sha,
                path,
                source: m.source.clone(),
                manifest_digest: m.manifest_digest,
                dynamic_module: m.dynamic_module.clone(),
                size: m.size,
                last_used: m.last_used,
                expires: m.last_used.saturating_add(settings.module_expiry.as_secs()),
            })
        })
        .collect())
}

/// Removes modules unused for longer than `WASM_MODULE_EXPIRY` and, with
/// `WASM_CACHE_MAX_BYTES`, the least recently used until the cache fits, sparing what a running
/// `serve` uses ([`lifecycle::purge`]); then what killed processes left behind: temp files, and
/// lock files no one holds. Returns the removed modules' digests.
pub fn purge(cache: &Cache, settings: &Settings) -> Result<Vec<Sha256>, FetchError> {
    let purged = lifecycle::purge(cache, settings, &Default::default())?;
    Ok(purged.removed().copied().collect())
}
