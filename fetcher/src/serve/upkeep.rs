//! What `serve` does besides converting: checking the modules in use on disk, and purging
//! the cache around them.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Shared, State};
use crate::envoy::render::Outcome;
use crate::store::lifecycle;

/// Sources whose modules are gone or damaged on disk, or which run on a fallback: they are
/// converted again. `rehash` checks every byte (SIGHUP); otherwise size and mtime against the
/// index.
pub(super) fn needing_refresh(shared: &Shared, rehash: bool) -> Vec<PathBuf> {
    let cache = &shared.options.cache;
    let idx = crate::store::index::IndexFile::new(cache)
        .load()
        .unwrap_or_default();
    let state = shared.state();
    state
        .sources
        .iter()
        .filter(|(_, s)| {
            s.applied.as_ref().is_some_and(|files| {
                files.values().any(|r| match &r.outcome {
                    Outcome::Fallback { .. } => true,
                    // A dynamic module is checked where it lies: its file is never rewritten.
                    Outcome::Module { sha256: sha, path }
                        if super::dynamic::is_cached(cache, sha, path) =>
                    {
                        !path.is_file()
                    }
                    Outcome::Module { sha256: sha, .. } => {
                        let verify = if rehash {
                            crate::store::cache::Verify::Hash
                        } else {
                            crate::store::cache::Verify::Stamp(
                                idx.modules
                                    .get(sha)
                                    .map(crate::store::index::ModuleEntry::stamp),
                            )
                        };
                        cache.lookup_intact(sha, verify).is_none()
                    }
                })
            })
        })
        .map(|(p, _)| p.clone())
        .collect()
}

pub(super) async fn purge_now(shared: &Arc<Shared>) {
    let _gate = shared.purge_gate.write().await;
    let in_use = shared.in_use(&shared.state());
    let (cache, settings) = (
        shared.options.cache.clone(),
        shared.options.settings.clone(),
    );
    let purged =
        tokio::task::spawn_blocking(move || lifecycle::purge(&cache, &settings, &in_use)).await;
    match purged {
        Ok(Ok(p)) => {
            for sha in &p.expired {
                tracing::info!(%sha, "purged: unused for WASM_MODULE_EXPIRY");
            }
            for sha in &p.evicted {
                tracing::info!(%sha, "evicted: over WASM_CACHE_MAX_BYTES");
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "purge failed"),
        Err(e) => tracing::warn!(error = %e, "purge did not finish"),
    }
    drop(_gate);
    purge_copies(shared).await;
    shared.refresh_cache_entries();
}

/// With `--copy-image-volumes`: removes the copies of image-volume modules no ECDS file names
/// any more (the node moved on to another image). Only once every ECDS file on disk is one
/// this process wrote (no leftover of an earlier run still names an older copy).
pub(super) async fn purge_copies(shared: &Arc<Shared>) {
    if !shared.options.settings.copy_image_volumes {
        return;
    }
    let _gate = shared.purge_gate.write().await;
    let in_use = {
        let state = shared.state();
        if !files_settled(&state) {
            return;
        }
        shared.in_use(&state)
    };
    let cache = shared.options.cache.clone();
    match tokio::task::spawn_blocking(move || lifecycle::purge_copies(&cache, &in_use)).await {
        Ok(Ok(gone)) => {
            for sha in gone {
                tracing::info!(%sha, "removed the copy of an image volume's module no ECDS file names");
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot purge the copies of image volumes"),
        Err(e) => tracing::warn!(error = %e, "purging the copies of image volumes did not finish"),
    }
}

/// Whether every ECDS file on disk is one whose resource `state` holds: the directory was
/// read, and each file an earlier run left is written again by a source now.
fn files_settled(state: &State) -> bool {
    let applied = || {
        state
            .sources
            .values()
            .flat_map(|s| s.applied.iter().flat_map(|a| a.keys()))
    };
    state.scanned && state.leftover.iter().all(|f| applied().any(|a| a == f))
}
