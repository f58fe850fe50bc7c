//! The roles' Envoy counters, named by [`crate::metrics::metric_name`] as the Wasm module's
//! are, so one `stats_tags` pair takes the plugin and the role out of either (Envoy puts a
//! dynamic module's under `dynamic_module_config.metrics_namespace`, `dynamicmodulescustom`
//! by default, where the Wasm module's are under `wasmcustom`). A counter Envoy refuses to
//! define is logged and not counted; the filter goes on. The counting itself is the handles'
//! ([`super::host::Stream::count`], [`super::host::Connection::count`]).

use super::host::{log, ConfigScope};

/// One counter of a filter configuration; no id when Envoy refused it.
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    id: Option<usize>,
}

impl Counter {
    pub fn id(self) -> Option<usize> {
        self.id
    }
}

/// Defines the counters of one plugin in one role, on the configuration Envoy is creating.
pub struct Metrics<'a> {
    scope: &'a ConfigScope,
    plugin: &'a str,
    role: &'static str,
}

impl<'a> Metrics<'a> {
    pub fn new(scope: &'a ConfigScope, plugin: &'a str, role: &'static str) -> Self {
        Self {
            scope,
            plugin,
            role,
        }
    }

    pub fn counter(&self, metric: &str) -> Counter {
        let name = crate::metrics::metric_name(self.plugin, self.role, metric);
        match self.scope.define_counter(&name) {
            Ok(id) => Counter { id: Some(id) },
            Err(None) => Counter { id: None },
            Err(Some(result)) => {
                log!(
                    Warn,
                    "defining metric {name} failed (Envoy answered {result}); not counted there"
                );
                Counter { id: None }
            }
        }
    }
}
