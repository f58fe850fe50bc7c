//! The cache's persistent index (`<cache>/index.json`): which module each source last
//! resolved to, which resource version each resource last pulled, and when each module was
//! last used. It is what lets `IfNotPresent`, `Always` and `Never` hold across processes and
//! restarts. Updates are read-modify-write under an exclusive file lock, written atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::digest::{Digest, Sha256};
use crate::error::FetchError;
use crate::reference::canonical_key;
use crate::store::cache::Cache;

/// What `format` says of an index whose source and resource names are canonical
/// (`Source::key`). An older index (no `format`) is migrated when read.
const FORMAT: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Index {
    #[serde(default)]
    pub format: u32,
    /// By module sha256.
    #[serde(default)]
    pub modules: BTreeMap<Sha256, ModuleEntry>,
    /// By source, under its canonical key (`crate::reference::Source::key`).
    #[serde(default)]
    pub sources: BTreeMap<String, SourceEntry>,
    /// Last resource version pulled successfully, by resource name; a resource named by a
    /// source URL (the default) under the source's canonical key.
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            format: FORMAT,
            modules: BTreeMap::new(),
            sources: BTreeMap::new(),
            resources: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModuleEntry {
    /// The canonical key of the source it was first pulled from; empty when the index was
    /// rebuilt from the module files, which cannot say.
    pub source: String,
    pub manifest_digest: Option<Digest>,
    #[serde(default)]
    pub index_digest: Option<Digest>,
    pub size: u64,
    /// The file's mtime when last verified (see `Cache::lookup_intact`).
    #[serde(default)]
    pub modified_ns: Option<u64>,
    pub pulled_at: u64,
    pub last_used: u64,
    /// A copy of a module read from an image volume (`serve --copy-image-volumes`): the image
    /// is its home, so the copy goes once no config names it rather than when it expires.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub image_volume_copy: bool,
    /// Set for an Envoy dynamic module; a Wasm module otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_module: Option<crate::store::cache::DynamicModuleFile>,
    /// The cosign signatures its image verified with (one per signed digest), so that a later
    /// pull with the same keys is answered here without asking the registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signatures: Vec<crate::signed::Verified>,
}

impl ModuleEntry {
    /// The entry a pull makes for a module the index does not list yet.
    pub fn pulled(source: &str, now: u64) -> Self {
        Self {
            source: source.to_string(),
            manifest_digest: None,
            index_digest: None,
            size: 0,
            modified_ns: None,
            pulled_at: now,
            last_used: now,
            image_volume_copy: false,
            dynamic_module: None,
            signatures: vec![],
        }
    }

    /// Remembers what verified its image.
    pub fn signed(&mut self, verified: &crate::signed::Verified) {
        match self
            .signatures
            .iter_mut()
            .find(|v| v.digest == verified.digest)
        {
            Some(known) => known.merge(verified),
            None => self.signatures.push(verified.clone()),
        }
    }

    /// What verified its image (its manifest's or its index's digest) with every key in
    /// `keys`, if that is remembered.
    pub fn signed_by(&self, keys: &[String]) -> Option<&crate::signed::Verified> {
        self.signatures.iter().find(|v| {
            (Some(v.digest) == self.manifest_digest || Some(v.digest) == self.index_digest)
                && v.covers(keys)
        })
    }

    /// A pull just verified the file (downloaded it, or found it intact): remember it as it
    /// is now, and where it came from if a rebuilt index could not say.
    pub fn verified(&mut self, source: &str, now: u64, stamp: Option<crate::store::cache::Stamp>) {
        self.last_used = now;
        if self.source.is_empty() {
            self.source = source.to_string();
        }
        if let Some(stamp) = stamp {
            self.size = stamp.size;
            self.modified_ns = stamp.modified_ns;
        }
    }

    /// Where its file is kept.
    pub fn path(&self, cache: &Cache, sha: &Sha256) -> PathBuf {
        cache.path_of(sha, self.dynamic_module.as_ref())
    }

    pub fn stamp(&self) -> crate::store::cache::Stamp {
        crate::store::cache::Stamp {
            size: self.size,
            modified_ns: self.modified_ns,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceEntry {
    pub sha256: Sha256,
    pub manifest_digest: Option<Digest>,
}

impl Index {
    /// The cached module named by `sha`, if its file is intact; `pinned` re-hashes it
    /// whatever the index recorded, since the answer is reported as a pin match.
    pub fn intact(&self, cache: &Cache, sha: &Sha256, pinned: bool) -> Option<PathBuf> {
        let verify = if pinned {
            crate::store::cache::Verify::Hash
        } else {
            crate::store::cache::Verify::Stamp(self.modules.get(sha).map(ModuleEntry::stamp))
        };
        cache.lookup_intact(sha, verify)
    }

    /// The intact cached module an image manifest was last resolved to.
    pub fn module_of_manifest(
        &self,
        cache: &Cache,
        manifest: Digest,
        pinned: bool,
    ) -> Option<Sha256> {
        self.modules
            .iter()
            .find(|(sha, m)| {
                m.manifest_digest == Some(manifest) && self.intact(cache, sha, pinned).is_some()
            })
            .map(|(sha, _)| *sha)
    }

    /// Brings an index written before source keys were canonical to the current format: every
    /// source and URL-named resource moves to its canonical key. Two spellings of one source
    /// become one entry, the one whose module was used last; two versions recorded for one
    /// resource are both dropped, so `Always` pulls once more rather than trust either.
    fn migrate(&mut self) {
        if self.format >= FORMAT {
            return;
        }
        let last_used = |e: &SourceEntry| self.modules.get(&e.sha256).map(|m| m.last_used);
        let mut sources: BTreeMap<String, SourceEntry> = BTreeMap::new();
        for (key, entry) in std::mem::take(&mut self.sources) {
            let key = canonical_key(&key);
            match sources.get(&key) {
                Some(kept) if last_used(kept) >= last_used(&entry) => {}
                _ => {
                    sources.insert(key, entry);
                }
            }
        }
        self.sources = sources;
        let mut resources: BTreeMap<String, Option<String>> = BTreeMap::new();
        for (name, version) in std::mem::take(&mut self.resources) {
            resources
                .entry(canonical_key(&name))
                .and_modify(|kept| {
                    if kept.as_ref() != Some(&version) {
                        *kept = None;
                    }
                })
                .or_insert(Some(version));
        }
        self.resources = resources
            .into_iter()
            .filter_map(|(name, version)| Some((name, version?)))
            .collect();
        for m in self.modules.values_mut() {
            if !m.source.is_empty() {
                m.source = canonical_key(&m.source);
            }
        }
        self.format = FORMAT;
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn err(path: &Path, e: impl std::fmt::Display) -> FetchError {
    FetchError::Cache {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Far more than any real index (an entry is a few hundred bytes); a bigger file is damage.
const MAX_INDEX_BYTES: u64 = 64 << 20;
/// How long an update waits for another process's index lock. The lock is held only for a
/// read-modify-write, so a longer wait means that process is stuck.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The index as read from disk, or rebuilt from the module files when there was none to read.
enum Loaded {
    Read(Index),
    /// `damaged` when a file was there but unreadable as an index: it is set aside on the
    /// next write rather than overwritten.
    Rebuilt {
        index: Index,
        damaged: bool,
    },
}

/// The index file plus the lock that guards it.
#[derive(Debug, Clone)]
pub struct IndexFile {
    cache: Cache,
    path: PathBuf,
    lock_path: PathBuf,
}

impl IndexFile {
    pub fn new(cache: &Cache) -> Self {
        Self {
            cache: cache.clone(),
            path: cache.root().join("index.json"),
            lock_path: cache.root().join("index.lock"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The index. One that is missing, empty, damaged, or lists no module while there are
    /// module files is rebuilt from `modules/`: every
    /// module stays visible to `ls` and purgeable; which source and resource version each
    /// came from is lost, so those are fetched again when next asked for.
    pub fn load(&self) -> Result<Index, FetchError> {
        Ok(match self.read()? {
            Loaded::Read(index) | Loaded::Rebuilt { index, .. } => index,
        })
    }

    fn read(&self) -> Result<Loaded, FetchError> {
        use crate::regular_file::{read, ReadError};
        let problem = match read(&self.path, MAX_INDEX_BYTES) {
            Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => "empty".to_string(),
            Ok(bytes) => match serde_json::from_slice::<Index>(&bytes) {
                // A document listing no module while module files are on disk (`{}`, say)
                // would leave them orphaned: never listed, never purged.
                Ok(index) if index.modules.is_empty() && !self.cache.module_files().is_empty() => {
                    "valid JSON that lists none of the modules on disk".to_string()
                }
                Ok(mut index) => {
                    index.migrate();
                    return Ok(Loaded::Read(index));
                }
                Err(e) => format!("not a valid index ({e})"),
            },
            Err(ReadError::Missing) => return Ok(self.rebuild(false)),
            Err(
                e @ (ReadError::NotRegular(_)
                | ReadError::Link
                | ReadError::TooLarge { .. }
                | ReadError::NotText { .. }),
            ) => e.to_string(),
            Err(ReadError::Io(e)) => return Err(crate::store::cache::io_error(&self.path, e)),
        };
        tracing::warn!(path = %self.path.display(), %problem, "cache index rebuilt from the module files");
        Ok(self.rebuild(true))
    }

    fn rebuild(&self, damaged: bool) -> Loaded {
        let modules = self
            .cache
            .module_files()
            .into_iter()
            .map(|f| {
                let mtime = f
                    .meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                let entry = ModuleEntry {
                    source: String::new(),
                    manifest_digest: None,
                    index_digest: None,
                    size: f.meta.len(),
                    // Not a verified stamp: the first lookup re-hashes the file.
                    modified_ns: None,
                    pulled_at: mtime,
                    last_used: mtime,
                    image_volume_copy: false,
                    dynamic_module: f.dynamic_module,
                    signatures: vec![],
                };
                (f.sha256, entry)
            })
            .collect();
        Loaded::Rebuilt {
            index: Index {
                modules,
                ..Index::default()
            },
            damaged,
        }
    }

    /// Applies `f` to the index under an exclusive lock and saves it atomically.
    pub fn update<T>(&self, f: impl FnOnce(&mut Index) -> T) -> Result<T, FetchError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| crate::store::cache::io_error(&path, e)
        };
        let _lock = wasm_common::fs::lock_within(&self.lock_path, LOCK_WAIT)
            .map_err(io(&self.lock_path))?;
        let mut index = match self.read()? {
            Loaded::Read(index) => index,
            Loaded::Rebuilt { index, damaged } => {
                if damaged {
                    // Kept for whoever wants to see what went wrong; the next one replaces it.
                    let _ = std::fs::rename(&self.path, self.path.with_extension("json.damaged"));
                }
                index
            }
        };
        let out = f(&mut index);
        let bytes = serde_json::to_vec_pretty(&index).map_err(|e| err(&self.path, e))?;
        // The temp file goes to `tmp/` with the downloads: one a killed process leaves is
        // removed by `purge`. Synced: the index is what makes the modules findable.
        let dir = self.cache.root().join("tmp");
        wasm_common::fs::write_whole(
            &dir,
            "index-",
            &self.path,
            &bytes,
            wasm_common::fs::Mode::WorldReadable,
            true,
        )
        .map_err(io(&self.path))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_older_index_moves_to_canonical_keys_keeping_the_latest_use() {
        let (old, new) = (Sha256([1; 32]), Sha256([2; 32]));
        let module = |last_used| ModuleEntry {
            source: "HTTP://h/m.wasm".into(),
            manifest_digest: None,
            index_digest: None,
            size: 8,
            modified_ns: None,
            pulled_at: 0,
            last_used,
            image_volume_copy: false,
            dynamic_module: None,
            signatures: vec![],
        };
        let source = |sha| SourceEntry {
            sha256: sha,
            manifest_digest: None,
        };
        let mut idx = Index {
            format: 0,
            modules: [(old, module(10)), (new, module(20))].into(),
            sources: [
                ("HTTP://h/m.wasm".to_string(), source(new)),
                ("http://H:80/m.wasm".to_string(), source(old)),
                ("oci://r/a".to_string(), source(old)),
            ]
            .into(),
            resources: [
                ("HTTP://h/m.wasm".to_string(), "1".to_string()),
                ("http://h/m.wasm".to_string(), "2".to_string()),
                ("oci://r/a".to_string(), "3".to_string()),
                ("ns.plugin".to_string(), "4".to_string()),
            ]
            .into(),
        };
        idx.migrate();
        assert_eq!(idx.format, FORMAT);
        let keys: Vec<&str> = idx.sources.keys().map(String::as_str).collect();
        assert_eq!(keys, ["http://h/m.wasm", "oci://r/a:latest"]);
        assert_eq!(
            idx.sources["http://h/m.wasm"].sha256, new,
            "the one used last"
        );
        let resources: Vec<(&str, &str)> = idx
            .resources
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            resources,
            [("ns.plugin", "4"), ("oci://r/a:latest", "3")],
            "two versions for one resource: neither is trusted"
        );
        assert!(idx.modules.values().all(|m| m.source == "http://h/m.wasm"));
        let before = idx.clone();
        idx.migrate();
        assert_eq!(format!("{idx:?}"), format!("{before:?}"), "migrated once");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever `index.json` holds, loading answers (rebuilding when it must) and never
        /// loses a module file.
        #[test]
        fn any_index_file_loads(bytes in proptest::collection::vec(any::<u8>(), 0..512), json in "\\{\"modules\":\\{\"[a-f0-9]{0,64}\":\\{[^}]{0,40}\\}\\}\\}") {
            let dir = tempfile::tempdir().unwrap();
            let cache = Cache::open(dir.path()).unwrap();
            let sha = crate::digest::Sha256([7; 32]);
            std::fs::write(cache.module_path(&sha), b"\0asm\x01\0\0\0").unwrap();
            let index = IndexFile::new(&cache);
            for content in [&bytes[..], json.as_bytes()] {
                std::fs::write(index.path(), content).unwrap();
                let loaded = index.load().unwrap();
                if serde_json::from_slice::<Index>(content).is_err() {
                    prop_assert!(loaded.modules.contains_key(&sha));
                }
            }
        }
    }

    #[test]
    fn a_lost_index_is_rebuilt_with_the_dynamic_modules_too() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let sha = Sha256([7; 32]);
        let path = cache.dynamic_module_path(&sha, "libm.so");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut elf = b"\x7fELF\x02\x01\x01\0".to_vec();
        elf.extend([0; 8]);
        elf.extend(3u16.to_le_bytes());
        elf.extend(183u16.to_le_bytes());
        std::fs::write(&path, &elf).unwrap();
        std::fs::write(path.with_file_name(".lib-partial"), b"x").unwrap();
        let idx = IndexFile::new(&cache).load().unwrap();
        assert_eq!(idx.modules.len(), 1);
        let m = &idx.modules[&sha];
        let kept = crate::store::cache::DynamicModuleFile {
            file: "libm.so".into(),
            platform: "linux/arm64".into(),
        };
        assert_eq!(m.dynamic_module, Some(kept));
        assert_eq!(m.path(&cache, &sha), path);
    }
}
