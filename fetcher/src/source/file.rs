//! `file://` sources.

use tokio::io::AsyncReadExt;

use crate::cache::Staging;
use crate::error::FetchError;

pub async fn fetch(url: &url::Url, staging: &mut Staging) -> Result<(), FetchError> {
    let path = url.to_file_path().map_err(|_| FetchError::BadUrl {
        reason: "a file:// URL needs an absolute local path (file:///abs/path.wasm)".into(),
    })?;
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FetchError::NoSuchFile { path: path.clone() },
            _ => FetchError::Io(e),
        })?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        staging.write(&buf[..n])?;
    }
}
