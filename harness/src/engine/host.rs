//! The host side of the proxy-wasm ABI: the per-VM state wasmtime hands to every hostcall,
//! and one module per hostcall family.
//!
//! Hostcalls resolve their context as cpp-host does (`contextOrEffectiveContext`): the context
//! set by `proxy_set_effective_context` during the current call, else the one the host called.

pub mod buffers;
pub mod callouts;
pub mod filter_state;
pub mod foreign;
pub mod headers;
pub mod held;
pub mod log_book;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod properties;
pub mod queues;
pub mod shared_data;
pub mod stream;
pub mod time;
pub mod wasi;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wasm_common::sync::lock;
use wasmtime::{Linker, Memory, StoreLimits, TypedFunc};

use crate::engine::abi::{AbiVersion, Status};
use crate::engine::plugin::WasmPlugin;

pub use logging::LogRecord;

pub use crate::engine::header_map::HeaderMap;

/// State shared by every VM of one host: the log, the virtual clock, shared data and queues.
#[derive(Debug, Default)]
pub struct Shared {
    /// Every VM's log records, within [`log_book::MAX_LOG_BYTES`] for the run.
    pub log: Mutex<log_book::LogBook>,
    pub clock: Mutex<time::VirtualClock>,
    pub data: Mutex<shared_data::SharedData>,
    pub queues: Mutex<queues::Queues>,
    /// Bytes guests make the host hold (shared data, queued items, pending callouts).
    pub held: held::Held,
    /// HTTP and gRPC callouts made and not yet answered, from every VM.
    pub calls: Mutex<callouts::PendingCalls>,
    /// Set whenever a queue notification or a callout is posted, so the proxy only takes
    /// the locks above when there is something to deliver (most callbacks post nothing).
    pub posted: std::sync::atomic::AtomicBool,
    /// Custom metrics, proxy-wide as in Envoy's stats store.
    pub stats: metrics::Stats,
    /// The bootstrap's `node` (id, cluster, metadata), for the `xds.node` properties.
    pub node: std::sync::OnceLock<serde_json::Value>,
    /// The configuration's routes, for the route and cluster a stream's `xds.*` properties name.
    pub routes: std::sync::OnceLock<Arc<dyn properties::RouteTable>>,
    /// Clusters with no endpoint: Envoy's async client fails a call to one as it is made.
    pub clusters_without_endpoints: std::sync::OnceLock<Vec<String>>,
    /// Numbers VM instances (from 1) so queue notifications find the one that registered.
    next_instance: AtomicU64,
}

impl Shared {
    /// A number no other VM instance of this host has.
    pub fn new_instance_id(&self) -> u64 {
        self.next_instance.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Nanoseconds since the harness started, on the virtual clock.
    pub fn monotonic_nanos(&self) -> u64 {
        lock(&self.clock).monotonic_nanos()
    }
}

/// What a worker's VM knows about one plugin (one root context).
#[derive(Debug)]
pub struct RootInfo {
    pub plugin: Arc<WasmPlugin>,
}

/// A reply the guest asked for with `proxy_send_local_response`; Envoy sends it after the
/// current VM call returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u16,
    pub details: String,
    pub body: Vec<u8>,
    pub headers: HeaderMap,
    pub grpc_status: Option<u32>,
}

/// What Envoy keeps for one HTTP stream context between callbacks. A map is `None` while
/// Envoy would not hand it to the filter (before it arrives, or after the filter let it go).
#[derive(Debug, Default)]
pub struct HttpStreamState {
    pub root: u32,
    pub request_headers: Option<HeaderMap>,
    pub request_trailers: Option<HeaderMap>,
    pub response_headers: Option<HeaderMap>,
    pub response_trailers: Option<HeaderMap>,
    pub request_body: Vec<u8>,
    pub response_body: Vec<u8>,
    /// The request's headers once this filter's request-headers callback is over, shared by
    /// the stream's contexts, for `request.*` properties (during that callback they come from
    /// the live `request_headers`).
    pub request_snapshot: Option<Arc<HeaderMap>>,
    pub connection: Connection,
    pub response_code: Option<u16>,
    /// Properties the guest set on this stream (Envoy's filter state), by `\0`-joined path.
    pub properties: HashMap<String, Vec<u8>>,
    pub local_reply: Option<LocalReply>,
    /// Set by `proxy_send_local_response`: the current callback's result becomes a stop.
    pub stop_forced: bool,
    pub continue_request: bool,
    pub continue_response: bool,
    pub reset: bool,
    /// The stream's dynamic metadata, shared by its contexts (`metadata` property).
    pub dynamic_metadata: Arc<crate::engine::metadata::DynamicMetadata>,
    /// Set while `proxy_on_log` runs (Envoy's access-log phase): the maps as the stream ended.
    pub access_log: Option<AccessLogMaps>,
    /// The trailers a body callback at end of stream may create by editing them (Envoy's
    /// `getMap`: `addDecodedTrailers` / `addEncodedTrailers`), while that callback runs.
    pub addable_trailers: Option<crate::engine::abi::MapType>,
    /// The body whose callback runs: Envoy hands it even empty (an HTTP/1 end of stream),
    /// so `proxy_set_buffer_bytes` may fill it.
    pub body_callback: Option<crate::engine::abi::BufferType>,
}

/// What Envoy's access log hands `proxy_on_log` (`Context::log`): the request headers, the
/// response headers and trailers as the stream ended, read-only; never the request trailers.
#[derive(Debug, Default, Clone)]
pub struct AccessLogMaps {
    pub request_headers: Option<Arc<HeaderMap>>,
    pub response_headers: Option<Arc<HeaderMap>>,
    pub response_trailers: Option<Arc<HeaderMap>>,
}

/// The downstream connection a stream arrived on, for the `source.*`, `destination.*` and
/// `connection.*` properties.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Envoy's connection id (the harness numbers connections from 1).
    pub id: u64,
    /// The client's port; the harness's clients are 127.0.0.1.
    pub source_port: u16,
    /// The listener's address and port.
    pub destination: Arc<(String, u16)>,
    /// Filter state set by `set_envoy_filter_state`, shared by every filter of the connection
    /// (of the request, for HTTP: the harness opens one connection per request).
    pub filter_state: Arc<Mutex<filter_state::FilterState>>,
    /// What the client speaks, as Envoy names it for `request.protocol` (`HTTP/1.1`,
    /// `HTTP/2`); `None` on a TCP connection.
    pub http_protocol: Option<&'static str>,
    /// The upstream host once the proxy connected to it (`upstream.address` / `.port`).
    pub upstream: Arc<std::sync::OnceLock<(String, u16)>>,
}

impl Connection {
    /// A new connection with an empty filter state.
    pub fn new(id: u64, source_port: u16, destination: Arc<(String, u16)>) -> Self {
        Self {
            id,
            source_port,
            destination,
            filter_state: Default::default(),
            http_protocol: None,
            upstream: Default::default(),
        }
    }

    /// Runs `f` on the connection's filter state.
    pub fn with_filter_state<T>(&self, f: impl FnOnce(&mut filter_state::FilterState) -> T) -> T {
        f(&mut lock(&self.filter_state))
    }
}

impl Default for Connection {
    /// No connection yet; shares one empty destination (stream states are built per request).
    fn default() -> Self {
        static NOWHERE: std::sync::OnceLock<Arc<(String, u16)>> = std::sync::OnceLock::new();
        Self {
            id: 0,
            source_port: 0,
            destination: NOWHERE.get_or_init(|| Arc::new((String::new(), 0))).clone(),
            filter_state: Default::default(),
            http_protocol: None,
            upstream: Default::default(),
        }
    }
}

/// What Envoy keeps for one TCP connection context (`envoy.filters.network.wasm`).
#[derive(Debug, Default)]
pub struct TcpStreamState {
    pub root: u32,
    pub connection: Connection,
    /// The data in flight from the client (buffer type 2), all of it while the filter holds it.
    pub downstream_data: Vec<u8>,
    /// The data in flight from the upstream (buffer type 3).
    pub upstream_data: Vec<u8>,
    /// Set by `proxy_continue_stream(DOWNSTREAM)`: Envoy's `continueReading`.
    pub continue_downstream: bool,
    /// Set by `proxy_close_stream`: the connection is closed once the callback returns.
    pub close: bool,
    /// The buffer Envoy hands the data callback that runs (`onData` / `onWrite`): there even
    /// when empty, as at the end of stream, so the guest may insert bytes into it.
    pub in_data_callback: Option<crate::engine::abi::BufferType>,
}

#[derive(Debug)]
pub enum ContextKind {
    Root(RootInfo),
    Http(Box<HttpStreamState>),
    Tcp(Box<TcpStreamState>),
}

/// Per-VM-instance state: everything a hostcall may read or change.
pub struct HostState {
    pub shared: Arc<Shared>,
    /// This VM instance's number within the host (see [`Shared::new_instance_id`]).
    pub instance: u64,
    /// `None` for the canary VM Envoy starts at configuration time.
    pub worker: Option<usize>,
    pub abi: AbiVersion,
    pub memory: Option<Memory>,
    pub allocator: Option<TypedFunc<i32, i32>>,
    pub vm_configuration: Arc<Vec<u8>>,
    pub environment: Vec<(String, String)>,
    /// Looked up on nearly every hostcall: a fast hasher for small integer keys.
    pub contexts: rustc_hash::FxHashMap<u32, ContextKind>,
    /// The context the host called into (0 = the VM context).
    pub current: u32,
    /// Set by `proxy_set_effective_context` for the rest of the current call.
    pub effective: Option<u32>,
    /// The root whose plugin configuration is readable (only during `on_configure`).
    pub configuring: Option<u32>,
    /// Tick timers by root context id.
    pub timers: rustc_hash::FxHashMap<u32, time::Timer>,
    pub rng: u64,
    pub limits: StoreLimits,
    /// The VM's own vm_id (for hostcalls made outside any plugin context).
    pub vm_id: String,
    /// Cluster names of the bootstrap: callouts may only target these.
    pub clusters: Arc<Vec<String>>,
    pub metrics: metrics::Metrics,
    pub callouts: callouts::CalloutState,
    /// Roots whose `proxy_on_done` returned false at shutdown: they live on (ticks, queues,
    /// callouts) until they call `proxy_done`.
    pub pending_done: Vec<u32>,
    /// Roots that called `proxy_done` in the current callback: deleted once it returns.
    pub done_now: Vec<u32>,
}

impl HostState {
    pub fn new(
        shared: Arc<Shared>,
        worker: Option<usize>,
        abi: AbiVersion,
        plugin: &WasmPlugin,
        clusters: Arc<Vec<String>>,
    ) -> Self {
        Self {
            instance: shared.new_instance_id(),
            metrics: metrics::Metrics::new(shared.stats.clone()),
            shared,
            worker,
            abi,
            memory: None,
            allocator: None,
            vm_configuration: Arc::new(plugin.vm_configuration.clone()),
            environment: plugin.environment.clone(),
            contexts: Default::default(),
            current: 0,
            effective: None,
            configuring: None,
            timers: Default::default(),
            // Fixed seed: runs are reproducible; each worker draws its own sequence.
            rng: 0x9E37_79B9_7F4A_7C15 ^ worker.map_or(0, |w| w as u64 + 1),
            limits: HostState::default_limits(),
            vm_id: plugin.vm_id.clone(),
            clusters,
            callouts: callouts::CalloutState::default(),
            pending_done: Vec::new(),
            done_now: Vec::new(),
        }
    }

    /// cpp-host's `contextOrEffectiveContext()`.
    pub fn context_id(&self) -> u32 {
        match self.effective {
            Some(id) if self.contexts.contains_key(&id) => id,
            _ => self.current,
        }
    }

    /// The root context that owns `id` (a root owns itself).
    pub fn root_of(&self, id: u32) -> Option<u32> {
        match self.contexts.get(&id)? {
            ContextKind::Root(_) => Some(id),
            ContextKind::Http(s) => Some(s.root),
            ContextKind::Tcp(s) => Some(s.root),
        }
    }

    pub fn plugin_of(&self, id: u32) -> Option<&Arc<WasmPlugin>> {
        match self.contexts.get(&self.root_of(id)?)? {
            ContextKind::Root(r) => Some(&r.plugin),
            _ => None,
        }
    }

    pub fn http_stream(&mut self) -> Option<&mut HttpStreamState> {
        let id = self.context_id();
        match self.contexts.get_mut(&id)? {
            ContextKind::Http(s) => Some(s),
            _ => None,
        }
    }

    pub fn http_stream_ref(&self) -> Option<&HttpStreamState> {
        match self.contexts.get(&self.context_id())? {
            ContextKind::Http(s) => Some(s),
            _ => None,
        }
    }

    pub fn tcp_stream(&mut self) -> Option<&mut TcpStreamState> {
        let id = self.context_id();
        match self.contexts.get_mut(&id)? {
            ContextKind::Tcp(s) => Some(s),
            _ => None,
        }
    }

    /// The downstream connection of the current context, if it is a stream.
    pub fn connection(&self) -> Option<&Connection> {
        match self.contexts.get(&self.context_id())? {
            ContextKind::Http(s) => Some(&s.connection),
            ContextKind::Tcp(s) => Some(&s.connection),
            ContextKind::Root(_) => None,
        }
    }

    /// splitmix64: a fixed, reproducible stream for `random_get`.
    pub fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Why a hostcall did not succeed: a status for the guest, or a trap (a guest allocator that
/// trapped while the host was copying data out).
#[derive(Debug)]
pub enum HostError {
    Status(Status),
    Trap(wasmtime::Error),
}

impl From<Status> for HostError {
    fn from(s: Status) -> Self {
        Self::Status(s)
    }
}

impl From<wasmtime::Error> for HostError {
    fn from(e: wasmtime::Error) -> Self {
        Self::Trap(e)
    }
}

/// Turns a hostcall's outcome into what the guest sees: a status code, or a trap.
pub fn finish(r: Result<(), HostError>) -> wasmtime::Result<i32> {
    match r {
        Ok(()) => Ok(Status::Ok.code()),
        Err(HostError::Status(s)) => Ok(s.code()),
        Err(HostError::Trap(e)) => Err(e),
    }
}

/// Runs a hostcall's body, whose `?` exits with a status or a trap, and answers the guest
/// as [`finish`] does.
pub fn hostcall(body: impl FnOnce() -> Result<(), HostError>) -> wasmtime::Result<i32> {
    finish(body())
}

/// Registers every hostcall family the harness implements.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    logging::add_to_linker(linker)?;
    time::add_to_linker(linker)?;
    buffers::add_to_linker(linker)?;
    headers::add_to_linker(linker)?;
    stream::add_to_linker(linker)?;
    properties::add_to_linker(linker)?;
    shared_data::add_to_linker(linker)?;
    queues::add_to_linker(linker)?;
    callouts::add_to_linker(linker)?;
    foreign::add_to_linker(linker)?;
    metrics::add_to_linker(linker)?;
    wasi::add_to_linker(linker)?;
    Ok(())
}
