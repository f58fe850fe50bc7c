//! The stream contexts: [`HttpStream`], the SDK's `HttpContext` for one HTTP stream, and
//! [`TcpStream`], its `StreamContext` for one TCP connection. Each is one variant per role
//! that runs on it, routing the callbacks the role uses; a callback the role does not use
//! continues at once, and so does every callback of a pass-through stream (its root has no
//! role, or the role has nothing to do per stream).
//!
//! The stream's end is `on_log` (Envoy calls it as the stream or connection is done, before
//! deleting its context).

use proxy_wasm::traits::{Context, HttpContext, StreamContext};
use proxy_wasm::types::Action;

use super::body::BodyFilter;
use super::headers::HeaderFilter;
use super::rate_limit::LimitFilter;
use super::stats::RecordFilter;
use super::tcp::Connection;

pub enum HttpStream {
    Headers(HeaderFilter),
    Body(BodyFilter),
    RateLimit(LimitFilter),
    StatsRecord(RecordFilter),
    PassThrough,
}

impl Context for HttpStream {}

impl HttpContext for HttpStream {
    fn on_http_request_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        match self {
            Self::Headers(f) => f.on_http_request_headers(headers, end_of_stream),
            Self::Body(f) => f.on_http_request_headers(headers, end_of_stream),
            Self::RateLimit(f) => f.on_http_request_headers(headers, end_of_stream),
            Self::StatsRecord(f) => f.on_http_request_headers(headers, end_of_stream),
            Self::PassThrough => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Self::Body(f) => f.on_http_request_body(size, end_of_stream),
            _ => Action::Continue,
        }
    }

    fn on_http_request_trailers(&mut self, trailers: usize) -> Action {
        match self {
            Self::Body(f) => f.on_http_request_trailers(trailers),
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        match self {
            Self::Headers(f) => f.on_http_response_headers(headers, end_of_stream),
            Self::Body(f) => f.on_http_response_headers(headers, end_of_stream),
            Self::StatsRecord(f) => f.on_http_response_headers(headers, end_of_stream),
            _ => Action::Continue,
        }
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Self::Body(f) => f.on_http_response_body(size, end_of_stream),
            _ => Action::Continue,
        }
    }

    fn on_http_response_trailers(&mut self, trailers: usize) -> Action {
        match self {
            Self::Body(f) => f.on_http_response_trailers(trailers),
            _ => Action::Continue,
        }
    }

    fn on_log(&mut self) {
        if let Self::StatsRecord(f) = self {
            f.on_end();
        }
    }
}

pub enum TcpStream {
    Counting(Connection),
    PassThrough,
}

impl Context for TcpStream {}

impl StreamContext for TcpStream {
    fn on_downstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Self::Counting(c) => c.on_downstream_data(size, end_of_stream),
            Self::PassThrough => Action::Continue,
        }
    }

    fn on_upstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        match self {
            Self::Counting(c) => c.on_upstream_data(size, end_of_stream),
            Self::PassThrough => Action::Continue,
        }
    }

    fn on_log(&mut self) {
        if let Self::Counting(c) = self {
            c.on_end();
        }
    }
}
