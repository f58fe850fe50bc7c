//! `http-header-operation` on a stream: the `when` condition is read once from the request
//! headers, then the op lists are applied through raw hostcalls.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::{log, raw};
use crate::header_ops::{Edit, HeaderOperation, Ops};

pub struct HeaderFilter {
    ops: Rc<HeaderOperation>,
    matched: bool,
}

impl HeaderFilter {
    pub fn new(ops: Rc<HeaderOperation>) -> Self {
        let matched = ops.when.is_none();
        Self { ops, matched }
    }
}

fn apply(map: u32, ops: &Ops) {
    for e in ops.edits() {
        let status = match e {
            Edit::Remove(k) => raw::remove_header(map, k),
            Edit::Set(k, v) => raw::replace_header(map, k, v),
            Edit::Add(k, v) => raw::add_header(map, k, v),
        };
        if status != raw::OK {
            log!(
                Warn,
                "{e:?} failed with host status {status}; request continues"
            );
        }
    }
}

impl Context for HeaderFilter {}

impl HttpContext for HeaderFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(when) = &self.ops.when {
            self.matched = when.matches(&mut |name| raw::header_text(raw::REQUEST_HEADERS, name));
        }
        if self.matched {
            apply(raw::REQUEST_HEADERS, &self.ops.request);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.matched {
            apply(raw::RESPONSE_HEADERS, &self.ops.response);
        }
        Action::Continue
    }
}
