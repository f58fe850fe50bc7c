//! `tcp-total-data-size-counter` on a connection: bytes each way as they pass, then, once
//! the connection is done, a log line and the process-wide totals updated in shared data.

use std::rc::Rc;

use proxy_wasm::types::Action;

use super::metrics::{Counter, Metrics};
use super::{log, shared};
use crate::config::VmConfig;
use crate::tcp_count::{TcpCounter, Totals, TOTALS_KEY};

pub struct TcpRoot {
    config: TcpCounter,
    key: String,
    bytes_in: Counter,
    bytes_out: Counter,
    connections: Counter,
}

impl TcpRoot {
    #[inline(never)]
    pub fn new(config: TcpCounter, vm: &VmConfig) -> Self {
        let m = Metrics::new("tcp-total-data-size-counter");
        Self {
            config,
            key: format!("{}{TOTALS_KEY}", vm.shared_data_prefix),
            bytes_in: m.counter("bytes_in_total"),
            bytes_out: m.counter("bytes_out_total"),
            connections: m.counter("connections_total"),
        }
    }
}

pub struct Connection {
    root: Rc<TcpRoot>,
    bytes_in: u64,
    bytes_out: u64,
}

impl Connection {
    pub fn new(root: Rc<TcpRoot>) -> Self {
        Self {
            root,
            bytes_in: 0,
            bytes_out: 0,
        }
    }
}

/// The callbacks [`super::stream`]'s contexts route here, each compiled on its own (see
/// `plugin::PluginContext::configure`).
impl Connection {
    #[inline(never)]
    pub fn on_downstream_data(&mut self, data_size: usize, _end_of_stream: bool) -> Action {
        self.bytes_in = self.bytes_in.saturating_add(data_size as u64);
        self.root.bytes_in.add(data_size as u64);
        Action::Continue
    }

    #[inline(never)]
    pub fn on_upstream_data(&mut self, data_size: usize, _end_of_stream: bool) -> Action {
        self.bytes_out = self.bytes_out.saturating_add(data_size as u64);
        self.root.bytes_out.add(data_size as u64);
        Action::Continue
    }

    #[inline(never)]
    pub fn on_end(&mut self) {
        let (bytes_in, bytes_out) = (self.bytes_in, self.bytes_out);
        if self.root.config.log_connections {
            log!(Info, "tcp connection closed: in={bytes_in} out={bytes_out}");
        }
        self.root.connections.add(1);
        let result = shared::update(&self.root.key, |old| {
            let totals = Totals::decode(old)?.add_connection(bytes_in, bytes_out);
            Ok((totals.encode(), totals))
        });
        match result {
            Ok(t) => log!(Debug, "tcp totals: {}", t.encode()),
            Err(e) => log!(Warn, "tcp totals not updated: {e}"),
        }
    }
}
