//! The emulated Envoy: listeners from the bootstrap, worker threads each with their own VM per
//! distinct (vm_id, vm configuration, code), and an HTTP stream's path through the filter
//! chain, the router and back, with Envoy's order of callbacks. Ticks and queue notifications
//! (what Envoy's dispatchers run between requests) are in [`events`].

mod call_records;
mod callouts;
mod capacity;
mod events;
mod tcp;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bootstrap::{
    Bootstrap, BootstrapError, FailurePolicy, Listener, RouteAction, WasmPlugin,
};
use crate::host::{self, HeaderMap, LocalReply, LogRecord, Shared};
use crate::http::{Exchange, LocalReplySource, Request, Response, SeenRequest, UpstreamReply};
use crate::precompiled;
use crate::traffic::TrafficError;
use crate::vm::{CodeSource, LoadedModule, PluginStartError, Runtime, Vm, VmError};

pub use call_records::{CallRecords, MAX_CALL_RECORD_BYTES};
pub use callouts::{
    Callouts, DEFAULT_CALLOUT_BUDGET, MAX_CALLOUT_BODY_BYTES, MAX_CONCURRENT_CALLOUTS,
    NO_TIMEOUT_LIMIT,
};
pub use capacity::MAX_WORKERS;
pub use events::{
    format_duration, DeliveryError, MAX_CALL_DELIVERIES, MAX_QUEUE_DELIVERIES,
    MAX_TICKS_PER_ADVANCE,
};
pub use tcp::{TcpEvent, TcpOutcome};

/// Why the emulated proxy could not start: Envoy would refuse this configuration.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Vm(#[from] VmError),
    /// `log`: what the plugins logged while starting, usually the reason.
    #[error("configuration rejected by the canary VM: {error}{}", logged(log))]
    Rejected {
        error: PluginStartError,
        log: Vec<String>,
    },
    #[error("cannot create the Wasm runtime: {0}")]
    Runtime(String),
    #[error("workers: 0: the harness needs at least one worker (Envoy's --concurrency: set `workers:` in the scenario, or --workers)")]
    NoWorkers,
    #[error("workers: {workers} is more than the harness runs (at most {limit}, each worker has its own instance of every VM): lower `workers:` in the scenario, or --workers")]
    TooManyWorkers { workers: usize, limit: usize },
}

impl From<PluginStartError> for StartError {
    fn from(error: PluginStartError) -> Self {
        Self::Rejected {
            error,
            log: Vec::new(),
        }
    }
}

fn logged(log: &[String]) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("; the plugin logged:\n  {}", log.join("\n  "))
    }
}

#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Envoy's `--concurrency`: each worker has its own VM instances.
    pub workers: usize,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self { workers: 2 }
    }
}

/// Envoy shares one VM (per worker) between plugins with the same vm_id, VM configuration and
/// code; the runtime is not part of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct VmKey {
    vm_id: String,
    vm_configuration: Vec<u8>,
    code: PathBuf,
}

impl VmKey {
    fn of(p: &WasmPlugin) -> Self {
        Self {
            vm_id: p.vm_id.clone(),
            vm_configuration: p.vm_configuration.clone(),
            code: p.code.clone(),
        }
    }
}

/// A plugin as placed on one worker: which VM, which root context.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PluginSlot {
    vm: usize,
    root: u32,
}

/// A root context still waiting to call `proxy_done` after [`Proxy::shutdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRoot {
    /// `None`: the main thread.
    pub worker: Option<usize>,
    pub root: u32,
}

/// Where `Proxy::place_plugins` starts plugins: Envoy's configuration canary (thrown away
/// once every plugin has configured), the main thread, or a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thread {
    Canary,
    Main,
    Worker(usize),
}

#[derive(Default)]
pub(crate) struct Worker {
    vms: Vec<Vm>,
    /// Per listener, per Wasm filter in chain order. `None`: the plugin failed to start on
    /// this worker and the failure policy applies.
    slots: Vec<Vec<Option<PluginSlot>>>,
    /// Per VM: when it was created or last re-created (virtual monotonic ns), for the
    /// `FAIL_RELOAD` backoff.
    created_at: Vec<u64>,
    /// Per VM: the (listener, filter) positions of the plugins placed on it, started or not.
    hosts: Vec<Vec<(usize, usize)>>,
}

/// `FAIL_RELOAD`'s backoff (`reload_config.backoff.base_interval`, Envoy's default). The
/// harness does not jitter it, so runs repeat.
pub const RELOAD_BACKOFF: std::time::Duration = std::time::Duration::from_millis(1000);

/// Loaded modules by code path and the precompiled section honoured, if any (a plugin with
/// `allow_precompiled` and one without load the same file differently).
type Modules = HashMap<(PathBuf, Option<String>), Arc<LoadedModule>>;

fn module_key(p: &WasmPlugin) -> (PathBuf, Option<String>) {
    (
        p.code.clone(),
        precompiled::section_for(&p.runtime, p.allow_precompiled),
    )
}

fn module_of<'a>(modules: &'a Modules, p: &WasmPlugin) -> &'a Arc<LoadedModule> {
    &modules[&module_key(p)]
}

pub struct Proxy {
    pub bootstrap: Bootstrap,
    runtime: Runtime,
    shared: Arc<Shared>,
    workers: Vec<Worker>,
    /// The main thread: its instance of every plugin (serving no traffic) and the Wasm
    /// services, singletons included.
    main: Worker,
    /// Loaded modules, to re-create VMs (`FAIL_RELOAD`).
    modules: Modules,
    requests_sent: usize,
    /// Connections accepted so far, HTTP and TCP (Envoy's connection ids).
    connections: u64,
    /// Per listener: its address and port, for the `destination.*` properties.
    destinations: Vec<Arc<(String, u16)>>,
    /// Delivery problems not yet handed to the caller (see [`Proxy::take_errors`]).
    errors: Vec<DeliveryError>,
    /// Canned callout replies and the record of calls made.
    pub callouts: Callouts,
    /// Set by [`Proxy::shutdown`]: no more traffic.
    shut_down: bool,
}

impl Proxy {
    pub fn from_bootstrap(path: &Path, options: &ProxyOptions) -> Result<Self, StartError> {
        let bootstrap = Bootstrap::load(path)?;
        Self::new(bootstrap, options)
    }

    pub fn new(bootstrap: Bootstrap, options: &ProxyOptions) -> Result<Self, StartError> {
        capacity::check_workers(options.workers)?;
        let runtime =
            Runtime::with_capacity(capacity::instances_needed(&bootstrap, options.workers))
                .map_err(|e| StartError::Runtime(format!("{e:#}")))?;
        let shared = Arc::new(Shared::default());
        let _ = shared.node.set(bootstrap.node.clone());
        let mut modules = Modules::new();
        let plugins = bootstrap
            .listeners
            .iter()
            .flat_map(|l| l.plugins())
            .chain(bootstrap.services.iter().map(|s| &s.plugin));
        for p in plugins {
            if let std::collections::hash_map::Entry::Vacant(slot) = modules.entry(module_key(p)) {
                let module = runtime.load(&p.code, slot.key().1.as_deref())?;
                slot.insert(module);
            }
        }
        let mut proxy = Self {
            bootstrap,
            runtime,
            shared,
            workers: Vec::new(),
            main: Worker::default(),
            modules: HashMap::new(),
            requests_sent: 0,
            connections: 0,
            destinations: Vec::new(),
            errors: Vec::new(),
            callouts: Callouts::default(),
            shut_down: false,
        };
        proxy.callouts = Callouts::new(&proxy.bootstrap);
        proxy.destinations = proxy
            .bootstrap
            .listeners
            .iter()
            .map(|l| Arc::new((l.address.clone(), l.port)))
            .collect();
        // Envoy first starts every plugin on a throw-away canary; a refusal there rejects the
        // whole configuration before any worker sees it.
        proxy
            .place_plugins(&modules, Thread::Canary)
            .map_err(|e| match e {
                StartError::Rejected { error, .. } => StartError::Rejected {
                    error,
                    log: proxy.logs().iter().map(ToString::to_string).collect(),
                },
                other => other,
            })?;
        // Envoy's thread-local slots are set on the main thread first, then on each worker:
        // the main thread gets its own instance of every plugin too. It serves no traffic,
        // but its roots configure, tick, and take part in queues like the workers'.
        proxy.main = proxy.place_plugins(&modules, Thread::Main)?;
        for w in 0..options.workers {
            let worker = proxy.place_plugins(&modules, Thread::Worker(w))?;
            proxy.workers.push(worker);
        }
        proxy.modules = modules;
        // What the plugins enqueued while starting reaches the registrants now.
        proxy.deliver_posted();
        Ok(proxy)
    }

    fn place_plugins(&self, modules: &Modules, thread: Thread) -> Result<Worker, StartError> {
        let canary = thread == Thread::Canary;
        let worker = match thread {
            Thread::Worker(w) => Some(w),
            Thread::Canary | Thread::Main => None,
        };
        let mut vms: Vec<Vm> = Vec::new();
        let mut keys: Vec<VmKey> = Vec::new();
        let mut slots = Vec::new();
        let mut hosts: Vec<Vec<(usize, usize)>> = Vec::new();
        for (li, l) in self.bootstrap.listeners.iter().enumerate() {
            let mut listener_slots = Vec::new();
            for (fi, p) in l.plugins().iter().enumerate() {
                let key = VmKey::of(p);
                let vm = match keys.iter().position(|k| *k == key) {
                    Some(i) => i,
                    None => {
                        let vm = Vm::start(
                            &self.runtime,
                            module_of(modules, p),
                            self.shared.clone(),
                            worker,
                            p,
                            self.cluster_names(),
                        )?;
                        vms.push(vm);
                        keys.push(key);
                        hosts.push(Vec::new());
                        vms.len() - 1
                    }
                };
                hosts[vm].push((li, fi));
                match vms[vm].start_plugin(Arc::new(p.clone())) {
                    Ok(root) => listener_slots.push(Some(PluginSlot { vm, root })),
                    Err(e) if canary => return Err(e.into()),
                    Err(_) => listener_slots.push(None),
                }
            }
            slots.push(listener_slots);
        }
        // Wasm services: on the canary all of them (a refusal rejects the bootstrap), on the
        // main thread all of them too (a singleton lives there; the others' thread-local slot
        // includes it), on each worker those that are not singletons; VMs are shared by key
        // like filters'.
        for service in &self.bootstrap.services {
            if service.singleton && matches!(thread, Thread::Worker(_)) {
                continue;
            }
            let p = &service.plugin;
            let key = VmKey::of(p);
            let vm = match keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    vms.push(Vm::start(
                        &self.runtime,
                        module_of(modules, p),
                        self.shared.clone(),
                        worker,
                        p,
                        self.cluster_names(),
                    )?);
                    keys.push(key);
                    hosts.push(Vec::new());
                    vms.len() - 1
                }
            };
            match vms[vm].start_plugin(Arc::new(p.clone())) {
                Err(e) if canary => return Err(e.into()),
                _ => {}
            }
        }
        let created_at = vec![self.shared.monotonic_nanos(); vms.len()];
        Ok(Worker {
            vms,
            slots,
            created_at,
            hosts,
        })
    }

    fn cluster_names(&self) -> Arc<Vec<String>> {
        Arc::new(
            self.bootstrap
                .clusters
                .iter()
                .map(|c| c.name.clone())
                .collect(),
        )
    }

    /// `FAIL_RELOAD`: a worker VM that trapped is created again (fresh memory, `_initialize`,
    /// every plugin's `on_context_create` / `on_vm_start` / `on_configure`, context ids from 1;
    /// shared data survives) when a new stream arrives at least [`RELOAD_BACKOFF`] after its
    /// last creation. Until then, and if the reload fails, streams get FAIL_CLOSED's 503.
    fn reload_failed_vms(&mut self, w: usize) {
        let now = self.shared.monotonic_nanos();
        for v in 0..self.workers[w].vms.len() {
            let worker = &self.workers[w];
            if worker.vms[v].failed.is_none()
                || now.saturating_sub(worker.created_at[v]) < RELOAD_BACKOFF.as_nanos() as u64
            {
                continue;
            }
            let hosted = worker.hosts[v].clone();
            let reloads = hosted.iter().any(|&(li, fi)| {
                self.bootstrap.listeners[li].plugins()[fi].failure_policy
                    == FailurePolicy::FailReload
            });
            let Some(&(li0, fi0)) = hosted.first().filter(|_| reloads) else {
                continue;
            };
            let first = &self.bootstrap.listeners[li0].plugins()[fi0];
            let clusters = self.cluster_names();
            self.workers[w].created_at[v] = now;
            let Ok(mut vm) = Vm::start(
                &self.runtime,
                module_of(&self.modules, first),
                self.shared.clone(),
                Some(w),
                first,
                clusters,
            ) else {
                continue;
            };
            let mut roots = Vec::new();
            for &(li, fi) in &hosted {
                let plugin = Arc::new(self.bootstrap.listeners[li].plugins()[fi].clone());
                roots.push(vm.start_plugin(plugin).ok());
            }
            let worker = &mut self.workers[w];
            worker.vms[v] = vm;
            for (&(li, fi), root) in hosted.iter().zip(roots) {
                worker.slots[li][fi] = root.map(|root| PluginSlot { vm: v, root });
            }
        }
    }

    /// A counter's or gauge's value in the proxy-wide stats (`wasmcustom.<name>`, or the name
    /// without the prefix), summed over every worker as Envoy's stats store does.
    pub fn metric(&self, name: &str) -> Option<u64> {
        let full = if name.starts_with("wasmcustom.") {
            name.to_string()
        } else {
            format!("wasmcustom.{name}")
        };
        let stats = self.shared.stats.lock().unwrap_or_else(|e| e.into_inner());
        [
            host::metrics::MetricType::Counter,
            host::metrics::MetricType::Gauge,
        ]
        .into_iter()
        .find_map(|ty| stats.get(&(ty, full.clone())).map(|s| s.value))
    }

    /// A shared-data value (per `vm_id`, as Envoy keeps them).
    pub fn shared_data(&self, vm_id: &str, key: &str) -> Option<Vec<u8>> {
        let data = self.shared.data.lock().unwrap_or_else(|e| e.into_inner());
        data.get(vm_id, key).map(|(v, _)| v)
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Each module loaded, with where its machine code came from (for instance, to check that
    /// `allow_precompiled` really uses the module's precompiled code).
    pub fn modules(&self) -> Vec<(&Path, CodeSource)> {
        let mut out: Vec<_> = self
            .modules
            .values()
            .map(|m| (m.path.as_path(), m.code))
            .collect();
        out.sort_by_key(|(p, _)| *p);
        out
    }

    /// Every log line so far, in order, from all VMs (the canary's first).
    pub fn logs(&self) -> Vec<LogRecord> {
        self.logs_since(0)
    }

    /// The log lines after the first `from` (see [`Proxy::log_len`]).
    pub fn logs_since(&self, from: usize) -> Vec<LogRecord> {
        let log = self.shared.log.lock().unwrap_or_else(|e| e.into_inner());
        log.records().get(from..).unwrap_or_default().to_vec()
    }

    /// What the run's log cap left out so far (see [`host::log_book`]).
    pub fn log_dropped(&self) -> host::log_book::Dropped {
        self.shared
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dropped()
    }

    pub fn log_len(&self) -> usize {
        self.shared
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The listener's index by name (`None`: the first).
    fn listener_index(&self, listener: Option<&str>) -> Result<usize, TrafficError> {
        match listener {
            None => Ok(0),
            Some(name) => self
                .bootstrap
                .listeners
                .iter()
                .position(|l| l.name == name)
                .ok_or_else(|| TrafficError::NoListener { name: name.into() }),
        }
    }

    /// The worker asked for, else the next in round-robin order (requests and connections
    /// share the turn).
    fn pick_worker(&self, worker: Option<usize>) -> Result<usize, TrafficError> {
        if self.shut_down {
            return Err(TrafficError::ShutDown);
        }
        let w = worker.unwrap_or(self.requests_sent % self.workers.len());
        if w >= self.workers.len() {
            return Err(TrafficError::NoWorker {
                worker: w,
                workers: self.workers.len(),
            });
        }
        Ok(w)
    }

    /// A new downstream connection to listener `li`, from 127.0.0.1 and a port of its own.
    fn new_connection(&mut self, li: usize) -> host::Connection {
        self.connections += 1;
        host::Connection {
            id: self.connections,
            source_port: 40000 + (self.connections % 20000) as u16,
            destination: self.destinations[li].clone(),
        }
    }

    /// Envoy's shutdown (the server exits, or the plugins are removed): every root context
    /// on each worker, then on the main thread, gets `proxy_on_done`, then `proxy_on_delete`
    /// at once if that returned true (or is not exported). A root that returned false stays
    /// (ticks, queues and callouts still reach it, see [`Proxy::advance`]) until it calls
    /// `proxy_done`. After this the proxy takes no traffic. Returns the roots still pending.
    pub fn shutdown(&mut self) -> Vec<PendingRoot> {
        self.shut_down = true;
        for worker in &mut self.workers {
            for vm in &mut worker.vms {
                vm.shutdown();
            }
        }
        for vm in &mut self.main.vms {
            vm.shutdown();
        }
        self.deliver_posted();
        self.pending_done()
    }

    /// Roots whose `proxy_on_done` returned false and that have not called `proxy_done` yet.
    pub fn pending_done(&self) -> Vec<PendingRoot> {
        let threads = self
            .workers
            .iter()
            .enumerate()
            .map(|(w, worker)| (Some(w), worker))
            .chain(std::iter::once((None, &self.main)));
        threads
            .flat_map(|(worker, t)| {
                t.vms.iter().flat_map(move |vm| {
                    vm.pending_done()
                        .iter()
                        .map(move |&root| PendingRoot { worker, root })
                })
            })
            .collect()
    }

    /// Sends `request` to the first listener, on the next worker in turn, and lets the
    /// upstream answer `reply`: the short form of [`Proxy::send`].
    pub fn round_trip(
        &mut self,
        request: &Request,
        reply: UpstreamReply,
    ) -> Result<Exchange, TrafficError> {
        self.send(None, None, request, &mut |_| reply.clone())
    }

    /// Sends one request to a listener. Without `worker`, requests go round-robin.
    pub fn send(
        &mut self,
        listener: Option<&str>,
        worker: Option<usize>,
        request: &Request,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
    ) -> Result<Exchange, TrafficError> {
        let li = self.listener_index(listener)?;
        if self.bootstrap.listeners[li].tcp_proxy.is_some() {
            return Err(TrafficError::TcpListener {
                name: self.bootstrap.listeners[li].name.clone(),
            });
        }
        let w = self.pick_worker(worker)?;
        self.requests_sent += 1;
        let connection = self.new_connection(li);
        self.reload_failed_vms(w);
        let mut stream = HttpStream {
            workers: &mut self.workers,
            main: &mut self.main,
            w,
            shared: &self.shared,
            errors: &mut self.errors,
            callouts: &mut self.callouts,
            listener: &self.bootstrap.listeners[li],
            listener_index: li,
            connection,
            contexts: Vec::new(),
            request: None,
        };
        let mut exchange = stream.run(request, self.requests_sent, &self.bootstrap, upstream);
        exchange.worker = w;
        Ok(exchange)
    }
}

/// One HTTP stream on worker `w`. It holds every worker because what a callback enqueues is
/// delivered, once the callback returns, to whichever worker registered the queue.
struct HttpStream<'a> {
    workers: &'a mut [Worker],
    main: &'a mut Worker,
    w: usize,
    shared: &'a Shared,
    errors: &'a mut Vec<DeliveryError>,
    callouts: &'a mut Callouts,
    listener: &'a Listener,
    listener_index: usize,
    connection: host::Connection,
    /// Per Wasm filter: the stream context created for it, if the filter is active.
    contexts: Vec<Option<(usize, u32)>>,
    /// The request's headers while the contexts share them (see `share_request`).
    request: Option<Arc<HeaderMap>>,
}

/// How a callback's result (after the failure policy) tells the chain to go on.
enum Step {
    Continue,
    /// The filter paused (headers: a stall unless resumed; body: keep buffering), and why
    /// that would stall the stream.
    Paused(String),
    Stop(StopReason),
}

/// Which way data flows through the filter chain.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Request,
    Response,
}

/// The part of a message a callback is about.
#[derive(Clone, Copy)]
enum Part {
    Headers,
    Body,
    Trailers,
}

impl Dir {
    /// The callback's name, for messages.
    fn phase(self, part: Part) -> &'static str {
        match (self, part) {
            (Dir::Request, Part::Headers) => "on_http_request_headers",
            (Dir::Request, Part::Body) => "on_http_request_body",
            (Dir::Request, Part::Trailers) => "on_http_request_trailers",
            (Dir::Response, Part::Headers) => "on_http_response_headers",
            (Dir::Response, Part::Body) => "on_http_response_body",
            (Dir::Response, Part::Trailers) => "on_http_response_trailers",
        }
    }
}

/// The filters a direction visits: the request goes first to last, the response from
/// filter `from` back to the first. Positions index this order; `at` says which filter.
#[derive(Clone, Copy)]
enum Order {
    Forward(usize),
    Backward(usize),
}

impl Order {
    fn len(self) -> usize {
        match self {
            Order::Forward(n) => n,
            Order::Backward(from) => from,
        }
    }

    fn at(self, pos: usize) -> usize {
        match self {
            Order::Forward(_) => pos,
            Order::Backward(from) => from - 1 - pos,
        }
    }
}

/// Where a direction of the stream stopped: at filter `.0`, for this reason.
type Stopped = (usize, StopReason);

enum StopReason {
    LocalReply(LocalReplySource, Box<LocalReply>),
    /// A plugin closed the stream (`proxy_close_stream`): Envoy resets it, no response.
    Reset(String),
    Stalled(String),
}

impl<'a> HttpStream<'a> {
    fn plugin(&self, i: usize) -> &'a WasmPlugin {
        &self.listener.http.filters[i]
    }

    fn fail_stream(&self, i: usize) -> Step {
        let plugin = self.plugin(i);
        match plugin.failure_policy {
            FailurePolicy::FailOpen => Step::Continue,
            _ => Step::Stop(StopReason::LocalReply(
                LocalReplySource::FailurePolicy {
                    plugin: plugin.name.clone(),
                },
                Box::new(LocalReply {
                    status: 503,
                    details: "wasm_fail_stream".into(),
                    body: Vec::new(),
                    headers: Vec::new(),
                    grpc_status: Some(14),
                }),
            )),
        }
    }

    fn worker(&mut self) -> &mut Worker {
        &mut self.workers[self.w]
    }

    /// Delivers what the last callback posted (queue notifications, callout completions), as
    /// Envoy's dispatchers run posted work once the current callback has returned.
    fn deliver_posted(&mut self) {
        events::deliver_all(
            self.shared,
            self.workers,
            self.main,
            self.callouts,
            self.errors,
        );
    }

    /// Creates the stream contexts lazily, as Envoy does at the first decode callback.
    fn setup(&mut self) {
        let n = self.workers[self.w].slots[self.listener_index].len();
        self.contexts = vec![None; n];
        for i in 0..n {
            if let Some(slot) = self.workers[self.w].slots[self.listener_index][i] {
                if self.worker().vms[slot.vm].failed.is_none() {
                    let conn = self.connection.clone();
                    let ctx = self.worker().vms[slot.vm].create_http_context(slot.root, conn);
                    self.contexts[i] = Some((slot.vm, ctx));
                    self.deliver_posted();
                }
            }
        }
    }

    /// Runs one callback on filter `i`, then what it posted (a callout's completion may
    /// resume the stream or answer it locally), and turns the outcome into a step, applying
    /// local replies, the failure policy and pauses as Envoy does.
    fn callback(
        &mut self,
        i: usize,
        phase: &str,
        call: &mut dyn FnMut(&mut Vm, u32) -> Option<i32>,
    ) -> Step {
        let Some((vm, ctx)) = self.contexts[i] else {
            return self.fail_stream(i);
        };
        let name = &self.plugin(i).name;
        if self.worker().vms[vm].failed.is_some() {
            return self.fail_stream(i);
        }
        let result = call(&mut self.worker().vms[vm], ctx);
        self.deliver_posted();
        if self.worker().vms[vm].failed.is_some() {
            return self.fail_stream(i);
        }
        let vm = &mut self.worker().vms[vm];
        let s = vm
            .http_state(ctx)
            .expect("stream context exists while the stream runs");
        if std::mem::take(&mut s.reset) {
            return Step::Stop(StopReason::Reset(format!(
                "plugin {name:?} closed the stream in {phase} (proxy_close_stream): Envoy resets it and the client gets no response"
            )));
        }
        if let Some(reply) = s.local_reply.take() {
            s.stop_forced = false;
            return Step::Stop(StopReason::LocalReply(
                LocalReplySource::Plugin {
                    plugin: name.clone(),
                    details: reply.details.clone(),
                },
                Box::new(reply),
            ));
        }
        let resumed =
            std::mem::take(&mut s.continue_request) | std::mem::take(&mut s.continue_response);
        match result {
            // 0 Continue; 2 ContinueAndEndStream, which Envoy's converter treats as Continue.
            None | Some(0) | Some(2) => Step::Continue,
            Some(_) if resumed => Step::Continue,
            Some(code) => Step::Paused(format!(
                "plugin {name:?} paused the stream in {phase} (returned {code}) and nothing resumed it; Envoy would hold the request until a timeout"
            )),
        }
    }

    /// The whole stream: the exchange, then the contexts' end. What went upstream gets its
    /// headers back from the contexts, which read them until their end.
    fn run(
        &mut self,
        request: &Request,
        number: usize,
        bootstrap: &Bootstrap,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
    ) -> Exchange {
        let mut exchange = self.exchange(request, number, bootstrap, upstream);
        self.finish();
        if let (Some(seen), Some(shared)) = (exchange.upstream.as_mut(), self.request.take()) {
            seen.headers = Arc::unwrap_or_clone(shared);
        }
        exchange
    }

    /// Lends the request's headers to every context of the stream: Envoy's filters all read
    /// the one map for `request.*` properties, after their own headers callback too.
    fn share_request(&mut self, headers: HeaderMap) {
        let shared = Arc::new(headers);
        self.lend_request(Some(&shared));
        self.request = Some(shared);
    }

    /// Takes the request's headers back from the contexts, for the router to change.
    fn unshare_request(&mut self) -> HeaderMap {
        self.lend_request(None);
        self.request
            .take()
            .map(Arc::unwrap_or_clone)
            .unwrap_or_default()
    }

    fn lend_request(&mut self, shared: Option<&Arc<HeaderMap>>) {
        for &(vm, ctx) in self.contexts.iter().flatten() {
            if let Some(s) = self.workers[self.w].vms[vm].http_state(ctx) {
                s.request_snapshot = shared.cloned();
            }
        }
    }

    fn exchange(
        &mut self,
        request: &Request,
        number: usize,
        bootstrap: &Bootstrap,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
    ) -> Exchange {
        self.setup();
        let mut exchange = Exchange {
            worker: 0,
            upstream: None,
            response: None,
            local_reply: None,
            stalled: None,
            reset: None,
            notes: Vec::new(),
        };
        let n = self.contexts.len();
        // What Envoy's connection manager puts in front of the filters.
        let mut headers = HeaderMap::with_capacity(request.headers.len() + ROOM_FOR_FILTERS);
        headers.extend([
            (":authority".into(), request.authority.clone().into_bytes()),
            (":path".into(), request.path.clone().into_bytes()),
            (":method".into(), request.method.clone().into_bytes()),
            (":scheme".into(), b"http".to_vec()),
        ]);
        headers.extend(request.headers.iter().cloned());
        // Envoy answers a gRPC request's local replies the gRPC way.
        let grpc = host::headers::get(&headers, "content-type")
            .is_some_and(|v| v.starts_with(b"application/grpc"));
        let chunks = request.chunks();
        let body_len: usize = chunks.iter().map(Vec::len).sum();
        if body_len > 0 && host::headers::get(&headers, "content-length").is_none() {
            headers.push(("content-length".into(), body_len.to_string().into_bytes()));
        }
        host::headers::replace(&mut headers, "x-forwarded-proto", b"http".to_vec());
        if host::headers::get(&headers, "x-request-id").is_none() {
            headers.push(("x-request-id".into(), request_id(number).into_bytes()));
        }
        let trailers = (!request.trailers.is_empty()).then(|| request.trailers.clone());
        let end_at_headers = chunks.is_empty() && trailers.is_none();

        let decode_order = Order::Forward(n);
        let (headers, decoded) =
            self.headers_phase(Dir::Request, decode_order, headers, end_at_headers, 0);
        self.share_request(headers);
        let decoded =
            decoded.and_then(|()| self.data_phase(Dir::Request, decode_order, chunks, trailers));

        let (response, encode_from) = match decoded {
            Err((_, StopReason::Stalled(why))) => {
                exchange.stalled = Some(why);
                return exchange;
            }
            Err((_, StopReason::Reset(why))) => {
                exchange.reset = Some(why);
                return exchange;
            }
            Err((i, StopReason::LocalReply(source, reply))) => {
                exchange.local_reply = Some(source);
                (local_reply_response(&reply, grpc), i)
            }
            Ok((body, trailers)) => {
                let mut headers = self.unshare_request();
                let action = {
                    let authority = String::from_utf8_lossy(
                        host::headers::get(&headers, ":authority").unwrap_or_default(),
                    );
                    let path = String::from_utf8_lossy(
                        host::headers::get(&headers, ":path").unwrap_or_default(),
                    );
                    self.listener
                        .http
                        .routes
                        .route(&authority, &path)
                        .map(|r| r.action.clone())
                };
                let resp = match action {
                    None => {
                        exchange.local_reply = Some(LocalReplySource::NoRoute);
                        router_reply(404, Vec::new(), grpc)
                    }
                    Some(RouteAction::Direct { status, body }) => {
                        exchange.local_reply = Some(LocalReplySource::DirectResponse);
                        router_reply(status, body, grpc)
                    }
                    Some(RouteAction::Cluster(cluster))
                        if bootstrap.cluster(&cluster).is_none() =>
                    {
                        exchange.local_reply = Some(LocalReplySource::NoCluster { cluster });
                        router_reply(503, Vec::new(), grpc)
                    }
                    Some(RouteAction::Cluster(cluster)) => {
                        host::headers::replace(
                            &mut headers,
                            "x-envoy-expected-rq-timeout-ms",
                            b"15000".to_vec(),
                        );
                        let mut body = body;
                        let framing = http1_framing(&mut headers, &mut body, "upstream");
                        match framing {
                            Framing::Fine => {}
                            Framing::Truncated(note) => exchange.notes.push(note),
                            Framing::Short(why) => {
                                exchange.stalled = Some(why);
                                return exchange;
                            }
                        }
                        let mut seen = SeenRequest {
                            cluster,
                            headers,
                            body,
                            trailers: trailers.unwrap_or_default(),
                        };
                        let reply = upstream(&seen);
                        // The contexts read the headers until their end; `run` returns them.
                        headers = std::mem::take(&mut seen.headers);
                        exchange.upstream = Some(seen);
                        upstream_response(reply)
                    }
                };
                self.share_request(headers);
                (resp, n.saturating_sub(1))
            }
        };

        // Encode: the response runs back through the filters, last to first, starting at the
        // one that produced a local reply.
        let encode_order = Order::Backward(if n == 0 { 0 } else { encode_from + 1 });
        let Outgoing {
            status,
            headers,
            chunks,
            trailers,
        } = response;
        let resp_eos = chunks.is_empty() && trailers.is_none();
        let (headers, encoded) =
            self.headers_phase(Dir::Response, encode_order, headers, resp_eos, status);
        let encoded = encoded.and_then(|()| {
            let (body, trailers) =
                self.data_phase(Dir::Response, encode_order, chunks, trailers)?;
            Ok(Response {
                status,
                headers,
                body,
                trailers: trailers.unwrap_or_default(),
            })
        });
        let mut response = match encoded {
            Ok(r) => r,
            Err((_, StopReason::Stalled(why))) => {
                exchange.stalled = Some(why);
                return exchange;
            }
            Err((_, StopReason::Reset(why))) => {
                exchange.reset = Some(why);
                return exchange;
            }
            // Envoy can still replace the response before its headers went out.
            Err((_, StopReason::LocalReply(source, reply))) => {
                exchange.local_reply = Some(source);
                let r = local_reply_response(&reply, grpc);
                // It does not pass through the filters again.
                Response {
                    status: r.status,
                    headers: r.headers,
                    body: r.chunks.concat(),
                    trailers: Vec::new(),
                }
            }
        };
        match http1_framing(&mut response.headers, &mut response.body, "client") {
            Framing::Fine => {}
            Framing::Truncated(note) => exchange.notes.push(note),
            Framing::Short(why) => {
                exchange.stalled = Some(why);
                return exchange;
            }
        }
        finalize_downstream(&mut response);
        exchange.response = Some(response);
        exchange
    }

    /// Request or response headers through the filters in `order`; the map each filter
    /// leaves goes to the next. The map is returned however the phase ended: a stopped
    /// request's headers still answer `request.*` properties.
    fn headers_phase(
        &mut self,
        dir: Dir,
        order: Order,
        mut headers: HeaderMap,
        end_of_stream: bool,
        status: u16,
    ) -> (HeaderMap, Result<(), Stopped>) {
        let phase = dir.phase(Part::Headers);
        for pos in 0..order.len() {
            let i = order.at(pos);
            let count = headers.len();
            let unplaced = self.put(i, std::mem::take(&mut headers), |s, h| match dir {
                Dir::Request => s.request_headers = Some(h),
                Dir::Response => {
                    s.response_headers = Some(h);
                    s.response_code = Some(status);
                }
            });
            let step = self.callback(i, phase, &mut |vm, ctx| match dir {
                Dir::Request => vm.on_request_headers(ctx, count, end_of_stream),
                Dir::Response => vm.on_response_headers(ctx, count, end_of_stream),
            });
            // A filter that let its headers go no longer sees them (Envoy's availability).
            headers = unplaced
                .or_else(|| {
                    self.take(i, |s| match dir {
                        Dir::Request => s.request_headers.take(),
                        Dir::Response => s.response_headers.take(),
                    })
                })
                .unwrap_or_default();
            match step {
                Step::Continue => {}
                Step::Paused(why) => return (headers, Err((i, StopReason::Stalled(why)))),
                Step::Stop(r) => return (headers, Err((i, r))),
            }
        }
        (headers, Ok(()))
    }

    /// Body chunks, then trailers, through the filters in `order`, with Envoy's buffering: a
    /// filter that pauses on a chunk keeps it, sees the growing buffer with each later chunk
    /// (`body_size` = all of it), and releases it when it continues; a pause on the last
    /// chunk waits for a resume. With trailers, no chunk ends the stream, and a filter's
    /// `Continue` on its trailers releases what it buffered. Returns the body and trailers
    /// that came out of the last filter.
    fn data_phase(
        &mut self,
        dir: Dir,
        order: Order,
        chunks: Vec<Vec<u8>>,
        mut trailers: Option<HeaderMap>,
    ) -> Result<(Vec<u8>, Option<HeaderMap>), Stopped> {
        if chunks.is_empty() && trailers.is_none() {
            return Ok((Vec::new(), None));
        }
        let mut held: Vec<Option<Vec<u8>>> = vec![None; order.len()];
        let mut out = Vec::new();
        let last = chunks.len();
        for (k, chunk) in chunks.into_iter().enumerate() {
            let end_of_stream = k + 1 == last && trailers.is_none();
            self.pass_chunk(dir, order, 0, chunk, end_of_stream, &mut held, &mut out)?;
        }
        let Some(t) = trailers.as_mut() else {
            return Ok((out, None));
        };
        let phase = dir.phase(Part::Trailers);
        for pos in 0..order.len() {
            let i = order.at(pos);
            let count = t.len();
            let buffered = held[pos].take().unwrap_or_default();
            let unplaced = self.put(i, (std::mem::take(t), buffered), |s, (t, b)| match dir {
                Dir::Request => {
                    s.request_trailers = Some(t);
                    s.request_body = b;
                }
                Dir::Response => {
                    s.response_trailers = Some(t);
                    s.response_body = b;
                }
            });
            let step = self.callback(i, phase, &mut |vm, ctx| match dir {
                Dir::Request => vm.on_request_trailers(ctx, count),
                Dir::Response => vm.on_response_trailers(ctx, count),
            });
            let (back, buffered) = unplaced
                .or_else(|| {
                    self.take(i, |s| {
                        Some(match dir {
                            Dir::Request => (
                                s.request_trailers.take().unwrap_or_default(),
                                std::mem::take(&mut s.request_body),
                            ),
                            Dir::Response => (
                                s.response_trailers.take().unwrap_or_default(),
                                std::mem::take(&mut s.response_body),
                            ),
                        })
                    })
                })
                .unwrap_or_default();
            *t = back;
            match step {
                Step::Continue => {}
                Step::Paused(why) => return Err((i, StopReason::Stalled(why))),
                Step::Stop(r) => return Err((i, r)),
            }
            if !buffered.is_empty() {
                self.pass_chunk(dir, order, pos + 1, buffered, false, &mut held, &mut out)?;
            }
        }
        Ok((out, trailers))
    }

    /// One chunk through the filters from position `from` of `order`, added to what each
    /// filter holds; lands in `out` if every filter continues.
    #[allow(clippy::too_many_arguments)]
    fn pass_chunk(
        &mut self,
        dir: Dir,
        order: Order,
        from: usize,
        mut data: Vec<u8>,
        end_of_stream: bool,
        held: &mut [Option<Vec<u8>>],
        out: &mut Vec<u8>,
    ) -> Result<(), Stopped> {
        let phase = dir.phase(Part::Body);
        for (pos, slot) in held.iter_mut().enumerate().skip(from) {
            let i = order.at(pos);
            let mut buffer = slot.take().unwrap_or_default();
            buffer.append(&mut data);
            let size = buffer.len();
            let unplaced = self.put(i, buffer, |s, b| match dir {
                Dir::Request => s.request_body = b,
                Dir::Response => s.response_body = b,
            });
            let step = self.callback(i, phase, &mut |vm, ctx| match dir {
                Dir::Request => vm.on_request_body(ctx, size, end_of_stream),
                Dir::Response => vm.on_response_body(ctx, size, end_of_stream),
            });
            let body = unplaced
                .or_else(|| {
                    self.take(i, |s| {
                        Some(std::mem::take(match dir {
                            Dir::Request => &mut s.request_body,
                            Dir::Response => &mut s.response_body,
                        }))
                    })
                })
                .unwrap_or_default();
            match step {
                Step::Continue => data = body,
                Step::Paused(why) if end_of_stream => {
                    return Err((i, StopReason::Stalled(why)));
                }
                Step::Paused(_) => {
                    *slot = Some(body);
                    return Ok(());
                }
                Step::Stop(r) => return Err((i, r)),
            }
        }
        out.append(&mut data);
        Ok(())
    }

    /// Hands `value` to filter `i`'s stream state; gives it back when the filter has no
    /// context (a plugin that failed to start, under fail-open).
    fn put<T>(
        &mut self,
        i: usize,
        value: T,
        f: impl FnOnce(&mut host::HttpStreamState, T),
    ) -> Option<T> {
        let w = self.w;
        match self.contexts[i].and_then(|(vm, ctx)| self.workers[w].vms[vm].http_state(ctx)) {
            Some(s) => {
                f(s, value);
                None
            }
            None => Some(value),
        }
    }

    fn take<T>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut host::HttpStreamState) -> Option<T>,
    ) -> Option<T> {
        let (vm, ctx) = self.contexts[i]?;
        self.worker().vms[vm].http_state(ctx).and_then(f)
    }

    /// Stream end: `on_log`, `on_done`, `on_delete` on every filter's context.
    fn finish(&mut self) {
        for c in std::mem::take(&mut self.contexts).into_iter().flatten() {
            self.worker().vms[c.0].finish_stream(c.1);
            self.deliver_posted();
        }
    }
}

/// The `x-request-id` Envoy would generate: a UUID's shape, numbered by request so that runs
/// repeat. Built in its one 36-byte allocation (`format!` grows its buffer on the way).
fn request_id(number: usize) -> String {
    let mut id = String::with_capacity(36);
    let _ = write!(id, "{:08x}-0000-4000-8000-{number:012x}", 0x5eed);
    id
}

/// Headers the connection manager, the router and typical filters add to a message: reserved
/// up front so that a request does not grow its header maps several times.
const ROOM_FOR_FILTERS: usize = 10;

/// A response on its way back through the filters, as it arrives: headers, body chunks,
/// trailers.
struct Outgoing {
    status: u16,
    headers: HeaderMap,
    chunks: Vec<Vec<u8>>,
    trailers: Option<HeaderMap>,
}

impl Outgoing {
    fn new(status: u16, headers: HeaderMap, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            chunks: if body.is_empty() { vec![] } else { vec![body] },
            trailers: None,
        }
    }
}

/// A reply the router makes (no route, no cluster, a direct response).
fn router_reply(status: u16, body: Vec<u8>, grpc: bool) -> Outgoing {
    if grpc {
        return grpc_local_reply(status, &[], &body, None);
    }
    let mut headers: HeaderMap = vec![(":status".into(), status.to_string().into_bytes())];
    if !body.is_empty() {
        headers.push(("content-length".into(), body.len().to_string().into_bytes()));
        headers.push(("content-type".into(), b"text/plain".to_vec()));
    }
    Outgoing::new(status, headers, body)
}

/// Envoy's `sendLocalReply`: `:status`, the plugin's headers, then length and type; to a
/// gRPC request, a trailers-only gRPC response instead.
fn local_reply_response(reply: &LocalReply, grpc: bool) -> Outgoing {
    if grpc {
        return grpc_local_reply(reply.status, &reply.headers, &reply.body, reply.grpc_status);
    }
    let mut headers: HeaderMap = vec![(":status".into(), reply.status.to_string().into_bytes())];
    for (k, v) in &reply.headers {
        host::headers::add(&mut headers, k, v.clone());
    }
    if !reply.body.is_empty() {
        host::headers::replace(
            &mut headers,
            "content-length",
            reply.body.len().to_string().into_bytes(),
        );
        if host::headers::get(&headers, "content-type").is_none() {
            headers.push(("content-type".into(), b"text/plain".to_vec()));
        }
    }
    Outgoing::new(reply.status, headers, reply.body.clone())
}

/// Envoy's local reply to a gRPC request: HTTP 200 with headers only, `grpc-status` (the
/// one given, else mapped from the HTTP status as Envoy maps it) and the body as a
/// percent-encoded `grpc-message`.
fn grpc_local_reply(
    status: u16,
    extra: &[(String, Vec<u8>)],
    body: &[u8],
    grpc_status: Option<u32>,
) -> Outgoing {
    let code = grpc_status.unwrap_or(match status {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    });
    let mut headers: HeaderMap = vec![
        (":status".into(), b"200".to_vec()),
        ("content-type".into(), b"application/grpc".to_vec()),
        ("grpc-status".into(), code.to_string().into_bytes()),
    ];
    if !body.is_empty() {
        let mut message = Vec::new();
        for &b in body {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                message.push(b);
            } else {
                message.extend_from_slice(format!("%{b:02X}").as_bytes());
            }
        }
        headers.push(("grpc-message".into(), message));
    }
    for (k, v) in extra {
        host::headers::add(&mut headers, k, v.clone());
    }
    Outgoing::new(200, headers, Vec::new())
}

fn upstream_response(reply: UpstreamReply) -> Outgoing {
    let chunks = reply.chunks();
    let len = chunks.iter().map(Vec::len).sum();
    Outgoing {
        status: reply.status,
        headers: routed_headers(reply.status, reply.headers, len),
        chunks,
        trailers: (!reply.trailers.is_empty()).then_some(reply.trailers),
    }
}

/// An upstream's response headers as Envoy's router hands them on, to the filter chain or to
/// a callout's caller: `:status` first, the upstream's headers, a `content-length` when the
/// upstream sent none, and the router's service-time stamp.
pub(crate) fn routed_headers(status: u16, upstream: HeaderMap, body_len: usize) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(upstream.len() + ROOM_FOR_FILTERS);
    headers.push((":status".into(), status.to_string().into_bytes()));
    for (k, v) in upstream {
        host::headers::add(&mut headers, k, v);
    }
    if host::headers::get(&headers, "content-length").is_none() {
        headers.push(("content-length".into(), body_len.to_string().into_bytes()));
    }
    host::headers::replace(&mut headers, "x-envoy-upstream-service-time", b"0".to_vec());
    headers
}

/// How a message's body fits the framing Envoy's HTTP/1 codec sends it with.
enum Framing {
    Fine,
    /// The body was longer than its `content-length`: the peer reads only that much.
    Truncated(String),
    /// Shorter: the peer waits for bytes that never come.
    Short(String),
}

/// Envoy's HTTP/1 codec frames a message by the `content-length` the filters left, or
/// chunked without one; it does not fix a length a filter invalidated by changing the body
/// (filters that change a body's size remove `content-length` in their headers callback).
fn http1_framing(headers: &mut HeaderMap, body: &mut Vec<u8>, peer: &str) -> Framing {
    let declared = host::headers::get(headers, "content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
    match declared {
        None if !body.is_empty() => {
            if host::headers::get(headers, "transfer-encoding").is_none() {
                headers.push(("transfer-encoding".into(), b"chunked".to_vec()));
            }
            Framing::Fine
        }
        None => Framing::Fine,
        Some(n) if n == body.len() => Framing::Fine,
        Some(n) if n < body.len() => {
            let note = format!(
                "content-length says {n} but the filters left a {}-byte body: the {peer} reads only the first {n} bytes (a filter that changes a body's size must remove content-length in its headers callback)",
                body.len()
            );
            body.truncate(n);
            Framing::Truncated(note)
        }
        Some(n) => Framing::Short(format!(
            "content-length says {n} but the filters left a {}-byte body: the {peer} waits for the rest and Envoy would time out (a filter that changes a body's size must remove content-length in its headers callback)",
            body.len()
        )),
    }
}

/// What the connection manager does after the filters, on the way to the client.
fn finalize_downstream(response: &mut Response) {
    response.status = host::headers::get(&response.headers, ":status")
        .and_then(|s| std::str::from_utf8(s).ok()?.parse().ok())
        .unwrap_or(response.status);
    host::headers::replace(&mut response.headers, "server", b"envoy".to_vec());
    // Envoy's HTTP/1 codec ends a bodiless response with `content-length: 0` unless the
    // status forbids a body (seen on its failure-policy 503, whose local reply has none).
    let bodiless_status = response.status < 200 || matches!(response.status, 204 | 304);
    if response.body.is_empty()
        && !bodiless_status
        && host::headers::get(&response.headers, "content-length").is_none()
        && host::headers::get(&response.headers, "transfer-encoding").is_none()
    {
        response
            .headers
            .push(("content-length".into(), b"0".to_vec()));
    }
}
