//! One plugin's root context: it reads the VM configuration at VM start and the plugin
//! configuration at each configure, becomes the role's root, and gives each new stream the
//! role's state. A root whose configuration was refused, or that never got one, gives
//! pass-through streams.

use std::rc::Rc;

use super::stream::Stream;
use super::{body, headers, log, note_memory, rate_limit, raw, set_level, stats, tcp};
use crate::config::{LogLevel, PluginConfig, VmConfig};
use crate::stats::Mode;

/// Configuration buffers are read whole, but never more than this.
const MAX_CONFIG_BYTES: usize = 1024 * 1024;

enum Role {
    Unconfigured,
    Headers(Rc<headers::HeaderRoot>),
    Body(Rc<body::BodyRoot>),
    Tcp(Rc<tcp::TcpRoot>),
    RateLimit(Rc<rate_limit::Limiter>),
    StatsRecord(Rc<stats::Recorder>),
    StatsService(Box<stats::Service>),
}

pub struct Root {
    vm: Rc<VmConfig>,
    role: Role,
}

/// Reads a configuration buffer: absent is empty, a failed read or one over the limit is an
/// error naming the buffer.
fn read_config(kind: u32, size: usize, what: &str) -> Result<Vec<u8>, String> {
    if size > MAX_CONFIG_BYTES {
        return Err(format!(
            "the {what} is {size} bytes, over the {MAX_CONFIG_BYTES}-byte limit"
        ));
    }
    match raw::buffer(kind, MAX_CONFIG_BYTES) {
        Ok(bytes) => Ok(bytes.unwrap_or_default()),
        Err(status) => Err(format!(
            "the {what} could not be read (host status {status})"
        )),
    }
}

impl Root {
    pub fn new() -> Self {
        Self {
            vm: Rc::new(VmConfig::default()),
            role: Role::Unconfigured,
        }
    }

    #[inline(never)]
    pub fn on_vm_start(&mut self, size: usize) -> bool {
        let parsed = read_config(raw::VM_CONFIGURATION, size, "VM configuration")
            .and_then(|bytes| VmConfig::parse(&bytes));
        match parsed {
            Ok(vm) => {
                set_level(&vm);
                self.vm = Rc::new(vm);
                true
            }
            Err(e) => {
                raw::log(
                    LogLevel::Error as u32,
                    &format!("wasm-filter: invalid VM configuration: {e}"),
                );
                false
            }
        }
    }

    /// Each role's root is built by a function of its own (`#[inline(never)]` on its `new`),
    /// for the reason `contexts::with` gives.
    #[inline(never)]
    pub fn on_configure(&mut self, size: usize) -> bool {
        set_level(&self.vm);
        let parsed = read_config(raw::PLUGIN_CONFIGURATION, size, "plugin configuration")
            .and_then(|bytes| PluginConfig::parse(&bytes));
        let config = match parsed {
            Ok(c) => c,
            Err(e) => {
                self.role = Role::Unconfigured;
                log!(Error, "invalid plugin configuration: {e}");
                return false;
            }
        };
        let role = config.role();
        let (role_state, detail) = match config {
            PluginConfig::HttpHeaderOperation(ops) => {
                let (req, resp) = ops.count();
                let when = if ops.when.is_some() {
                    ", when given"
                } else {
                    ""
                };
                (
                    Role::Headers(Rc::new(headers::HeaderRoot::new(ops))),
                    format!("request: {req} ops, response: {resp} ops{when}"),
                )
            }
            PluginConfig::HttpBodyOperation(ops) => {
                let detail = ops.summary();
                (Role::Body(Rc::new(body::BodyRoot::new(ops))), detail)
            }
            PluginConfig::TcpTotalDataSizeCounter(c) => {
                let root = tcp::TcpRoot::new(c, &self.vm);
                (Role::Tcp(Rc::new(root)), "totals in shared data".into())
            }
            PluginConfig::RateLimit(c) => {
                let detail = format!(
                    "burst {}, {} per second, {} buckets",
                    c.burst, c.refill_per_second, c.buckets
                );
                (
                    Role::RateLimit(Rc::new(rate_limit::Limiter::new(c, &self.vm))),
                    detail,
                )
            }
            PluginConfig::StatsAggregator(c) if c.mode == Mode::Aggregate => {
                match stats::Service::new(c, &self.vm) {
                    Ok(s) => (Role::StatsService(Box::new(s)), "aggregating".into()),
                    Err(e) => {
                        self.role = Role::Unconfigured;
                        log!(Error, "invalid plugin configuration: {e}");
                        return false;
                    }
                }
            }
            PluginConfig::StatsAggregator(_) => (
                Role::StatsRecord(Rc::new(stats::Recorder::new(&self.vm))),
                "recording".into(),
            ),
        };
        self.role = role_state;
        log!(Info, "configured role {role} ({detail})");
        true
    }

    #[inline(never)]
    pub fn on_tick(&mut self) {
        if let Role::StatsService(s) = &mut self.role {
            s.on_tick();
        }
    }

    #[inline(never)]
    pub fn on_queue_ready(&mut self, queue_id: u32) {
        if let Role::StatsService(s) = &mut self.role {
            s.drain(queue_id);
        }
    }

    #[inline(never)]
    pub fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize) {
        if let Role::StatsService(s) = &mut self.role {
            s.on_post_answer(token, headers, body);
        }
    }

    /// The state of a new stream (HTTP or TCP, as the role is) of this plugin.
    #[inline(never)]
    pub fn new_stream(&self) -> Stream {
        note_memory();
        match &self.role {
            Role::Headers(ops) => Stream::Headers(headers::HeaderFilter::new(ops.clone())),
            Role::Body(ops) => Stream::Body(body::BodyFilter::new(ops.clone())),
            Role::RateLimit(l) => Stream::RateLimit(rate_limit::LimitFilter::new(l.clone())),
            Role::StatsRecord(r) => Stream::StatsRecord(stats::RecordFilter::new(r.clone())),
            Role::Tcp(root) => Stream::Tcp(tcp::Connection::new(root.clone())),
            Role::Unconfigured | Role::StatsService(_) => Stream::PassThrough,
        }
    }
}
