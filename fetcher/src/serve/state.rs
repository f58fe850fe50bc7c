//! What `serve` knows of each plugin file: the plugins it declares, what is written for it,
//! and which file owns a name two files declare.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::envoy::render::{self, EcdsResource};
use crate::envoy::wasmplugin::WasmPlugin;

use super::watch::Content;
use super::written;

/// A plugin a file declares: its ECDS file name and its `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) file: String,
    pub(super) name: String,
}

impl Claim {
    pub(super) fn of(p: &WasmPlugin) -> Self {
        Self {
            file: render::file_name(p),
            name: format!("{}/{}", p.namespace, p.name),
        }
    }
}

/// One plugin file and what is on disk for it.
#[derive(Debug)]
pub(super) struct Source {
    pub(super) generation: u64,
    pub(super) content: Content,
    /// The plugins its newest parsed version declares, in document order.
    pub(super) claims: Vec<Claim>,
    /// The declared plugins that are not served, each `namespace/name: why`.
    pub(super) unserved: Vec<String>,
    /// The ECDS files written for it, by file name; `None` until the first conversion.
    pub(super) applied: Option<BTreeMap<String, EcdsResource>>,
    /// Why its newest version is not what is served, if it is not.
    pub(super) problem: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) next_generation: u64,
    pub(super) sources: BTreeMap<PathBuf, Source>,
    /// True once the directory was read once.
    pub(super) scanned: bool,
    /// ECDS files an earlier run recorded writing that no source has claimed since; once every
    /// source is served, those left are files of plugins deleted meanwhile, and are removed.
    pub(super) leftover: BTreeSet<String>,
    /// What the record in the ECDS directory says.
    pub(super) recorded: BTreeSet<String>,
    /// Sources to convert again: a plugin name they declare may have become theirs.
    pub(super) reconvert: BTreeSet<PathBuf>,
    /// The modules of conversions about to write their files: leased before any file names
    /// them.
    pub(super) pending: BTreeMap<PathBuf, BTreeSet<crate::Sha256>>,
}

impl State {
    /// The source that owns ECDS file `file`: of those declaring it, the first by path, so
    /// which duplicate is served never depends on which pull ends first.
    pub(super) fn owner(&self, file: &str) -> Option<&Path> {
        self.sources
            .iter()
            .find(|(_, s)| s.claims.iter().any(|c| c.file == file))
            .map(|(p, _)| p.as_path())
    }

    /// After the plugins some source declares changed: the converted sources that declare a
    /// plugin they do not serve are converted again, as it may be theirs now.
    pub(super) fn queue_unserved(&mut self) {
        let waiting: Vec<PathBuf> = self
            .sources
            .iter()
            .filter(|(_, s)| {
                s.applied
                    .as_ref()
                    .is_some_and(|a| s.claims.iter().any(|c| !a.contains_key(&c.file)))
            })
            .map(|(p, _)| p.clone())
            .collect();
        self.reconvert.extend(waiting);
    }

    /// The ECDS files `serve` answers for: those written for a source, and the leftovers
    /// still waiting to be claimed or removed.
    pub(super) fn written(&self) -> BTreeSet<String> {
        self.sources
            .values()
            .flat_map(|s| s.applied.iter().flat_map(|a| a.keys().cloned()))
            .chain(self.leftover.iter().cloned())
            .collect()
    }

    /// Brings the record in `dir` in line with what is written, if it is not.
    pub(super) fn record(&mut self, dir: &Path) {
        let written = self.written();
        if written != self.recorded {
            written::store(dir, &written);
            self.recorded = written;
        }
    }

    /// Once the directory was read and every source is served, removes the leftovers no
    /// source claimed: the files of plugins deleted while `serve` was down.
    pub(super) fn sweep_leftovers(&mut self, dir: &Path) {
        let settled = self.scanned && self.sources.values().all(|s| s.applied.is_some());
        if self.leftover.is_empty() || !settled {
            return;
        }
        let claimed: BTreeSet<String> = self
            .sources
            .values()
            .flat_map(|s| s.applied.iter().flat_map(|a| a.keys().cloned()))
            .collect();
        for name in std::mem::take(&mut self.leftover) {
            if !claimed.contains(&name) {
                match std::fs::remove_file(dir.join(&name)) {
                    Ok(()) => {
                        tracing::info!(file = %name, "removed the ECDS file of a plugin deleted while serve was down")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(file = %name, error = %e, "cannot remove the ECDS file of a deleted plugin")
                    }
                }
            }
        }
        self.record(dir);
    }
}

/// Why `name` is not served: `owner` declares it too and comes first.
pub(super) fn duplicate(name: &str, owner: &Path) -> String {
    format!(
        "{name}: also declared in {}, which comes first by file name and is the one served",
        owner.file_name().unwrap_or_default().to_string_lossy()
    )
}
