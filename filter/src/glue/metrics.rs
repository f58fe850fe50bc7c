//! A role's Envoy metrics, named by [`crate::metrics::metric_name`] so the plugin and the
//! role come out as tags. A metric that cannot be defined is logged once and not counted;
//! the stream goes on.

use super::{host, log};

/// A counter; `None` when Envoy refused to define it.
pub struct Counter(Option<u32>);

impl Counter {
    pub fn add(&self, by: u64) {
        if let (Some(id), true) = (self.0, by > 0) {
            // A counter Envoy dropped is not worth a log line per request.
            let _ = host::increment(id, by);
        }
    }
}

/// Defines the metrics of one plugin in one role.
pub struct Metrics {
    plugin: String,
    role: &'static str,
}

impl Metrics {
    /// The plugin's name comes from Envoy (`plugin_name`).
    pub fn new(role: &'static str) -> Self {
        let plugin = host::property_text(&["plugin_name"]).unwrap_or_default();
        Self { plugin, role }
    }

    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    pub fn counter(&self, metric: &str) -> Counter {
        let name = crate::metrics::metric_name(&self.plugin, self.role, metric);
        match host::define_counter(&name) {
            Ok(id) => Counter(Some(id)),
            Err(status) => {
                log!(
                    Warn,
                    "defining metric {name} failed with host status {status:?}; not counted there"
                );
                Counter(None)
            }
        }
    }
}
