//! The cache's persistent index (`<cache>/index.json`): which module each source last
//! resolved to, which resource version each resource last pulled, and when each module was
//! last used. It is what lets `IfNotPresent`, `Always` and `Never` hold across processes and
//! restarts. Updates are read-modify-write under an exclusive file lock, written atomically.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::FetchError;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Index {
    /// By module sha256 (hex).
    #[serde(default)]
    pub modules: BTreeMap<String, ModuleEntry>,
    /// By source URL, exactly as given.
    #[serde(default)]
    pub sources: BTreeMap<String, SourceEntry>,
    /// Last resource version pulled successfully, by resource name.
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModuleEntry {
    pub source: String,
    pub manifest_digest: Option<String>,
    #[serde(default)]
    pub index_digest: Option<String>,
    pub size: u64,
    /// The file's mtime when last verified (see `Cache::lookup_intact`).
    #[serde(default)]
    pub modified_ns: Option<u64>,
    pub pulled_at: u64,
    pub last_used: u64,
}

impl ModuleEntry {
    pub fn stamp(&self) -> crate::cache::Stamp {
        crate::cache::Stamp {
            size: self.size,
            modified_ns: self.modified_ns,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceEntry {
    pub sha256: String,
    pub manifest_digest: Option<String>,
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

/// The index file plus the lock that guards it.
pub struct IndexFile {
    path: PathBuf,
    lock_path: PathBuf,
}

impl IndexFile {
    pub fn new(cache_root: &Path) -> Self {
        Self {
            path: cache_root.join("index.json"),
            lock_path: cache_root.join("index.lock"),
        }
    }

    pub fn load(&self) -> Result<Index, FetchError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                err(&self.path, format!("corrupt cache index ({e}); remove it to start over (cached modules stay valid)"))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(err(&self.path, e)),
        }
    }

    /// Applies `f` to the index under an exclusive lock and saves it atomically.
    pub fn update<T>(&self, f: impl FnOnce(&mut Index) -> T) -> Result<T, FetchError> {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(|e| err(&self.lock_path, e))?;
        lock.lock().map_err(|e| err(&self.lock_path, e))?;
        let mut index = self.load()?;
        let out = f(&mut index);
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::Builder::new()
            .prefix("index-")
            .tempfile_in(dir)
            .map_err(|e| err(dir, e))?;
        let bytes = serde_json::to_vec_pretty(&index).map_err(|e| err(&self.path, e))?;
        std::io::Write::write_all(&mut tmp, &bytes).map_err(|e| err(&self.path, e))?;
        tmp.as_file().sync_all().map_err(|e| err(&self.path, e))?;
        tmp.persist(&self.path)
            .map_err(|e| err(&self.path, e.error))?;
        Ok(out)
    }
}
