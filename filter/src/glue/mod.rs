//! The proxy-wasm side: one root context per plugin reads the VM and plugin configurations
//! and becomes the role's root; streams get the role's context. Each role's SDK glue has its
//! own module; `raw` holds the hostcalls they all use, which return statuses instead of
//! panicking.
//!
//! The SDK's dispatcher panics when a root hands it no context (`create_http_context`
//! returning `None`) or no context type, so every root answers both, whatever its state: an
//! unconfigured root (its configuration was refused, or it never got one) gives pass-through
//! contexts. No SDK wrapper that panics on a host status is called, with one exception: HTTP
//! callouts go through `hostcalls::dispatch_http_call`, because the SDK's dispatcher only
//! routes a callout's answer to a token it registered itself; that wrapper returns an error
//! for every status Envoy's `proxy_http_call` returns (BadArgument, InternalFailure).

mod body;
mod headers;
mod metrics;
mod rate_limit;
mod raw;
mod shared;
mod stats;
mod tcp;

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::{ContextType, LogLevel as SdkLogLevel};

use crate::config::{LogLevel, PluginConfig, VmConfig};
use crate::stats::Mode;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(SdkLogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { vm: Rc::new(VmConfig::default()), role: Role::Unconfigured })
    });
}}

thread_local! {
    /// The level below which nothing is logged: the VM configuration's, or Envoy's when that
    /// is higher, since Envoy drops those lines after the guest has formatted and passed them
    /// (one VM per thread in Envoy and in the harness).
    static LEVEL: Cell<LogLevel> = const { Cell::new(LogLevel::Info) };
    /// The linear memory size last reported, in 64 KiB pages.
    static PAGES: Cell<usize> = const { Cell::new(0) };
}

/// Logs the VM's linear memory each time it has grown (it never shrinks), when a stream
/// starts: operators see a VM that keeps growing, and `make bench` reads the figure. Costs
/// one instruction per stream otherwise.
fn note_memory() {
    let pages = core::arch::wasm32::memory_size(0);
    if pages > PAGES.with(Cell::get) {
        PAGES.with(|p| p.set(pages));
        log!(Info, "linear memory is {} KiB", pages * 64);
    }
}

pub(crate) fn enabled(level: LogLevel) -> bool {
    LEVEL.with(|l| level >= l.get())
}

/// Sets the level from the VM configuration and Envoy's level, read once here (at VM start and
/// at each configuration) rather than per line: a level Envoy lowers at run time
/// (`/logging?wasm=debug`) takes effect at the plugin's next configuration.
fn set_level(vm: &VmConfig) {
    let host = match raw::host_log_level() {
        Some(0) | None => LogLevel::Trace,
        Some(1) => LogLevel::Debug,
        Some(2) => LogLevel::Info,
        Some(3) => LogLevel::Warn,
        Some(4) => LogLevel::Error,
        Some(_) => LogLevel::Critical,
    };
    LEVEL.with(|l| l.set(vm.log_level.max(host)));
}

/// Logs `wasm-filter: <message>` at a level, formatting only when the level is enabled.
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        if $crate::glue::enabled($crate::config::LogLevel::$level) {
            $crate::glue::raw::log(
                $crate::config::LogLevel::$level as u32,
                &format!("wasm-filter: {}", format_args!($($arg)*)),
            );
        }
    };
}
pub(crate) use log;

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

struct Root {
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

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        if let Role::StatsService(s) = &mut self.role {
            s.on_post_answer(token, headers, body);
        }
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, size: usize) -> bool {
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

    fn on_configure(&mut self, size: usize) -> bool {
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

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        note_memory();
        Some(match &self.role {
            Role::Headers(ops) => Box::new(headers::HeaderFilter::new(ops.clone())),
            Role::Body(ops) => Box::new(body::BodyFilter::new(ops.clone())),
            Role::RateLimit(l) => Box::new(rate_limit::LimitFilter::new(l.clone())),
            Role::StatsRecord(r) => Box::new(stats::RecordFilter::new(r.clone())),
            Role::Unconfigured | Role::Tcp(_) | Role::StatsService(_) => Box::new(PassThrough),
        })
    }

    fn create_stream_context(&self, _context_id: u32) -> Option<Box<dyn StreamContext>> {
        note_memory();
        Some(match &self.role {
            Role::Tcp(root) => Box::new(tcp::Connection::new(root.clone())),
            _ => Box::new(PassThrough),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(match self.role {
            Role::Tcp(_) => ContextType::StreamContext,
            _ => ContextType::HttpContext,
        })
    }
}

/// What a stream gets from a root with nothing to do: every callback continues.
struct PassThrough;

impl Context for PassThrough {}
impl HttpContext for PassThrough {}
impl StreamContext for PassThrough {}
