//! The files a user names (Wasm modules, bootstraps, scenarios) are read with
//! [`wasm_common::regular_file`]: only regular files, only up to a limit checked before
//! anything is allocated. This gives the harness's limits and its callers' `io::Error`.

use std::io;
use std::path::Path;

use wasm_common::regular_file::{self, ReadError};

/// The largest Wasm module the harness loads (the fetcher's default `max_size`).
pub const MAX_MODULE_BYTES: u64 = 256 << 20;

/// The largest bootstrap or scenario the harness reads.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

fn io_error(e: ReadError) -> io::Error {
    match e {
        ReadError::Io(e) => e,
        ReadError::Missing => io::Error::new(io::ErrorKind::NotFound, e.to_string()),
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// The bytes of the regular file at `path`, at most `limit` of them.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    regular_file::read(path, limit).map_err(io_error)
}

/// The regular file at `path` as UTF-8 text, at most `limit` bytes.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    regular_file::read_text(path, limit).map_err(io_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_reads_through_the_shared_reader() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.yaml");
        std::fs::write(&file, "abc").unwrap();
        assert_eq!(read_text(&file, 3).unwrap(), "abc");
        let e = read(&file, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(
            e.to_string().contains("larger than the limit of 2 bytes"),
            "{e}"
        );
        let e = read(&dir.path().join("none"), 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
