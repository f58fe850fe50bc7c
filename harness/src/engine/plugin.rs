//! What a Wasm plugin asks of the engine: its code, the VM it shares and the configuration
//! its root context reads, as Envoy's `PluginConfig` gives them (the emulated Envoy reads
//! them from the bootstrap).

use std::path::PathBuf;

/// Where the failed-VM policy sends traffic (`fail_open` / `failure_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    FailClosed,
    FailOpen,
    FailReload,
}

/// One `PluginConfig`: what Envoy needs to create (or share) a VM and a root context.
#[derive(Debug, Clone)]
pub struct WasmPlugin {
    pub name: String,
    pub root_id: String,
    pub vm_id: String,
    pub runtime: String,
    pub code: PathBuf,
    pub vm_configuration: Vec<u8>,
    pub configuration: Vec<u8>,
    pub failure_policy: FailurePolicy,
    pub environment: Vec<(String, String)>,
    /// `vm_config.allow_precompiled`: load code precompiled into the module (see
    /// [`super::precompiled_section`]).
    pub allow_precompiled: bool,
}
