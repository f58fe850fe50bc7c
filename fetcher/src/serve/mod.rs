//! `wasm-fetcher serve`: keeps a directory of Envoy ECDS files in step with a directory of
//! Istio `WasmPlugin` resources, for any Envoy that watches the ECDS directory
//! (`path_config_source` with `watched_directory`).
//!
//! A plugin file's content is its version. Each change gets a generation number; the pull it
//! starts may take long, and its result is written only if no newer generation of that file
//! was seen meanwhile, so a slow pull of an old version never overwrites a new one. Every
//! file is written by a rename inside the ECDS directory: Envoy sees the old file or the new,
//! never a part, and a stop (SIGTERM) between two writes leaves both files whole.
//!
//! The modules the written files name are held in a lease (`crate::store::lifecycle`), so no purge,
//! this process's or the CLI's, removes a module Envoy loads.

mod apply;
mod dir;
pub mod dynamic;
pub mod http;
pub mod metrics;
pub mod retry;
mod state;
mod upkeep;
pub mod watch;
mod written;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::envoy::render::{self, Outcome};
use crate::error::FetchError;
use crate::store::lifecycle::Lease;
use crate::{Cache, Settings};
use metrics::{ConversionResult, Metrics};
use state::{Claim, Source, State};
use watch::{Change, Content, Events, Watcher};

/// How `serve` runs; the CLI fills it from flags and the environment.
#[derive(Debug, Clone)]
pub struct Options {
    pub plugins: PathBuf,
    pub ecds_dir: PathBuf,
    pub cache: Cache,
    pub settings: Settings,
    pub render: render::Options,
    /// How often the plugins directory is scanned when no file events come (none could be
    /// watched).
    pub poll: Duration,
    /// How often it is scanned while file events come: the fallback for changes events miss.
    pub rescan: Duration,
    /// How often the modules in use are checked on disk (a SIGHUP checks at once, re-hashing).
    pub verify_every: Duration,
    pub backoff: retry::Backoff,
    /// Put before every metric name (`istio_agent_` for Istio's spelling).
    pub metrics_prefix: String,
    /// Bound on the bytes of all plugin files together (each is also bounded alone).
    pub max_plugin_bytes: u64,
    /// Bound on pulls running at once: 1500 slow sources do not hold 1500 connections.
    pub max_concurrent_pulls: usize,
    /// Who may read the ECDS files (see docs/security.md): the owner's group by default, as
    /// they hold `pluginConfig` and `vmConfig.env` values verbatim.
    pub ecds_mode: wasm_common::fs::Mode,
    /// The Envoy `DynamicModule` resources are pulled and checked for (`dynamic`).
    pub dynamic_target: Option<dynamic::Target>,
}

impl Options {
    pub fn new(plugins: &Path, ecds_dir: &Path, cache: Cache, settings: Settings) -> Self {
        Self {
            plugins: plugins.to_path_buf(),
            ecds_dir: ecds_dir.to_path_buf(),
            cache,
            settings,
            render: render::Options::default(),
            poll: Duration::from_millis(200),
            rescan: Duration::from_secs(10),
            verify_every: Duration::from_secs(60),
            backoff: retry::Backoff::default(),
            metrics_prefix: String::new(),
            max_plugin_bytes: 64 << 20,
            max_concurrent_pulls: 8,
            ecds_mode: wasm_common::fs::Mode::GroupReadable,
            dynamic_target: None,
        }
    }
}

/// What the process's signals ask of a running `serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// SIGHUP: re-hash every module in use now, fetch back what is missing or damaged, and
    /// retry plugins that run on their fallback.
    Reverify,
    /// SIGTERM / SIGINT: stop; every file written is whole.
    Stop,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read the plugins directory {}: {source}; give an existing directory of WasmPlugin files (--plugins)", path.display())]
    Plugins {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the ECDS directory {} is not a writable directory ({reason}); create it, on the same volume Envoy reads (--ecds-dir)", path.display())]
    EcdsDir { path: PathBuf, reason: String },
    #[error("another wasm-fetcher serve is writing the ECDS directory {} (it holds {} there); run one serve per ECDS directory", path.display(), dir::DIR_LOCK)]
    EcdsDirTaken { path: PathBuf },
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

struct Shared {
    options: Options,
    metrics: Metrics,
    state: Mutex<State>,
    lease: Lease,
    /// Held (shared) by a conversion from its pull until its files and lease are written,
    /// (exclusive) by a purge: a module just pulled is in the lease before a purge looks.
    purge_gate: tokio::sync::RwLock<()>,
    /// Lease writes one at a time, so an older set never lands after a newer one.
    lease_writes: Mutex<()>,
    /// One permit per pull that may run now.
    pulls: tokio::sync::Semaphore,
    /// Rung as each conversion ends: the loop then converts what it queued again and sweeps
    /// leftovers, without waiting for a scan.
    converted: tokio::sync::Notify,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        wasm_common::sync::lock(&self.state)
    }

    /// The digests of the modules the written files name, and those about to be named.
    fn in_use(&self, state: &State) -> BTreeSet<crate::Sha256> {
        state
            .sources
            .values()
            .flat_map(|s| s.applied.iter().flat_map(|a| a.values()))
            .filter_map(|r| cached_module(&self.options.cache, &r.outcome))
            .chain(state.pending.values().flatten().copied())
            .collect()
    }

    /// Brings the lease in line with the modules in use.
    fn record_lease(&self) {
        let _one = wasm_common::sync::lock(&self.lease_writes);
        let in_use = self.in_use(&self.state());
        if let Err(e) = self.lease.set(&in_use) {
            tracing::warn!(error = %e, "cannot record the modules in use; a purge might remove one");
        }
    }

    /// Leases the modules in use, pending ones included, and returns those a purge removed
    /// before it could see them leased. Blocks while a purge runs: call off the runtime.
    fn hold_lease(&self) -> Result<BTreeSet<crate::Sha256>, FetchError> {
        let _one = wasm_common::sync::lock(&self.lease_writes);
        let in_use = self.in_use(&self.state());
        self.lease.hold(&in_use)
    }

    fn refresh_cache_entries(&self) {
        if let Ok(idx) = crate::store::index::IndexFile::new(&self.options.cache).load() {
            self.metrics.set_cache_entries(idx.modules.len());
        }
    }
}

impl http::Endpoints for Shared {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn ready(&self) -> Result<(), String> {
        let state = self.state();
        if !state.scanned {
            return Err("the plugins directory has not been read yet".into());
        }
        // Ready means every plugin declared is served: its module or its fallback is written.
        let waiting: Vec<String> = state
            .sources
            .iter()
            .flat_map(|(path, s)| {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                match (&s.applied, &s.problem) {
                    (None, Some(p)) => vec![format!("{name}: {p}")],
                    (None, None) => vec![format!("{name}: pulling")],
                    (Some(_), _) => s.unserved.clone(),
                }
            })
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(waiting.join("; "))
        }
    }
}

/// Runs until `control` says stop (or is closed). `listener`, if any, answers `/metrics`,
/// `/healthz` and `/readyz`.
pub async fn run(
    options: Options,
    listener: Option<tokio::net::TcpListener>,
    mut control: mpsc::Receiver<Control>,
) -> Result<(), ServeError> {
    dir::check_ecds_dir(&options.ecds_dir)?;
    let _dir_lock = dir::lock_ecds_dir(&options.ecds_dir)?;
    let mut watcher = Watcher::new(&options.plugins, options.max_plugin_bytes);
    let events = match Events::watch(&options.plugins) {
        Ok(events) => Some(events),
        Err(e) => {
            tracing::warn!(dir = %options.plugins.display(), error = %e, every = ?options.poll, "no file events for the plugins directory; scanning it on a timer");
            None
        }
    };
    if events.is_some() {
        tracing::info!(dir = %options.plugins.display(), rescan = ?options.rescan, "watching the plugins directory for file events; scanning it on a timer too (--rescan-interval)");
    }
    let shared = start(options)?;
    let endpoint = listener.map(|l| tokio::spawn(http::serve(l, shared.clone())));
    let mut work = Work {
        tasks: JoinSet::new(),
        running: BTreeMap::new(),
    };
    let opts = &shared.options;
    let mut poll = tokio::time::interval(if events.is_some() {
        opts.rescan
    } else {
        opts.poll
    });
    let mut verify = tokio::time::interval(opts.verify_every);
    let mut purge = tokio::time::interval(opts.settings.purge_interval);
    for t in [&mut poll, &mut verify, &mut purge] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    // The first ticks fire at once: verify and purge wait for their period.
    verify.tick().await;
    purge.tick().await;
    let outcome = loop {
        let again: Vec<PathBuf> = tokio::select! {
            _ = next_scan(&mut poll, events.as_ref()) => match watcher.poll() {
                Ok(changes) => work.take_changes(&shared, changes),
                Err(source) if !shared.state().scanned => {
                    break Err(ServeError::Plugins { path: opts.plugins.clone(), source });
                }
                Err(e) => {
                    tracing::warn!(dir = %opts.plugins.display(), error = %e, "cannot read the plugins directory; keeping what is served");
                    shared.state().scanned = true;
                    Vec::new()
                }
            },
            () = shared.converted.notified() => Vec::new(),
            _ = verify.tick() => upkeep::needing_refresh(&shared, false),
            _ = purge.tick() => {
                let shared = shared.clone();
                work.tasks.spawn(async move { upkeep::purge_now(&shared).await });
                Vec::new()
            }
            c = control.recv() => match c {
                Some(Control::Reverify) => upkeep::needing_refresh(&shared, true),
                Some(Control::Stop) | None => break Ok(()),
            },
        };
        work.convert_again(&shared, again);
        shared.state().sweep_leftovers(&opts.ecds_dir);
    };
    // Each pull is dropped at an await: its temp file goes with it, and no ECDS file is being
    // written then (writes happen whole, between awaits).
    work.tasks.shutdown().await;
    if let Some(e) = endpoint {
        e.abort();
    }
    outcome
}

/// Returns when the plugins directory is to be scanned: at a file event, or at the timer.
async fn next_scan(timer: &mut tokio::time::Interval, events: Option<&Events>) {
    match events {
        Some(events) => {
            tokio::select! {
                _ = timer.tick() => {}
                () = events.changed() => timer.reset(),
            }
            events.keep_watching();
        }
        None => {
            timer.tick().await;
        }
    }
}

/// What `run` starts with: the temp files of killed writers gone, the lease taken, and the
/// ECDS files a previous run left read back as what is served.
fn start(options: Options) -> Result<Arc<Shared>, ServeError> {
    let orphans = dir::remove_orphaned_temp_files(&options.ecds_dir)
        + options.cache.remove_orphaned_downloads();
    if orphans > 0 {
        tracing::info!(
            orphans,
            "removed the temp files of writers killed mid-write"
        );
    }
    let lease = Lease::take(&options.cache, &dir::lease_holder(&options.ecds_dir))?;
    let pulls = tokio::sync::Semaphore::new(options.max_concurrent_pulls.max(1));
    let shared = Arc::new(Shared {
        metrics: Metrics::new(&options.metrics_prefix),
        options,
        state: Mutex::default(),
        lease,
        purge_gate: tokio::sync::RwLock::new(()),
        lease_writes: Mutex::default(),
        pulls,
        converted: tokio::sync::Notify::new(),
    });
    shared.refresh_cache_entries();
    {
        let mut state = shared.state();
        state.leftover = written::load(&shared.options.ecds_dir);
        state.recorded = state.leftover.clone();
    }
    Ok(shared)
}

/// The conversions and purges under way, and which plugin file each conversion is for.
struct Work {
    tasks: JoinSet<()>,
    running: BTreeMap<PathBuf, tokio::task::AbortHandle>,
}

impl Work {
    /// Records what a scan of the plugins directory found; returns the files to convert.
    fn take_changes(&mut self, shared: &Arc<Shared>, changes: Vec<Change>) -> Vec<PathBuf> {
        let mut updated = Vec::new();
        for change in changes {
            match change {
                Change::Updated(path, content) => {
                    let mut state = shared.state();
                    match state.sources.get_mut(&path) {
                        Some(s) => s.content = content,
                        None => {
                            state.sources.insert(
                                path.clone(),
                                Source {
                                    generation: 0,
                                    content,
                                    claims: Vec::new(),
                                    unserved: Vec::new(),
                                    applied: None,
                                    problem: None,
                                },
                            );
                        }
                    }
                    updated.push(path);
                }
                Change::Removed(path) => {
                    if let Some(h) = self.running.remove(&path) {
                        h.abort();
                    }
                    remove_source(shared, &path);
                    let shared = shared.clone();
                    self.tasks
                        .spawn(async move { upkeep::purge_copies(&shared).await });
                }
            }
        }
        shared.state().scanned = true;
        updated
    }

    /// Starts a conversion of each file in `again` (and each the state asks for), a new
    /// generation each, aborting the one under way for that file.
    fn convert_again(&mut self, shared: &Arc<Shared>, again: Vec<PathBuf>) {
        let again: BTreeSet<PathBuf> = again
            .into_iter()
            .chain(std::mem::take(&mut shared.state().reconvert))
            .collect();
        for path in again {
            let generation = {
                let mut state = shared.state();
                state.next_generation += 1;
                let generation = state.next_generation;
                let Some(source) = state.sources.get_mut(&path) else {
                    continue;
                };
                source.generation = generation;
                generation
            };
            if let Some(h) = self.running.remove(&path) {
                h.abort();
            }
            let shared = shared.clone();
            let key = path.clone();
            let handle = self.tasks.spawn(async move {
                convert(&shared, &path, generation).await;
                shared.converted.notify_one();
            });
            self.running.insert(key, handle);
        }
        while self.tasks.try_join_next().is_some() {}
        self.running.retain(|_, h| !h.is_finished());
    }
}

/// Pulls and renders every plugin of one file's content, then writes the files if this is
/// still the newest generation of that file.
async fn convert(shared: &Arc<Shared>, path: &Path, generation: u64) {
    let _gate = shared.purge_gate.read().await;
    let Some(content) = shared.state().sources.get(path).map(|s| s.content.clone()) else {
        return;
    };
    let opts = &shared.options;
    let plugins = match content {
        Content::Unreadable(reason) => Err(reason),
        // Off the runtime's one thread, which also answers the kubelet's probes.
        Content::Text { text, .. } => {
            match tokio::task::spawn_blocking(move || dynamic::parse(&text)).await {
                Ok(parsed) => {
                    parsed.map_err(|e| format!("{}: {}", path.display(), crate::error::chain(&e)))
                }
                Err(e) => Err(format!("{}: reading it failed: {e}", path.display())),
            }
        }
    };
    let plugins = match plugins {
        Ok(p) => {
            let claims: Vec<Claim> = p.plugins().iter().map(Claim::of).collect();
            let mut state = shared.state();
            match state.sources.get_mut(path) {
                Some(s) if s.generation == generation => {
                    if s.claims != claims {
                        s.claims = claims;
                        state.queue_unserved();
                    }
                }
                _ => return,
            }
            p
        }
        Err(problem) => {
            shared
                .metrics
                .conversion(ConversionResult::UnmarshalFailure);
            tracing::error!(%problem, "WasmPlugin refused; the files written for its last good version stay");
            if let Some(s) = shared.state().sources.get_mut(path) {
                if s.generation == generation {
                    s.problem = Some(problem);
                }
            }
            return;
        }
    };
    let native = matches!(plugins, dynamic::Resources::Dynamic(_));
    let plugins = plugins.plugins();
    let mut resources = Vec::with_capacity(plugins.len());
    let mut seen = BTreeSet::new();
    for plugin in plugins {
        // Only the owner of a name pulls for it, and within a file only the first document.
        let file = render::file_name(plugin);
        if !seen.insert(file.clone()) || shared.state().owner(&file) != Some(path) {
            continue;
        }
        let request = render::plan(plugin, &opts.render);
        let Ok(_turn) = shared.pulls.acquire().await else {
            return;
        };
        if native {
            let target = opts.dynamic_target.as_ref();
            let deadline = opts.backoff.deadline;
            let made = dynamic::resource(
                plugin,
                &request,
                target,
                &opts.cache,
                &opts.settings,
                deadline,
            );
            resources.push(made.await);
            continue;
        }
        let pulled = retry::pull(
            &request,
            &opts.cache,
            &opts.settings,
            opts.backoff,
            &shared.metrics,
        )
        .await;
        if let Err(e) = &pulled {
            tracing::error!(plugin = %plugin.qualified_name(), error = %crate::reference::redact_for_display(&crate::error::chain(e)), "module not available; writing the plugin's fallback");
        }
        resources.push(render::resource(plugin, pulled.as_ref()));
    }
    // The modules are leased before a file names them, and checked to be there under the
    // purge lock: a purge in another process either sees them leased or they are pulled again.
    // A module read in place from an image volume is not the cache's: no purge can touch it.
    let modules: BTreeSet<crate::Sha256> = resources
        .iter()
        .filter_map(|r| cached_module(&shared.options.cache, &r.outcome))
        .collect();
    shared
        .state()
        .pending
        .insert(path.to_path_buf(), modules.clone());
    let held = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || shared.hold_lease()).await
    };
    match held {
        Ok(Ok(gone)) if gone.is_disjoint(&modules) => {}
        Ok(Ok(_)) => {
            tracing::warn!(path = %path.display(), "a purge removed a module before it was leased; pulling it again");
            let mut state = shared.state();
            state.pending.remove(path);
            state.reconvert.insert(path.to_path_buf());
            return;
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot lease the modules in use; a purge might remove one")
        }
        Err(e) => tracing::warn!(error = %e, "leasing the modules in use did not finish"),
    }
    apply::apply(shared, path, generation, resources);
    drop(_gate);
    upkeep::purge_copies(shared).await;
    shared.refresh_cache_entries();
}

/// The cached module an ECDS resource names, which a lease must keep from a purge; `None` for
/// a fallback and for a module read in place from an image volume, which no purge touches.
fn cached_module(cache: &Cache, outcome: &Outcome) -> Option<crate::Sha256> {
    match outcome {
        Outcome::Module { sha256, path } => (*path == cache.module_path(sha256)
            || dynamic::is_cached(cache, sha256, path))
        .then_some(*sha256),
        Outcome::Fallback { .. } => None,
    }
}

/// A plugin file is gone: so are its ECDS files, and a duplicate of one of its plugins
/// is written in its place.
fn remove_source(shared: &Shared, path: &Path) {
    let mut state = shared.state();
    state.pending.remove(path);
    let Some(source) = state.sources.remove(path) else {
        return;
    };
    for name in source.applied.iter().flat_map(|a| a.keys()) {
        let _ = std::fs::remove_file(shared.options.ecds_dir.join(name));
    }
    state.queue_unserved();
    state.record(&shared.options.ecds_dir);
    drop(state);
    shared.record_lease();
}
