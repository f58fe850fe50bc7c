//! The ECDS directory `serve` writes: checked at start, and locked while `serve` runs.

use std::path::{Path, PathBuf};

use super::ServeError;

/// The name of the lease a `serve` writing `ecds_dir` holds: one writer per directory.
pub(super) fn lease_holder(ecds_dir: &Path) -> String {
    use sha2::Digest;
    let dir = std::fs::canonicalize(ecds_dir).unwrap_or_else(|_| ecds_dir.to_path_buf());
    let digest = hex::encode(sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes()));
    format!("serve-{}", &digest[..32])
}

/// The lock file a running `serve` holds in its ECDS directory (a dot file, which no ECDS file
/// name is): one writer per directory, whatever cache each uses.
pub(super) const DIR_LOCK: &str = ".wasm-fetcher.lock";

/// The held lock on an ECDS directory. A clean stop removes the lock file (while holding it,
/// so no other holder's lock is broken); after a kill the file stays, unheld, and is reused.
pub(super) struct DirLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(super) fn lock_ecds_dir(dir: &Path) -> Result<DirLock, ServeError> {
    let path = dir.join(DIR_LOCK);
    match wasm_common::fs::try_lock(&path) {
        Ok(Some(file)) => Ok(DirLock { _file: file, path }),
        Ok(None) => Err(ServeError::EcdsDirTaken {
            path: dir.to_path_buf(),
        }),
        Err(e) => Err(ServeError::EcdsDir {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// Removes the temp files in `dir` a writer killed mid-write left (a live writer holds a lock
/// on its own): without this a crash loop would fill the volume. Returns how many.
pub(super) fn remove_orphaned_temp_files(dir: &Path) -> usize {
    wasm_common::fs::remove_unheld(dir, |name| {
        name.starts_with(".wasm-fetcher-") && name != super::written::RECORD
    })
}

pub(super) fn check_ecds_dir(dir: &Path) -> Result<(), ServeError> {
    let bad = |reason: String| ServeError::EcdsDir {
        path: dir.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(dir).map_err(|e| bad(e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory".into()));
    }
    tempfile::Builder::new()
        .prefix(".wasm-fetcher-probe-")
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| bad(e.to_string()))
}
