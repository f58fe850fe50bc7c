//! One wasmtime engine per host, one VM instance per (worker, vm key), and the guard rails
//! Envoy's host has: a trap marks the instance failed and every later call into it is skipped,
//! a callback that runs too long is interrupted (epoch deadline), memory growth is capped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{
    Engine, Instance, InstancePre, Linker, Module, Store, StoreLimits, StoreLimitsBuilder,
    TypedFunc, WasmParams, WasmResults,
};

use crate::abi::{AbiVersion, LogLevel, Status};
use crate::bootstrap::WasmPlugin;
use crate::compiled::CompiledCache;
use crate::host::{self, logging, ContextKind, HostState, RootInfo, Shared};
use crate::precompiled;

/// How often the epoch ticks; deadlines are whole ticks.
const EPOCH_TICK: Duration = Duration::from_millis(10);
pub use crate::host::memory::MAX_MEMORY_BYTES;
/// The most elements a VM's table may have, as the pooling allocator's default allows. The
/// same limit holds when instances are allocated on demand: otherwise one `table.grow` and
/// `table.fill` (a single instruction, which no deadline interrupts) would have the host
/// write gigabytes.
pub const MAX_TABLE_ELEMENTS: usize = 20_000;
/// Default time one callback may run before the harness interrupts it. Envoy has no such
/// limit (a looping guest hangs its worker); the harness reports it instead of hanging.
pub const DEFAULT_CALLBACK_DEADLINE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot read Wasm module {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Wasm module {path} is not a Wasm binary (it does not begin with \"\\0asm\"); only a file named *.wat is read as WebAssembly text")]
    NotWasm { path: PathBuf },
    #[error("Wasm module {path} failed to compile: {message}")]
    Compile { path: PathBuf, message: String },
    #[error("Wasm module {path}: Missing or unknown Proxy-Wasm ABI version (no proxy_abi_version_* export)")]
    NoAbiVersion { path: PathBuf },
    #[error("Wasm module {path} failed to link: {message}")]
    Link { path: PathBuf, message: String },
    #[error("Wasm module {path} failed to start: {message}")]
    Start { path: PathBuf, message: String },
    #[error(
        "Wasm module {path} is missing malloc function (export malloc or proxy_on_memory_allocate)"
    )]
    NoAllocator { path: PathBuf },
}

/// Instances a runtime's pool holds at least (canary + workers, times distinct VMs, plus
/// restarts). Each slot reserves address space, not memory.
pub const POOLED_INSTANCES: usize = 128;

/// Beyond this many instances the runtime allocates each instance on demand instead of
/// reserving slots for all of them up front (a few TiB of address space).
pub const MAX_POOLED_INSTANCES: usize = 1024;

/// The engine, the linker with every hostcall, and the thread that advances the epoch.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    pub callback_deadline: Duration,
    /// Compiled modules on disk (see [`crate::compiled`]); `None` compiles in memory.
    pub compiled: Option<CompiledCache>,
}

/// `pool`: how many instances the pooling allocator holds; `None` allocates on demand.
fn engine_config(pool: Option<u32>) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    if let Some(slots) = pool {
        // Instances come from preallocated slots, so starting a worker VM costs no mmap:
        // that is most of what makes a VM start take microseconds, not milliseconds.
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_core_instances(slots)
            .total_memories(slots)
            .total_tables(slots)
            .max_memory_size(MAX_MEMORY_BYTES)
            .table_elements(MAX_TABLE_ELEMENTS);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

impl Runtime {
    /// A runtime with the pooling allocator (falling back to on-demand allocation where the
    /// address space cannot be reserved) and the compiled-code cache of
    /// [`CompiledCache::default_dir`] when that directory is safe to use.
    pub fn new() -> wasmtime::Result<Self> {
        Self::with_capacity(POOLED_INSTANCES)
    }

    /// A runtime for `instances` VM instances alive at once: pooled up to
    /// [`MAX_POOLED_INSTANCES`], allocated on demand beyond, so no number of workers runs out
    /// of slots.
    pub fn with_capacity(instances: usize) -> wasmtime::Result<Self> {
        let slots = instances.max(POOLED_INSTANCES);
        let pool = u32::try_from(slots)
            .ok()
            .filter(|_| slots <= MAX_POOLED_INSTANCES);
        if pool.is_none() {
            tracing::info!(
                "{instances} VM instances: more than the {MAX_POOLED_INSTANCES} the pooling allocator holds; allocating on demand"
            );
        }
        let engine = Engine::new(&engine_config(pool)).or_else(|e| {
            tracing::warn!("pooling allocator unavailable ({e:#}); allocating on demand");
            Engine::new(&engine_config(None))
        })?;
        let compiled = CompiledCache::default_dir().and_then(|dir| {
            CompiledCache::open(&dir)
                .map_err(|e| tracing::warn!("{e}; compiling in memory"))
                .ok()
        });
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("wasm-harness-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })?;
        let mut linker = Linker::new(&engine);
        host::add_to_linker(&mut linker)?;
        Ok(Self {
            engine,
            linker,
            callback_deadline: DEFAULT_CALLBACK_DEADLINE,
            compiled,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles (or finds compiled) the module at `path`. With a `precompiled` section name
    /// (see [`precompiled::section_for`]), code precompiled into that section of the module
    /// is used when it loads, as cpp-host does.
    pub fn load(
        &self,
        path: &Path,
        precompiled: Option<&str>,
    ) -> Result<Arc<LoadedModule>, VmError> {
        let bytes = crate::input::read(path, crate::input::MAX_MODULE_BYTES).map_err(|source| {
            VmError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let is_text = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("wat"));
        if !is_text && !bytes.starts_with(b"\0asm") {
            return Err(VmError::NotWasm {
                path: path.to_path_buf(),
            });
        }
        let compile_error = |e: wasmtime::Error| VmError::Compile {
            path: path.to_path_buf(),
            message: format!("{e:#}"),
        };
        let precompiled = match precompiled {
            Some(section) => self.load_precompiled(path, &bytes, section)?,
            None => None,
        };
        let (module, code) = match precompiled {
            Some(m) => (m, CodeSource::Precompiled),
            None => match &self.compiled {
                Some(cache) => {
                    let (m, origin) = cache
                        .load_or_compile(&self.engine, &bytes)
                        .map_err(compile_error)?;
                    let code = match origin {
                        crate::compiled::Origin::Cached => CodeSource::Cache,
                        crate::compiled::Origin::Compiled => CodeSource::Compiled,
                    };
                    (m, code)
                }
                None => (
                    Module::new(&self.engine, &bytes).map_err(compile_error)?,
                    CodeSource::Compiled,
                ),
            },
        };
        let abi = AbiVersion::detect(
            module
                .exports()
                .filter(|e| e.ty().func().is_some())
                .map(|e| e.name()),
        )
        .ok_or_else(|| VmError::NoAbiVersion {
            path: path.to_path_buf(),
        })?;
        if let Some(import) = module
            .imports()
            .find(|i| i.module() == "env" && !abi.links_import(i.name()))
        {
            return Err(VmError::Link {
                path: path.to_path_buf(),
                message: format!(
                    "import env.{} is not part of Proxy-Wasm ABI {} (Envoy does not link it for this module)",
                    import.name(),
                    abi.as_str()
                ),
            });
        }
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| VmError::Link {
                path: path.to_path_buf(),
                message: format!("{e:#}"),
            })?;
        Ok(Arc::new(LoadedModule {
            path: path.to_path_buf(),
            abi,
            code,
            pre,
        }))
    }

    /// The module from its section `name`, or `None` (no section, or code another wasmtime
    /// or other settings made: then the bytecode is compiled, as in cpp-host).
    fn load_precompiled(
        &self,
        path: &Path,
        bytes: &[u8],
        name: &str,
    ) -> Result<Option<Module>, VmError> {
        let section = precompiled::find_section(bytes, name).map_err(|e| VmError::Compile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let Some(code) = section else {
            return Ok(None);
        };
        // SAFETY: this is what `allow_precompiled` means in Envoy: the operator trusts the
        // module's precompiled code (see `crate::precompiled`). wasmtime checks the header,
        // version and engine settings before using it.
        match unsafe { Module::deserialize(&self.engine, code) } {
            Ok(m) => Ok(Some(m)),
            Err(e) => {
                tracing::warn!(path = %path.display(), "section {name} does not load here, compiling the bytecode: {e:#}");
                Ok(None)
            }
        }
    }
}

/// Where a module's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeSource {
    /// The module's own `precompiled_wasmtime_*` section (`allow_precompiled`).
    Precompiled,
    /// The harness's compiled-code cache.
    Cache,
    /// Compiled from the bytecode now.
    Compiled,
}

pub struct LoadedModule {
    pub path: PathBuf,
    pub abi: AbiVersion,
    pub code: CodeSource,
    pre: InstancePre<HostState>,
}

/// `proxy_on_http_call_response(root, token, headers, body size, trailers)`.
type CallResponseArgs = (i32, i32, i32, i32, i32);

/// The exports the host calls, looked up once by name and signature. As with cpp-host's
/// wasmtime backend, an export with the wrong signature counts as absent.
#[derive(Default)]
struct Exports {
    on_context_create: Option<TypedFunc<(i32, i32), ()>>,
    on_vm_start: Option<TypedFunc<(i32, i32), i32>>,
    on_configure: Option<TypedFunc<(i32, i32), i32>>,
    on_request_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    on_request_headers_v010: Option<TypedFunc<(i32, i32), i32>>,
    on_request_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    on_response_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    on_response_headers_v010: Option<TypedFunc<(i32, i32), i32>>,
    on_response_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    on_request_trailers: Option<TypedFunc<(i32, i32), i32>>,
    on_new_connection: Option<TypedFunc<i32, i32>>,
    on_downstream_data: Option<TypedFunc<(i32, i32, i32), i32>>,
    on_upstream_data: Option<TypedFunc<(i32, i32, i32), i32>>,
    on_downstream_connection_close: Option<TypedFunc<(i32, i32), ()>>,
    on_upstream_connection_close: Option<TypedFunc<(i32, i32), ()>>,
    on_response_trailers: Option<TypedFunc<(i32, i32), i32>>,
    on_log: Option<TypedFunc<i32, ()>>,
    on_done: Option<TypedFunc<i32, i32>>,
    on_delete: Option<TypedFunc<i32, ()>>,
    on_tick: Option<TypedFunc<i32, ()>>,
    on_queue_ready: Option<TypedFunc<(i32, i32), ()>>,
    on_http_call_response: Option<TypedFunc<CallResponseArgs, ()>>,
    on_grpc_receive: Option<TypedFunc<(i32, i32, i32), ()>>,
    on_grpc_close: Option<TypedFunc<(i32, i32, i32), ()>>,
}

impl Exports {
    fn lookup(instance: &Instance, store: &mut Store<HostState>) -> Self {
        macro_rules! get {
            ($name:literal) => {
                instance.get_typed_func(&mut *store, $name).ok()
            };
        }
        Self {
            on_context_create: get!("proxy_on_context_create"),
            on_vm_start: get!("proxy_on_vm_start"),
            on_configure: get!("proxy_on_configure"),
            on_request_headers: get!("proxy_on_request_headers"),
            on_request_headers_v010: get!("proxy_on_request_headers"),
            on_request_body: get!("proxy_on_request_body"),
            on_response_headers: get!("proxy_on_response_headers"),
            on_response_headers_v010: get!("proxy_on_response_headers"),
            on_response_body: get!("proxy_on_response_body"),
            on_request_trailers: get!("proxy_on_request_trailers"),
            on_new_connection: get!("proxy_on_new_connection"),
            on_downstream_data: get!("proxy_on_downstream_data"),
            on_upstream_data: get!("proxy_on_upstream_data"),
            on_downstream_connection_close: get!("proxy_on_downstream_connection_close"),
            on_upstream_connection_close: get!("proxy_on_upstream_connection_close"),
            on_response_trailers: get!("proxy_on_response_trailers"),
            on_log: get!("proxy_on_log"),
            on_done: get!("proxy_on_done"),
            on_delete: get!("proxy_on_delete"),
            on_tick: get!("proxy_on_tick"),
            on_queue_ready: get!("proxy_on_queue_ready"),
            on_http_call_response: get!("proxy_on_http_call_response"),
            on_grpc_receive: get!("proxy_on_grpc_receive"),
            on_grpc_close: get!("proxy_on_grpc_close"),
        }
    }
}

/// Why a plugin did not start on a VM; Envoy rejects the configuration for each.
#[derive(Debug, thiserror::Error)]
pub enum PluginStartError {
    #[error("plugin {plugin:?}: proxy_on_vm_start returned false")]
    VmStartFailed { plugin: String },
    #[error("plugin {plugin:?}: proxy_on_configure returned false (the plugin rejected its configuration)")]
    ConfigureFailed { plugin: String },
    #[error("plugin {plugin:?}: the VM trapped while starting: {message}")]
    Trapped { plugin: String, message: String },
}

/// One VM instance: a store, its instance's exports, and whether it has failed.
pub struct Vm {
    store: Store<HostState>,
    exports: Exports,
    abi: AbiVersion,
    next_context_id: u32,
    deadline_ticks: u64,
    /// Set by the first trap; every later call into this instance is skipped, as in Envoy.
    pub failed: Option<String>,
}

impl Vm {
    /// Instantiates the module and runs its start functions the way cpp-host does
    /// (`_initialize`, then `main(0, 0)` or `__main_void`; `_start` only without `_initialize`).
    pub fn start(
        runtime: &Runtime,
        module: &LoadedModule,
        shared: Arc<Shared>,
        worker: Option<usize>,
        plugin: &WasmPlugin,
        clusters: Arc<Vec<String>>,
    ) -> Result<Self, VmError> {
        let start_err = |name: &'static str| {
            let deadline = runtime.callback_deadline;
            move |e: wasmtime::Error| VmError::Start {
                path: module.path.clone(),
                message: describe_start_trap(name, &e, deadline),
            }
        };
        let state = HostState::new(shared, worker, module.abi, plugin, clusters);
        let mut store = Store::new(&runtime.engine, state);
        store.limiter(|s| &mut s.limits);
        let deadline_ticks =
            (runtime.callback_deadline.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64;
        store.set_epoch_deadline(deadline_ticks);
        store.epoch_deadline_trap();
        let instance = module
            .pre
            .instantiate(&mut store)
            .map_err(start_err("instantiation"))?;
        let memory = instance.get_memory(&mut store, "memory");
        let allocator = instance
            .get_typed_func::<i32, i32>(&mut store, "malloc")
            .or_else(|_| {
                instance.get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            })
            .map_err(|_| VmError::NoAllocator {
                path: module.path.clone(),
            })?;
        store.data_mut().memory = memory;
        store.data_mut().allocator = Some(allocator);
        if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
            init.call(&mut store, ())
                .map_err(start_err("_initialize"))?;
            if let Ok(main) = instance.get_typed_func::<(i32, i32), i32>(&mut store, "main") {
                main.call(&mut store, (0, 0)).map_err(start_err("main"))?;
            } else if let Ok(main) = instance.get_typed_func::<(), i32>(&mut store, "__main_void") {
                main.call(&mut store, ())
                    .map_err(start_err("__main_void"))?;
            }
        } else if let Ok(start) = instance.get_typed_func::<(), ()>(&mut store, "_start") {
            start.call(&mut store, ()).map_err(start_err("_start"))?;
        }
        let exports = Exports::lookup(&instance, &mut store);
        Ok(Self {
            store,
            exports,
            abi: module.abi,
            next_context_id: 1,
            deadline_ticks,
            failed: None,
        })
    }

    pub fn state(&self) -> &HostState {
        self.store.data()
    }

    pub fn state_mut(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    fn alloc_context_id(&mut self) -> u32 {
        let id = self.next_context_id;
        self.next_context_id += 1;
        id
    }

    /// Calls one export on behalf of context `ctx`. Returns `None` when the export is absent,
    /// the VM has already failed, or the call trapped (which fails the VM and logs the trap
    /// as Envoy does: `Function: <name> failed: <message>`).
    fn call<P: WasmParams, R: WasmResults>(
        &mut self,
        name: &str,
        pick: for<'e> fn(&'e Exports) -> Option<&'e TypedFunc<P, R>>,
        ctx: u32,
        args: P,
    ) -> Option<R> {
        if self.failed.is_some() {
            return None;
        }
        // Borrowed, not cloned: a TypedFunc clone costs type-registry reference counting on
        // every callback.
        let func = pick(&self.exports)?;
        let (prev_current, prev_effective) = {
            let s = self.store.data_mut();
            let prev = (s.current, s.effective);
            s.current = ctx;
            s.effective = None;
            prev
        };
        self.store.set_epoch_deadline(self.deadline_ticks);
        let result = func.call(&mut self.store, args);
        let s = self.store.data_mut();
        s.current = prev_current;
        s.effective = prev_effective;
        match result {
            Ok(r) => {
                // Roots that called proxy_done during the call are deleted after it.
                for root in std::mem::take(&mut self.store.data_mut().done_now) {
                    self.delete_root(root);
                }
                Some(r)
            }
            Err(e) => {
                let message = match e.downcast_ref::<wasmtime::Trap>() {
                    Some(wasmtime::Trap::Interrupt) => format!(
                        "interrupted: the callback ran longer than the harness's deadline of {} (an infinite loop?)",
                        crate::host::time::format_duration(EPOCH_TICK * self.deadline_ticks as u32)
                    ),
                    _ => describe_trap(&e),
                };
                let s = self.store.data();
                let saved = (s.current, s.effective);
                self.store.data_mut().current = ctx;
                logging::record(
                    self.store.data(),
                    LogLevel::Critical,
                    format!("Function: {name} failed: {message}"),
                );
                self.store.data_mut().current = saved.0;
                self.failed = Some(format!("{name}: {message}"));
                None
            }
        }
    }

    /// Creates the plugin's root context and runs `on_context_create`, `on_vm_start` and
    /// `on_configure` on it (cpp-host's `WasmBase::start` + `configure`).
    pub fn start_plugin(&mut self, plugin: Arc<WasmPlugin>) -> Result<u32, PluginStartError> {
        let id = self.alloc_context_id();
        let name = plugin.name.clone();
        let vm_config_len = self.state().vm_configuration.len() as i32;
        let config_len = plugin.configuration.len() as i32;
        self.state_mut()
            .contexts
            .insert(id, ContextKind::Root(RootInfo { plugin }));
        let trapped = |vm: &Self| PluginStartError::Trapped {
            plugin: name.clone(),
            message: vm.failed.clone().unwrap_or_default(),
        };
        self.call(
            "proxy_on_context_create",
            |e| e.on_context_create.as_ref(),
            id,
            (id as i32, 0),
        );
        if self.failed.is_some() {
            return Err(trapped(self));
        }
        let started = self.call(
            "proxy_on_vm_start",
            |e| e.on_vm_start.as_ref(),
            id,
            (id as i32, vm_config_len),
        );
        if self.failed.is_some() {
            return Err(trapped(self));
        }
        if started == Some(0) {
            return Err(PluginStartError::VmStartFailed { plugin: name });
        }
        self.state_mut().configuring = Some(id);
        let configured = self.call(
            "proxy_on_configure",
            |e| e.on_configure.as_ref(),
            id,
            (id as i32, config_len),
        );
        self.state_mut().configuring = None;
        if self.failed.is_some() {
            return Err(trapped(self));
        }
        if configured == Some(0) {
            return Err(PluginStartError::ConfigureFailed { plugin: name });
        }
        Ok(id)
    }

    /// A new HTTP stream context under `root` (`proxy_on_context_create(stream, root)`).
    pub fn create_http_context(&mut self, root: u32, connection: host::Connection) -> u32 {
        let id = self.alloc_context_id();
        self.state_mut().contexts.insert(
            id,
            ContextKind::Http(Box::new(host::HttpStreamState {
                root,
                connection,
                ..Default::default()
            })),
        );
        self.call(
            "proxy_on_context_create",
            |e| e.on_context_create.as_ref(),
            id,
            (id as i32, root as i32),
        );
        id
    }

    pub fn on_request_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Option<i32> {
        if self.abi == AbiVersion::V0_1_0 {
            return self.call(
                "proxy_on_request_headers",
                |e| e.on_request_headers_v010.as_ref(),
                ctx,
                (ctx as i32, n as i32),
            );
        }
        self.call(
            "proxy_on_request_headers",
            |e| e.on_request_headers.as_ref(),
            ctx,
            (ctx as i32, n as i32, eos as i32),
        )
    }

    pub fn on_request_body(&mut self, ctx: u32, size: usize, eos: bool) -> Option<i32> {
        self.call(
            "proxy_on_request_body",
            |e| e.on_request_body.as_ref(),
            ctx,
            (ctx as i32, size as i32, eos as i32),
        )
    }

    pub fn on_response_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Option<i32> {
        if self.abi == AbiVersion::V0_1_0 {
            return self.call(
                "proxy_on_response_headers",
                |e| e.on_response_headers_v010.as_ref(),
                ctx,
                (ctx as i32, n as i32),
            );
        }
        self.call(
            "proxy_on_response_headers",
            |e| e.on_response_headers.as_ref(),
            ctx,
            (ctx as i32, n as i32, eos as i32),
        )
    }

    pub fn on_response_body(&mut self, ctx: u32, size: usize, eos: bool) -> Option<i32> {
        self.call(
            "proxy_on_response_body",
            |e| e.on_response_body.as_ref(),
            ctx,
            (ctx as i32, size as i32, eos as i32),
        )
    }

    pub fn on_request_trailers(&mut self, ctx: u32, n: usize) -> Option<i32> {
        self.call(
            "proxy_on_request_trailers",
            |e| e.on_request_trailers.as_ref(),
            ctx,
            (ctx as i32, n as i32),
        )
    }

    pub fn on_response_trailers(&mut self, ctx: u32, n: usize) -> Option<i32> {
        self.call(
            "proxy_on_response_trailers",
            |e| e.on_response_trailers.as_ref(),
            ctx,
            (ctx as i32, n as i32),
        )
    }

    /// A new TCP connection context under `root`: `proxy_on_context_create(ctx, root)`, then
    /// `proxy_on_new_connection(ctx)`, whose result is returned.
    pub fn create_tcp_context(
        &mut self,
        root: u32,
        connection: host::Connection,
    ) -> (u32, Option<i32>) {
        let id = self.alloc_context_id();
        self.state_mut().contexts.insert(
            id,
            ContextKind::Tcp(Box::new(host::TcpStreamState {
                root,
                connection,
                ..Default::default()
            })),
        );
        self.call(
            "proxy_on_context_create",
            |e| e.on_context_create.as_ref(),
            id,
            (id as i32, root as i32),
        );
        let r = self.call(
            "proxy_on_new_connection",
            |e| e.on_new_connection.as_ref(),
            id,
            id as i32,
        );
        (id, r)
    }

    pub fn on_downstream_data(&mut self, ctx: u32, size: usize, eos: bool) -> Option<i32> {
        let args = (ctx as i32, size as i32, eos as i32);
        self.call(
            "proxy_on_downstream_data",
            |e| e.on_downstream_data.as_ref(),
            ctx,
            args,
        )
    }

    pub fn on_upstream_data(&mut self, ctx: u32, size: usize, eos: bool) -> Option<i32> {
        let args = (ctx as i32, size as i32, eos as i32);
        self.call(
            "proxy_on_upstream_data",
            |e| e.on_upstream_data.as_ref(),
            ctx,
            args,
        )
    }

    /// `peer`: 0 unknown, 1 local, 2 remote.
    pub fn on_downstream_connection_close(&mut self, ctx: u32, peer: i32) {
        self.call(
            "proxy_on_downstream_connection_close",
            |e| e.on_downstream_connection_close.as_ref(),
            ctx,
            (ctx as i32, peer),
        );
    }

    pub fn on_upstream_connection_close(&mut self, ctx: u32, peer: i32) {
        self.call(
            "proxy_on_upstream_connection_close",
            |e| e.on_upstream_connection_close.as_ref(),
            ctx,
            (ctx as i32, peer),
        );
    }

    /// Envoy's end of a TCP context (`onCloseTCP`): `on_done`, `on_log`, `on_delete`, in that
    /// order (unlike HTTP streams).
    pub fn finish_tcp(&mut self, ctx: u32) {
        self.call("proxy_on_done", |e| e.on_done.as_ref(), ctx, ctx as i32);
        self.call("proxy_on_log", |e| e.on_log.as_ref(), ctx, ctx as i32);
        self.call("proxy_on_delete", |e| e.on_delete.as_ref(), ctx, ctx as i32);
        self.state_mut().contexts.remove(&ctx);
    }

    pub fn tcp_state(&mut self, ctx: u32) -> Option<&mut host::TcpStreamState> {
        match self.state_mut().contexts.get_mut(&ctx)? {
            ContextKind::Tcp(s) => Some(s),
            _ => None,
        }
    }

    /// Envoy's stream end for HTTP: `on_log`, `on_done`, `on_delete`, then the context is gone.
    pub fn finish_stream(&mut self, ctx: u32) {
        self.call("proxy_on_log", |e| e.on_log.as_ref(), ctx, ctx as i32);
        self.call("proxy_on_done", |e| e.on_done.as_ref(), ctx, ctx as i32);
        self.call("proxy_on_delete", |e| e.on_delete.as_ref(), ctx, ctx as i32);
        self.state_mut().contexts.remove(&ctx);
    }

    /// Envoy's shutdown of this VM's roots (cpp-host `startShutdown`, when Envoy exits or
    /// the plugin is removed), in creation order: `proxy_on_done(root)`; a true (or absent
    /// export) is followed by `proxy_on_delete(root)` at once, a false leaves the root
    /// pending until it calls `proxy_done`. Returns the roots left pending.
    pub fn shutdown(&mut self) -> Vec<u32> {
        let mut roots: Vec<u32> = self
            .state()
            .contexts
            .iter()
            .filter(|(_, c)| matches!(c, ContextKind::Root(_)))
            .map(|(&id, _)| id)
            .collect();
        roots.sort_unstable();
        for root in roots {
            match self.call("proxy_on_done", |e| e.on_done.as_ref(), root, root as i32) {
                Some(0) => self.state_mut().pending_done.push(root),
                _ => self.delete_root(root),
            }
        }
        self.state().pending_done.clone()
    }

    /// Roots still waiting to call `proxy_done`.
    pub fn pending_done(&self) -> &[u32] {
        &self.state().pending_done
    }

    fn delete_root(&mut self, root: u32) {
        self.call(
            "proxy_on_delete",
            |e| e.on_delete.as_ref(),
            root,
            root as i32,
        );
        let state = self.state_mut();
        state.contexts.remove(&root);
        state.timers.remove(&root);
    }

    /// Whether `id` is a live root context of this VM.
    pub fn is_root(&self, id: u32) -> bool {
        matches!(self.state().contexts.get(&id), Some(ContextKind::Root(_)))
    }

    /// Whether the module exports `proxy_on_tick` (without it Envoy never re-arms a timer).
    pub fn has_on_tick(&self) -> bool {
        self.exports.on_tick.is_some()
    }

    /// `proxy_on_tick(root)`; skipped if the VM failed or `root` is not a live root context.
    pub fn on_tick(&mut self, root: u32) {
        if self.is_root(root) {
            self.call("proxy_on_tick", |e| e.on_tick.as_ref(), root, root as i32);
        }
    }

    /// `proxy_on_queue_ready(root, token)`; skipped as Envoy skips it: the VM failed, or
    /// `root` is not a live root context.
    pub fn on_queue_ready(&mut self, root: u32, token: u32) {
        if self.is_root(root) {
            self.call(
                "proxy_on_queue_ready",
                |e| e.on_queue_ready.as_ref(),
                root,
                (root as i32, token as i32),
            );
        }
    }

    /// Answers callout `token` on the root that owns it, as Envoy's `onHttpCallSuccess` /
    /// `onHttpCallFailure` and gRPC `onSuccess` / `onFailure` do. Skipped when the call was
    /// cancelled, the root is gone or the VM failed. Returns whether the guest was called.
    pub fn complete_call(&mut self, token: u32, outcome: CallOutcome) -> bool {
        let Some(root) = self.state_mut().callouts.in_flight.remove(&token) else {
            return false;
        };
        if !self.is_root(root) || self.failed.is_some() {
            return false;
        }
        let readable = |body, headers, trailers| {
            Some(host::callouts::CallResponse {
                root,
                headers,
                body,
                trailers,
            })
        };
        match outcome {
            CallOutcome::Http(r) => {
                let args = (
                    root as i32,
                    token as i32,
                    r.headers.len() as i32,
                    r.body.len() as i32,
                    r.trailers.len() as i32,
                );
                self.state_mut().callouts.response = readable(r.body, r.headers, r.trailers);
                self.call(
                    "proxy_on_http_call_response",
                    |e| e.on_http_call_response.as_ref(),
                    root,
                    args,
                );
            }
            CallOutcome::HttpReset => {
                let reset = (Status::BrokenConnection.code() as u32, b"reset".to_vec());
                self.state_mut().callouts.status.insert(root, reset);
                let args = (root as i32, token as i32, 0, 0, 0);
                self.call(
                    "proxy_on_http_call_response",
                    |e| e.on_http_call_response.as_ref(),
                    root,
                    args,
                );
            }
            CallOutcome::GrpcMessage(message) => {
                let args = (root as i32, token as i32, message.len() as i32);
                self.state_mut().callouts.response = readable(message, Vec::new(), Vec::new());
                self.call(
                    "proxy_on_grpc_receive",
                    |e| e.on_grpc_receive.as_ref(),
                    root,
                    args,
                );
            }
            CallOutcome::GrpcClose { status, message } => {
                let closed = (status, message.into_bytes());
                self.state_mut().callouts.status.insert(root, closed);
                let args = (root as i32, token as i32, status as i32);
                self.call(
                    "proxy_on_grpc_close",
                    |e| e.on_grpc_close.as_ref(),
                    root,
                    args,
                );
            }
        }
        self.state_mut().callouts.response = None;
        true
    }

    pub fn http_state(&mut self, ctx: u32) -> Option<&mut host::HttpStreamState> {
        match self.state_mut().contexts.get_mut(&ctx)? {
            ContextKind::Http(s) => Some(s),
            _ => None,
        }
    }
}

/// How a callout ended, as the owning root is told.
#[derive(Debug, Clone)]
pub enum CallOutcome {
    /// A response (an upstream's, or one Envoy's router made up: 503, 504).
    Http(host::callouts::CallResponse),
    /// The stream was reset before a response: `(root, token, 0, 0, 0)`, status 11 "reset".
    HttpReset,
    /// A unary gRPC call's reply message (an implied OK; no close follows).
    GrpcMessage(Vec<u8>),
    /// A unary gRPC call that failed with this gRPC status.
    GrpcClose { status: u32, message: String },
}

/// Why a start function failed; an interrupt names the function and the deadline it ran past
/// (a start function gets the same per-call deadline as a callback).
fn describe_start_trap(name: &str, e: &wasmtime::Error, deadline: Duration) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => format!(
            "{name} was interrupted: it ran longer than the harness's deadline of {} for one call into the VM (an infinite loop at start-up?)",
            crate::host::time::format_duration(deadline)
        ),
        _ => format!("{name}: {}", describe_trap(e)),
    }
}

/// A trap's message as a user needs it: the cause first, then the guest backtrace if any
/// (an interrupt is worded by the caller, which knows the deadline).
fn describe_trap(e: &wasmtime::Error) -> String {
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        if *trap == wasmtime::Trap::UnreachableCodeReached {
            return "unreachable (the guest panicked or aborted)".into();
        }
    }
    format!("{e:#}").replace('\n', " ")
}

impl HostState {
    /// What a VM may allocate, whichever way its instance is allocated: one instance with
    /// one memory and one table (as the pooling allocator holds them), each within its cap.
    pub fn default_limits() -> StoreLimits {
        StoreLimitsBuilder::new()
            .memory_size(MAX_MEMORY_BYTES)
            .table_elements(MAX_TABLE_ELEMENTS)
            .instances(1)
            .memories(1)
            .tables(1)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(code: &Path) -> WasmPlugin {
        WasmPlugin {
            name: "p".into(),
            root_id: String::new(),
            vm_id: String::new(),
            runtime: crate::precompiled::WASMTIME_RUNTIME.into(),
            code: code.to_path_buf(),
            vm_configuration: Vec::new(),
            configuration: Vec::new(),
            failure_policy: crate::bootstrap::FailurePolicy::FailClosed,
            environment: Vec::new(),
            allow_precompiled: false,
        }
    }

    /// Starts `guest` (in testdata/guests) on a runtime that allocates on demand, as one with
    /// more instances than the pool holds does.
    fn start_on_demand(guest: &str) -> Result<Vm, VmError> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/guests")
            .join(guest);
        let runtime = Runtime::with_capacity(MAX_POOLED_INSTANCES + 1).unwrap();
        let module = runtime.load(&path, None)?;
        Vm::start(
            &runtime,
            &module,
            Arc::new(Shared::default()),
            Some(0),
            &plugin(&path),
            Arc::new(Vec::new()),
        )
    }

    #[test]
    fn instances_allocated_on_demand_keep_the_pools_table_and_memory_limits() {
        let e = start_on_demand("table-bomb.wat").err().expect("a refusal");
        assert!(
            e.to_string()
                .contains("table minimum size of 100000000 elements exceeds table limits"),
            "{e}"
        );
        assert!(start_on_demand("counter.wat").is_ok());
    }
}
