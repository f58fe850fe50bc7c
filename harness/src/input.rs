//! Reading the files a user names (Wasm modules, bootstraps, scenarios): only regular files,
//! and only up to a limit checked before anything is allocated, so a path to `/dev/zero`, a
//! FIFO or a directory is a clear error rather than a hang or an exhausted memory.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// The largest Wasm module the harness loads (the fetcher's default `max_size`).
pub const MAX_MODULE_BYTES: u64 = 256 << 20;

/// The largest bootstrap or scenario the harness reads.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// What a path is, when it is not a regular file.
fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

fn check(meta: &Metadata, limit: u64) -> io::Result<()> {
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a regular file ({}): give the path of a file",
                kind(meta)
            ),
        ));
    }
    if meta.len() > limit {
        return Err(too_large(meta.len(), limit));
    }
    Ok(())
}

fn too_large(size: u64, limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{size} bytes or more, over the harness's limit of {limit} bytes"),
    )
}

/// Opens `path` for reading without blocking on a FIFO that has no writer (the type is
/// checked again on the open file, in case the path changed in between).
fn open(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    options.open(path)
}

/// The bytes of the regular file at `path`, at most `limit` of them.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    check(&std::fs::metadata(path)?, limit)?;
    let file = open(path)?;
    let meta = file.metadata()?;
    check(&meta, limit)?;
    // The size is within the limit, so this reservation is too; the read stops at the limit
    // even if the file grows meanwhile.
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(too_large(out.len() as u64, limit));
    }
    Ok(out)
}

/// The regular file at `path` as UTF-8 text, at most `limit` bytes.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.yaml");
        std::fs::write(&file, "abc").unwrap();
        assert_eq!(read_text(&file, 3).unwrap(), "abc");
        let e = read(&file, 2).unwrap_err().to_string();
        assert!(e.contains("over the harness's limit of 2 bytes"), "{e}");
        let e = read(dir.path(), 10).unwrap_err().to_string();
        assert!(e.contains("not a regular file (a directory)"), "{e}");
        let e = read(Path::new("/dev/zero"), 10).unwrap_err().to_string();
        assert!(e.contains("a character device"), "{e}");
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        let e = read_text(&file, 10).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}
