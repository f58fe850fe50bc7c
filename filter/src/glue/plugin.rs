//! The plugin context: the SDK's `RootContext` for one plugin. It reads the VM configuration
//! at VM start and the plugin configuration at each configure, becomes the role's root, and
//! creates each stream's context with the role's state. A root whose configuration was
//! refused, or that never got one, creates pass-through streams.
//!
//! Which kind of stream context Envoy gets is decided here, by the role: the TCP role's root
//! says `StreamContext` and creates [`TcpStream`]s, every other root `HttpContext` and
//! creates [`HttpStream`]s. Nothing the module can read tells an HTTP filter from a network
//! filter, and the SDK's dispatcher traps on a callback for a context of the other kind, so a
//! role on the wrong kind of filter traps its VM at its first stream (docs/filter.md, Known
//! limits).

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::{BufferType, ContextType};

use super::stream::{HttpStream, TcpStream};
use super::vm::{note_memory, set_level};
use super::{body, headers, host, log, rate_limit, stats, tcp};
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

pub struct PluginContext {
    vm: Rc<VmConfig>,
    role: Role,
}

/// Reads a configuration buffer: absent is empty, a failed read or one over the limit is an
/// error naming the buffer.
fn read_config(kind: BufferType, size: usize, what: &str) -> Result<Vec<u8>, String> {
    if size > MAX_CONFIG_BYTES {
        return Err(format!(
            "the {what} is {size} bytes, over the {MAX_CONFIG_BYTES}-byte limit"
        ));
    }
    match host::buffer(kind, MAX_CONFIG_BYTES) {
        Ok(bytes) => Ok(bytes.unwrap_or_default()),
        Err(status) => Err(format!(
            "the {what} could not be read (host status {status:?})"
        )),
    }
}

impl PluginContext {
    pub fn new() -> Self {
        Self {
            vm: Rc::new(VmConfig::default()),
            role: Role::Unconfigured,
        }
    }

    #[inline(never)]
    fn vm_start(&mut self, size: usize) -> bool {
        let parsed = read_config(BufferType::VmConfiguration, size, "VM configuration")
            .and_then(|bytes| VmConfig::parse(&bytes));
        match parsed {
            Ok(vm) => {
                set_level(&vm);
                self.vm = Rc::new(vm);
                true
            }
            Err(e) => {
                host::log(
                    LogLevel::Error as u32,
                    &format!("wasm-filter: invalid VM configuration: {e}"),
                );
                false
            }
        }
    }

    /// Each role's root is built by a function of its own (`#[inline(never)]` on its `new`):
    /// V8's optimizing compiler, which compiles every function of the module, then works on
    /// several small bodies rather than one large one.
    #[inline(never)]
    fn configure(&mut self, size: usize) -> bool {
        set_level(&self.vm);
        let parsed = read_config(
            BufferType::PluginConfiguration,
            size,
            "plugin configuration",
        )
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
}

impl Context for PluginContext {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        if let Role::StatsService(s) = &mut self.role {
            s.on_post_answer(token, headers, body);
        }
    }
}

impl RootContext for PluginContext {
    fn on_vm_start(&mut self, size: usize) -> bool {
        self.vm_start(size)
    }

    fn on_configure(&mut self, size: usize) -> bool {
        self.configure(size)
    }

    fn on_tick(&mut self) {
        if let Role::StatsService(s) = &mut self.role {
            s.on_tick();
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Role::StatsService(s) = &mut self.role {
            s.drain(queue_id);
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(match self.role {
            Role::Tcp(_) => ContextType::StreamContext,
            _ => ContextType::HttpContext,
        })
    }

    /// Never `None` (the SDK's dispatcher traps on it): a root with nothing to do per stream
    /// gives a pass-through.
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        note_memory();
        Some(Box::new(match &self.role {
            Role::Headers(ops) => HttpStream::Headers(headers::HeaderFilter::new(ops.clone())),
            Role::Body(ops) => HttpStream::Body(body::BodyFilter::new(ops.clone())),
            Role::RateLimit(l) => HttpStream::RateLimit(rate_limit::LimitFilter::new(l.clone())),
            Role::StatsRecord(r) => HttpStream::StatsRecord(stats::RecordFilter::new(r.clone())),
            Role::Tcp(_) | Role::Unconfigured | Role::StatsService(_) => HttpStream::PassThrough,
        }))
    }

    fn create_stream_context(&self, _: u32) -> Option<Box<dyn StreamContext>> {
        note_memory();
        Some(Box::new(match &self.role {
            Role::Tcp(root) => TcpStream::Counting(tcp::Connection::new(root.clone())),
            _ => TcpStream::PassThrough,
        }))
    }
}
