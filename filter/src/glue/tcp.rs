//! `tcp-total-data-size-counter` on a connection: bytes each way as they pass, then, once
//! the connection is done, a log line and the process-wide totals updated in shared data.

use std::rc::Rc;

use proxy_wasm::traits::{Context, StreamContext};
use proxy_wasm::types::Action;

use super::{log, raw, shared};
use crate::config::VmConfig;
use crate::tcp_count::{TcpCounter, Totals, TOTALS_KEY};

pub struct TcpRoot {
    config: TcpCounter,
    key: String,
    bytes_in: Option<u32>,
    bytes_out: Option<u32>,
    connections: Option<u32>,
}

fn counter(name: &str) -> Option<u32> {
    match raw::define_counter(name) {
        Ok(id) => Some(id),
        Err(status) => {
            log!(
                Warn,
                "defining metric {name} failed with host status {status}; not counted there"
            );
            None
        }
    }
}

fn bump(metric: Option<u32>, by: u64) {
    if let Some(id) = metric {
        if by > 0 {
            raw::increment(id, by);
        }
    }
}

impl TcpRoot {
    pub fn new(config: TcpCounter, vm: &VmConfig) -> Self {
        Self {
            config,
            key: format!("{}{TOTALS_KEY}", vm.shared_data_prefix),
            bytes_in: counter("tcp_bytes_in"),
            bytes_out: counter("tcp_bytes_out"),
            connections: counter("tcp_connections"),
        }
    }
}

pub struct Counter {
    root: Rc<TcpRoot>,
    bytes_in: u64,
    bytes_out: u64,
}

impl Counter {
    pub fn new(root: Rc<TcpRoot>) -> Self {
        Self {
            root,
            bytes_in: 0,
            bytes_out: 0,
        }
    }
}

impl Context for Counter {}

impl StreamContext for Counter {
    fn on_downstream_data(&mut self, data_size: usize, _end_of_stream: bool) -> Action {
        self.bytes_in = self.bytes_in.saturating_add(data_size as u64);
        bump(self.root.bytes_in, data_size as u64);
        Action::Continue
    }

    fn on_upstream_data(&mut self, data_size: usize, _end_of_stream: bool) -> Action {
        self.bytes_out = self.bytes_out.saturating_add(data_size as u64);
        bump(self.root.bytes_out, data_size as u64);
        Action::Continue
    }

    fn on_log(&mut self) {
        let (bytes_in, bytes_out) = (self.bytes_in, self.bytes_out);
        if self.root.config.log_connections {
            log!(Info, "tcp connection closed: in={bytes_in} out={bytes_out}");
        }
        bump(self.root.connections, 1);
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
