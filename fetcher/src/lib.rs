//! Pulls Wasm modules for Envoy the way Istio's agent does, into a verified,
//! content-addressed cache, and rewrites Envoy configuration to load the cached file.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wasm_fetcher::FetchError> {
//! use wasm_fetcher::{pull, Cache, PullRequest, Settings};
//! let cache = Cache::open("/var/cache/wasm".as_ref())?;
//! let pulled = pull(
//!     &PullRequest { url: "https://example.com/filter.wasm".into(), ..Default::default() },
//!     &cache,
//!     &Settings::from_env()?,
//! ).await?;
//! println!("{}", pulled.path.display());
//! # Ok(()) }
//! ```

#[cfg(test)]
mod alloc_meter;
pub mod auth;
pub mod bootstrap;
pub mod cache;
pub mod convert;
pub mod error;
pub mod fallback;
pub mod guard;
pub mod index;
pub mod lifecycle;
pub mod net;
pub mod policy;
pub mod progress;
pub mod push;
pub mod reference;
pub mod regular_file;
pub mod render;
pub mod serve;
pub mod settings;
pub mod source;
pub mod tls;
pub mod unbox;
pub mod verify;
pub mod wasmplugin;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

pub use cache::Cache;
pub use error::FetchError;
pub use policy::PullPolicy;
pub use progress::Progress;
pub use settings::Settings;
pub use verify::Sha256;

use index::{IndexFile, ModuleEntry, SourceEntry};
use reference::Source;

#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    pub url: String,
    /// A pin: for file and HTTP the module's sha256; for OCI the image manifest digest, the
    /// index digest, or the module's sha256.
    pub sha256: Option<Sha256>,
    pub policy: Option<PullPolicy>,
    /// The resource the module is for (an Envoy extension config); defaults to the URL.
    pub resource: Option<String>,
    /// Its version: `Always` re-pulls when it changes, and on every pull when absent.
    pub resource_version: Option<String>,
    /// `os/arch` to pick from an image index.
    pub platform: Option<String>,
    /// Docker config JSON with registry credentials.
    pub pull_secret: Option<PathBuf>,
    /// Where download progress goes (the CLI draws a bar on a terminal).
    pub progress: Progress,
}

/// Which pin a module was matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PinMatch {
    ModuleSha256,
    ManifestDigest,
    IndexDigest,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Pulled {
    pub path: PathBuf,
    pub source: String,
    pub sha256: String,
    pub manifest_digest: Option<String>,
    pub pin: Option<PinMatch>,
    /// No module bytes were downloaded (a tag may still have been checked).
    pub from_cache: bool,
}

/// A source URL as the index records it and a pull reports it: without its userinfo. The
/// index is world-readable, and a password in an `http://user:password@...` URL must not be
/// written to disk or printed.
fn recorded_source(url: &str) -> String {
    reference::redact_userinfo(url)
}

fn digest_str(s: &Sha256) -> String {
    format!("sha256:{}", s.hex())
}

/// What the cache alone can answer, under `policy`.
fn from_cache(
    idx: &index::Index,
    cache: &Cache,
    req: &PullRequest,
    source: &Source,
    policy: PullPolicy,
    resource: &str,
) -> Option<Pulled> {
    let hit = |sha: &str, pin: Option<PinMatch>| -> Option<Pulled> {
        let path = intact(idx, cache, sha, pin.is_some())?;
        Some(Pulled {
            path,
            source: recorded_source(&req.url),
            sha256: sha.to_string(),
            manifest_digest: idx.modules.get(sha).and_then(|m| m.manifest_digest.clone()),
            pin,
            from_cache: true,
        })
    };
    let by_digest = |d: &str| {
        idx.modules.iter().find_map(|(sha, m)| {
            if m.manifest_digest.as_deref() == Some(d) {
                Some((sha.clone(), PinMatch::ManifestDigest))
            } else if m.index_digest.as_deref() == Some(d) {
                Some((sha.clone(), PinMatch::IndexDigest))
            } else {
                None
            }
        })
    };
    for pin in req.sha256.iter().chain(source.pinned_digest().as_ref()) {
        if let Some(p) = hit(&pin.hex(), Some(PinMatch::ModuleSha256)) {
            return Some(p);
        }
        if let Some((sha, m)) = by_digest(&digest_str(pin)) {
            return hit(&sha, Some(m));
        }
    }
    if req.sha256.is_some() || source.pinned_digest().is_some() {
        return None;
    }
    let known = idx.sources.get(&recorded_source(&req.url))?;
    match policy {
        PullPolicy::IfNotPresent | PullPolicy::Never => hit(&known.sha256, None),
        PullPolicy::Always => {
            let version = req.resource_version.as_ref()?;
            (idx.resources.get(resource) == Some(version)).then(|| hit(&known.sha256, None))?
        }
    }
}

/// Resolves the pull policy, serves from the cache when it may, otherwise fetches, verifies,
/// stores and records the module. A pull never deletes anything.
pub async fn pull(
    req: &PullRequest,
    cache: &Cache,
    settings: &Settings,
) -> Result<Pulled, FetchError> {
    let source = Source::parse(&req.url)?;
    let pinned = req.sha256.is_some() || source.pinned_digest().is_some();
    let policy = policy::effective(req.policy, &source, pinned);
    let resource = req
        .resource
        .clone()
        .unwrap_or_else(|| recorded_source(&req.url));
    let index = IndexFile::new(cache);
    let idx = index.load()?;
    if let Some(p) = from_cache(&idx, cache, req, &source, policy, &resource) {
        // A hit that would change nothing but a last-use time under a minute old skips the
        // locked index rewrite: that keeps a warm lookup to a read and a stat.
        if already_recorded(&idx, req, &resource, &p) {
            return Ok(p);
        }
        return match record(&index, req, &resource, p.clone(), None).await {
            // The module is there and checked; only the bookkeeping could not be written.
            Err(FetchError::CacheReadOnly { path, message }) => {
                tracing::warn!(path = %path.display(), %message, "cache is read-only; last use not recorded");
                Ok(p)
            }
            other => other,
        };
    }
    if policy == PullPolicy::Never {
        return Err(FetchError::NotInCache);
    }
    // One download per source: within this process through an async mutex, across processes
    // through the file lock. Whoever waited finds the module cached below.
    let _in_process = in_flight(cache, &req.url).lock_owned().await;
    let _lock = lock_source(cache, &req.url).await?;
    if policy != PullPolicy::Always || req.resource_version.is_some() {
        if let Some(p) = from_cache(&index.load()?, cache, req, &source, policy, &resource) {
            return record(&index, req, &resource, p, None).await;
        }
    }
    let mut staging = cache.staging(settings.max_size)?;
    staging.report_to(req.progress.clone());
    let (pulled, index_digest) = match &source {
        Source::File(url) => {
            source::file::fetch(url, &mut staging).await?;
            (commit(cache, staging, req, None)?, None)
        }
        Source::Http(url) => {
            source::http::fetch(url, &mut staging, settings).await?;
            let staging = unbox::unbox(cache, staging)?;
            (commit(cache, staging, req, None)?, None)
        }
        Source::Oci(r) => {
            let creds = auth::credentials(req.pull_secret.as_deref(), &r.registry)?;
            let registry = source::oci::Registry::new(r, creds, settings);
            let (connection, resolved) = registry.resolve(r, req.platform.as_deref()).await?;
            // A pin may name the manifest or the index instead of the module.
            let digest_pin = req.sha256.as_ref().map(digest_str).and_then(|pin| {
                if pin == resolved.manifest_digest {
                    Some(PinMatch::ManifestDigest)
                } else if Some(&pin) == resolved.index_digest.as_ref() {
                    Some(PinMatch::IndexDigest)
                } else {
                    None
                }
            });
            let url_pin = source.pinned_digest().map(|d| digest_str(&d));
            if let Some(d) = &url_pin {
                if *d != resolved.manifest_digest && Some(d) != resolved.index_digest.as_ref() {
                    return Err(FetchError::ChecksumMismatch {
                        expected: d.clone(),
                        actual: resolved.manifest_digest.clone(),
                    });
                }
            }
            // The tag still points at the manifest we have: no layer download.
            let idx = index.load()?;
            let unchanged = idx.modules.iter().find(|(sha, m)| {
                m.manifest_digest.as_deref() == Some(&resolved.manifest_digest)
                    && intact(&idx, cache, sha, pinned).is_some()
            });
            let module_pin = if digest_pin.is_some() {
                None
            } else {
                req.sha256
            };
            match unchanged {
                Some((sha, _)) if module_pin.is_none_or(|p| p.hex() == *sha) => {
                    let sha = Sha256::parse(sha).map_err(|e| FetchError::Cache {
                        path: cache.root().to_path_buf(),
                        message: e,
                    })?;
                    (
                        Pulled {
                            path: cache.module_path(&sha),
                            source: recorded_source(&req.url),
                            sha256: sha.hex(),
                            manifest_digest: Some(resolved.manifest_digest.clone()),
                            pin: digest_pin.or(module_pin.map(|_| PinMatch::ModuleSha256)),
                            from_cache: true,
                        },
                        resolved.index_digest.clone(),
                    )
                }
                _ => {
                    let staging = registry
                        .download(&connection, cache, &resolved, staging)
                        .await?;
                    let (path, sha) = cache.commit(staging, module_pin.as_ref())?;
                    let pin = digest_pin
                        .or(module_pin.map(|_| PinMatch::ModuleSha256))
                        .or(url_pin.map(|d| {
                            if Some(&d) == resolved.index_digest.as_ref() {
                                PinMatch::IndexDigest
                            } else {
                                PinMatch::ManifestDigest
                            }
                        }));
                    (
                        Pulled {
                            path,
                            source: recorded_source(&req.url),
                            sha256: sha.hex(),
                            manifest_digest: Some(resolved.manifest_digest.clone()),
                            pin,
                            from_cache: false,
                        },
                        resolved.index_digest.clone(),
                    )
                }
            }
        }
    };
    record(&index, req, &resource, pulled, index_digest).await
}

/// The cross-process lock on one source. Waiting polls instead of blocking a thread in the
/// kernel, so a caller's deadline (`--timeout`) ends the wait at once and leaves no thread
/// behind.
async fn lock_source(cache: &Cache, url: &str) -> Result<std::fs::File, FetchError> {
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        if let Some(lock) = cache.try_lock_source(url)? {
            return Ok(lock);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// The in-process lock for one source in one cache. Entries stay for the life of the process:
/// one small mutex per distinct source pulled.
fn in_flight(cache: &Cache, url: &str) -> Arc<tokio::sync::Mutex<()>> {
    type SourceLocks = HashMap<(PathBuf, String), Arc<tokio::sync::Mutex<()>>>;
    static IN_FLIGHT: LazyLock<Mutex<SourceLocks>> = LazyLock::new(Mutex::default);
    let mut map = IN_FLIGHT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    map.entry((cache.root().to_path_buf(), url.to_string()))
        .or_default()
        .clone()
}

/// The cached module named by `sha` (hex), if its file is intact; `pinned` re-hashes it
/// whatever the index recorded, since the answer is reported as a pin match.
fn intact(idx: &index::Index, cache: &Cache, sha: &str, pinned: bool) -> Option<PathBuf> {
    let verify = if pinned {
        cache::Verify::Hash
    } else {
        cache::Verify::Stamp(idx.modules.get(sha).map(ModuleEntry::stamp))
    };
    cache.lookup_intact(&Sha256::parse(sha).ok()?, verify)
}

fn already_recorded(idx: &index::Index, req: &PullRequest, resource: &str, p: &Pulled) -> bool {
    let fresh = idx.modules.get(&p.sha256).is_some_and(|m| {
        index::now().saturating_sub(m.last_used) < 60
            && cache::Stamp::of_file(&p.path) == Some(m.stamp())
    });
    let source_known = idx
        .sources
        .get(&recorded_source(&req.url))
        .is_some_and(|s| s.sha256 == p.sha256);
    let version_known = req
        .resource_version
        .as_ref()
        .is_none_or(|v| idx.resources.get(resource) == Some(v));
    fresh && source_known && version_known
}

fn commit(
    cache: &Cache,
    staging: cache::Staging,
    req: &PullRequest,
    manifest_digest: Option<String>,
) -> Result<Pulled, FetchError> {
    let (path, sha) = cache.commit(staging, req.sha256.as_ref())?;
    Ok(Pulled {
        path,
        source: recorded_source(&req.url),
        sha256: sha.hex(),
        manifest_digest,
        pin: req.sha256.map(|_| PinMatch::ModuleSha256),
        from_cache: false,
    })
}

/// [`record_now`] on a blocking thread: waiting for the index lock must not stall the
/// runtime, or a caller's deadline could not fire.
async fn record(
    index: &IndexFile,
    req: &PullRequest,
    resource: &str,
    pulled: Pulled,
    index_digest: Option<String>,
) -> Result<Pulled, FetchError> {
    let (index, req, resource) = (index.clone(), req.clone(), resource.to_string());
    let root = index.path().to_path_buf();
    tokio::task::spawn_blocking(move || record_now(&index, &req, &resource, pulled, index_digest))
        .await
        .map_err(|e| FetchError::Cache {
            path: root,
            message: format!("recording the pull: {e}"),
        })?
}

/// Records a successful pull: the module's use, what the source resolved to, and (only now,
/// after success) the resource version.
fn record_now(
    index: &IndexFile,
    req: &PullRequest,
    resource: &str,
    pulled: Pulled,
    index_digest: Option<String>,
) -> Result<Pulled, FetchError> {
    let now = index::now();
    let stamp = cache::Stamp::of_file(&pulled.path);
    index.update(|idx| {
        let entry = idx
            .modules
            .entry(pulled.sha256.clone())
            .or_insert_with(|| ModuleEntry {
                source: recorded_source(&req.url),
                manifest_digest: pulled.manifest_digest.clone(),
                index_digest: index_digest.clone(),
                size: 0,
                modified_ns: None,
                pulled_at: now,
                last_used: now,
            });
        entry.last_used = now;
        if entry.source.is_empty() {
            // Found by a rebuilt index, which cannot know where a module came from.
            entry.source = recorded_source(&req.url);
        }
        // Verified by this pull (downloaded, or checked by `intact`): remember the file as is.
        if let Some(stamp) = stamp {
            entry.size = stamp.size;
            entry.modified_ns = stamp.modified_ns;
        }
        if pulled.manifest_digest.is_some() {
            entry.manifest_digest = pulled.manifest_digest.clone();
        }
        if index_digest.is_some() {
            entry.index_digest = index_digest.clone();
        }
        idx.sources.insert(
            recorded_source(&req.url),
            SourceEntry {
                sha256: pulled.sha256.clone(),
                manifest_digest: pulled.manifest_digest.clone(),
            },
        );
        if let Some(v) = &req.resource_version {
            idx.resources.insert(resource.to_string(), v.clone());
        }
    })?;
    Ok(pulled)
}

/// One cached module as `wasm-fetcher ls` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub sha256: String,
    pub path: PathBuf,
    pub source: String,
    pub manifest_digest: Option<String>,
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
            // A hand-edited index may spell a digest otherwise: listed in one spelling.
            let sha = Sha256::parse(sha).ok()?;
            let path = cache.lookup(&sha)?;
            Some(Listed {
                sha256: sha.hex(),
                path,
                source: m.source.clone(),
                manifest_digest: m.manifest_digest.clone(),
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
pub fn purge(cache: &Cache, settings: &Settings) -> Result<Vec<String>, FetchError> {
    let purged = lifecycle::purge(cache, settings, &Default::default())?;
    Ok(purged.removed().cloned().collect())
}
