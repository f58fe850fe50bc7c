//! One VM instance per (thread, vm key) and its lifecycle, with the guard rails Envoy's host
//! has: a trap marks the instance failed and every later call into it is skipped, a callback
//! that runs too long is interrupted (epoch deadline), memory growth is capped. The engine and
//! code loading are in [`crate::engine::runtime`].

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{
    Instance, Store, StoreLimits, StoreLimitsBuilder, TypedFunc, WasmParams, WasmResults,
};

use crate::engine::abi::AbiVersion;
use crate::engine::host::{self, logging, ContextKind, HostState, RootInfo, Shared};
use crate::engine::plugin::WasmPlugin;
use crate::engine::runtime::{EPOCH_TICK, MAX_TABLE_ELEMENTS};

mod calls;
pub(crate) mod failure;

pub use calls::CallOutcome;

// What VMs are made from, also named beside them.
#[doc(hidden)]
pub use crate::engine::host::memory::MAX_MEMORY_BYTES;
#[doc(hidden)]
pub use crate::engine::runtime::{
    CodeSource, LoadedModule, Runtime, VmError, DEFAULT_CALLBACK_DEADLINE, MAX_POOLED_INSTANCES,
    POOLED_INSTANCES,
};

/// `proxy_on_http_call_response(root, token, headers, body size, trailers)`.
type CallResponseArgs = (i32, i32, i32, i32, i32);

/// Every export the host calls: the field it is kept in, its name, its signature, and for
/// the stream callbacks that only pass numbers on, the `Vm` method that calls it with the
/// context id first. Looked up once by name and signature; as with cpp-host's wasmtime
/// backend, an export with the wrong signature counts as absent.
macro_rules! exports {
    ($(
        $field:ident = $name:literal: $params:ty => $results:ty
        $(, $(#[$doc:meta])* $vis:vis fn $method:ident($($arg:ident: $ty:ty),*))?;
    )*) => {
        #[derive(Default)]
        struct Exports {
            $($field: Option<TypedFunc<$params, $results>>,)*
        }

        impl Exports {
            fn lookup(instance: &Instance, store: &mut Store<HostState>) -> Self {
                Self {
                    $($field: instance.get_typed_func(&mut *store, $name).ok(),)*
                }
            }
        }

        impl Vm {
            $($(
                $(#[$doc])*
                $vis fn $method(&mut self, ctx: u32, $($arg: $ty),*) -> Option<$results> {
                    self.call($name, |e| e.$field.as_ref(), ctx, (ctx as i32, $($arg as i32),*))
                }
            )?)*
        }
    };
}

exports! {
    on_context_create = "proxy_on_context_create": (i32, i32) => ();
    on_vm_start = "proxy_on_vm_start": (i32, i32) => i32;
    on_configure = "proxy_on_configure": (i32, i32) => i32;
    on_request_headers = "proxy_on_request_headers": (i32, i32, i32) => i32,
        fn request_headers_v0_2(n: usize, eos: bool);
    on_request_headers_v0_1 = "proxy_on_request_headers": (i32, i32) => i32,
        fn request_headers_v0_1(n: usize);
    on_request_body = "proxy_on_request_body": (i32, i32, i32) => i32,
        pub fn on_request_body(size: usize, eos: bool);
    on_request_trailers = "proxy_on_request_trailers": (i32, i32) => i32,
        pub fn on_request_trailers(n: usize);
    on_response_headers = "proxy_on_response_headers": (i32, i32, i32) => i32,
        fn response_headers_v0_2(n: usize, eos: bool);
    on_response_headers_v0_1 = "proxy_on_response_headers": (i32, i32) => i32,
        fn response_headers_v0_1(n: usize);
    on_response_body = "proxy_on_response_body": (i32, i32, i32) => i32,
        pub fn on_response_body(size: usize, eos: bool);
    on_response_trailers = "proxy_on_response_trailers": (i32, i32) => i32,
        pub fn on_response_trailers(n: usize);
    on_new_connection = "proxy_on_new_connection": i32 => i32;
    on_downstream_data = "proxy_on_downstream_data": (i32, i32, i32) => i32,
        pub fn on_downstream_data(size: usize, eos: bool);
    on_upstream_data = "proxy_on_upstream_data": (i32, i32, i32) => i32,
        pub fn on_upstream_data(size: usize, eos: bool);
    on_downstream_connection_close = "proxy_on_downstream_connection_close": (i32, i32) => (),
        /// `peer`: 0 unknown, 1 local, 2 remote.
        pub fn on_downstream_connection_close(peer: i32);
    on_upstream_connection_close = "proxy_on_upstream_connection_close": (i32, i32) => (),
        /// `peer`: 0 unknown, 1 local, 2 remote.
        pub fn on_upstream_connection_close(peer: i32);
    on_log = "proxy_on_log": i32 => ();
    on_done = "proxy_on_done": i32 => i32;
    on_delete = "proxy_on_delete": i32 => ();
    on_tick = "proxy_on_tick": i32 => ();
    on_queue_ready = "proxy_on_queue_ready": (i32, i32) => ();
    on_http_call_response = "proxy_on_http_call_response": CallResponseArgs => ();
    on_grpc_receive = "proxy_on_grpc_receive": (i32, i32, i32) => ();
    on_grpc_close = "proxy_on_grpc_close": (i32, i32, i32) => ();
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
    /// A start function (`_initialize`, `_start`, `main`) trapped: the module's code never
    /// became ready (Envoy: "Failed to initialize Wasm code").
    #[error("plugin {plugin:?}: the module failed to initialize: {message}")]
    Uninitialized { plugin: String, message: String },
}

/// One VM instance: a store, its instance's exports, and whether it has failed.
pub struct Vm {
    store: Store<HostState>,
    exports: Exports,
    abi: AbiVersion,
    /// Whether the module names its functions (a trap's report then has a backtrace).
    names_functions: bool,
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
        let deadline = runtime.callback_deadline;
        // Envoy logs a start function's trap as it logs a callback's (after the lines the
        // guest wrote meanwhile); the canary's refusal follows it.
        let start_err = |name: &'static str, e: wasmtime::Error, store: &Store<HostState>| {
            let line = match e.downcast_ref::<wasmtime::Trap>() {
                Some(wasmtime::Trap::Interrupt) => format!(
                    "Function: {name} failed: {}",
                    describe_start_trap(name, &e, deadline)
                ),
                _ => failure::describe(name, &e, module.names_functions),
            };
            logging::vm_failure(store.data(), line);
            VmError::Start {
                path: module.path.clone(),
                message: describe_start_trap(name, &e, deadline),
            }
        };
        let state = HostState::new(shared, worker, module.abi, plugin, clusters);
        let mut store = Store::new(runtime.engine(), state);
        store.limiter(|s| &mut s.limits);
        let deadline_ticks =
            (runtime.callback_deadline.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64;
        store.set_epoch_deadline(deadline_ticks);
        store.epoch_deadline_trap();
        let instance = module
            .pre
            .instantiate(&mut store)
            .map_err(|e| VmError::Start {
                path: module.path.clone(),
                message: describe_start_trap("instantiation", &e, deadline),
            })?;
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
            let r = init.call(&mut store, ());
            r.map_err(|e| start_err("_initialize", e, &store))?;
            if let Ok(main) = instance.get_typed_func::<(i32, i32), i32>(&mut store, "main") {
                let r = main.call(&mut store, (0, 0));
                r.map_err(|e| start_err("main", e, &store))?;
            } else if let Ok(main) = instance.get_typed_func::<(), i32>(&mut store, "__main_void") {
                let r = main.call(&mut store, ());
                r.map_err(|e| start_err("__main_void", e, &store))?;
            }
        } else if let Ok(start) = instance.get_typed_func::<(), ()>(&mut store, "_start") {
            let r = start.call(&mut store, ());
            r.map_err(|e| start_err("_start", e, &store))?;
        }
        let exports = Exports::lookup(&instance, &mut store);
        Ok(Self {
            store,
            exports,
            abi: module.abi,
            names_functions: module.names_functions,
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
                let line = match e.downcast_ref::<wasmtime::Trap>() {
                    Some(wasmtime::Trap::Interrupt) => format!(
                        "Function: {name} failed: interrupted: the callback ran longer than the harness's deadline of {} (an infinite loop?)",
                        crate::engine::host::time::format_duration(EPOCH_TICK * self.deadline_ticks as u32)
                    ),
                    _ => failure::describe(name, &e, self.names_functions),
                };
                let message = line
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches(&format!("Function: {name} failed: "))
                    .to_string();
                let s = self.store.data();
                let saved = (s.current, s.effective);
                self.store.data_mut().current = ctx;
                logging::vm_failure(self.store.data(), line);
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

    /// A new HTTP stream context under `root` (`proxy_on_context_create(stream, root)`),
    /// on a stream carrying `dynamic_metadata`.
    pub fn create_http_context(
        &mut self,
        root: u32,
        connection: host::Connection,
        dynamic_metadata: Arc<crate::engine::metadata::DynamicMetadata>,
    ) -> u32 {
        let id = self.alloc_context_id();
        self.state_mut().contexts.insert(
            id,
            ContextKind::Http(Box::new(host::HttpStreamState {
                root,
                connection,
                dynamic_metadata,
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

    /// `proxy_on_request_headers` with the arguments of the module's ABI version.
    pub fn on_request_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Option<i32> {
        match self.abi {
            AbiVersion::V0_1_0 => self.request_headers_v0_1(ctx, n),
            _ => self.request_headers_v0_2(ctx, n, eos),
        }
    }

    /// `proxy_on_response_headers` with the arguments of the module's ABI version.
    pub fn on_response_headers(&mut self, ctx: u32, n: usize, eos: bool) -> Option<i32> {
        match self.abi {
            AbiVersion::V0_1_0 => self.response_headers_v0_1(ctx, n),
            _ => self.response_headers_v0_2(ctx, n, eos),
        }
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

    /// Envoy's stream end for HTTP: `on_log` (with `log`'s maps, read-only), `on_done`,
    /// `on_delete`, then the context is gone.
    pub fn finish_stream(&mut self, ctx: u32, log: host::AccessLogMaps) {
        if let Some(ContextKind::Http(s)) = self.state_mut().contexts.get_mut(&ctx) {
            s.access_log = Some(log);
        }
        self.call("proxy_on_log", |e| e.on_log.as_ref(), ctx, ctx as i32);
        if let Some(ContextKind::Http(s)) = self.state_mut().contexts.get_mut(&ctx) {
            s.access_log = None;
        }
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
            self.finish_root(root);
        }
        self.state().pending_done.clone()
    }

    /// One root's end, as [`Vm::shutdown`] ends each (also when Envoy releases a filter
    /// configuration an ECDS update replaced): `proxy_on_done(root)`, then `proxy_on_delete`
    /// unless it answered false.
    pub fn finish_root(&mut self, root: u32) {
        match self.call("proxy_on_done", |e| e.on_done.as_ref(), root, root as i32) {
            Some(0) => self.state_mut().pending_done.push(root),
            _ => self.delete_root(root),
        }
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

    pub fn http_state(&mut self, ctx: u32) -> Option<&mut host::HttpStreamState> {
        match self.state_mut().contexts.get_mut(&ctx)? {
            ContextKind::Http(s) => Some(s),
            _ => None,
        }
    }
}

/// Why a start function failed; an interrupt names the function and the deadline it ran past
/// (a start function gets the same per-call deadline as a callback).
fn describe_start_trap(name: &str, e: &wasmtime::Error, deadline: Duration) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => format!(
            "{name} was interrupted: it ran longer than the harness's deadline of {} for one call into the VM (an infinite loop at start-up?)",
            crate::engine::host::time::format_duration(deadline)
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
    use std::path::Path;

    fn plugin(code: &Path) -> WasmPlugin {
        WasmPlugin {
            name: "p".into(),
            root_id: String::new(),
            vm_id: String::new(),
            runtime: crate::engine::precompiled_section::WASMTIME_RUNTIME.into(),
            code: code.to_path_buf(),
            vm_configuration: Vec::new(),
            configuration: Vec::new(),
            failure_policy: crate::engine::plugin::FailurePolicy::FailClosed,
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
