//! A stream's state, one variant per role, and the callbacks routed to it. A callback the
//! role does not use continues at once; so does every callback of a pass-through stream
//! (its root has no role, or the role has nothing to do per stream).
//!
//! Envoy creates a stream's context before anything tells an HTTP filter from a network
//! filter; the first callback does. A role on the wrong kind of filter (the TCP role on an
//! HTTP filter, an HTTP role on a network filter) turns its stream into a pass-through there,
//! and the VM says so once.

use std::cell::Cell;

use super::body::BodyFilter;
use super::headers::HeaderFilter;
use super::rate_limit::LimitFilter;
use super::stats::RecordFilter;
use super::tcp::Connection;
use super::{log, Action};

thread_local! {
    /// Whether this VM has logged a role on the wrong kind of filter.
    static TOLD_MISPLACED: Cell<bool> = const { Cell::new(false) };
}

pub enum Stream {
    Headers(HeaderFilter),
    Body(BodyFilter),
    RateLimit(LimitFilter),
    StatsRecord(RecordFilter),
    Tcp(Connection),
    PassThrough,
}

impl Stream {
    fn role(&self) -> &'static str {
        match self {
            Stream::Headers(_) => "http-header-operation",
            Stream::Body(_) => "http-body-operation",
            Stream::RateLimit(_) => "rate-limit",
            Stream::StatsRecord(_) => "stats-aggregator",
            Stream::Tcp(_) => "tcp-total-data-size-counter",
            Stream::PassThrough => "",
        }
    }

    /// The role is on the wrong kind of filter (`filter`, the kind it is on): the stream
    /// passes through from now on.
    fn misplaced(&mut self, filter: &str) -> Action {
        if !TOLD_MISPLACED.with(|t| t.replace(true)) {
            log!(
                Warn,
                "role {} is on {filter} filter, where it cannot run: its streams pass through untouched",
                self.role()
            );
        }
        *self = Stream::PassThrough;
        Action::Continue
    }

    pub fn request_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        match self {
            Stream::Headers(f) => f.on_http_request_headers(headers, end_of_stream),
            Stream::Body(f) => f.on_http_request_headers(headers, end_of_stream),
            Stream::RateLimit(f) => f.on_http_request_headers(headers, end_of_stream),
            Stream::StatsRecord(f) => f.on_http_request_headers(headers, end_of_stream),
            Stream::Tcp(_) => self.misplaced("an HTTP"),
            Stream::PassThrough => Action::Continue,
        }
    }

    pub fn request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Stream::Body(f) => f.on_http_request_body(size, end_of_stream),
            _ => Action::Continue,
        }
    }

    pub fn request_trailers(&mut self, trailers: usize) -> Action {
        match self {
            Stream::Body(f) => f.on_http_request_trailers(trailers),
            _ => Action::Continue,
        }
    }

    pub fn response_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        match self {
            Stream::Headers(f) => f.on_http_response_headers(headers, end_of_stream),
            Stream::Body(f) => f.on_http_response_headers(headers, end_of_stream),
            Stream::StatsRecord(f) => f.on_http_response_headers(headers, end_of_stream),
            _ => Action::Continue,
        }
    }

    pub fn response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Stream::Body(f) => f.on_http_response_body(size, end_of_stream),
            _ => Action::Continue,
        }
    }

    pub fn response_trailers(&mut self, trailers: usize) -> Action {
        match self {
            Stream::Body(f) => f.on_http_response_trailers(trailers),
            _ => Action::Continue,
        }
    }

    pub fn downstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Stream::Tcp(c) => c.on_downstream_data(size, end_of_stream),
            Stream::PassThrough => Action::Continue,
            _ => self.misplaced("a network"),
        }
    }

    pub fn upstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Stream::Tcp(c) => c.on_upstream_data(size, end_of_stream),
            Stream::PassThrough => Action::Continue,
            _ => self.misplaced("a network"),
        }
    }

    /// The stream is over: called when Envoy deletes its context, right after its access log
    /// for HTTP and as the connection closes for TCP. The module does not export
    /// `proxy_on_log` for this, which would cost every stream of every role one more call
    /// into the VM.
    pub fn end(&mut self) {
        match self {
            Stream::StatsRecord(f) => f.on_end(),
            Stream::Tcp(c) => c.on_end(),
            _ => {}
        }
    }
}
