//! The proxy-wasm side: root context parses the configuration, HTTP contexts apply it.
//!
//! Header edits go through `hostcall` (raw imports that return the status) instead of the
//! SDK's wrappers, which panic (and so trap the VM) on any status but Ok.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

use crate::config::PluginConfig;
use crate::header_ops::{Edit, Ops};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { config: None }) });
}}

mod hostcall {
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_replace_header_map_value(
            t: u32,
            k: *const u8,
            kl: usize,
            v: *const u8,
            vl: usize,
        ) -> u32;
        fn proxy_add_header_map_value(
            t: u32,
            k: *const u8,
            kl: usize,
            v: *const u8,
            vl: usize,
        ) -> u32;
        fn proxy_remove_header_map_value(t: u32, k: *const u8, kl: usize) -> u32;
        fn proxy_log(level: u32, m: *const u8, ml: usize) -> u32;
    }

    pub fn log(level: u32, msg: &str) {
        // Nothing sensible to do if logging itself fails.
        unsafe { proxy_log(level, msg.as_ptr(), msg.len()) };
    }

    /// Applies one edit; returns the host's status (0 = Ok).
    pub fn edit(map: u32, e: &super::Edit<'_>) -> u32 {
        unsafe {
            match *e {
                super::Edit::Remove(k) => proxy_remove_header_map_value(map, k.as_ptr(), k.len()),
                super::Edit::Set(k, v) => {
                    proxy_replace_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len())
                }
                super::Edit::Add(k, v) => {
                    proxy_add_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len())
                }
            }
        }
    }
}

const INFO: u32 = 2;
const WARN: u32 = 3;
const ERROR: u32 = 4;

struct Root {
    config: Option<Rc<PluginConfig>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        match PluginConfig::parse(&bytes) {
            Ok(config) => {
                let PluginConfig::HttpHeaderOperation(ops) = &config;
                let (req, resp) = ops.count();
                hostcall::log(
                    INFO,
                    &format!("wasm-filter: configured role {} (request: {req} ops, response: {resp} ops)", config.role()),
                );
                self.config = Some(Rc::new(config));
                true
            }
            Err(e) => {
                hostcall::log(
                    ERROR,
                    &format!("wasm-filter: invalid plugin configuration: {e}"),
                );
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(HeaderFilter { config }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct HeaderFilter {
    config: Rc<PluginConfig>,
}

impl HeaderFilter {
    fn apply(&self, map: MapType, ops: &Ops) {
        for e in ops.edits() {
            let status = hostcall::edit(map as u32, &e);
            if status != 0 {
                hostcall::log(
                    WARN,
                    &format!(
                        "wasm-filter: {e:?} failed with host status {status}; request continues"
                    ),
                );
            }
        }
    }
}

impl Context for HeaderFilter {}

impl HttpContext for HeaderFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let PluginConfig::HttpHeaderOperation(ops) = &*self.config;
        self.apply(MapType::HttpRequestHeaders, &ops.request);
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let PluginConfig::HttpHeaderOperation(ops) = &*self.config;
        self.apply(MapType::HttpResponseHeaders, &ops.response);
        Action::Continue
    }
}
