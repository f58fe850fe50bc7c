//! `http-header-operation` as a dynamic module: the `when` condition is read once from the
//! request headers, then the op lists are applied through Envoy's header callbacks. Counted
//! as the Wasm module counts: requests edited (`edited_total`) and those `when` did not match
//! (`skipped_total`).

use super::host::{log, Stream};
use super::metrics::{Counter, Metrics};
use crate::body_flow::Side;
use crate::header_ops::{Edit, HeaderOperation, Ops};

/// Applies `ops` to one side's headers; a refused edit is logged and the request goes on.
fn apply(stream: &Stream, side: Side, ops: &Ops) {
    for e in ops.edits() {
        let done = match e {
            Edit::Remove(k) => stream.remove_header(side, k),
            Edit::Set(k, v) => stream.set_header(side, k, v),
            Edit::Add(k, v) => stream.add_header(side, k, v),
        };
        if !done {
            log!(Warn, "{e:?} was refused by Envoy; request continues");
        }
    }
}

pub struct Counters {
    edited: Counter,
    skipped: Counter,
}

impl Counters {
    pub fn new(m: &Metrics) -> Self {
        Self {
            edited: m.counter("edited_total"),
            skipped: m.counter("skipped_total"),
        }
    }
}

/// The request headers hook; the answer is whether `when` matched (the response is only
/// edited then).
pub fn on_request_headers(ops: &HeaderOperation, counters: &Counters, stream: &Stream) -> bool {
    let matched = match &ops.when {
        Some(when) => when.matches(&mut |name| stream.header(Side::Request, name)),
        None => true,
    };
    let counter = if matched {
        counters.edited
    } else {
        counters.skipped
    };
    stream.count(counter, 1);
    if matched && !ops.request.is_empty() {
        apply(stream, Side::Request, &ops.request);
        // A Wasm filter's header edits make Envoy pick the route again; here it is asked
        // for, so a new `:path` (or host, or header a route matches on) is routed on.
        stream.clear_route_cache();
    }
    matched
}

pub fn on_response_headers(ops: &HeaderOperation, stream: &Stream) {
    apply(stream, Side::Response, &ops.response);
}
