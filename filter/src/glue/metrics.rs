//! A role's Envoy metrics, named by [`crate::metrics::metric_name`] so the plugin and the
//! role come out as tags. A metric that cannot be defined is logged once and not counted;
//! the stream goes on.

use std::cell::Cell;

use super::{log, raw};

/// The period of the tick that adds a [`Tally`]'s counts to Envoy's counter: the most its
/// counter lags behind the requests.
pub const TALLY_TICK_MS: u32 = 1000;

/// A counter; `None` when Envoy refused to define it.
pub struct Counter(Option<u32>);

impl Counter {
    pub fn add(&self, by: u64) {
        if let (Some(id), true) = (self.0, by > 0) {
            raw::increment(id, by);
        }
    }
}

/// A counter counted in the guest and added to Envoy's on the root's tick: one hostcall per
/// tick instead of one per request, for a figure that lags by at most [`TALLY_TICK_MS`]. If
/// the tick could not be set it counts at once, as a [`Counter`] does.
pub struct Tally {
    counter: Counter,
    pending: Cell<u64>,
    on_tick: bool,
}

impl Tally {
    pub fn add(&self, by: u64) {
        if self.on_tick {
            self.pending.set(self.pending.get().saturating_add(by));
        } else {
            self.counter.add(by);
        }
    }

    /// Adds what was counted since the last flush to Envoy's counter.
    pub fn flush(&self) {
        self.counter.add(self.pending.replace(0));
    }
}

/// Asks for the root's tick that flushes its tallies; `false` (they then count at once) if
/// the host refused.
pub fn tally_tick() -> bool {
    let status = raw::set_tick_period_ms(TALLY_TICK_MS);
    if status != raw::OK {
        log!(
            Warn,
            "setting the tick period failed with host status {status}; metrics are counted per request"
        );
    }
    status == raw::OK
}

/// Defines the metrics of one plugin in one role.
pub struct Metrics {
    plugin: String,
    role: &'static str,
}

impl Metrics {
    /// The plugin's name comes from Envoy (`plugin_name`).
    pub fn new(role: &'static str) -> Self {
        let plugin = raw::property_text(&["plugin_name"]).unwrap_or_default();
        Self { plugin, role }
    }

    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    pub fn counter(&self, metric: &str) -> Counter {
        let name = crate::metrics::metric_name(&self.plugin, self.role, metric);
        match raw::define_counter(&name) {
            Ok(id) => Counter(Some(id)),
            Err(status) => {
                log!(
                    Warn,
                    "defining metric {name} failed with host status {status}; not counted there"
                );
                Counter(None)
            }
        }
    }

    /// A [`Tally`], flushed on the tick [`tally_tick`] asked for (`on_tick`).
    pub fn tally(&self, metric: &str, on_tick: bool) -> Tally {
        Tally {
            counter: self.counter(metric),
            pending: Cell::new(0),
            on_tick,
        }
    }
}
