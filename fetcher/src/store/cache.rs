//! The content-addressed module cache: `<dir>/modules/sha256/<hex>.wasm`, and Envoy dynamic
//! modules as `<dir>/dynamic-modules/<hex>/lib<name>.so` (a directory of their own, since Envoy
//! finds one by name in `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`). One index lists both.
//!
//! A module becomes visible only whole and verified: bytes stream into a temp file in
//! `<dir>/tmp/` (same filesystem) while being hashed, the header and the pin are checked, the
//! file is made world-readable (0644, so an Envoy running as another user can read it)
//! and renamed into place. Any failure drops the temp file; nothing half-written remains.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256 as Hasher};

use crate::digest::{self, Sha256};
use crate::error::FetchError;

#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

fn cache_err(path: &Path, e: impl std::fmt::Display) -> FetchError {
    FetchError::Cache {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// An I/O error on the cache at `path`; a refused write is told apart, since a cache the
/// process may only read can still answer from what it holds.
pub(crate) fn io_error(path: &Path, e: std::io::Error) -> FetchError {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    match e.kind() {
        ReadOnlyFilesystem | PermissionDenied => FetchError::CacheReadOnly {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
        _ => cache_err(path, e),
    }
}

/// How much a cached module file is trusted before it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Trusted on a stat when its size and mtime are the recorded ones, re-hashed otherwise:
    /// a warm lookup stays a read and a stat.
    Stamp(Option<Stamp>),
    /// Always re-hashed: a pin is a promise about the bytes, and size and mtime can be put
    /// back by whoever changed them.
    Hash,
}

impl Cache {
    /// `$WASM_CACHE_DIR`, else `$XDG_CACHE_HOME/wasm-fetcher`, else `~/.cache/wasm-fetcher`
    /// (`./.cache/wasm-fetcher` without a home).
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("WASM_CACHE_DIR").filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
        wasm_common::dirs::user_cache_dir()
            .unwrap_or_else(|| PathBuf::from(".cache"))
            .join("wasm-fetcher")
    }

    /// Opens the cache at `root`, creating it if needed. A cache this process may not write
    /// still opens (it can answer `--pull-policy Never` from what it holds); a write is refused
    /// when it comes, naming the cause.
    pub fn open(root: &Path) -> Result<Self, FetchError> {
        let root = std::path::absolute(root).map_err(|e| cache_err(root, e))?;
        for d in [root.join("modules").join("sha256"), root.join("tmp")] {
            match std::fs::create_dir_all(&d).map_err(|e| io_error(&d, e)) {
                Err(FetchError::CacheReadOnly { .. }) if root.is_dir() => {}
                other => other?,
            }
        }
        Ok(Self { root })
    }

    fn modules_dir(&self) -> PathBuf {
        self.root.join("modules").join("sha256")
    }

    fn dynamic_modules_dir(&self) -> PathBuf {
        self.root.join("dynamic-modules")
    }

    /// Every module file in the cache (Wasm and dynamic) with its metadata, whatever the index
    /// says: what an index that is lost or damaged is rebuilt from.
    pub fn module_files(&self) -> Vec<CachedFile> {
        let dir = self.modules_dir();
        let wasm = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let sha256 = Sha256::parse(name.to_str()?.strip_suffix(".wasm")?).ok()?;
                let meta = e.metadata().ok().filter(|m| m.is_file())?;
                Some(CachedFile {
                    sha256,
                    dynamic_module: None,
                    meta,
                })
            });
        let dynamic = std::fs::read_dir(self.dynamic_modules_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| self.dynamic_module_file(&e.path()));
        wasm.chain(dynamic).collect()
    }

    /// The one `lib<name>.so` in `dir` (`dynamic-modules/<hex>`) and the platform its ELF
    /// header names; `None` for anything else (a pull's temp file, a damaged module).
    fn dynamic_module_file(&self, dir: &Path) -> Option<CachedFile> {
        let sha256 = Sha256::parse(dir.file_name()?.to_str()?).ok()?;
        let mut found = std::fs::read_dir(dir).ok()?.flatten().filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            crate::store::shared_object::module_name(&name).ok()?;
            Some((name, e.metadata().ok().filter(|m| m.is_file())?))
        });
        let (file, meta) = found.next()?;
        let mut head = [0u8; crate::store::shared_object::HEADER_LEN];
        std::fs::File::open(dir.join(&file))
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .ok()?;
        let platform = crate::store::shared_object::platform(&head)
            .ok()?
            .to_string();
        Some(CachedFile {
            sha256,
            dynamic_module: Some(DynamicModuleFile { file, platform }),
            meta,
        })
    }

    /// Where a dynamic module with this digest is kept: `dynamic-modules/<hex>/<file>`, `file`
    /// being `lib<name>.so`.
    pub fn dynamic_module_path(&self, sha: &Sha256, file: &str) -> PathBuf {
        self.dynamic_modules_dir().join(sha.hex()).join(file)
    }

    /// Where the module with this digest is kept, Wasm or dynamic.
    pub fn path_of(&self, sha: &Sha256, dynamic_module: Option<&DynamicModuleFile>) -> PathBuf {
        match dynamic_module {
            Some(d) => self.dynamic_module_path(sha, &d.file),
            None => self.module_path(sha),
        }
    }

    /// Removes a module's file (a dynamic module's directory with it). Envoy keeps a module it
    /// has loaded: the mapping outlives the name.
    pub fn remove(&self, sha: &Sha256, dynamic_module: Option<&DynamicModuleFile>) {
        match dynamic_module {
            Some(_) => {
                let _ = std::fs::remove_dir_all(self.dynamic_modules_dir().join(sha.hex()));
            }
            None => {
                let _ = std::fs::remove_file(self.module_path(sha));
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn module_path(&self, sha: &Sha256) -> PathBuf {
        self.modules_dir().join(format!("{}.wasm", sha.hex()))
    }

    /// The cached module with this digest, if present.
    pub fn lookup(&self, sha: &Sha256) -> Option<PathBuf> {
        let p = self.module_path(sha);
        p.is_file().then_some(p)
    }

    /// Whether the cache holds the dynamic module with this digest (its directory, with its
    /// one `lib<name>.so`).
    pub fn holds_dynamic_module(&self, sha: &Sha256) -> bool {
        std::fs::read_dir(self.dynamic_modules_dir().join(sha.hex()))
            .is_ok_and(|mut entries| entries.any(|e| e.is_ok_and(|e| e.path().is_file())))
    }

    /// The cached module with this digest if present and intact (see [`Verify`]). A file that
    /// no longer matches its name is not served: it is downloaded again (or refused under
    /// `Never`) instead of handed to Envoy.
    pub fn lookup_intact(&self, sha: &Sha256, verify: Verify) -> Option<PathBuf> {
        let path = self.module_path(sha);
        let meta = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
        if let Verify::Stamp(Some(recorded)) = verify {
            if recorded == Stamp::of(&meta) {
                return Some(path);
            }
        }
        let intact = hash_file(&path).is_ok_and(|actual| actual == *sha);
        if !intact {
            tracing::warn!(path = %path.display(), "cached module is damaged; fetching it again");
        }
        intact.then_some(path)
    }

    /// An exclusive lock on one source key (held until dropped), so concurrent processes
    /// pulling the same module make one download; `None` while another holds it. It never
    /// blocks, so a waiter (`crate::pull`) can give up at its deadline.
    pub fn try_lock_source(&self, key: &str) -> Result<Option<std::fs::File>, FetchError> {
        let dir = self.root.join("locks");
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        let name = hex::encode(Hasher::digest(key.as_bytes()));
        let path = dir.join(format!("{}.lock", &name[..32]));
        wasm_common::fs::try_lock(&path).map_err(|e| io_error(&path, e))
    }

    /// Removes lock files no process holds (`purge` removes what killed processes left).
    pub fn remove_unused_locks(&self) {
        let dir = self.root.join("locks");
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "lock") {
                wasm_common::fs::remove_if_unused(&path);
            }
        }
    }

    /// Removes downloads older than `age` from `tmp/`: a live download is younger, so what is
    /// left is from a process that was killed.
    pub fn remove_stale_temp_files(&self, age: std::time::Duration) {
        let dir = self.root.join("tmp");
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a >= age);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Removes the downloads no live process writes (each holds a lock on its file): what a
    /// killed one left. Returns how many.
    pub fn remove_orphaned_downloads(&self) -> usize {
        wasm_common::fs::remove_unheld(&self.root.join("tmp"), |name| name.ends_with(".part"))
    }

    /// A temp file to stream a download into.
    pub fn staging(&self, max_size: u64) -> Result<Staging, FetchError> {
        let dir = self.root.join("tmp");
        let file = tempfile::Builder::new()
            .prefix("download-")
            .suffix(".part")
            .tempfile_in(&dir)
            .map_err(|e| io_error(&dir, e))?;
        wasm_common::fs::hold(file.as_file());
        Ok(Staging {
            file,
            hasher: Hasher::new(),
            head: Vec::with_capacity(8),
            size: 0,
            max_size,
            progress: crate::progress::Progress::default(),
        })
    }

    /// Verifies a finished download and moves it into place; returns its path and digest.
    pub fn commit(
        &self,
        staging: Staging,
        expected: Option<&Sha256>,
    ) -> Result<(PathBuf, Sha256), FetchError> {
        let Staging {
            file, hasher, head, ..
        } = staging;
        digest::check_wasm_header(&head)?;
        let actual = Sha256(hasher.finalize().into());
        digest::check_pin(expected, &actual)?;
        let dest = self.module_path(&actual);
        // Not fsynced, which would cost more than the rest of a pull: after a power loss the
        // file may be short or empty, and `lookup_intact` then sees a size or mtime the index
        // did not record (or no record at all), re-hashes, and fetches it again. It is never
        // served. World-readable: an Envoy, or a `--pull-policy Never` pull, running as
        // another user reads the cache it may not write.
        wasm_common::fs::persist(file, &dest, wasm_common::fs::Mode::WorldReadable)
            .map_err(|e| io_error(&dest, e))?;
        Ok((dest, actual))
    }
}

/// A module file found on disk.
#[derive(Debug)]
pub struct CachedFile {
    pub sha256: Sha256,
    pub dynamic_module: Option<DynamicModuleFile>,
    pub meta: std::fs::Metadata,
}

/// What makes a cached module an Envoy dynamic module: its file name (`lib<name>.so`, what
/// Envoy searches for) and the `os/arch` it is built for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DynamicModuleFile {
    pub file: String,
    pub platform: String,
}

/// What the index remembers of a module file to notice, without hashing, that it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub modified_ns: Option<u64>,
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            size: meta.len(),
            modified_ns: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos() as u64),
        }
    }

    pub fn of_file(path: &Path) -> Option<Self> {
        std::fs::metadata(path).ok().map(|m| Self::of(&m))
    }
}

fn hash_file(path: &Path) -> std::io::Result<Sha256> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf)?;
        if n == 0 {
            return Ok(Sha256(hasher.finalize().into()));
        }
        hasher.update(&buf[..n]);
    }
}

/// A download in progress: bytes go to the temp file and through the hash in one pass.
pub struct Staging {
    file: tempfile::NamedTempFile,
    hasher: Hasher,
    head: Vec<u8>,
    size: u64,
    max_size: u64,
    progress: crate::progress::Progress,
}

impl Staging {
    pub fn report_to(&mut self, progress: crate::progress::Progress) {
        self.progress = progress;
    }

    /// A download into this file begins (again, after a reset).
    pub fn started(&self, total: Option<u64>) {
        self.progress
            .emit(crate::progress::Event::Started { total });
    }

    pub fn write(&mut self, chunk: &[u8]) -> Result<(), FetchError> {
        self.progress
            .emit(crate::progress::Event::Advanced(chunk.len() as u64));
        self.size += chunk.len() as u64;
        if self.size > self.max_size {
            return Err(FetchError::TooLarge {
                limit: self.max_size,
            });
        }
        if self.head.len() < 8 {
            let take = (8 - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
        }
        self.hasher.update(chunk);
        let file = &mut self.file;
        file.write_all(chunk).map_err(|e| io_error(file.path(), e))
    }

    /// The first bytes written (up to 8): a source that is never unboxed checks the Wasm
    /// header with them as soon as they arrive.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// A fresh reader over what was written.
    pub fn reopen(&mut self) -> Result<std::fs::File, FetchError> {
        let file = &mut self.file;
        file.as_file_mut()
            .flush()
            .and_then(|()| file.reopen())
            .map_err(|e| io_error(file.path(), e))
    }

    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// The sha256 of what was written so far.
    pub fn digest_so_far(&self) -> Sha256 {
        Sha256(self.hasher.clone().finalize().into())
    }

    /// Starts over (a retried HTTP attempt).
    pub fn reset(&mut self) -> Result<(), FetchError> {
        use std::io::Seek;
        let file = &mut self.file;
        file.as_file_mut()
            .set_len(0)
            .and_then(|()| file.as_file_mut().seek(std::io::SeekFrom::Start(0)))
            .map_err(|e| io_error(file.path(), e))?;
        self.hasher = Hasher::new();
        self.head.clear();
        self.size = 0;
        Ok(())
    }
}
