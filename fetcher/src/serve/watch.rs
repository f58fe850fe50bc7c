//! Watching the plugins directory: file events (inotify, through the `notify` crate) say when
//! to look, and a scan (a stat of each file) says what changed. An event wakes a scan within
//! milliseconds and costs nothing while nothing changes; a scan on a timer stays as the
//! fallback, for what events miss (NFS, some overlayfs and FUSE mounts, the directory itself
//! replaced) and for a platform or a full inotify table that gives none. The scan sees every
//! way a file is replaced (editors' rename-over, a Kubernetes ConfigMap's `..data` symlink
//! swap, which is a rename in the directory itself, so one watch of the directory covers it). A
//! file whose stat changed is read again; only a change of content is a new version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// File events on the plugins directory, as wake-ups: [`Events::changed`] returns once
/// something in the directory may have changed, and the writer looks to have finished.
pub struct Events {
    dir: PathBuf,
    /// The watcher (kept for its thread and its watch; dropping it ends both) and the
    /// directory it watches, by device and inode: a directory replaced is watched again.
    watching: std::sync::Mutex<(notify::RecommendedWatcher, Option<(u64, u64)>)>,
    wake: Arc<tokio::sync::Notify>,
    /// An event came that no finished [`Events::changed`] has answered yet: set by the
    /// watcher's thread, cleared only as `changed` returns, so a wait dropped half-way (another
    /// branch of the caller's `select!` won) loses nothing.
    pending: Arc<AtomicBool>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Events")
    }
}

/// How long the directory must stay quiet after an event before the scan: a file written in
/// place (truncated, then written) is read whole, not half. Renames, as ConfigMaps and editors
/// replace files, are one event and pay this once.
const SETTLE: Duration = Duration::from_millis(10);
/// Bound on the settling: a directory written to without pause is still scanned this often.
const SETTLE_AT_MOST: Duration = Duration::from_millis(100);

/// The directory's device and inode (following a symlink to it).
fn identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

impl Events {
    /// Watches `dir` (not its subdirectories: a ConfigMap's swap renames `..data` in `dir`).
    /// Opening a file is no change: `serve`'s own reads wake nothing.
    pub fn watch(dir: &Path) -> Result<Self, notify::Error> {
        use notify::Watcher as _;
        let wake = Arc::new(tokio::sync::Notify::new());
        let pending = Arc::new(AtomicBool::new(false));
        let (waker, flag) = (wake.clone(), pending.clone());
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // An error (the kernel's queue overflowed) may hide a change: scan. A file
                // closed after writing is a change (a write through mmap gives no other event).
                use notify::event::{AccessKind, AccessMode, EventKind};
                let closed_written = EventKind::Access(AccessKind::Close(AccessMode::Write));
                if event.is_ok_and(|e| e.kind.is_access() && e.kind != closed_written) {
                    return;
                }
                flag.store(true, Ordering::Release);
                waker.notify_one();
            })?;
        let id = identity(dir);
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            watching: std::sync::Mutex::new((watcher, id)),
            wake,
            pending,
        })
    }

    /// Returns after the next event, once the directory has been quiet for [`SETTLE`] (or
    /// [`SETTLE_AT_MOST`] passed). Cancel-safe: an event that came before or meanwhile is
    /// answered by the next call if this one is dropped.
    pub async fn changed(&self) {
        if !self.pending.load(Ordering::Acquire) {
            self.wake.notified().await;
        }
        let deadline = tokio::time::Instant::now() + SETTLE_AT_MOST;
        while tokio::time::Instant::now() < deadline {
            let quiet = tokio::time::timeout(SETTLE, self.wake.notified()).await;
            if quiet.is_err() {
                break;
            }
        }
        self.pending.store(false, Ordering::Release);
    }

    /// Watches the directory again when it is not the one watched (removed and made again,
    /// or a symlink to it swapped): its watch went with the old one. Called before each scan;
    /// `false` when the directory cannot be watched now (the timer's scans go on).
    pub fn keep_watching(&self) -> bool {
        use notify::Watcher as _;
        let now = identity(&self.dir);
        let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
        if now.is_some() && now == watching.1 {
            return true;
        }
        let (watcher, id) = &mut *watching;
        let _ = watcher.unwatch(&self.dir);
        match (
            now,
            watcher.watch(&self.dir, notify::RecursiveMode::NonRecursive),
        ) {
            (Some(_), Ok(())) => {
                tracing::info!(dir = %self.dir.display(), "the plugins directory was replaced; watching the new one");
                *id = now;
                true
            }
            (_, result) => {
                if let Err(e) = result {
                    tracing::debug!(dir = %self.dir.display(), error = %e, "cannot watch the plugins directory now");
                }
                *id = None;
                false
            }
        }
    }
}

/// One plugin file's content as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Text {
        text: String,
        /// Hex sha256 of the bytes: the file's version.
        version: String,
    },
    /// Unreadable as given (too large, not UTF-8, not a regular file); the reason says what to do.
    Unreadable(String),
}

impl Content {
    pub fn version(&self) -> &str {
        match self {
            Content::Text { version, .. } => version,
            Content::Unreadable(reason) => reason,
        }
    }
}

/// What a file looked like to `stat` (following symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified_ns: u128,
    ino: u64,
    dev: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        len: m.len(),
        modified_ns: m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos()),
        ino: m.ino(),
        dev: m.dev(),
    })
}

/// A change seen by [`Watcher::poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// New, or its content changed.
    Updated(PathBuf, Content),
    Removed(PathBuf),
}

#[derive(Debug)]
pub struct Watcher {
    dir: PathBuf,
    /// Each file's stamp, version, and whether it was left unread for the total bound.
    seen: BTreeMap<PathBuf, (Stamp, String, bool)>,
    max_total: u64,
}

/// Whether a directory entry is a plugin file: `*.yaml`, `*.yml` or `*.json`, not hidden (a
/// ConfigMap volume's `..data` and editors' swap files start with a dot).
fn is_plugin_file(name: &str) -> bool {
    !name.starts_with('.')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.ends_with(ext))
}

impl Watcher {
    /// Watches `dir`, reading at most `max_total` bytes of plugin files in all: the files
    /// past it, in path order, are not read (and not kept in memory), and say so.
    pub fn new(dir: &Path, max_total: u64) -> Self {
        Self {
            dir: dir.to_path_buf(),
            seen: BTreeMap::new(),
            max_total,
        }
    }

    /// The changes since the last poll. A directory that cannot be read reports nothing
    /// (rather than every file removed): a transient error must not take configs away.
    pub fn poll(&mut self) -> std::io::Result<Vec<Change>> {
        // Links are followed only to files inside the directory (a ConfigMap's `..data`).
        let root = std::fs::canonicalize(&self.dir)?;
        let mut present = BTreeMap::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name();
            let Some(name) = name.to_str().filter(|n| is_plugin_file(n)) else {
                continue;
            };
            let path = self.dir.join(name);
            if let Some(s) = stamp(&path) {
                present.insert(path, s);
            }
        }
        let mut changes = Vec::new();
        let mut total: u64 = 0;
        for (path, s) in &present {
            total = total.saturating_add(s.len);
            let over = total > self.max_total;
            match self.seen.get(path) {
                Some((old, _, was_over)) if old == s && *was_over == over => continue,
                _ => {}
            }
            let content = if over {
                Content::Unreadable(format!(
                    "{}: not read: the plugin files together exceed {} bytes (--max-plugin-bytes, WASM_PLUGINS_MAX_BYTES); those first by name are read",
                    path.display(),
                    self.max_total
                ))
            } else {
                read_within(&root, path)
            };
            let unchanged = self
                .seen
                .get(path)
                .is_some_and(|(_, v, _)| v == content.version());
            self.seen
                .insert(path.clone(), (*s, content.version().to_string(), over));
            if !unchanged {
                changes.push(Change::Updated(path.clone(), content));
            }
        }
        let gone: Vec<PathBuf> = self
            .seen
            .keys()
            .filter(|p| !present.contains_key(*p))
            .cloned()
            .collect();
        for path in gone {
            self.seen.remove(&path);
            changes.push(Change::Removed(path));
        }
        Ok(changes)
    }
}

/// The content of the plugin file `path` in the directory whose canonical path is `root`,
/// read with a limit checked before allocating. A symbolic link is followed only to a file
/// inside `root` (a ConfigMap volume's `p.yaml -> ..data/p.yaml`): a file elsewhere is not
/// read, so nothing of it can be quoted in a log or `/readyz`.
fn read_within(root: &Path, path: &Path) -> Content {
    let target = match std::fs::canonicalize(path) {
        Ok(target) => target,
        Err(e) => return Content::Unreadable(format!("{}: {e}", path.display())),
    };
    if !target.starts_with(root) {
        return Content::Unreadable(format!(
            "{}: a symbolic link to a file outside the plugins directory, not followed (links are followed only within it)",
            path.display()
        ));
    }
    // The resolved path itself, never through a link swapped in since.
    let read =
        crate::regular_file::read_no_follow(&target, crate::envoy::wasmplugin::MAX_FILE_BYTES);
    content(path, read)
}

fn content(path: &Path, read: Result<Vec<u8>, crate::regular_file::ReadError>) -> Content {
    match read {
        Ok(bytes) => {
            let version = hex::encode(Sha256::digest(&bytes));
            match String::from_utf8(bytes) {
                Ok(text) => Content::Text { text, version },
                Err(_) => Content::Unreadable(format!(
                    "{}: not UTF-8 text; a WasmPlugin is YAML or JSON",
                    path.display()
                )),
            }
        }
        Err(e) => Content::Unreadable(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_new_changed_and_removed_files_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Watcher::new(dir.path(), u64::MAX);
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, "one").unwrap();
        std::fs::write(dir.path().join(".a.yaml.swp"), "x").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let first = w.poll().unwrap();
        assert!(
            matches!(&first[..], [Change::Updated(p, Content::Text { text, .. })] if *p == a && text == "one"),
            "{first:?}"
        );
        assert_eq!(w.poll().unwrap(), vec![]);
        // Same content written again: a new stamp, not a new version.
        std::fs::write(&a, "one").unwrap();
        assert_eq!(w.poll().unwrap(), vec![]);
        // Replaced by rename, as editors and ConfigMaps do.
        let tmp = dir.path().join(".tmp");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &a).unwrap();
        assert!(
            matches!(&w.poll().unwrap()[..], [Change::Updated(_, Content::Text { text, .. })] if text == "two")
        );
        std::fs::remove_file(&a).unwrap();
        assert_eq!(w.poll().unwrap(), vec![Change::Removed(a)]);
    }

    /// A Kubernetes ConfigMap volume: `p.yaml -> ..data/p.yaml`, `..data -> ..<timestamp>`;
    /// an update makes a new timestamped directory and swaps the `..data` link.
    #[test]
    fn sees_a_configmap_update_through_its_symlinks() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..2026_1")).unwrap();
        std::fs::write(d.join("..2026_1/p.yaml"), "one").unwrap();
        symlink("..2026_1", d.join("..data")).unwrap();
        symlink("..data/p.yaml", d.join("p.yaml")).unwrap();
        let mut w = Watcher::new(d, u64::MAX);
        let first = w.poll().unwrap();
        assert!(
            matches!(&first[..], [Change::Updated(p, Content::Text { text, .. })] if p.ends_with("p.yaml") && text == "one"),
            "{first:?}"
        );
        std::fs::create_dir(d.join("..2026_2")).unwrap();
        std::fs::write(d.join("..2026_2/p.yaml"), "two").unwrap();
        symlink("..2026_2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        std::fs::remove_dir_all(d.join("..2026_1")).unwrap();
        let second = w.poll().unwrap();
        assert!(
            matches!(&second[..], [Change::Updated(_, Content::Text { text, .. })] if text == "two"),
            "{second:?}"
        );
        assert_eq!(w.poll().unwrap(), vec![]);
    }

    /// The events of a ConfigMap update (a new timestamped directory, the `..data` link
    /// renamed over) wake a waiter, and a scan then sees the new content; reading files wakes
    /// nothing.
    #[tokio::test]
    async fn a_configmap_swap_wakes_the_watch_and_reads_wake_nothing() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..2026_1")).unwrap();
        std::fs::write(d.join("..2026_1/p.yaml"), "one").unwrap();
        symlink("..2026_1", d.join("..data")).unwrap();
        symlink("..data/p.yaml", d.join("p.yaml")).unwrap();
        std::fs::write(d.join("plain.yaml"), "plain").unwrap();
        let events = Events::watch(d).unwrap();
        let mut w = Watcher::new(d, u64::MAX);
        assert_eq!(w.poll().unwrap().len(), 2);
        let quiet = tokio::time::timeout(Duration::from_millis(300), events.changed()).await;
        assert!(quiet.is_err(), "reading the plugin files woke the watch");

        std::fs::create_dir(d.join("..2026_2")).unwrap();
        std::fs::write(d.join("..2026_2/p.yaml"), "two").unwrap();
        symlink("..2026_2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        std::fs::remove_dir_all(d.join("..2026_1")).unwrap();
        tokio::time::timeout(Duration::from_secs(5), events.changed())
            .await
            .expect("no event for a ConfigMap swap");
        let changes = w.poll().unwrap();
        assert!(
            matches!(&changes[..], [Change::Updated(p, Content::Text { text, .. })] if p.ends_with("p.yaml") && text == "two"),
            "{changes:?}"
        );
    }

    /// A link to a file outside the plugins directory is not read: its content appears in no
    /// change, and the reason names the link alone.
    #[test]
    fn a_link_out_of_the_directory_is_not_followed() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.yaml");
        std::fs::write(&secret, "password: hunter2\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        symlink(&secret, dir.path().join("p.yaml")).unwrap();
        symlink(outside.path(), dir.path().join("..data")).unwrap();
        symlink("..data/secret.yaml", dir.path().join("q.yaml")).unwrap();
        let mut w = Watcher::new(dir.path(), u64::MAX);
        let changes = w.poll().unwrap();
        assert_eq!(changes.len(), 2, "{changes:?}");
        for c in &changes {
            match c {
                Change::Updated(_, Content::Unreadable(why)) => {
                    assert!(why.contains("outside the plugins directory"), "{why}");
                    assert!(!why.contains("hunter2") && !why.contains("secret"), "{why}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
