//! Modules the kubelet mounted: an `oci://` image holding `plugin.wasm` (the `compat` layout
//! of `push`) declared as an image volume (KEP-4639, `volumes[].image`) and mounted read-only
//! under one root (`--image-volume-root`). The container runtime pulled it with the node's
//! credentials and mirrors and checked it against the digest the pod spec pins; this reads the
//! mounted file in place: checks that it is a regular file and a core Wasm module, checks a
//! module sha256 pin, and hands its path on. Nothing is fetched and nothing enters the cache,
//! so no purge can remove it; the kubelet removes it with the pod.
//!
//! One reference, one mount: the volume's name is `wasm-` and 16 hex digits of the sha256 of
//! the source's canonical key ([`crate::reference::Source::key`]), and it is mounted at
//! `ROOT/<name>`. `render --image-volumes` writes the pod's side of that mapping and `serve`
//! reads by it, so the two agree by construction.
//!
//! With `serve --copy-image-volumes` the checked module is also copied into the cache (on a
//! node directory an Envoy in another pod reads): the DaemonSet that mounts the images rolls on
//! a module change, and the Envoy reading the copies never does.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use crate::digest::Sha256;
use crate::error::FetchError;
use crate::reference::Source;
use crate::store::cache::Staging;

/// The file the `compat` layout puts the module in, at the image's root.
pub const MODULE_FILE: &str = "plugin.wasm";

/// Where the image of one `oci://` source is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The pod's volume name: a DNS label (`wasm-` and 16 hex digits), as Kubernetes requires.
    pub name: String,
    /// `ROOT/<name>`.
    pub dir: PathBuf,
}

impl Mount {
    /// The mount of `source` under `root`; `None` for a source that is not `oci://`.
    pub fn of(source: &Source, root: &Path) -> Option<Self> {
        let Source::Oci(_) = source else {
            return None;
        };
        let hash = Sha256::of(source.key().as_bytes()).hex();
        let name = format!("wasm-{}", &hash[..16]);
        Some(Self {
            dir: root.join(&name),
            name,
        })
    }

    /// The module's path inside the mount.
    pub fn module(&self) -> PathBuf {
        self.dir.join(MODULE_FILE)
    }
}

/// The mounted module of `source`: its path and sha256, once it is a regular file of at most
/// `max_size` bytes holding a core Wasm module whose sha256 is `pin` (when given). A symbolic
/// link is refused: it would resolve inside this container, not inside the image.
pub async fn read(
    mount: &Mount,
    pin: Option<&Sha256>,
    max_size: u64,
) -> Result<(PathBuf, Sha256), FetchError> {
    let path = mount.module();
    let checked = path.clone();
    let sha = tokio::task::spawn_blocking(move || scan(&checked, max_size, |_| Ok(())))
        .await
        .map_err(|e| FetchError::Io(std::io::Error::other(format!("reading the module: {e}"))))??;
    crate::digest::check_pin(pin, &sha)?;
    Ok((path, sha))
}

/// [`read`], streaming the module's bytes into `staging` on the way: the staged copy and the
/// returned sha256 are of the same bytes, read once.
pub async fn copy(
    mount: &Mount,
    pin: Option<&Sha256>,
    max_size: u64,
    mut staging: Staging,
) -> Result<(Staging, Sha256), FetchError> {
    let path = mount.module();
    let (staging, sha) = tokio::task::spawn_blocking(move || {
        scan(&path, max_size, |chunk| staging.write(chunk)).map(|sha| (staging, sha))
    })
    .await
    .map_err(|e| FetchError::Io(std::io::Error::other(format!("copying the module: {e}"))))??;
    crate::digest::check_pin(pin, &sha)?;
    Ok((staging, sha))
}

/// Hashes the module at `path`, handing each chunk read to `sink`, after checking it is a
/// regular file of at most `max_size` bytes that starts like a core Wasm module.
fn scan(
    path: &Path,
    max_size: u64,
    mut sink: impl FnMut(&[u8]) -> Result<(), FetchError>,
) -> Result<Sha256, FetchError> {
    let unreadable = |reason: String| FetchError::Read {
        what: "image volume module",
        path: path.to_path_buf(),
        reason,
    };
    // The mount directory the kubelet made is a directory, never a link (one would lead out of
    // the root, to whatever this container can read).
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir_before =
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(unreadable(
                "its mount directory is a symbolic link, not an image volume the kubelet mounted"
                    .into(),
            )),
            Ok(meta) => Some(meta),
            Err(_) => None,
        };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(unreadable(
                "a symbolic link; the image must hold plugin.wasm itself (push --layout compat)"
                    .into(),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(unreadable(format!(
                "no such file: the pod mounts no image volume {} there; add the volumes `render --image-volumes` writes",
                path.parent().map(|d| d.display().to_string()).unwrap_or_default()
            )))
        }
        Err(e) => return Err(unreadable(e.to_string())),
    }
    // Opened without following a link, and checked on the opened file: a module swapped in
    // after the checks above is refused, not read.
    let file =
        wasm_common::regular_file::open_no_follow(path).map_err(|e| unreadable(e.to_string()))?;
    let opened = file.metadata().map_err(|e| unreadable(e.to_string()))?;
    if !same_dir_and_file(dir_before.as_ref(), dir, path, &opened) {
        return Err(unreadable(
            "it changed while it was opened (the mount directory or the file was replaced); try again".into(),
        ));
    }
    let size = opened.len();
    if size > max_size {
        return Err(FetchError::TooLarge { limit: max_size });
    }
    let mut reader = file.take(max_size.saturating_add(1));
    let mut hasher = sha2::Sha256::new();
    let mut head = Vec::with_capacity(8);
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| unreadable(e.to_string()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > max_size {
            return Err(FetchError::TooLarge { limit: max_size });
        }
        if head.len() < 8 {
            let want = (8 - head.len()).min(n);
            head.extend_from_slice(&buf[..want]);
        }
        hasher.update(&buf[..n]);
        sink(&buf[..n])?;
    }
    crate::digest::check_wasm_header(&head)?;
    Ok(Sha256(hasher.finalize().into()))
}

/// Whether the mount directory is still the directory checked (not a link since) and the
/// opened file is still the one its path names: the same device and inode both.
fn same_dir_and_file(
    dir_before: Option<&std::fs::Metadata>,
    dir: &Path,
    path: &Path,
    opened: &std::fs::Metadata,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    let same =
        |a: &std::fs::Metadata, b: &std::fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
    let dir_now = std::fs::symlink_metadata(dir);
    let file_now = std::fs::symlink_metadata(path);
    match (dir_before, dir_now, file_now) {
        (Some(before), Ok(now), Ok(file)) => {
            now.is_dir() && same(before, &now) && same(&file, opened)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(url: &str) -> Option<Mount> {
        Mount::of(&Source::parse(url).unwrap(), Path::new("/mnt/wasm"))
    }

    #[test]
    fn one_reference_written_two_ways_is_one_mount_with_a_dns_label_name() {
        let a = mount("oci://Reg.Example:443/team/filter").unwrap();
        let b = mount("oci://reg.example/team/filter:latest").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.name.len(), 21);
        assert!(a
            .name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'));
        assert_eq!(a.dir, Path::new("/mnt/wasm").join(&a.name));
        assert_ne!(a, mount("oci://reg.example/team/filter:2").unwrap());
        assert!(mount("https://reg.example/filter.wasm").is_none());
        assert!(mount("file:///filter.wasm").is_none());
    }

    #[tokio::test]
    async fn only_a_regular_core_module_with_the_pinned_sha_is_taken() {
        let root = tempfile::tempdir().unwrap();
        let m = Mount {
            name: "wasm-0".into(),
            dir: root.path().join("wasm-0"),
        };
        std::fs::create_dir(&m.dir).unwrap();
        let missing = read(&m, None, 1 << 20).await.unwrap_err().to_string();
        assert!(missing.contains("no image volume"), "{missing}");
        let module = b"\0asm\x01\0\0\0".to_vec();
        std::fs::write(m.module(), &module).unwrap();
        let (path, sha) = read(&m, None, 1 << 20).await.unwrap();
        assert_eq!((path, sha), (m.module(), Sha256::of(&module)));
        assert!(read(&m, Some(&sha), 1 << 20).await.is_ok());
        let wrong = Sha256::of(b"other");
        assert!(matches!(
            read(&m, Some(&wrong), 1 << 20).await,
            Err(FetchError::ChecksumMismatch { .. })
        ));
        assert!(matches!(
            read(&m, None, 4).await,
            Err(FetchError::TooLarge { limit: 4 })
        ));
        std::fs::write(m.module(), b"not wasm at all").unwrap();
        assert!(matches!(
            read(&m, None, 1 << 20).await,
            Err(FetchError::NotWasm { .. })
        ));
        std::fs::remove_file(m.module()).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", m.module()).unwrap();
        let link = read(&m, None, 1 << 20).await.unwrap_err().to_string();
        assert!(link.contains("symbolic link"), "{link}");
    }

    /// A mount directory that is a link out of the root (to a directory holding a module) is
    /// refused, though the module behind it would pass every other check.
    #[tokio::test]
    async fn a_mount_directory_linked_out_of_the_root_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join(MODULE_FILE), b"\0asm\x01\0\0\0").unwrap();
        let m = Mount {
            name: "wasm-0".into(),
            dir: root.path().join("wasm-0"),
        };
        std::os::unix::fs::symlink(elsewhere.path(), &m.dir).unwrap();
        let e = read(&m, None, 1 << 20).await.unwrap_err().to_string();
        assert!(e.contains("mount directory is a symbolic link"), "{e}");
    }

    /// The module swapped for a link to another module, and back, all the while: no read takes
    /// the module behind the link (the check and the open are of one file).
    #[test]
    fn a_module_swapped_for_a_link_between_check_and_open_is_never_read() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("wasm-0");
        std::fs::create_dir(&dir).unwrap();
        let own = b"\0asm\x01\0\0\0\0\x02\x01a".to_vec();
        let other = b"\0asm\x01\0\0\0\0\x02\x01b".to_vec();
        let outside = root.path().join("other.wasm");
        std::fs::write(&outside, &other).unwrap();
        let module = dir.join(MODULE_FILE);
        std::fs::write(&module, &own).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (dir, module, outside, own, stop) = (
                dir.clone(),
                module.clone(),
                outside.clone(),
                own.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let link = dir.join(".link");
                    let _ = std::fs::remove_file(&link);
                    std::os::unix::fs::symlink(&outside, &link).unwrap();
                    std::fs::rename(&link, &module).unwrap();
                    let file = dir.join(".file");
                    std::fs::write(&file, &own).unwrap();
                    std::fs::rename(&file, &module).unwrap();
                }
            })
        };
        let theirs = Sha256::of(&other);
        for _ in 0..300 {
            if let Ok(sha) = scan(&module, 1 << 20, |_| Ok(())) {
                assert_ne!(sha, theirs, "the module behind the link was read");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
    }
}
