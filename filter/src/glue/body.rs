//! `http-body-operation` on a stream. A side that rewrites drops `content-length` in its
//! headers callback (the body's new size is unknown until its end, and Envoy sends headers
//! on before the body), holds chunks until the end of the stream, then rewrites the whole
//! body in place.
//!
//! Headers cannot wait for the body: Envoy turns a paused headers callback into "stop
//! everything", so no body callback would come. A `content-length` over the buffer is
//! therefore refused in the headers callback (413 / 502); a body that outgrows the buffer
//! without announcing it is caught in a body callback, where a request still gets its 413
//! but a response's headers are already on their way, so the stream is reset.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::{log, raw};
use crate::body_ops::{BodyOperation, BodySide, Overflow, Rewrite};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Request,
    Response,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Request => "request",
            Which::Response => "response",
        }
    }
    fn headers(self) -> u32 {
        match self {
            Which::Request => raw::REQUEST_HEADERS,
            Which::Response => raw::RESPONSE_HEADERS,
        }
    }
    fn body(self) -> u32 {
        match self {
            Which::Request => raw::REQUEST_BODY,
            Which::Response => raw::RESPONSE_BODY,
        }
    }
    /// The local reply when a body cannot be handled.
    fn refusal(self) -> (u32, &'static str) {
        match self {
            Which::Request => (413, "request_body_too_large"),
            Which::Response => (502, "response_body_too_large"),
        }
    }
}

#[derive(Debug, Default)]
struct SideState {
    /// Bytes already sent on (not held), for the request size limit.
    passed: u64,
    /// The rest flows untouched: past `max_buffer_bytes` with the `pass` policy, or a body
    /// in a content-encoding (rewriting compressed bytes would corrupt them).
    overflowed: bool,
    /// A local reply was sent; later callbacks only stop.
    answered: bool,
}

pub struct BodyFilter {
    ops: Rc<BodyOperation>,
    request: SideState,
    response: SideState,
    /// Set when the response became a 502: the text its body is replaced with.
    replacement: Option<String>,
}

impl BodyFilter {
    pub fn new(ops: Rc<BodyOperation>) -> Self {
        Self {
            ops,
            request: SideState::default(),
            response: SideState::default(),
            replacement: None,
        }
    }

    fn side(&self, which: Which) -> &BodySide {
        match which {
            Which::Request => &self.ops.request,
            Which::Response => &self.ops.response,
        }
    }

    fn state(&mut self, which: Which) -> &mut SideState {
        match which {
            Which::Request => &mut self.request,
            Which::Response => &mut self.response,
        }
    }

    /// This filter's own local reply is on its way back: let it through untouched.
    fn answered(&self) -> bool {
        self.request.answered || self.response.answered
    }

    fn refuse(&mut self, which: Which, why: &str) -> Action {
        let (status, details) = which.refusal();
        log!(Info, "{} refused with {status}: {why}", which.name());
        let status_sent = raw::send_local_response(status, details, why.as_bytes(), &[]);
        if status_sent != raw::OK {
            log!(
                Warn,
                "local reply {status} failed with host status {status_sent}"
            );
        }
        self.state(which).answered = true;
        Action::Pause
    }

    /// A response whose headers are in hand but whose body cannot be rewritten: its status
    /// becomes 502 and its body is swapped, chunk by chunk, for the reason. (A local reply
    /// cannot do this: Envoy resets a stream whose response a Wasm filter replaces at this
    /// point.)
    fn replace_response(&mut self, why: String) -> Action {
        log!(Info, "response refused with 502: {why}");
        for (name, value) in [(":status", "502"), ("content-type", "text/plain")] {
            let status = raw::replace_header(raw::RESPONSE_HEADERS, name, value);
            if status != raw::OK {
                log!(
                    Warn,
                    "setting response {name} failed with host status {status}"
                );
            }
        }
        // The reason replaces the body: nothing that described the upstream's body may stay
        // (a `content-encoding: gzip` would make the client decode plain text).
        for name in ["content-length", "content-encoding"] {
            raw::remove_header(raw::RESPONSE_HEADERS, name);
        }
        self.replacement = Some(why);
        Action::Continue
    }

    fn on_headers(&mut self, which: Which, end_of_stream: bool) -> Action {
        let declared = || {
            raw::header_text(which.headers(), "content-length")
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if which == Which::Request {
            if let Some(max) = self.ops.request.max_bytes {
                if let Some(len) = declared().filter(|len| *len > max) {
                    return self.refuse(
                        which,
                        &format!("content-length {len} is over the {max}-byte limit"),
                    );
                }
            }
        }
        if end_of_stream || !self.side(which).rewrites() {
            return Action::Continue;
        }
        let limit = self.ops.max_buffer_bytes;
        if self.ops.on_overflow == Overflow::Reject {
            if let Some(len) = declared().filter(|len| *len > limit) {
                let why = format!(
                    "content-length {len} is over max_buffer_bytes ({limit}): the body cannot be rewritten"
                );
                return match which {
                    Which::Request => self.refuse(which, &why),
                    Which::Response => self.replace_response(why),
                };
            }
        }
        if let Some(encoding) = raw::header_text(which.headers(), "content-encoding")
            .filter(|e| !e.trim().eq_ignore_ascii_case("identity"))
        {
            log!(
                Info,
                "{} body is in content-encoding {encoding:?}: passed on unmodified",
                which.name()
            );
            self.state(which).overflowed = true;
            return Action::Continue;
        }
        let status = raw::remove_header(which.headers(), "content-length");
        if status != raw::OK {
            log!(
                Warn,
                "removing {} content-length failed with host status {status}",
                which.name()
            );
        }
        Action::Continue
    }

    fn on_body(&mut self, which: Which, body_size: usize, end_of_stream: bool) -> Action {
        if self.state(which).answered {
            return Action::Pause;
        }
        let size = body_size as u64;
        let holding = self.side(which).rewrites() && !self.state(which).overflowed;
        if which == Which::Request {
            if let Some(max) = self.ops.request.max_bytes {
                let total = self.request.passed.saturating_add(size);
                if total > max {
                    return self.refuse(which, &format!("the body is over the {max}-byte limit"));
                }
            }
        }
        if !holding {
            let state = self.state(which);
            state.passed = state.passed.saturating_add(size);
            return Action::Continue;
        }
        let limit = self.ops.max_buffer_bytes;
        if size > limit {
            return match self.ops.on_overflow {
                Overflow::Reject if which == Which::Response => {
                    self.reset_response(&format!("body over max_buffer_bytes ({limit})"))
                }
                Overflow::Reject => self.refuse(
                    which,
                    &format!("the body is over max_buffer_bytes ({limit}) and cannot be rewritten"),
                ),
                Overflow::Pass => {
                    log!(
                        Warn,
                        "{} body over max_buffer_bytes ({limit}): passed on unmodified",
                        which.name()
                    );
                    let state = self.state(which);
                    state.overflowed = true;
                    state.passed = state.passed.saturating_add(size);
                    Action::Continue
                }
            };
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.rewrite(which, body_size)
    }

    /// Rewrites the whole body in place; the action is what the body callback returns.
    fn rewrite(&mut self, which: Which, body_size: usize) -> Action {
        let body = match raw::buffer(which.body(), body_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(status) => {
                log!(
                    Warn,
                    "reading the {} body failed with host status {status}; passed on unmodified",
                    which.name()
                );
                return Action::Continue;
            }
        };
        let limit = usize::try_from(self.ops.max_buffer_bytes).unwrap_or(usize::MAX);
        match self.side(which).rewrite(&body, limit) {
            Rewrite::Unchanged => {}
            Rewrite::Changed(new, what) => {
                let status = raw::set_buffer(which.body(), body_size, &new);
                if status == raw::OK {
                    log!(Debug, "{} body rewritten: {what}", which.name());
                } else {
                    log!(Warn, "writing the {} body failed with host status {status}; passed on unmodified", which.name());
                }
            }
            Rewrite::NotJson(e) => {
                log!(
                    Info,
                    "{} body is not JSON ({e}): passed on unmodified",
                    which.name()
                );
            }
            Rewrite::TooLarge(limit) => {
                let why = format!("the rewritten body would be over max_buffer_bytes ({limit})");
                return match (self.ops.on_overflow, which) {
                    (Overflow::Pass, _) => {
                        log!(Warn, "{} {why}: passed on unmodified", which.name());
                        Action::Continue
                    }
                    (Overflow::Reject, Which::Request) => self.refuse(which, &why),
                    (Overflow::Reject, Which::Response) => self.reset_response(&why),
                };
            }
        }
        Action::Continue
    }

    /// A response that cannot be sent as asked once its headers are on their way: the
    /// stream is reset (a local reply at this point resets it too, without saying why).
    fn reset_response(&mut self, why: &str) -> Action {
        log!(
            Info,
            "response {why} after its headers were sent: stream reset"
        );
        let status = raw::close_stream(raw::HTTP_RESPONSE_STREAM);
        if status != raw::OK {
            log!(
                Warn,
                "resetting the stream failed with host status {status}"
            );
        }
        self.response.answered = true;
        Action::Pause
    }

    fn on_trailers(&mut self, which: Which) -> Action {
        if self.state(which).answered {
            return Action::Pause;
        }
        if self.side(which).rewrites() && !self.state(which).overflowed {
            log!(
                Warn,
                "{} with trailers: its body is passed on unmodified",
                which.name()
            );
        }
        Action::Continue
    }
}

impl Context for BodyFilter {}

impl HttpContext for BodyFilter {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if self.ops.response.rewrites() {
            // Ask for the response as it is: a compressed one could not be rewritten.
            let status = raw::remove_header(raw::REQUEST_HEADERS, "accept-encoding");
            if status != raw::OK {
                log!(
                    Warn,
                    "removing request accept-encoding failed with host status {status}"
                );
            }
        }
        self.on_headers(Which::Request, end_of_stream)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.on_body(Which::Request, body_size, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, _: usize) -> Action {
        self.on_trailers(Which::Request)
    }

    fn on_http_response_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if self.answered() {
            return Action::Continue;
        }
        self.on_headers(Which::Response, end_of_stream)
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.answered() {
            return Action::Continue;
        }
        if let Some(why) = &self.replacement {
            let text = if end_of_stream { why.as_bytes() } else { b"" };
            let status = raw::set_buffer(raw::RESPONSE_BODY, body_size, text);
            if status != raw::OK {
                log!(
                    Warn,
                    "replacing the response body failed with host status {status}"
                );
            }
            return Action::Continue;
        }
        self.on_body(Which::Response, body_size, end_of_stream)
    }

    fn on_http_response_trailers(&mut self, _: usize) -> Action {
        if self.answered() {
            return Action::Continue;
        }
        self.on_trailers(Which::Response)
    }
}
