//! An ECDS update while the proxy runs: a filter's discovery file replaced (as `wasm-fetcher
//! serve` replaces it, by a rename into the watched directory). Envoy's filter-config provider
//! checks the new configuration on a canary, then hands it to the main thread and every
//! worker; streams that start afterwards get the new filter, and a stream already under way
//! keeps the filter chain it was created with (the harness runs no stream across steps).

use super::threads::{place_changed, same_plugin, Dispatcher, Thread};
use super::{Proxy, StartError};
use crate::envoy::bootstrap::Bootstrap;

/// Why an update was not applied.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// The canary refused the new configuration: Envoy rejects the update and keeps the
    /// filter it had (`update_rejected`).
    #[error("the new configuration was refused: {0}")]
    Rejected(StartError),
    #[error("not emulated: the swapped ECDS file changes {0}; the harness swaps a Wasm filter's configuration for another Wasm filter's")]
    Shape(String),
}

impl Proxy {
    /// Applies `updated` (this proxy's bootstrap with some discovery files read again): each
    /// Wasm filter whose plugin changed is placed anew, as Envoy places an updated filter
    /// configuration; the others keep their root contexts. Returns the names of the filters
    /// that changed (none: Envoy sees the same configuration and does nothing).
    pub fn swap_ecds(&mut self, updated: Bootstrap) -> Result<Vec<String>, SwapError> {
        let old = &self.bootstrap;
        if updated.listeners.len() != old.listeners.len() {
            return Err(SwapError::Shape("the listeners".into()));
        }
        let mut changed = Vec::new();
        for (l, (a, b)) in old.listeners.iter().zip(&updated.listeners).enumerate() {
            let (pa, pb) = (a.plugins(), b.plugins());
            if pa.len() != pb.len() || a.http().map(|h| h.deny_at) != b.http().map(|h| h.deny_at) {
                return Err(SwapError::Shape(format!(
                    "which filters of listener {:?} are Wasm filters or RBAC fallbacks",
                    a.name
                )));
            }
            for (f, (x, y)) in pa.iter().zip(pb).enumerate() {
                if !same_plugin(x, y) {
                    changed.push((l, f));
                }
            }
        }
        if changed.is_empty() {
            return Ok(Vec::new());
        }
        self.factory
            .load_modules(&updated)
            .map_err(|e| SwapError::Rejected(e.into()))?;
        let shared = self.threads.shared.clone();
        let mut canary = Dispatcher::default();
        place_changed(
            &self.factory,
            &updated,
            &shared,
            Thread::Canary,
            &mut canary,
            &changed,
        )
        .map_err(SwapError::Rejected)?;
        drop(canary);
        // Envoy's thread-local slots: the main thread first, then each worker. A plugin that
        // fails to start there leaves its filter to the failure policy.
        let threads = &mut self.threads;
        for (thread, d) in std::iter::once((Thread::Main, &mut threads.main)).chain(
            threads
                .workers
                .iter_mut()
                .enumerate()
                .map(|(w, d)| (Thread::Worker(w), d)),
        ) {
            place_changed(&self.factory, &updated, &shared, thread, d, &changed)
                .map_err(SwapError::Rejected)?;
        }
        let names = changed
            .iter()
            .map(|&(l, f)| updated.listeners[l].plugins()[f].name.clone())
            .collect();
        self.bootstrap = updated;
        self.threads.deliver_posted();
        Ok(names)
    }
}
