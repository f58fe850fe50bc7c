//! A conversion's result, applied: the ECDS files the newest generation of a plugin file names
//! are written, a plugin name another file already serves is reported rather than taken, and
//! the files this plugin file no longer names go.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::metrics::ConversionResult;
use super::state::{duplicate, Claim, State};
use super::Shared;
use crate::envoy::render::{EcdsResource, Outcome};

/// Writes `resources` for the file at `path`, unless a newer generation of it was seen.
pub(super) fn apply(shared: &Shared, path: &Path, generation: u64, resources: Vec<EcdsResource>) {
    apply_locked(shared, path, generation, resources);
    shared.record_lease();
}

/// Which plugin file serves each ECDS file name `claims` declares.
type Owners = BTreeMap<String, PathBuf>;

fn ours(owners: &Owners, path: &Path, file: &str) -> bool {
    owners.get(file).is_some_and(|o| o == path)
}

fn apply_locked(shared: &Shared, path: &Path, generation: u64, resources: Vec<EcdsResource>) {
    let dir = &shared.options.ecds_dir;
    let mut state = shared.state();
    state.pending.remove(path);
    let current = state
        .sources
        .get(path)
        .is_some_and(|s| s.generation == generation);
    if !current {
        tracing::debug!(path = %path.display(), generation, "a newer version arrived; result dropped");
        return;
    }
    let claims = state
        .sources
        .get(path)
        .map(|s| s.claims.clone())
        .unwrap_or_default();
    let owners: Owners = claims
        .iter()
        .filter_map(|c| Some((c.file.clone(), state.owner(&c.file)?.to_path_buf())))
        .collect();
    let mut unserved = duplicates(&claims, &owners, path);
    settle_names(&mut state, path, &claims, &owners, &resources);
    let Some(source) = state.sources.get_mut(path) else {
        return;
    };
    let previous = source.applied.take().unwrap_or_default();
    let Written {
        served: written,
        unserved: unwritten,
        mut problems,
    } = write(shared, path, &claims, &owners, resources, &previous);
    unserved.extend(unwritten);
    // A file no longer written for this source goes, unless another source owns it now.
    for name in previous.keys().filter(|n| !written.contains_key(*n)) {
        if owners.get(name).is_none_or(|o| o == path) {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
    problems.extend(unserved.iter().cloned());
    source.unserved = unserved;
    source.applied = Some(written);
    source.problem = (!problems.is_empty()).then(|| problems.join("; "));
    state.record(dir);
}

/// The plugins of this file that are not served: declared twice in it, or served by another.
fn duplicates(claims: &[Claim], owners: &Owners, path: &Path) -> Vec<String> {
    let mut unserved = Vec::new();
    let mut seen = BTreeSet::new();
    for c in claims {
        if !seen.insert(c.file.as_str()) {
            unserved.push(format!(
                "{}: declared again in a later document of this file; the first is served",
                c.name
            ));
        } else if let Some(owner) = owners.get(&c.file).filter(|o| *o != path) {
            unserved.push(duplicate(&c.name, owner));
        }
    }
    unserved
}

/// A name that became ours while the pull ran is converted again (it has no resource yet);
/// the names this file now writes are no longer served for a later duplicate.
fn settle_names(
    state: &mut State,
    path: &Path,
    claims: &[Claim],
    owners: &Owners,
    resources: &[EcdsResource],
) {
    if claims
        .iter()
        .any(|c| ours(owners, path, &c.file) && !resources.iter().any(|r| r.file_name == c.file))
    {
        state.reconvert.insert(path.to_path_buf());
    }
    for (other, s) in state
        .sources
        .iter_mut()
        .filter(|(p, _)| p.as_path() != path)
    {
        let Some(applied) = s.applied.as_mut() else {
            continue;
        };
        for r in resources
            .iter()
            .filter(|r| ours(owners, path, &r.file_name))
        {
            if applied.remove(&r.file_name).is_some() {
                if let Some(c) = s.claims.iter().find(|c| c.file == r.file_name) {
                    s.unserved.push(duplicate(&c.name, path));
                }
                tracing::warn!(file = %other.display(), plugin = %r.file_name, "duplicate plugin name: the file first by name serves it");
            }
        }
    }
}

/// What [`write`] did: the resources served now, the plugins whose file could not be written,
/// and what `/readyz` says of the file.
struct Written {
    served: BTreeMap<String, EcdsResource>,
    unserved: Vec<String>,
    problems: Vec<String>,
}

/// Writes each resource this file owns (an unchanged one already on disk is left as it is).
/// A file that cannot be written keeps what was there.
fn write(
    shared: &Shared,
    path: &Path,
    claims: &[Claim],
    owners: &Owners,
    resources: Vec<EcdsResource>,
    previous: &BTreeMap<String, EcdsResource>,
) -> Written {
    let dir = &shared.options.ecds_dir;
    let (mut written, mut unserved, mut problems) = (BTreeMap::new(), Vec::new(), Vec::new());
    for r in resources {
        if !ours(owners, path, &r.file_name) {
            continue;
        }
        let unchanged = previous.get(&r.file_name) == Some(&r) && dir.join(&r.file_name).is_file();
        let result = if unchanged {
            Ok(())
        } else {
            r.write_with_mode(dir, shared.options.ecds_mode).map(drop)
        };
        match result {
            Ok(()) => {
                shared.metrics.conversion(match r.outcome {
                    Outcome::Module { .. } => ConversionResult::Success,
                    Outcome::Fallback { .. } => ConversionResult::FetchFailure,
                });
                if let Outcome::Fallback { error, .. } = &r.outcome {
                    problems.push(format!("{}: on its fallback ({error})", r.name));
                }
                written.insert(r.file_name.clone(), r);
            }
            Err(e) => {
                shared.metrics.conversion(ConversionResult::MarshalFailure);
                let name = claims
                    .iter()
                    .find(|c| c.file == r.file_name)
                    .map_or(r.name.as_str(), |c| c.name.as_str());
                unserved.push(format!(
                    "{name}: its ECDS file cannot be written ({})",
                    e.source
                ));
                problems.push(e.to_string());
                // What was there stays there, and stays counted.
                if let Some(old) = previous.get(&r.file_name) {
                    written.insert(r.file_name.clone(), old.clone());
                }
            }
        }
    }
    Written {
        served: written,
        unserved,
        problems,
    }
}
