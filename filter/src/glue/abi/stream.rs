//! The proxy-wasm ABI 0.2.1 exports of HTTP streams and TCP connections: each finds the
//! stream's state by its id and routes the callback to it. An unknown id continues.

use crate::glue::contexts::with_stream;
use crate::glue::Action;

fn status(action: Option<Action>) -> u32 {
    action.unwrap_or(Action::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, headers: usize, end_of_stream: u32) -> u32 {
    status(with_stream("on_request_headers", id, |s| {
        s.request_headers(headers, end_of_stream != 0)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(id: u32, size: usize, end_of_stream: u32) -> u32 {
    status(with_stream("on_request_body", id, |s| {
        s.request_body(size, end_of_stream != 0)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(id: u32, trailers: usize) -> u32 {
    status(with_stream("on_request_trailers", id, |s| {
        s.request_trailers(trailers)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, headers: usize, end_of_stream: u32) -> u32 {
    status(with_stream("on_response_headers", id, |s| {
        s.response_headers(headers, end_of_stream != 0)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(id: u32, size: usize, end_of_stream: u32) -> u32 {
    status(with_stream("on_response_body", id, |s| {
        s.response_body(size, end_of_stream != 0)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(id: u32, trailers: usize) -> u32 {
    status(with_stream("on_response_trailers", id, |s| {
        s.response_trailers(trailers)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_downstream_data(id: u32, size: usize, end_of_stream: u32) -> u32 {
    status(with_stream("on_downstream_data", id, |s| {
        s.downstream_data(size, end_of_stream != 0)
    }))
}

#[no_mangle]
pub extern "C" fn proxy_on_upstream_data(id: u32, size: usize, end_of_stream: u32) -> u32 {
    status(with_stream("on_upstream_data", id, |s| {
        s.upstream_data(size, end_of_stream != 0)
    }))
}
