//! The ECDS files `serve` wrote, recorded in the ECDS directory itself. A plugin file deleted
//! while `serve` was down has no source left to remove its ECDS file, and Envoy would keep
//! loading it; the record lets the next start remove exactly those, never a file someone
//! else put in the directory.

use std::collections::BTreeSet;
use std::path::Path;

/// The record's name: a dot file, which no ECDS file name (`<namespace>.<name>.yaml`) is.
pub const RECORD: &str = ".wasm-fetcher-written";

/// A record of 100,000 file names is far under this; a larger one is not ours.
const MAX_RECORD_BYTES: u64 = 16 << 20;

/// The names recorded in `dir`; none if there is no record or it cannot be read. Only plain
/// file names are taken, so a tampered record cannot name a file outside `dir`.
pub fn load(dir: &Path) -> BTreeSet<String> {
    let bytes = match wasm_common::regular_file::read(&dir.join(RECORD), MAX_RECORD_BYTES) {
        Ok(bytes) => bytes,
        Err(wasm_common::regular_file::ReadError::Missing) => return BTreeSet::new(),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the record of written ECDS files; files of plugins deleted while serve was down stay");
            return BTreeSet::new();
        }
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|name| is_plain_name(name))
        .map(String::from)
        .collect()
}

/// Replaces the record in `dir` by `names`, whole.
pub fn store(dir: &Path, names: &BTreeSet<String>) {
    let mut text = String::new();
    for name in names {
        text.push_str(name);
        text.push('\n');
    }
    let written = wasm_common::fs::write_whole(
        dir,
        ".wasm-fetcher-record-",
        &dir.join(RECORD),
        text.as_bytes(),
        wasm_common::fs::Mode::WorldReadable,
        false,
    );
    if let Err(e) = written {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot record the written ECDS files");
    }
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && name != RECORD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_refuses_paths() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).is_empty());
        let names: BTreeSet<String> = ["a.p.yaml", "b.q.yaml"].map(String::from).into();
        store(dir.path(), &names);
        assert_eq!(load(dir.path()), names);
        std::fs::write(
            dir.path().join(RECORD),
            "ok.yaml\n../../etc/passwd\n/abs\n.hidden\n\nsub/x.yaml\n",
        )
        .unwrap();
        assert_eq!(load(dir.path()), BTreeSet::from(["ok.yaml".to_string()]));
    }
}
