//! Istio's best-effort unboxing of HTTP bodies: a gzip or tar body (nested, so `.tar.gz`
//! too) is opened until a Wasm module appears; a tar yields its first entry. Unlike Istio, a
//! box whose content exceeds the size limit is an explicit error, not a silent cut.

use std::io::Read;

use crate::error::FetchError;
use crate::store::cache::{Cache, Staging};

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

/// How much a tar.gz layer may decompress to, as a multiple of the module size limit: room
/// for a few other files beside `plugin.wasm`, not for a decompression bomb.
const LAYER_EXPANSION: u64 = 4;

/// A reader that fails once more than `left` bytes were asked of it, instead of ending early
/// (which a tar reader would report as a damaged archive).
struct Bounded<R> {
    inner: R,
    left: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("the layer decompresses to more than its limit")]
struct OverLimit;

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self
            .left
            .checked_sub(n as u64)
            .ok_or_else(|| std::io::Error::other(OverLimit))?;
        Ok(n)
    }
}

fn is_over_limit(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<OverLimit>())
}

/// The largest PAX or GNU long-name header accepted, as Go's `archive/tar` (Istio's) allows.
const EXTENSION_LIMIT: u64 = 1 << 20;

/// Refuses an archive with a PAX or GNU long-name header over [`EXTENSION_LIMIT`]: the tar
/// crate reads such a header whole into memory, whatever size it declares, so a small
/// compressed layer could make it allocate up to the expansion limit. This pass reads the
/// headers raw and skips every entry's content; `first_only` stops it at the first entry that
/// is not such a header (all that [`unbox`] reads).
fn check_extension_headers(reader: impl Read, first_only: bool) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()?.raw(true) {
        let entry = entry?;
        let t = entry.header().entry_type();
        let extension = t.is_gnu_longname()
            || t.is_gnu_longlink()
            || t.is_pax_local_extensions()
            || t.is_pax_global_extensions();
        if extension && entry.size() > EXTENSION_LIMIT {
            return Err(std::io::Error::other(format!(
                "an extended (PAX or long-name) header of {} bytes, more than {EXTENSION_LIMIT}",
                entry.size()
            )));
        }
        if first_only && !extension {
            break;
        }
    }
    Ok(())
}

/// The `plugin.wasm` of a Docker or OCI image layer (tar.gz) held in `layer`, streamed into a
/// staging file of its own: nothing is held in memory, an entry declaring more than the size
/// limit is refused before it is read, and the layer's file is removed when this returns.
pub fn extract_plugin_wasm(
    cache: &Cache,
    mut layer: Staging,
    media_type: &str,
) -> Result<Staging, FetchError> {
    let limit = layer.max_size();
    let not_targz = |e: std::io::Error| {
        if is_over_limit(&e) {
            FetchError::TooLarge { limit }
        } else {
            FetchError::NotWasm {
                reason: format!("the {media_type} layer is not a valid tar.gz: {e}"),
            }
        }
    };
    let mut decompressed = || -> Result<_, FetchError> {
        Ok(Bounded {
            inner: flate2::read::GzDecoder::new(std::io::BufReader::new(layer.reopen()?)),
            left: limit.saturating_mul(LAYER_EXPANSION),
        })
    };
    check_extension_headers(decompressed()?, false).map_err(not_targz)?;
    let mut archive = tar::Archive::new(decompressed()?);
    for entry in archive.entries().map_err(not_targz)? {
        let entry = entry.map_err(not_targz)?;
        let is_plugin = entry
            .path()
            .ok()
            .and_then(|p| p.file_name().map(|n| n == "plugin.wasm"))
            .unwrap_or(false);
        if !is_plugin {
            continue;
        }
        if entry.size() > limit {
            return Err(FetchError::TooLarge { limit });
        }
        let mut module = cache.staging(limit)?;
        copy(entry, &mut module).map_err(|e| match e {
            FetchError::Io(io) => not_targz(io),
            other => other,
        })?;
        return Ok(module);
    }
    Err(FetchError::UnsupportedLayout {
        found: vec![format!("{media_type} without plugin.wasm")],
    })
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
                check_extension_headers(staging.reopen()?, true).map_err(|e| {
                    FetchError::NotWasm {
                        reason: format!(
                            "the body looks like a tar archive but cannot be read: {e}"
                        ),
                    }
                })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_gz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    fn extract(layer: &[u8], limit: u64) -> (tempfile::TempDir, Result<Vec<u8>, FetchError>) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let mut staging = cache.staging(limit).unwrap();
        staging.write(layer).unwrap();
        let out = extract_plugin_wasm(
            &cache,
            staging,
            "application/vnd.oci.image.layer.v1.tar+gzip",
        )
        .and_then(|mut s| {
            let mut v = Vec::new();
            s.reopen()?.read_to_end(&mut v)?;
            Ok(v)
        });
        (dir, out)
    }

    fn tmp_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("tmp")).unwrap().count()
    }

    /// A tar.gz whose first entry is a GNU long-name header holding `name`, then the module,
    /// whose path that header gives.
    fn long_name_layer(name: &[u8]) -> Vec<u8> {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_path("././@LongLink").unwrap();
        h.set_size(name.len() as u64);
        h.set_cksum();
        b.append(&h, name).unwrap();
        let m = b"\0asm\x01\0\0\0";
        let mut h = tar::Header::new_gnu();
        h.set_size(m.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, "plugin.wasm", &m[..]).unwrap();
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn a_huge_long_name_header_is_refused_without_reading_it_into_memory() {
        // 4 MiB of name compress to a few KiB.
        let layer = long_name_layer(&vec![0; 4 << 20]);
        assert!(layer.len() < 64 << 10, "{} bytes compressed", layer.len());
        let ((dir, out), allocated) = crate::alloc_meter::allocated_by(|| extract(&layer, 2 << 20));
        let e = out.unwrap_err().to_string();
        assert!(e.contains("extended (PAX or long-name) header"), "{e}");
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");
        assert_eq!(tmp_files(dir.path()), 0);

        // The same inside a plain tar body (an HTTP source).
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let mut staging = cache.staging(8 << 20).unwrap();
        let mut tar_body = Vec::new();
        flate2::read::GzDecoder::new(&layer[..])
            .read_to_end(&mut tar_body)
            .unwrap();
        staging.write(&tar_body).unwrap();
        drop(tar_body);
        let (out, allocated) = crate::alloc_meter::allocated_by(|| unbox(&cache, staging));
        let e = out.err().unwrap().to_string();
        assert!(e.contains("extended (PAX or long-name) header"), "{e}");
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");

        // A long name of ordinary length still names plugin.wasm.
        let name = format!("{}plugin.wasm\0", "deep/".repeat(60));
        let (_, out) = extract(&long_name_layer(name.as_bytes()), 1 << 20);
        assert_eq!(out.unwrap(), b"\0asm\x01\0\0\0");
    }

    #[test]
    fn plugin_wasm_is_found_among_other_entries() {
        let m = b"\0asm\x01\0\0\0module";
        let layer = tar_gz(&[("etc/other", b"x"), ("./plugin.wasm", m)]);
        let (dir, out) = extract(&layer, 1 << 20);
        assert_eq!(out.unwrap(), m);
        assert_eq!(tmp_files(dir.path()), 0, "a staging file was left behind");
    }

    #[test]
    fn a_bomb_before_plugin_wasm_stops_at_the_expansion_limit() {
        let zeros = vec![0u8; 64 * 1024];
        let layer = tar_gz(&[("padding", &zeros), ("plugin.wasm", b"\0asm\x01\0\0\0")]);
        // 64 KiB of padding against a 4 KiB limit: 16 KiB may be decompressed, no more.
        let (dir, out) = extract(&layer, 4096);
        assert!(
            matches!(out, Err(FetchError::TooLarge { limit: 4096 })),
            "{out:?}"
        );
        assert_eq!(tmp_files(dir.path()), 0);
        let (_, out) = extract(&tar_gz(&[("a", b"x")]), 4096);
        let e = out.unwrap_err().to_string();
        assert!(e.contains("without plugin.wasm"), "{e}");
        let (_, out) = extract(b"\x1f\x8bnot really gzip", 4096);
        let e = out.unwrap_err().to_string();
        assert!(e.contains("not a valid tar.gz"), "{e}");
    }
}
