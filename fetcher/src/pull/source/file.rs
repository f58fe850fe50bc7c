//! `file://` sources. A regular file, or a pipe (`file:///dev/fd/3`, a FIFO) that streams one;
//! a pipe that never opens or never ends is bounded by the caller's deadline (`--timeout`) and
//! the size limit. A directory is refused by name.

use tokio::io::AsyncReadExt;

use crate::error::FetchError;
use crate::regular_file::ReadError;
use crate::store::cache::Staging;

pub async fn fetch(url: &url::Url, staging: &mut Staging) -> Result<(), FetchError> {
    let path = url.to_file_path().map_err(|_| FetchError::BadUrl {
        reason: "a file:// URL needs an absolute local path (file:///abs/path.wasm)".into(),
    })?;
    let unreadable = |e: ReadError| match e {
        ReadError::Missing => FetchError::NoSuchFile { path: path.clone() },
        e => crate::regular_file::named(e, "file", &path),
    };
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| unreadable(e.into()))?;
    let meta = file.metadata().await.map_err(|e| unreadable(e.into()))?;
    if meta.is_dir() {
        return Err(unreadable(ReadError::NotRegular("a directory")));
    }
    if meta.is_file() && meta.len() > staging.max_size() {
        return Err(FetchError::TooLarge {
            limit: staging.max_size(),
        });
    }
    let mut buf = vec![0u8; 256 * 1024];
    let mut header_checked = false;
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| unreadable(e.into()))?;
        if n == 0 {
            return Ok(());
        }
        staging.write(&buf[..n])?;
        // Not a module: stop now rather than copy up to the size limit (`/dev/urandom`).
        if !header_checked && staging.head().len() == 8 {
            crate::digest::check_wasm_header(staging.head())?;
            header_checked = true;
        }
    }
}
