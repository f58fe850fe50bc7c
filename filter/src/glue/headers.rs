//! `http-header-operation` on a stream: the `when` condition is read once from the request
//! headers, then the op lists are applied through raw hostcalls. Counted: requests edited
//! (`edited_total`) and those `when` did not match (`skipped_total`).

use std::rc::Rc;

use proxy_wasm::types::{Action, MapType};

use super::metrics::{Counter, Metrics};
use super::{host, log};
use crate::header_ops::{Edit, HeaderOperation, Ops};

pub struct HeaderRoot {
    ops: HeaderOperation,
    edited: Counter,
    skipped: Counter,
}

impl HeaderRoot {
    #[inline(never)]
    pub fn new(ops: HeaderOperation) -> Self {
        let m = Metrics::new("http-header-operation");
        Self {
            ops,
            edited: m.counter("edited_total"),
            skipped: m.counter("skipped_total"),
        }
    }
}

pub struct HeaderFilter {
    root: Rc<HeaderRoot>,
    matched: bool,
}

impl HeaderFilter {
    pub fn new(root: Rc<HeaderRoot>) -> Self {
        let matched = root.ops.when.is_none();
        Self { root, matched }
    }
}

fn apply(map: MapType, ops: &Ops) {
    for e in ops.edits() {
        if let Err(status) = match e {
            Edit::Remove(k) => host::remove_header(map, k),
            Edit::Set(k, v) => host::replace_header(map, k, v),
            Edit::Add(k, v) => host::add_header(map, k, v),
        } {
            log!(
                Warn,
                "{e} failed with host status {status:?}; request continues"
            );
        }
    }
}

/// The callbacks [`super::stream`]'s contexts route here, each compiled on its own (see
/// `plugin::PluginContext::configure`).
impl HeaderFilter {
    #[inline(never)]
    pub fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(when) = &self.root.ops.when {
            self.matched =
                when.matches(&mut |name| host::header_text(MapType::HttpRequestHeaders, name));
        }
        if self.matched {
            apply(MapType::HttpRequestHeaders, &self.root.ops.request);
            self.root.edited.add(1);
        } else {
            self.root.skipped.add(1);
        }
        Action::Continue
    }

    #[inline(never)]
    pub fn on_http_response_headers(
        &mut self,
        _num_headers: usize,
        _end_of_stream: bool,
    ) -> Action {
        if self.matched {
            apply(MapType::HttpResponseHeaders, &self.root.ops.response);
        }
        Action::Continue
    }
}
