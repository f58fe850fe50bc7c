//! Where plugins run: Envoy's configuration canary, the main thread and each worker have their
//! own VMs, one per distinct [`VmKey`], and every distinct plugin ([`PluginKey`]) placed on a
//! thread gets one root context in the VM of its key, shared by the filters that configure it
//! identically. A worker VM that trapped is created again under `FAIL_RELOAD` with every plugin
//! it hosted, filters and Wasm services alike.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::callouts::Callouts;
use super::events::{self, DeliveryError};
use super::StartError;
use crate::engine::host::Shared;
use crate::engine::precompiled_section as precompiled;
use crate::engine::runtime::{LoadedModule, Runtime, VmError};
use crate::engine::vm::{PluginStartError, Vm};
use crate::envoy::bootstrap::{Bootstrap, FailurePolicy, WasmPlugin};

/// `FAIL_RELOAD`'s backoff (`reload_config.backoff.base_interval`, Envoy's default). The
/// harness does not jitter it, so runs repeat.
pub const RELOAD_BACKOFF: std::time::Duration = std::time::Duration::from_millis(1000);

/// Envoy 1.40 shares one VM (per thread) between plugins whose `vm_config` agrees on every
/// field the VM is built from: vm_id, runtime, code, VM configuration and environment
/// variables (and capability restrictions, which the harness refuses); `allow_precompiled` is
/// not part of it (envoy#46893; checked by counting starts in real Envoy).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct VmKey {
    vm_id: String,
    runtime: String,
    vm_configuration: Vec<u8>,
    code: PathBuf,
    environment: Vec<(String, String)>,
}

impl VmKey {
    pub(super) fn of(p: &WasmPlugin) -> Self {
        let mut environment = p.environment.clone();
        environment.sort();
        Self {
            vm_id: p.vm_id.clone(),
            runtime: p.runtime.clone(),
            vm_configuration: p.vm_configuration.clone(),
            code: p.code.clone(),
            environment,
        }
    }
}

/// Envoy 1.40 keys a plugin by its whole configuration but `vm_config` (which the VM key
/// covers): filters configured identically in one VM share one root context, so it starts and
/// configures once per thread.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PluginKey {
    name: String,
    root_id: String,
    configuration: Vec<u8>,
    failure_policy: FailurePolicy,
}

impl PluginKey {
    fn of(p: &WasmPlugin) -> Self {
        Self {
            name: p.name.clone(),
            root_id: p.root_id.clone(),
            configuration: p.configuration.clone(),
            failure_policy: p.failure_policy,
        }
    }
}

/// A plugin as placed on one worker: which VM, which root context.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PluginSlot {
    pub(super) vm: usize,
    pub(super) root: u32,
}

/// A plugin a VM hosts, by where the bootstrap declares it.
#[derive(Debug, Clone, Copy)]
enum Hosted {
    Filter { listener: usize, filter: usize },
    Service(usize),
}

impl Hosted {
    fn plugin(self, bootstrap: &Bootstrap) -> &WasmPlugin {
        match self {
            Hosted::Filter { listener, filter } => &bootstrap.listeners[listener].plugins()[filter],
            Hosted::Service(index) => &bootstrap.services[index].plugin,
        }
    }
}

/// Where [`place_plugins`] starts plugins: Envoy's configuration canary (thrown away once
/// every plugin has configured), the main thread, or a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Thread {
    Canary,
    Main,
    Worker(usize),
}

impl Thread {
    /// The worker index VMs on this thread report (`None`: the canary or the main thread).
    fn worker(self) -> Option<usize> {
        match self {
            Thread::Worker(w) => Some(w),
            Thread::Canary | Thread::Main => None,
        }
    }
}

/// One thread's VMs (Envoy runs a dispatcher per thread, the main thread's included) and the
/// plugins placed on them.
#[derive(Default)]
pub(crate) struct Dispatcher {
    pub(super) vms: Vec<Vm>,
    /// Per listener, per Wasm filter in chain order. `None`: the plugin failed to start on
    /// this thread and the failure policy applies.
    pub(super) slots: Vec<Vec<Option<PluginSlot>>>,
    /// Per VM: its key, to share it between plugins; on the canary also the one plugin it
    /// checks.
    keys: Vec<(VmKey, Option<PluginKey>)>,
    /// Per VM: when it was created or last re-created (virtual monotonic ns), for the
    /// `FAIL_RELOAD` backoff.
    created_at: Vec<u64>,
    /// Per VM: the plugins placed on it, started or not, in the order they were started.
    hosts: Vec<Vec<Hosted>>,
    /// Per VM and plugin key: the root context the plugin got, if it started.
    roots: HashMap<(usize, PluginKey), Option<u32>>,
}

/// The main thread, the workers, and what every delivery of posted work borrows: the shared
/// host state, the callout answers and the record of delivery problems. An HTTP stream or a
/// TCP connection runs on one worker but holds all of this, because what a callback posts
/// (a queue notification, a callout) may be for any thread.
pub(crate) struct Threads {
    pub(super) shared: Arc<Shared>,
    /// The main thread: its instance of every plugin (serving no traffic) and the Wasm
    /// services, singletons included.
    pub(super) main: Dispatcher,
    pub(super) workers: Vec<Dispatcher>,
    pub(super) callouts: Callouts,
    /// Delivery problems not yet handed to the caller (see `Proxy::take_errors`).
    pub(super) errors: Vec<DeliveryError>,
}

impl Threads {
    pub(super) fn new(shared: Arc<Shared>, callouts: Callouts) -> Self {
        Self {
            shared,
            main: Dispatcher::default(),
            workers: Vec::new(),
            callouts,
            errors: Vec::new(),
        }
    }

    /// Delivers what the last callback posted (queue notifications, callout completions), as
    /// Envoy's dispatchers run posted work once the current callback has returned.
    pub(super) fn deliver_posted(&mut self) {
        events::deliver_all(self);
    }

    /// The dispatcher of worker `worker`, or the main thread's for `None`.
    pub(super) fn dispatcher(&mut self, worker: Option<usize>) -> Option<&mut Dispatcher> {
        match worker {
            Some(w) => self.workers.get_mut(w),
            None => Some(&mut self.main),
        }
    }

    /// Every thread with the worker index its VMs report: the workers first, then the main
    /// thread (`None`).
    pub(super) fn all(&self) -> impl Iterator<Item = (Option<usize>, &Dispatcher)> {
        self.workers
            .iter()
            .enumerate()
            .map(|(w, d)| (Some(w), d))
            .chain(std::iter::once((None, &self.main)))
    }
}

/// Loaded modules by code path and the precompiled section honoured, if any (a plugin with
/// `allow_precompiled` and one without load the same file differently).
type Modules = HashMap<(PathBuf, Option<String>), Arc<LoadedModule>>;

fn module_key(p: &WasmPlugin) -> (PathBuf, Option<String>) {
    (
        p.code.clone(),
        precompiled::section_for(&p.runtime, p.allow_precompiled),
    )
}

/// What starting a VM takes: the engine, every module the bootstrap names (loaded once, kept
/// to re-create VMs under `FAIL_RELOAD`), and the cluster names plugins may call.
pub(super) struct VmFactory {
    runtime: Runtime,
    modules: Modules,
    clusters: Arc<Vec<String>>,
}

impl VmFactory {
    /// Loads every module the bootstrap's filters and services use.
    pub(super) fn new(runtime: Runtime, bootstrap: &Bootstrap) -> Result<Self, StartError> {
        let clusters = Arc::new(bootstrap.clusters.iter().map(|c| c.name.clone()).collect());
        let mut factory = Self {
            runtime,
            modules: Modules::new(),
            clusters,
        };
        factory.load_modules(bootstrap)?;
        Ok(factory)
    }

    /// Loads the modules of `bootstrap` not loaded yet (a swapped ECDS file may name others).
    pub(super) fn load_modules(&mut self, bootstrap: &Bootstrap) -> Result<(), VmError> {
        let plugins = bootstrap
            .listeners
            .iter()
            .flat_map(|l| l.plugins())
            .chain(bootstrap.services.iter().map(|s| &s.plugin));
        for p in plugins {
            if let std::collections::hash_map::Entry::Vacant(slot) =
                self.modules.entry(module_key(p))
            {
                let module = self.runtime.load(&p.code, slot.key().1.as_deref())?;
                slot.insert(module);
            }
        }
        Ok(())
    }

    pub(super) fn modules(&self) -> impl Iterator<Item = &LoadedModule> {
        self.modules.values().map(|m| &**m)
    }

    fn start(
        &self,
        shared: &Arc<Shared>,
        worker: Option<usize>,
        p: &WasmPlugin,
    ) -> Result<Vm, VmError> {
        Vm::start(
            &self.runtime,
            &self.modules[&module_key(p)],
            shared.clone(),
            worker,
            p,
            self.clusters.clone(),
        )
    }
}

impl Dispatcher {
    /// The VM for `p`'s key on this thread, started now if the thread has none yet. The
    /// canary has a fresh VM for each distinct plugin, as Envoy checks each plugin in a clone
    /// of its VM of its own (identically configured plugins are checked once).
    fn find_or_start_vm(
        &mut self,
        factory: &VmFactory,
        shared: &Arc<Shared>,
        thread: Thread,
        p: &WasmPlugin,
    ) -> Result<usize, VmError> {
        let key = (
            VmKey::of(p),
            (thread == Thread::Canary).then(|| PluginKey::of(p)),
        );
        if let Some(v) = self.keys.iter().position(|k| *k == key) {
            return Ok(v);
        }
        self.vms.push(factory.start(shared, thread.worker(), p)?);
        self.keys.push(key);
        self.hosts.push(Vec::new());
        self.created_at.push(shared.monotonic_nanos());
        Ok(self.vms.len() - 1)
    }

    /// The root context of `p` in VM `vm`: the one an identically configured plugin already
    /// has there, else a new one. `Err` only the first time, when starting it fails.
    fn find_or_start_plugin(
        &mut self,
        vm: usize,
        p: &WasmPlugin,
    ) -> Result<Option<u32>, crate::engine::vm::PluginStartError> {
        let key = (vm, PluginKey::of(p));
        if let Some(root) = self.roots.get(&key) {
            return Ok(*root);
        }
        let started = self.vms[vm].start_plugin(Arc::new(p.clone()));
        self.roots.insert(key, started.as_ref().ok().copied());
        started.map(Some)
    }
}

/// Starts every plugin of the bootstrap that runs on `thread`, each in the VM of its key. On
/// the canary a plugin that fails to start rejects the configuration; elsewhere its slot is
/// empty and its failure policy applies to traffic.
pub(super) fn place_plugins(
    factory: &VmFactory,
    bootstrap: &Bootstrap,
    shared: &Arc<Shared>,
    thread: Thread,
) -> Result<Dispatcher, StartError> {
    let canary = thread == Thread::Canary;
    let mut dispatcher = Dispatcher::default();
    for (listener, l) in bootstrap.listeners.iter().enumerate() {
        let mut slots = Vec::new();
        for (filter, p) in l.plugins().iter().enumerate() {
            let vm = refused_if_uninitialized(
                dispatcher.find_or_start_vm(factory, shared, thread, p),
                p,
            )?;
            dispatcher.hosts[vm].push(Hosted::Filter { listener, filter });
            match dispatcher.find_or_start_plugin(vm, p) {
                Ok(root) => slots.push(root.map(|root| PluginSlot { vm, root })),
                Err(e) if canary => return Err(e.into()),
                Err(_) => slots.push(None),
            }
        }
        dispatcher.slots.push(slots);
    }
    // Wasm services: on the canary all of them (a refusal rejects the bootstrap), on the main
    // thread all of them too (a singleton lives there; the others' thread-local slot includes
    // it), on each worker those that are not singletons.
    for (index, service) in bootstrap.services.iter().enumerate() {
        if service.singleton && matches!(thread, Thread::Worker(_)) {
            continue;
        }
        let p = &service.plugin;
        let vm =
            refused_if_uninitialized(dispatcher.find_or_start_vm(factory, shared, thread, p), p)?;
        dispatcher.hosts[vm].push(Hosted::Service(index));
        match dispatcher.find_or_start_plugin(vm, p) {
            Err(e) if canary => return Err(e.into()),
            _ => {}
        }
    }
    Ok(dispatcher)
}

/// A module whose start function trapped is a plugin that failed to load, as Envoy reports
/// it (the refusal's lines follow the trap's); other VM errors stay what they are.
fn refused_if_uninitialized(
    started: Result<usize, VmError>,
    p: &WasmPlugin,
) -> Result<usize, StartError> {
    started.map_err(|e| match e {
        VmError::Start { message, .. } => StartError::from(PluginStartError::Uninitialized {
            plugin: p.name.clone(),
            message,
        }),
        other => other.into(),
    })
}

/// Whether two plugins start the same VM and root context (Envoy's VM and plugin keys), and
/// load the same code: an ECDS update that leaves them so changes nothing there.
pub(super) fn same_plugin(a: &WasmPlugin, b: &WasmPlugin) -> bool {
    VmKey::of(a) == VmKey::of(b)
        && PluginKey::of(a) == PluginKey::of(b)
        && a.allow_precompiled == b.allow_precompiled
}

/// An ECDS update on `thread`: the filters at `changed` (listener, filter) of `bootstrap`
/// (the updated one) placed in `d` as Envoy's filter-config provider places a new filter
/// configuration: in the thread's VM of its key (started if the thread has none), with the
/// root context an identical plugin has there, else a new one (`on_context_create`,
/// `on_vm_start`, `on_configure`). Then the roots no filter or service uses any more end
/// (`on_done`, `on_delete`), as Envoy releases the replaced configuration (checked against
/// Envoy 1.40). On the canary (a fresh `d`) a refusal rejects the update.
pub(super) fn place_changed(
    factory: &VmFactory,
    bootstrap: &Bootstrap,
    shared: &Arc<Shared>,
    thread: Thread,
    d: &mut Dispatcher,
    changed: &[(usize, usize)],
) -> Result<(), StartError> {
    let replaced: Vec<PluginSlot> = changed
        .iter()
        .filter_map(|&(l, f)| d.slots.get(l).and_then(|s| s.get(f)).copied().flatten())
        .collect();
    for &(listener, filter) in changed {
        let p = &bootstrap.listeners[listener].plugins()[filter];
        let vm = d.find_or_start_vm(factory, shared, thread, p)?;
        for hosted in &mut d.hosts {
            hosted.retain(|h| {
                !matches!(h, Hosted::Filter { listener: l, filter: f } if (*l, *f) == (listener, filter))
            });
        }
        d.hosts[vm].push(Hosted::Filter { listener, filter });
        let root = match d.find_or_start_plugin(vm, p) {
            Ok(root) => root,
            Err(e) if thread == Thread::Canary => return Err(e.into()),
            Err(_) => None,
        };
        if let Some(slot) = d.slots.get_mut(listener).and_then(|s| s.get_mut(filter)) {
            *slot = root.map(|root| PluginSlot { vm, root });
        }
    }
    for old in replaced {
        let in_use = d
            .slots
            .iter()
            .flatten()
            .flatten()
            .any(|s| (s.vm, s.root) == (old.vm, old.root))
            || d.hosts[old.vm].iter().any(|h| match h {
                Hosted::Service(i) => {
                    let key = (old.vm, PluginKey::of(&bootstrap.services[*i].plugin));
                    d.roots.get(&key) == Some(&Some(old.root))
                }
                Hosted::Filter { .. } => false,
            });
        if !in_use {
            d.roots
                .retain(|(vm, _), root| !(*vm == old.vm && *root == Some(old.root)));
            d.vms[old.vm].finish_root(old.root);
        }
    }
    Ok(())
}

/// `FAIL_RELOAD`: a worker VM that trapped is created again (fresh memory, `_initialize`,
/// every hosted plugin's `on_context_create` / `on_vm_start` / `on_configure`, context ids
/// from 1; shared data survives) when a new stream arrives at least [`RELOAD_BACKOFF`] after
/// its last creation, if one of the filters it hosts has that policy. Until then, and if the
/// reload fails, streams get FAIL_CLOSED's 503.
pub(super) fn reload_failed_vms(
    threads: &mut Threads,
    w: usize,
    factory: &VmFactory,
    bootstrap: &Bootstrap,
) {
    let now = threads.shared.monotonic_nanos();
    let shared = &threads.shared;
    let worker = &mut threads.workers[w];
    for v in 0..worker.vms.len() {
        if worker.vms[v].failed.is_none()
            || now.saturating_sub(worker.created_at[v]) < RELOAD_BACKOFF.as_nanos() as u64
        {
            continue;
        }
        let hosted = worker.hosts[v].clone();
        let reloads = hosted.iter().any(|h| {
            matches!(h, Hosted::Filter { .. })
                && h.plugin(bootstrap).failure_policy == FailurePolicy::FailReload
        });
        let Some(first) = hosted.first().filter(|_| reloads) else {
            continue;
        };
        worker.created_at[v] = now;
        let Ok(mut vm) = factory.start(shared, Some(w), first.plugin(bootstrap)) else {
            continue;
        };
        let mut started: HashMap<PluginKey, Option<u32>> = HashMap::new();
        let roots: Vec<Option<u32>> = hosted
            .iter()
            .map(|h| {
                let p = h.plugin(bootstrap);
                *started
                    .entry(PluginKey::of(p))
                    .or_insert_with(|| vm.start_plugin(Arc::new(p.clone())).ok())
            })
            .collect();
        worker.roots.retain(|(at, _), _| *at != v);
        worker
            .roots
            .extend(started.into_iter().map(|(key, root)| ((v, key), root)));
        worker.vms[v] = vm;
        for (hosted, root) in hosted.into_iter().zip(roots) {
            if let Hosted::Filter { listener, filter } = hosted {
                worker.slots[listener][filter] = root.map(|root| PluginSlot { vm: v, root });
            }
        }
    }
}
