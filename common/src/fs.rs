//! Files other processes read while we write them: a module in a cache, an index, compiled
//! code. Each is written whole into a temp file beside its destination and renamed into
//! place, so a reader sees the old file or the new one, never half of one; and lock files
//! let processes that share a directory take turns.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Who may read a file once it is in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 0600, the temp file's own: compiled code only this user may load.
    Private,
    /// 0640: read by the owner's group too (an Envoy sharing the pod's `fsGroup`).
    GroupReadable,
    /// 0644: a module or an index an Envoy running as another user reads.
    WorldReadable,
}

/// Gives the finished temp file `mode` and renames it to `dest`.
pub fn persist(tmp: tempfile::NamedTempFile, dest: &Path, mode: Mode) -> std::io::Result<()> {
    set_mode(tmp.path(), mode)?;
    tmp.persist(dest).map(drop).map_err(|e| e.error)
}

/// Writes `bytes` to `dest` whole (a temp file named `prefix…` in `dir`, on the same
/// filesystem, then a rename). `sync` flushes the bytes to disk before the rename, for a file
/// whose loss after a crash would cost more than the flush.
pub fn write_whole(
    dir: &Path,
    prefix: &str,
    dest: &Path,
    bytes: &[u8],
    mode: Mode,
    sync: bool,
) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(prefix).tempfile_in(dir)?;
    hold(tmp.as_file());
    tmp.write_all(bytes)?;
    if sync {
        tmp.as_file().sync_all()?;
    }
    persist(tmp, dest, mode)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: Mode) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match mode {
        Mode::Private => Ok(()),
        Mode::GroupReadable => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o640))
        }
        Mode::WorldReadable => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        }
    }
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: Mode) -> std::io::Result<()> {
    Ok(())
}

/// Marks a temp file as being written by a live process: the lock lasts as long as the file
/// is open, so [`remove_unheld`] after a crash removes only what no one writes. A file
/// system without locks leaves the file unmarked, which only makes it removable.
pub fn hold(file: &File) {
    let _ = file.try_lock();
}

/// Removes each file in `dir` that `is_temp` picks and no process holds (see [`hold`]): what
/// writers killed mid-write left. Returns how many were removed.
pub fn remove_unheld(dir: &Path, is_temp: impl Fn(&str) -> bool) -> usize {
    let mut removed = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(&is_temp) {
            continue;
        }
        let path = e.path();
        let Ok(file) = File::options().write(true).open(&path) else {
            continue;
        };
        if file.try_lock().is_ok() && same_file(&file, &path) && std::fs::remove_file(&path).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// The lock file at `path` (created if missing), taken exclusively; `None` while another
/// holds it. A lock file may be removed by whoever holds it (a cleanup that takes each
/// unused lock first): a lock taken on a file just unlinked guards nothing, so it counts only
/// if `path` still names the locked file. Never blocks, so a waiter can give up at its own
/// deadline.
pub fn try_lock(path: &Path) -> std::io::Result<Option<File>> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(same_file(&file, path).then_some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// [`try_lock`], retried until `wait` has passed; then a `TimedOut` error saying so. For a
/// lock held only for a short read-modify-write, where a longer wait means the holder is
/// stuck.
pub fn lock_within(path: &Path, wait: Duration) -> std::io::Result<File> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(file) = try_lock(path)? {
            return Ok(file);
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "another process has held {} for {}s",
                    path.display(),
                    wait.as_secs()
                ),
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Removes the lock file at `path` if no one holds it (taking it first, so no holder's lock
/// is broken: see [`try_lock`]).
pub fn remove_if_unused(path: &Path) {
    let Ok(file) = File::options().write(true).open(path) else {
        return;
    };
    if file.try_lock().is_ok() && same_file(&file, path) {
        let _ = std::fs::remove_file(path);
    }
}

/// Whether `path` still names the open file `f`.
#[cfg(unix)]
fn same_file(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_f: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_held_until_dropped_and_waiting_ends_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.lock");
        let held = try_lock(&path).unwrap().expect("free");
        assert!(try_lock(&path).unwrap().is_none(), "held");
        let e = lock_within(&path, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        remove_if_unused(&path);
        assert!(path.exists(), "a held lock is not removed");
        drop(held);
        assert!(lock_within(&path, Duration::from_millis(20)).is_ok());
        remove_if_unused(&path);
        assert!(!path.exists(), "an unused lock is removed");
    }

    #[test]
    fn a_lock_on_a_removed_file_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.lock");
        let held = try_lock(&path).unwrap().unwrap();
        std::fs::remove_file(&path).unwrap();
        // A new file takes the name: it can be locked, the old lock guards nothing.
        assert!(try_lock(&path).unwrap().is_some());
        drop(held);
    }

    #[cfg(unix)]
    #[test]
    fn a_whole_write_replaces_the_file_with_the_mode_asked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        std::fs::write(&dest, b"old").unwrap();
        for (mode, bits) in [(Mode::WorldReadable, 0o644), (Mode::Private, 0o600)] {
            write_whole(dir.path(), ".w-", &dest, b"new", mode, true).unwrap();
            assert_eq!(std::fs::read(&dest).unwrap(), b"new");
            let got = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
            assert_eq!(got, bits);
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }
}
