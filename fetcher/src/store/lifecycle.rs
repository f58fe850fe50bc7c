//! What leaves the cache, and what never does. A module a current config names is never
//! removed (Istio's agent purges modules Envoy still loads: istio#42154, #53891); the rest go
//! when unused for `WASM_MODULE_EXPIRY`, and, with `WASM_CACHE_MAX_BYTES` set, the least
//! recently used go first until the cache fits.
//!
//! Recency is the index's `last_used`, not an in-memory `lru::LruCache`: the order has to
//! survive restarts and count the pulls of every process sharing the cache (`wasm-fetcher
//! pull`, an init container, another `serve`), which only the index sees. Ties are broken by
//! pull time, then digest, so the order is total and a test can state it.
//!
//! A long-running process says which modules it uses through a lease: `<cache>/in-use/<holder>
//! .json`, valid while that process holds the lock on `<holder>.lock`. Any purge, the CLI's
//! included, spares what a live lease names; a lease whose holder died is dropped.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::digest::Sha256;
use crate::error::FetchError;
use crate::settings::Settings;
use crate::store::cache::{io_error, Cache};
use crate::store::index::{self, IndexFile};

/// What a purge did, each list holding module digests.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Purged {
    /// Unused for `WASM_MODULE_EXPIRY`.
    pub expired: Vec<Sha256>,
    /// Removed for `WASM_CACHE_MAX_BYTES`, least recently used first.
    pub evicted: Vec<Sha256>,
    /// Expired or over the cap, but named by a current config, so kept.
    pub spared: Vec<Sha256>,
}

impl Purged {
    pub fn removed(&self) -> impl Iterator<Item = &Sha256> {
        self.expired.iter().chain(&self.evicted)
    }
}

/// Removes expired modules, then (with a cap) the least recently used until the cache fits,
/// never one in `in_use` or in a live lease; then what killed processes left behind (temp
/// files, unheld locks).
pub fn purge(
    cache: &Cache,
    settings: &Settings,
    in_use: &BTreeSet<Sha256>,
) -> Result<Purged, FetchError> {
    let _purging = purge_lock(cache)?;
    let mut keep = leased(cache);
    keep.extend(in_use.iter().copied());
    let now = index::now();
    let expiry = settings.module_expiry.as_secs();
    let purged = IndexFile::new(cache).update(|idx| {
        let mut out = Purged::default();
        for (sha, m) in &idx.modules {
            if now.saturating_sub(m.last_used) >= expiry {
                if keep.contains(sha) {
                    out.spared.push(*sha);
                } else {
                    out.expired.push(*sha);
                }
            }
        }
        if let Some(cap) = settings.cache_max_bytes {
            let size_of = |sha: &Sha256, m: &index::ModuleEntry| {
                if m.size > 0 {
                    return m.size;
                }
                std::fs::metadata(m.path(cache, sha)).map_or(0, |m| m.len())
            };
            let mut left: Vec<_> = idx
                .modules
                .iter()
                .filter(|(sha, _)| !out.expired.contains(sha))
                .map(|(sha, m)| (m.last_used, m.pulled_at, *sha, size_of(sha, m)))
                .collect();
            let mut total: u64 = left.iter().map(|(.., size)| size).sum();
            left.sort();
            for (_, _, sha, size) in left {
                if total <= cap {
                    break;
                }
                if keep.contains(&sha) {
                    if !out.spared.contains(&sha) {
                        out.spared.push(sha);
                    }
                    continue;
                }
                total = total.saturating_sub(size);
                out.evicted.push(sha);
            }
            if total > cap {
                tracing::warn!(
                    total,
                    cap,
                    "the modules in use alone exceed WASM_CACHE_MAX_BYTES; they are kept"
                );
            }
        }
        let gone: BTreeSet<Sha256> = out.removed().copied().collect();
        for sha in &gone {
            if let Some(m) = idx.modules.remove(sha) {
                cache.remove(sha, m.dynamic_module.as_ref());
            }
        }
        idx.sources.retain(|_, s| !gone.contains(&s.sha256));
        out
    })?;
    cache.remove_stale_temp_files(settings.purge_interval);
    cache.remove_unused_locks();
    Ok(purged)
}

/// Removes the copies of image-volume modules (`ModuleEntry::image_volume_copy`) that neither
/// `in_use` nor a live lease names: the image is the module's home, and a copy no config names
/// is of an image the node moved on from. Returns their digests.
pub fn purge_copies(cache: &Cache, in_use: &BTreeSet<Sha256>) -> Result<Vec<Sha256>, FetchError> {
    let _purging = purge_lock(cache)?;
    let mut keep = leased(cache);
    keep.extend(in_use.iter().copied());
    IndexFile::new(cache).update(|idx| {
        let gone: Vec<Sha256> = idx
            .modules
            .iter()
            .filter(|(sha, m)| m.image_volume_copy && !keep.contains(sha))
            .map(|(sha, _)| *sha)
            .collect();
        for sha in &gone {
            idx.modules.remove(sha);
            let _ = std::fs::remove_file(cache.module_path(sha));
        }
        idx.sources.retain(|_, s| !gone.contains(&s.sha256));
        gone
    })
}

/// A process's claim on the modules it uses (see the module docs). Dropping it (or the
/// process dying) ends the claim.
#[derive(Debug)]
pub struct Lease {
    _lock: File,
    list: PathBuf,
    cache: Cache,
}

fn leases_dir(cache: &Cache) -> PathBuf {
    cache.root().join("in-use")
}

/// A purge of a large index takes well under this; a longer wait means the holder is stuck.
const PURGE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Held by a purge from reading the leases to removing modules, and for a moment by a lease
/// holder checking that its modules are still there ([`Lease::hold`]): a module is either
/// seen leased by the purge or seen gone by its holder, never neither.
fn purge_lock(cache: &Cache) -> Result<File, FetchError> {
    let dir = leases_dir(cache);
    std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
    let path = dir.join("purge.lock");
    wasm_common::fs::lock_within(&path, PURGE_LOCK_WAIT).map_err(|e| io_error(&path, e))
}

impl Lease {
    /// Takes the lease named `holder` (a file-name-safe word). Refused while another live
    /// process holds it: two processes writing one set of configs would undo each other.
    pub fn take(cache: &Cache, holder: &str) -> Result<Self, FetchError> {
        let dir = leases_dir(cache);
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        let lock_path = dir.join(format!("{holder}.lock"));
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_error(&lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(FetchError::Cache {
                    path: lock_path,
                    message: "another running wasm-fetcher holds this lease (is a second `serve` writing the same ECDS directory?)".into(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_error(&lock_path, e)),
        }
        Ok(Self {
            _lock: lock,
            list: dir.join(format!("{holder}.json")),
            cache: cache.clone(),
        })
    }

    /// [`Lease::set`], then the modules of `modules` a purge removed before it could see them
    /// leased: those must be fetched again before a config names them. Blocks while a purge
    /// runs.
    pub fn hold(&self, modules: &BTreeSet<Sha256>) -> Result<BTreeSet<Sha256>, FetchError> {
        self.set(modules)?;
        let _purging = purge_lock(&self.cache)?;
        Ok(modules
            .iter()
            .filter(|sha| self.cache.lookup(sha).is_none() && !self.cache.holds_dynamic_module(sha))
            .copied()
            .collect())
    }

    /// Replaces the set of modules this lease keeps, atomically.
    pub fn set(&self, modules: &BTreeSet<Sha256>) -> Result<(), FetchError> {
        let dir = self.cache.root().join("tmp");
        let mut tmp = tempfile::Builder::new()
            .prefix("lease-")
            .tempfile_in(&dir)
            .map_err(|e| io_error(&dir, e))?;
        let bytes = serde_json::to_vec(modules).map_err(|e| FetchError::Cache {
            path: self.list.clone(),
            message: e.to_string(),
        })?;
        std::io::Write::write_all(&mut tmp, &bytes).map_err(|e| io_error(&self.list, e))?;
        tmp.persist(&self.list)
            .map_err(|e| io_error(&self.list, e.error))?;
        Ok(())
    }
}

/// Far more than any lease (a digest is 67 bytes in it).
const MAX_LEASE_BYTES: u64 = 16 << 20;

/// The modules named by live leases. A lease whose holder is gone is removed.
pub fn leased(cache: &Cache) -> BTreeSet<Sha256> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(leases_dir(cache))
        .into_iter()
        .flatten()
        .flatten()
    {
        let list = e.path();
        if list.extension().is_none_or(|x| x != "json") {
            continue;
        }
        if !held(&list.with_extension("lock")) {
            let _ = std::fs::remove_file(&list);
            let _ = std::fs::remove_file(list.with_extension("lock"));
            continue;
        }
        match read_lease(&list) {
            Ok(shas) => out.extend(shas),
            Err(problem) => {
                tracing::warn!(path = %list.display(), %problem, "unreadable lease ignored")
            }
        }
    }
    out
}

fn read_lease(path: &Path) -> Result<BTreeSet<Sha256>, String> {
    let bytes = crate::regular_file::read(path, MAX_LEASE_BYTES).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// Whether some process holds the lock at `path` (one that cannot be opened counts as held:
/// a lease is never dropped on a doubt).
fn held(path: &Path) -> bool {
    let Ok(f) = File::options().write(true).open(path) else {
        return !matches!(std::fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    };
    matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::index::ModuleEntry;

    fn cache_with(modules: &[(u8, u64, u64)]) -> (tempfile::TempDir, Cache, Vec<Sha256>) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let mut shas = Vec::new();
        IndexFile::new(&cache)
            .update(|idx| {
                for &(n, last_used, size) in modules {
                    let sha = Sha256([n; 32]);
                    std::fs::write(cache.module_path(&sha), vec![0u8; size as usize]).unwrap();
                    idx.modules.insert(
                        sha,
                        ModuleEntry {
                            source: format!("file:///m{n}"),
                            manifest_digest: None,
                            index_digest: None,
                            size,
                            modified_ns: None,
                            pulled_at: 1,
                            last_used,
                            image_volume_copy: false,
                            dynamic_module: None,
                            signatures: vec![],
                        },
                    );
                    shas.push(sha);
                }
            })
            .unwrap();
        (dir, cache, shas)
    }

    #[test]
    fn in_use_modules_are_never_purged() {
        let (_d, cache, shas) = cache_with(&[(1, 10, 100), (2, 10, 100)]);
        let in_use = BTreeSet::from([shas[0]]);
        let purged = purge(&cache, &Settings::default(), &in_use).unwrap();
        assert_eq!(purged.expired, vec![shas[1]]);
        assert_eq!(purged.spared, vec![shas[0]]);
        assert!(cache.lookup(&shas[0]).is_some());
        assert!(cache.lookup(&shas[1]).is_none());
    }

    #[test]
    fn a_live_lease_spares_its_modules_and_a_dead_one_is_dropped() {
        let (_d, cache, shas) = cache_with(&[(1, 10, 100), (2, 10, 100)]);
        let lease = Lease::take(&cache, "serve").unwrap();
        lease.set(&BTreeSet::from([shas[1]])).unwrap();
        assert!(
            Lease::take(&cache, "serve").is_err(),
            "a second holder is refused"
        );
        let purged = purge(&cache, &Settings::default(), &BTreeSet::new()).unwrap();
        assert_eq!(purged.expired, vec![shas[0]]);
        assert_eq!(purged.spared, vec![shas[1]]);
        drop(lease);
        assert!(leased(&cache).is_empty());
        assert!(!leases_dir(&cache).join("serve.json").exists());
    }

    #[test]
    fn only_copies_of_image_volumes_no_one_names_go_at_once() {
        let now = index::now();
        let (_d, cache, shas) = cache_with(&[(1, now, 100), (2, now, 100), (3, now, 100)]);
        IndexFile::new(&cache)
            .update(|idx| {
                for sha in &shas[1..] {
                    idx.modules.get_mut(sha).unwrap().image_volume_copy = true;
                }
            })
            .unwrap();
        let lease = Lease::take(&cache, "other").unwrap();
        lease.set(&BTreeSet::from([shas[2]])).unwrap();
        assert_eq!(
            purge_copies(&cache, &BTreeSet::new()).unwrap(),
            vec![shas[1]]
        );
        assert!(
            cache.lookup(&shas[0]).is_some(),
            "a pulled module waits for its expiry"
        );
        assert!(cache.lookup(&shas[1]).is_none());
        assert!(cache.lookup(&shas[2]).is_some(), "a leased copy stays");
        drop(lease);
        assert_eq!(
            purge_copies(&cache, &BTreeSet::from([shas[2]])).unwrap(),
            vec![]
        );
        assert_eq!(
            purge_copies(&cache, &BTreeSet::new()).unwrap(),
            vec![shas[2]]
        );
    }

    #[test]
    fn the_cap_evicts_least_recently_used_first_and_spares_in_use() {
        let now = index::now();
        // Oldest first: 3 (in use), 1, 4, 2.
        let (_d, cache, shas) = cache_with(&[
            (1, now - 30, 100),
            (2, now - 10, 100),
            (3, now - 40, 100),
            (4, now - 20, 100),
        ]);
        let settings = Settings {
            cache_max_bytes: Some(250),
            ..Settings::default()
        };
        let in_use = BTreeSet::from([shas[2]]);
        let purged = purge(&cache, &settings, &in_use).unwrap();
        assert!(purged.expired.is_empty());
        assert_eq!(purged.evicted, vec![shas[0], shas[3]]);
        assert!(cache.lookup(&shas[1]).is_some());
        assert_eq!(purged.spared, vec![shas[2]]);
    }
}
