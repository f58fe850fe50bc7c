//! The fetcher's side inputs (`--pull-secret`, `--ca-file`, a bootstrap to rewrite, the cache
//! index) are read with [`wasm_common::regular_file`]; this adds the limits and the error that
//! names the input.

use std::path::Path;

pub use wasm_common::regular_file::{read, read_no_follow, ReadError};

use crate::error::FetchError;

/// The library error for input `what` (a flag name or a description) at `path`.
pub fn named(e: ReadError, what: &'static str, path: &Path) -> FetchError {
    FetchError::Read {
        what,
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// [`read`], with the error naming the input.
pub fn read_input(path: &Path, what: &'static str, limit: u64) -> Result<Vec<u8>, FetchError> {
    read(path, limit).map_err(|e| named(e, what, path))
}

/// `read_input`'s limit for a Docker config JSON: Kubernetes caps a Secret at 1 MiB.
pub const PULL_SECRET_LIMIT: u64 = 1 << 20;
/// A CA bundle: the whole Mozilla set in PEM is about 220 KiB.
pub const CA_FILE_LIMIT: u64 = 4 << 20;
/// An Envoy bootstrap to rewrite.
pub const BOOTSTRAP_LIMIT: u64 = 64 << 20;
