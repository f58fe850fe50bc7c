//! The roles' Envoy counters, named by [`crate::metrics::metric_name`] as the Wasm module's
//! are, so one `stats_tags` pair takes the plugin and the role out of either (Envoy puts a
//! dynamic module's under `dynamic_module_config.metrics_namespace`, `dynamicmodulescustom`
//! by default, where the Wasm module's are under `wasmcustom`). A counter Envoy refuses to
//! define is logged and not counted; the filter goes on.

use std::ffi::c_void;

use super::abi::{self, ModuleBuffer};
use super::host::log;

/// Which of Envoy's filter kinds defines and counts.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Http,
    Network,
}

/// One counter of a filter configuration; no id when Envoy refused it.
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    id: Option<usize>,
    kind: Kind,
}

impl Counter {
    /// Adds `by` through the filter Envoy runs the hook for.
    ///
    /// # Safety
    /// `envoy` is the stream's or the connection's pointer Envoy passed to the running hook.
    pub unsafe fn add(self, envoy: *mut c_void, by: u64) {
        let (Some(id), Some(host), true) = (self.id, abi::host(), by > 0) else {
            return;
        };
        // SAFETY: Envoy's filter pointer, valid during the hook that calls this; an id this
        // filter's configuration defined; no labels (a null array of length 0).
        unsafe {
            match self.kind {
                Kind::Http => (host.http_increment_counter)(envoy, id, std::ptr::null(), 0, by),
                Kind::Network => (host.network_increment_counter)(envoy, id, by),
            }
        };
    }
}

/// Defines the counters of one plugin in one role, on the configuration Envoy is creating.
pub struct Metrics<'a> {
    config: *mut c_void,
    kind: Kind,
    plugin: &'a str,
    role: &'static str,
}

impl<'a> Metrics<'a> {
    /// For an HTTP filter configuration.
    ///
    /// # Safety
    /// `config` is the configuration pointer Envoy passed to the running config_new hook,
    /// and the `Metrics` is used only during it.
    pub unsafe fn http(config: *mut c_void, plugin: &'a str, role: &'static str) -> Self {
        Self {
            config,
            kind: Kind::Http,
            plugin,
            role,
        }
    }

    /// For a network filter configuration.
    ///
    /// # Safety
    /// As [`Metrics::http`].
    pub unsafe fn network(config: *mut c_void, plugin: &'a str, role: &'static str) -> Self {
        Self {
            config,
            kind: Kind::Network,
            plugin,
            role,
        }
    }

    /// Metrics that define nothing, for unit tests (no Envoy).
    #[cfg(test)]
    pub fn none(plugin: &'a str, role: &'static str) -> Self {
        Self {
            config: std::ptr::null_mut(),
            kind: Kind::Http,
            plugin,
            role,
        }
    }

    pub fn counter(&self, metric: &str) -> Counter {
        let kind = self.kind;
        let Some(host) = abi::host() else {
            return Counter { id: None, kind };
        };
        let name = crate::metrics::metric_name(self.plugin, self.role, metric);
        let buffer = ModuleBuffer::of(name.as_bytes());
        let mut id = 0usize;
        // SAFETY: Envoy's configuration pointer, valid during config_new (the only caller);
        // the name is alive for the call, `id` is writable, no labels.
        let result = unsafe {
            match kind {
                Kind::Http => {
                    (host.http_define_counter)(self.config, buffer, std::ptr::null(), 0, &mut id)
                }
                Kind::Network => (host.network_define_counter)(self.config, buffer, &mut id),
            }
        };
        if result == abi::METRICS_SUCCESS {
            Counter { id: Some(id), kind }
        } else {
            log!(
                Warn,
                "defining metric {name} failed (Envoy answered {result}); not counted there"
            );
            Counter { id: None, kind }
        }
    }
}
