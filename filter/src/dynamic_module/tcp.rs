//! `tcp-total-data-size-counter` as an Envoy network filter
//! (`envoy.filters.network.dynamic_modules`): bytes each way as they pass, then, once the
//! connection closes, the Wasm module's log line and the totals updated. The totals live in
//! process memory behind one mutex, which every worker adds its closed connections to (the
//! Wasm module's compare-and-swap on shared data, without retries); the per-role counters
//! are Envoy stats, process-wide as Envoy's counters are, named as the Wasm module's
//! (`<metrics_namespace>.wasm_filter.plugin.<plugin>.role.<role>.<metric>`).
//!
//! A panic in a hook closes its connection (fail closed): data it was reading goes no
//! further, and the connection's later hooks only continue; Envoy and every other
//! connection go on.

use std::sync::{Arc, Mutex};

use super::host::{log, ConfigScope, Connection};
use super::metrics::{Counter, Metrics};
use super::{guard, plugin_config};
use crate::config::PluginConfig;
use crate::tcp_count::{TcpCounter, Totals};

/// The role's name in the plugin configuration and in its stats.
pub const ROLE: &str = "tcp-total-data-size-counter";

/// Every connection's totals since the module was loaded, across listeners and workers.
static TOTALS: Mutex<Totals> = Mutex::new(Totals {
    bytes_in: 0,
    bytes_out: 0,
    connections: 0,
});

struct Counters {
    bytes_in: Counter,
    bytes_out: Counter,
    connections: Counter,
}

pub struct TcpConfig {
    counter: TcpCounter,
    counters: Counters,
}

/// One connection's count.
pub struct Tally {
    config: Arc<TcpConfig>,
    bytes_in: u64,
    bytes_out: u64,
    /// Counted into the totals already (a close event came, or a hook panicked).
    done: bool,
}

/// The role's configuration and the plugin's name.
fn parse(name: &[u8], config: &[u8]) -> Result<(String, TcpCounter), String> {
    match plugin_config(name, config)? {
        (plugin, PluginConfig::TcpTotalDataSizeCounter(c)) => Ok((plugin, c)),
        (_, other) => Err(format!(
            "role: {:?} is an HTTP role: configure it in envoy.filters.http.dynamic_modules; \
             the network filter's role is {ROLE:?}",
            other.role()
        )),
    }
}

impl TcpConfig {
    /// The network filter's configuration, its counters defined in `scope`.
    pub fn new(name: &[u8], config: &[u8], scope: &ConfigScope) -> Result<Self, String> {
        let (plugin, counter) = parse(name, config)?;
        let m = Metrics::new(scope, &plugin, ROLE);
        let counters = Counters {
            bytes_in: m.counter("bytes_in_total"),
            bytes_out: m.counter("bytes_out_total"),
            connections: m.counter("connections_total"),
        };
        Ok(Self { counter, counters })
    }

    pub fn summary(&self) -> String {
        format!(
            "configured role {ROLE} (network filter, log_connections: {})",
            self.counter.log_connections
        )
    }
}

/// The fault the tests inject (see [`super::FAULT_MARKER`]).
#[cfg(feature = "fault")]
#[allow(clippy::panic)]
fn injected_fault(connection: &Connection) {
    use super::FAULT_MARKER;
    if connection.read_head(FAULT_MARKER.len()) == FAULT_MARKER {
        panic!(
            "wasm-filter: injected fault (connection data starts with x-wasm-filter-fault: panic)"
        );
    }
}

#[cfg(not(feature = "fault"))]
fn injected_fault(_: &Connection) {}

impl Tally {
    pub fn new(config: Arc<TcpConfig>) -> Self {
        Self {
            config,
            bytes_in: 0,
            bytes_out: 0,
            done: false,
        }
    }

    /// Runs one hook under [`guard`]; `false` when it panicked. A panic closes the
    /// connection (what a counter that cannot count does to the Wasm module's connection:
    /// it fails closed), and the connection's later hooks only continue.
    fn run(&mut self, connection: &Connection, hook: &str, f: impl FnOnce(&mut Self)) -> bool {
        if self.done {
            return true;
        }
        if guard(|| f(self)).is_some() {
            return true;
        }
        self.done = true;
        log!(
            Error,
            "panicked in the network {hook} hook: the connection is closed"
        );
        connection.close();
        false
    }

    /// Data read from the client; `false` when the hook panicked (the data goes no further).
    pub fn on_read(&mut self, connection: &Connection, length: usize) -> bool {
        self.run(connection, "read", |t| {
            injected_fault(connection);
            let n = length as u64;
            t.bytes_in = t.bytes_in.saturating_add(n);
            connection.count(t.config.counters.bytes_in, n);
        })
    }

    /// Data written to the client; `false` when the hook panicked.
    pub fn on_write(&mut self, connection: &Connection, length: usize) -> bool {
        self.run(connection, "write", |t| {
            let n = length as u64;
            t.bytes_out = t.bytes_out.saturating_add(n);
            connection.count(t.config.counters.bytes_out, n);
        })
    }

    /// The connection closed (either end).
    pub fn on_close(&mut self, connection: &Connection) {
        self.run(connection, "close event", |t| {
            t.done = true;
            let (bytes_in, bytes_out) = (t.bytes_in, t.bytes_out);
            if t.config.counter.log_connections {
                log!(Info, "tcp connection closed: in={bytes_in} out={bytes_out}");
            }
            connection.count(t.config.counters.connections, 1);
            let totals = {
                // A panic elsewhere while holding the lock leaves plain numbers: still usable.
                let mut totals = TOTALS.lock().unwrap_or_else(|p| p.into_inner());
                *totals = totals.add_connection(bytes_in, bytes_out);
                *totals
            };
            log!(Debug, "tcp totals: {}", totals.encode());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tcp_role_is_a_network_filter() {
        let (plugin, c) = parse(
            b"wasm-filter/tcp-counter",
            br#"{"role":"tcp-total-data-size-counter"}"#,
        )
        .unwrap();
        assert_eq!(plugin, "tcp-counter");
        assert!(c.log_connections);
        let e = parse(
            b"wasm-filter",
            br#"{"role":"tcp-total-data-size-counter","log":true}"#,
        )
        .unwrap_err();
        assert!(e.contains("unknown field `log`"), "{e}");
        let e = parse(
            b"wasm-filter",
            br#"{"role":"http-header-operation","request":{}}"#,
        )
        .unwrap_err();
        assert!(
            e.starts_with("role: \"http-header-operation\" is an HTTP role"),
            "{e}"
        );
        let e = parse(b"other", br#"{"role":"tcp-total-data-size-counter"}"#).unwrap_err();
        assert!(e.contains("filter_name \"other\""), "{e}");
    }
}
