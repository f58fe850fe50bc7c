//! Istio's best-effort unboxing of HTTP bodies: a gzip or tar body (nested, so `.tar.gz`
//! too) is opened until a Wasm module appears; a tar yields its first entry. Unlike Istio, a
//! box whose content exceeds the size limit is an explicit error, not a silent cut.

use std::io::Read;

use crate::cache::{Cache, Staging};
use crate::error::FetchError;

const MAX_DEPTH: usize = 4;

enum Kind {
    Gzip,
    Tar,
    Other,
}

fn kind(head: &[u8]) -> Kind {
    if head.starts_with(&[0x1f, 0x8b]) {
        Kind::Gzip
    } else if head.len() > 262 && &head[257..262] == b"ustar" {
        Kind::Tar
    } else {
        Kind::Other
    }
}

fn copy(mut from: impl Read, to: &mut Staging) -> Result<(), FetchError> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write(&buf[..n])?;
    }
}

/// Opens boxes until the content is no longer gzip or tar; the checksum is then the one of
/// the unboxed module.
pub fn unbox(cache: &Cache, mut staging: Staging) -> Result<Staging, FetchError> {
    for _ in 0..MAX_DEPTH {
        let mut head = Vec::with_capacity(512);
        staging.reopen()?.take(512).read_to_end(&mut head)?;
        if head.starts_with(b"\0asm") {
            return Ok(staging);
        }
        let mut inner = cache.staging(staging.max_size())?;
        match kind(&head) {
            Kind::Gzip => copy(flate2::read::GzDecoder::new(staging.reopen()?), &mut inner)
                .map_err(|e| match e {
                    FetchError::Io(io) => FetchError::NotWasm {
                        reason: format!(
                            "the body looks gzip-compressed but does not decompress: {io}"
                        ),
                    },
                    other => other,
                })?,
            Kind::Tar => {
                let mut archive = tar::Archive::new(staging.reopen()?);
                let first = archive
                    .entries()?
                    .next()
                    .transpose()
                    .map_err(|e| FetchError::NotWasm {
                        reason: format!(
                            "the body looks like a tar archive but cannot be read: {e}"
                        ),
                    })?
                    .ok_or_else(|| FetchError::NotWasm {
                        reason: "the body is an empty tar archive".into(),
                    })?;
                copy(first, &mut inner)?;
            }
            Kind::Other => return Ok(staging),
        }
        staging = inner;
    }
    Ok(staging)
}
