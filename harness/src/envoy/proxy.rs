//! The emulated Envoy as a library: [`Proxy`] starts the plugins of a bootstrap the way Envoy
//! does and takes traffic. Where plugins run is in [`threads`], an HTTP stream's path in
//! [`http_stream`] and [`router`], a TCP connection's in [`tcp`], and what Envoy's dispatchers
//! run between requests (ticks, queue notifications, callouts) in [`events`] and
//! [`callouts`].

mod call_records;
mod callouts;
mod capacity;
mod events;
mod http_stream;
mod router;
mod swap;
mod tcp;
mod threads;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wasm_common::sync::lock;

use crate::engine::host::{self, LogRecord, Shared};
use crate::engine::runtime::{CodeSource, Runtime, VmError};
use crate::engine::vm::PluginStartError;
use crate::envoy::bootstrap::{Bootstrap, BootstrapError};
use crate::envoy::http::{
    CannedGrpcCall, CannedHttpCall, Exchange, Request, SeenRequest, UpstreamReply,
};
use crate::envoy::traffic::TrafficError;
use http_stream::HttpStream;
use threads::{Thread, Threads, VmFactory};

pub use crate::engine::host::time::format_duration;
pub use call_records::{CallRecords, MAX_CALL_RECORD_BYTES};
pub use callouts::{
    Callouts, DEFAULT_CALLOUT_BUDGET, MAX_CALLOUT_BODY_BYTES, MAX_CONCURRENT_CALLOUTS,
    NO_TIMEOUT_LIMIT,
};
pub use capacity::MAX_WORKERS;
pub use events::{DeliveryError, MAX_CALL_DELIVERIES, MAX_QUEUE_DELIVERIES, MAX_TICKS_PER_ADVANCE};
pub(crate) use router::grpc_message_encode;
pub use swap::SwapError;
pub use threads::RELOAD_BACKOFF;
// Also named here, beside `Proxy::connect` that takes and returns them.
#[doc(hidden)]
pub use crate::envoy::http::{TcpEvent, TcpOutcome};

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

/// How to run the bootstrap: what Envoy takes on its command line.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Envoy's `--concurrency`: each worker has its own VM instances.
    pub workers: usize,
    /// Envoy's `-l`: guest log lines below it are not written, and `proxy_get_log_level`
    /// answers it.
    pub log_level: crate::engine::abi::LogLevel,
    /// How long one callback may run before it is treated as a trap
    /// ([`crate::engine::runtime::DEFAULT_CALLBACK_DEADLINE`]; Envoy has no such limit).
    pub callback_deadline: std::time::Duration,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            workers: 2,
            log_level: crate::engine::abi::LogLevel::Info,
            callback_deadline: crate::engine::runtime::DEFAULT_CALLBACK_DEADLINE,
        }
    }
}

impl ProxyOptions {
    /// `workers` worker threads, and Envoy's defaults for the rest.
    pub fn with_workers(workers: usize) -> Self {
        Self {
            workers,
            ..Self::default()
        }
    }
}

/// A root context still waiting to call `proxy_done` after [`Proxy::shutdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRoot {
    /// `None`: the main thread.
    pub worker: Option<usize>,
    pub root: u32,
}

/// Envoy running a bootstrap, emulated: its listeners take HTTP requests ([`Proxy::send`])
/// and TCP connections ([`Proxy::connect`]) on worker threads that each run their own VMs,
/// with a virtual clock ([`Proxy::advance`]) and an orderly shutdown ([`Proxy::shutdown`]).
pub struct Proxy {
    bootstrap: Bootstrap,
    factory: VmFactory,
    threads: Threads,
    requests_sent: usize,
    /// Connections accepted so far, HTTP and TCP (Envoy's connection ids).
    connections: u64,
    /// Per listener: its address and port, for the `destination.*` properties.
    destinations: Vec<Arc<(String, u16)>>,
    /// Set by [`Proxy::shutdown`]: no more traffic.
    shut_down: bool,
}

impl Proxy {
    /// Reads an Envoy bootstrap (YAML or JSON) and starts it.
    pub fn from_bootstrap(path: &Path, options: &ProxyOptions) -> Result<Self, StartError> {
        let bootstrap = Bootstrap::load(path)?;
        Self::new(bootstrap, options)
    }

    /// Starts the plugins of `bootstrap` as Envoy does: every plugin first on a throw-away
    /// canary, where a refusal rejects the whole configuration before any worker sees it;
    /// then on the main thread, then on each worker.
    pub fn new(bootstrap: Bootstrap, options: &ProxyOptions) -> Result<Self, StartError> {
        capacity::check_workers(options.workers)?;
        let mut runtime =
            Runtime::with_capacity(capacity::instances_needed(&bootstrap, options.workers))
                .map_err(|e| StartError::Runtime(format!("{e:#}")))?;
        runtime.callback_deadline = options.callback_deadline;
        let shared = Arc::new(Shared::default());
        lock(&shared.log).set_level(options.log_level);
        let _ = shared.node.set(bootstrap.node.clone());
        let _ = shared.routes.set(Arc::new(bootstrap.clone()));
        let _ = shared.clusters_without_endpoints.set(
            bootstrap
                .clusters
                .iter()
                .filter(|c| c.endpoints.is_empty())
                .map(|c| c.name.clone())
                .collect(),
        );
        let factory = VmFactory::new(runtime, &bootstrap)?;
        let destinations = bootstrap
            .listeners
            .iter()
            .map(|l| Arc::new((l.address.clone(), l.port)))
            .collect();
        let threads = Threads::new(shared, callouts::Callouts::new(&bootstrap));
        let mut proxy = Self {
            bootstrap,
            factory,
            threads,
            requests_sent: 0,
            connections: 0,
            destinations,
            shut_down: false,
        };
        proxy.place(Thread::Canary).map_err(|e| match e {
            StartError::Rejected { error, .. } => {
                proxy.log_refusal(&error);
                StartError::Rejected {
                    error,
                    log: proxy.logs().iter().map(ToString::to_string).collect(),
                }
            }
            other => other,
        })?;
        // Envoy's thread-local slots are set on the main thread first, then on each worker:
        // the main thread gets its own instance of every plugin too. It serves no traffic,
        // but its roots configure, tick, and take part in queues like the workers'.
        proxy.threads.main = proxy.place(Thread::Main)?;
        for w in 0..options.workers {
            let worker = proxy.place(Thread::Worker(w))?;
            proxy.threads.workers.push(worker);
        }
        // What the plugins enqueued while starting reaches the registrants now.
        proxy.threads.deliver_posted();
        Ok(proxy)
    }

    /// Envoy's lines when it refuses a configuration its canary rejected, after the guest's.
    fn log_refusal(&self, error: &PluginStartError) {
        let plugin = match error {
            PluginStartError::VmStartFailed { plugin }
            | PluginStartError::ConfigureFailed { plugin }
            | PluginStartError::Trapped { plugin, .. }
            | PluginStartError::Uninitialized { plugin, .. } => plugin,
        };
        let policy = self
            .bootstrap
            .listeners
            .iter()
            .flat_map(|l| l.plugins())
            .find(|p| &p.name == plugin)
            .map(|p| p.failure_policy);
        let mut log = lock(&self.threads.shared.log);
        for (level, message) in crate::engine::vm::failure::refusal(error, policy) {
            log.push(LogRecord {
                worker: None,
                level,
                source: host::logging::LogSource::Vm,
                plugin: plugin.clone(),
                root_id: String::new(),
                vm_id: String::new(),
                stream: false,
                message,
            });
        }
    }

    fn place(&self, thread: Thread) -> Result<threads::Dispatcher, StartError> {
        threads::place_plugins(&self.factory, &self.bootstrap, &self.threads.shared, thread)
    }

    /// The bootstrap the proxy runs.
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }

    /// How long one delivery round of callouts may wait for loopback upstreams in all
    /// (default [`DEFAULT_CALLOUT_BUDGET`]); calls still waiting then are answered 504.
    pub fn set_callout_budget(&mut self, budget: Duration) {
        self.threads.callouts.budget = budget;
    }

    /// Canned replies to HTTP callouts (the first that matches answers), in place of the
    /// ones set before.
    pub fn set_http_call_replies(&mut self, replies: Vec<CannedHttpCall>) {
        self.threads.callouts.http = replies;
    }

    /// Canned replies to gRPC callouts (the first that matches answers), in place of the
    /// ones set before.
    pub fn set_grpc_call_replies(&mut self, replies: Vec<CannedGrpcCall>) {
        self.threads.callouts.grpc = replies;
    }

    /// Every callout answered so far, oldest first, within [`MAX_CALL_RECORD_BYTES`].
    pub fn call_records(&self) -> &CallRecords {
        &self.threads.callouts.records
    }

    /// Opens a connection to a TCP listener (`None`: the first listener) on `worker` (else
    /// round robin), plays `events`, closes it if they did not, and says what each side got.
    pub fn connect(
        &mut self,
        listener: Option<&str>,
        worker: Option<usize>,
        events: &[TcpEvent],
    ) -> Result<TcpOutcome, TrafficError> {
        let listener = self.listener_index(listener)?;
        let Some((cluster, deny_at)) = self.bootstrap.listeners[listener]
            .tcp()
            .map(|tcp| (tcp.proxy.cluster.clone(), tcp.deny_at))
        else {
            return Err(TrafficError::HttpListener {
                name: self.bootstrap.listeners[listener].name.clone(),
            });
        };
        let w = self.pick_worker(worker)?;
        self.requests_sent += 1;
        threads::reload_failed_vms(&mut self.threads, w, &self.factory, &self.bootstrap);
        let connection = new_connection(&mut self.connections, &self.destinations[listener]);
        let plugins = self.bootstrap.listeners[listener].plugins();
        Ok(tcp::TcpConnection::new(
            &mut self.threads,
            w,
            listener,
            (plugins, deny_at),
            cluster,
            &self.bootstrap.clusters,
        )
        .run(connection, events))
    }

    /// Advances the virtual clock by `by`, firing the ticks that fall due (see
    /// [`events`]); returns how many `proxy_on_tick` calls were made.
    pub fn advance(&mut self, by: Duration) -> usize {
        events::advance(&mut self.threads, by)
    }

    /// Whether a root context has a timer armed: real Envoy's would tick in real time.
    pub fn ticking(&self) -> bool {
        events::any_armed(&self.threads)
    }

    /// Time on the virtual clock since the proxy started.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.threads.shared.monotonic_nanos())
    }

    /// Delivery problems since the last call (queue, callout and tick storms), oldest first.
    pub fn take_errors(&mut self) -> Vec<DeliveryError> {
        std::mem::take(&mut self.threads.errors)
    }

    /// A counter's or gauge's value in the proxy-wide stats (`wasmcustom.<name>`, or the name
    /// without the prefix), summed over every worker as Envoy's stats store does.
    pub fn metric(&self, name: &str) -> Option<u64> {
        let full = if name.starts_with("wasmcustom.") {
            name.to_string()
        } else {
            format!("wasmcustom.{name}")
        };
        let stats = lock(&self.threads.shared.stats);
        [
            host::metrics::MetricType::Counter,
            host::metrics::MetricType::Gauge,
        ]
        .into_iter()
        .find_map(|ty| stats.get(&(ty, full.clone())).map(|s| s.value))
    }

    /// A shared-data value (per `vm_id`, as Envoy keeps them).
    pub fn shared_data(&self, vm_id: &str, key: &str) -> Option<Vec<u8>> {
        let data = lock(&self.threads.shared.data);
        data.get(vm_id, key).map(|(v, _)| v)
    }

    /// How many workers take traffic (Envoy's `--concurrency`).
    pub fn workers(&self) -> usize {
        self.threads.workers.len()
    }

    /// Each module loaded, with where its machine code came from (for instance, to check that
    /// `allow_precompiled` really uses the module's precompiled code).
    pub fn modules(&self) -> Vec<(&Path, CodeSource)> {
        let mut out: Vec<_> = self
            .factory
            .modules()
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
        let log = lock(&self.threads.shared.log);
        log.records().get(from..).unwrap_or_default().to_vec()
    }

    /// What the run's log cap left out so far (see [`host::log_book`]).
    pub fn log_dropped(&self) -> host::log_book::Dropped {
        lock(&self.threads.shared.log).dropped()
    }

    /// How many log lines there are so far: a mark for [`Proxy::logs_since`].
    pub fn log_len(&self) -> usize {
        lock(&self.threads.shared.log).len()
    }

    /// The listener's index by name (`None`: the first).
    fn listener_index(&self, listener: Option<&str>) -> Result<usize, TrafficError> {
        match listener {
            None if self.bootstrap.listeners.is_empty() => Err(TrafficError::NoListeners),
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
        let w = worker.unwrap_or(self.requests_sent % self.threads.workers.len());
        if w >= self.threads.workers.len() {
            return Err(TrafficError::NoWorker {
                worker: w,
                workers: self.threads.workers.len(),
            });
        }
        Ok(w)
    }

    /// Envoy's shutdown (the server exits, or the plugins are removed): every root context
    /// on each worker, then on the main thread, gets `proxy_on_done`, then `proxy_on_delete`
    /// at once if that returned true (or is not exported). A root that returned false stays
    /// (ticks, queues and callouts still reach it, see [`Proxy::advance`]) until it calls
    /// `proxy_done`. After this the proxy takes no traffic. Returns the roots still pending.
    pub fn shutdown(&mut self) -> Vec<PendingRoot> {
        self.shut_down = true;
        for worker in &mut self.threads.workers {
            for vm in &mut worker.vms {
                vm.shutdown();
            }
        }
        for vm in &mut self.threads.main.vms {
            vm.shutdown();
        }
        self.threads.deliver_posted();
        self.pending_done()
    }

    /// Roots whose `proxy_on_done` returned false and that have not called `proxy_done` yet.
    pub fn pending_done(&self) -> Vec<PendingRoot> {
        self.threads
            .all()
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
        let listener = self.listener_index(listener)?;
        let Some(hcm) = self.bootstrap.listeners[listener].http() else {
            return Err(TrafficError::TcpListener {
                name: self.bootstrap.listeners[listener].name.clone(),
            });
        };
        let w = self.pick_worker(worker)?;
        self.requests_sent += 1;
        let mut connection = new_connection(&mut self.connections, &self.destinations[listener]);
        connection.http_protocol = Some(request.protocol.envoy_name());
        threads::reload_failed_vms(&mut self.threads, w, &self.factory, &self.bootstrap);
        let mut stream = HttpStream::new(
            &mut self.threads,
            w,
            &self.bootstrap,
            (listener, hcm),
            connection,
        );
        Ok(stream.run(request, self.requests_sent, upstream))
    }
}

/// A new downstream connection (Envoy's connection ids count every one accepted, HTTP and
/// TCP), from 127.0.0.1 and a port of its own, to the listener at `destination`.
fn new_connection(connections: &mut u64, destination: &Arc<(String, u16)>) -> host::Connection {
    *connections += 1;
    host::Connection::new(
        *connections,
        40000 + (*connections % 20000) as u16,
        destination.clone(),
    )
}
