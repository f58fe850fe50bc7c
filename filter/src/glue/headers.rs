//! `http-header-operation` on a stream: the `when` condition is read once from the request
//! headers, then the op lists are applied through raw hostcalls. Counted: requests edited
//! (`edited_total`) and those `when` did not match (`skipped_total`).

use std::rc::Rc;

use super::metrics::{Counter, Metrics};
use super::{log, raw, Action};
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
                "{e} failed with host status {status}; request continues"
            );
        }
    }
}

/// The callbacks [`super::stream::Stream`] routes here, each compiled on its own (see
/// `contexts::with`).
impl HeaderFilter {
    #[inline(never)]
    pub fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(when) = &self.root.ops.when {
            self.matched = when.matches(&mut |name| raw::header_text(raw::REQUEST_HEADERS, name));
        }
        if self.matched {
            apply(raw::REQUEST_HEADERS, &self.root.ops.request);
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
            apply(raw::RESPONSE_HEADERS, &self.root.ops.response);
        }
        Action::Continue
    }
}
