//! `http-body-operation` on a stream: the glue that executes [`crate::body_flow`]'s steps.
//! It reads what a decision needs (`content-length`, `content-encoding`, the whole body at
//! its end), asks the stream's [`BodyFlow`], and does what it answers: a local reply, a
//! response turned into a 502, a reset, a body written back, or nothing. Counted: bodies
//! rewritten, passed unchanged, and over a limit (`rewritten_total`, `passed_total`,
//! `over_limit_total`), and body bytes each way (`request_bytes_total`, `response_bytes_total`).

use std::rc::Rc;

use proxy_wasm::types::{Action, BufferType, MapType, StreamType};

use super::metrics::{Counter, Metrics};
use super::{host, log};
use crate::body_flow::{BodyFlow, BodyStep, HeadersStep, Refusal, RewriteStep, Side, TrailersStep};
use crate::body_ops::BodyOperation;

fn headers_map(which: Side) -> MapType {
    match which {
        Side::Request => MapType::HttpRequestHeaders,
        Side::Response => MapType::HttpResponseHeaders,
    }
}

fn body_buffer(which: Side) -> BufferType {
    match which {
        Side::Request => BufferType::HttpRequestBody,
        Side::Response => BufferType::HttpResponseBody,
    }
}

pub struct BodyRoot {
    ops: BodyOperation,
    rewritten: Counter,
    passed: Counter,
    over_limit: Counter,
    request_bytes: Counter,
    response_bytes: Counter,
}

impl BodyRoot {
    #[inline(never)]
    pub fn new(ops: BodyOperation) -> Self {
        let m = Metrics::new("http-body-operation");
        Self {
            ops,
            rewritten: m.counter("rewritten_total"),
            passed: m.counter("passed_total"),
            over_limit: m.counter("over_limit_total"),
            request_bytes: m.counter("request_bytes_total"),
            response_bytes: m.counter("response_bytes_total"),
        }
    }

    fn bytes(&self, which: Side, n: usize) {
        match which {
            Side::Request => self.request_bytes.add(n as u64),
            Side::Response => self.response_bytes.add(n as u64),
        }
    }
}

pub struct BodyFilter {
    root: Rc<BodyRoot>,
    flow: BodyFlow,
    /// Set when the response was replaced: the text its body is replaced with.
    replacement: Option<String>,
    /// The size of the body being rewritten, as its callback gave it.
    size: usize,
}

impl BodyFilter {
    pub fn new(root: Rc<BodyRoot>) -> Self {
        Self {
            root,
            flow: BodyFlow::default(),
            replacement: None,
            size: 0,
        }
    }

    fn refuse(&mut self, which: Side, refusal: Refusal) -> Action {
        self.root.over_limit.add(1);
        let Refusal {
            status,
            details,
            why,
        } = refusal;
        log!(Info, "{} refused with {status}: {why}", which.name());
        if let Err(sent) = host::send_local_response(status, details, why.as_bytes(), &[]) {
            log!(
                Warn,
                "local reply {status} failed with host status {sent:?}"
            );
        }
        self.flow.mark_answered(which);
        Action::Pause
    }

    /// A response whose headers are in hand but whose body cannot be rewritten: its status
    /// becomes 502 and its body is swapped, chunk by chunk, for the reason. (A local reply
    /// cannot do this: Envoy resets a stream whose response a Wasm filter replaces at this
    /// point.)
    fn replace_response(&mut self, status: u32, why: String) -> Action {
        self.root.over_limit.add(1);
        log!(Info, "response refused with {status}: {why}");
        let status = status.to_string();
        for (name, value) in [(":status", status.as_str()), ("content-type", "text/plain")] {
            if let Err(status) = host::replace_header(MapType::HttpResponseHeaders, name, value) {
                log!(
                    Warn,
                    "setting response {name} failed with host status {status:?}"
                );
            }
        }
        // The reason replaces the body: nothing that described the upstream's body may stay
        // (a `content-encoding: gzip` would make the client decode plain text).
        for name in ["content-length", "content-encoding"] {
            // Absent is fine; a failure leaves a header the 502 makes harmless.
            let _ = host::remove_header(MapType::HttpResponseHeaders, name);
        }
        self.replacement = Some(why);
        Action::Continue
    }

    /// A response that cannot be sent as asked once its headers are on their way: the
    /// stream is reset (a local reply at this point resets it too, without saying why).
    fn reset_response(&mut self, why: &str) -> Action {
        self.root.over_limit.add(1);
        log!(
            Info,
            "response {why} after its headers were sent: stream reset"
        );
        if let Err(status) = host::close_stream(StreamType::HttpResponse) {
            log!(
                Warn,
                "resetting the stream failed with host status {status:?}"
            );
        }
        self.flow.mark_answered(Side::Response);
        Action::Pause
    }

    fn on_headers(&mut self, which: Side, end_of_stream: bool) -> Action {
        let map = headers_map(which);
        let declared = || {
            host::header_text(map, "content-length")
                .and_then(|v| v.trim_ascii().parse::<u64>().ok())
        };
        // Every header of the name: a second one must not hide behind the first.
        let encoding = || {
            host::header_values(map, "content-encoding")
                .unwrap_or_else(|_| vec!["(unreadable)".to_string()])
        };
        match self
            .flow
            .headers(&self.root.ops, which, end_of_stream, declared, encoding)
        {
            HeadersStep::Continue => Action::Continue,
            HeadersStep::Refuse(refusal) => self.refuse(which, refusal),
            HeadersStep::ReplaceResponse(status, why) => self.replace_response(status, why),
            HeadersStep::PassEncoded(encoding) => {
                self.root.passed.add(1);
                log!(
                    Info,
                    "{} body is in content-encoding {encoding}: passed on unmodified",
                    which.name()
                );
                Action::Continue
            }
            HeadersStep::Hold => {
                if let Err(status) = host::remove_header(map, "content-length") {
                    log!(
                        Warn,
                        "removing {} content-length failed with host status {status:?}",
                        which.name()
                    );
                }
                Action::Continue
            }
        }
    }

    fn on_body(&mut self, which: Side, body_size: usize, end_of_stream: bool) -> Action {
        match self
            .flow
            .body(&self.root.ops, which, body_size as u64, end_of_stream)
        {
            BodyStep::Stop => Action::Pause,
            BodyStep::Refuse(refusal) => self.refuse(which, refusal),
            BodyStep::ResetResponse(why) => self.reset_response(&why),
            BodyStep::Pass => {
                self.root.bytes(which, body_size);
                Action::Continue
            }
            BodyStep::PassOverflowing(limit) => {
                self.root.bytes(which, body_size);
                self.root.over_limit.add(1);
                log!(
                    Warn,
                    "{} body over max_buffer_bytes ({limit}): passed on unmodified",
                    which.name()
                );
                Action::Continue
            }
            BodyStep::Hold => Action::Pause,
            BodyStep::Rewrite => self.rewrite(which, body_size),
        }
    }

    /// Rewrites the whole body in place; the action is what the body callback returns.
    fn rewrite(&mut self, which: Side, body_size: usize) -> Action {
        self.size = body_size;
        let body = match host::buffer(body_buffer(which), body_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(status) => {
                let why = format!("reading the body failed with host status {status:?}");
                if let Some(step) = self.flow.unhandled(&self.root.ops, which, why) {
                    return self.take(which, step);
                }
                log!(
                    Warn,
                    "reading the {} body failed with host status {status:?}; passed on unmodified",
                    which.name()
                );
                return Action::Continue;
            }
        };
        self.root.bytes(which, body.len());
        let step = self.flow.rewrite(&self.root.ops, which, &body);
        drop(body);
        self.take(which, step)
    }

    /// Does what a rewrite came to.
    fn take(&mut self, which: Side, step: RewriteStep) -> Action {
        match step {
            RewriteStep::Keep => {
                self.root.passed.add(1);
                Action::Continue
            }
            RewriteStep::Write(new, what) => {
                self.root.rewritten.add(1);
                if let Err(status) = host::set_buffer(body_buffer(which), self.size, &new) {
                    let why = format!("writing the body failed with host status {status:?}");
                    if let Some(step) = self.flow.unhandled(&self.root.ops, which, why) {
                        return self.take(which, step);
                    }
                    log!(
                        Warn,
                        "writing the {} body failed with host status {status:?}; passed on unmodified",
                        which.name()
                    );
                } else {
                    log!(Debug, "{} body rewritten: {what}", which.name());
                }
                Action::Continue
            }
            RewriteStep::PassNotJson(e) => {
                self.root.passed.add(1);
                log!(
                    Info,
                    "{} body is not JSON ({e}): passed on unmodified",
                    which.name()
                );
                Action::Continue
            }
            RewriteStep::PassTooLarge(why) => {
                self.root.over_limit.add(1);
                log!(Warn, "{} {why}: passed on unmodified", which.name());
                Action::Continue
            }
            RewriteStep::Refuse(refusal) => self.refuse(which, refusal),
            RewriteStep::ResetResponse(why) => self.reset_response(&why),
        }
    }

    fn on_trailers(&mut self, which: Side) -> Action {
        match self.flow.trailers(&self.root.ops, which) {
            TrailersStep::Stop => Action::Pause,
            TrailersStep::Continue => Action::Continue,
            TrailersStep::PassUnmodified => {
                log!(
                    Warn,
                    "{} with trailers: its body is passed on unmodified",
                    which.name()
                );
                Action::Continue
            }
            TrailersStep::Refuse(refusal) => self.refuse(which, refusal),
            TrailersStep::ResetResponse(why) => self.reset_response(&why),
        }
    }
}

/// The callbacks [`super::stream`]'s contexts route here, each compiled on its own (see
/// `plugin::PluginContext::configure`).
impl BodyFilter {
    #[inline(never)]
    pub fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if self.root.ops.response.rewrites() {
            // Ask for the response as it is: a compressed one could not be rewritten.
            if let Err(status) = host::remove_header(MapType::HttpRequestHeaders, "accept-encoding")
            {
                log!(
                    Warn,
                    "removing request accept-encoding failed with host status {status:?}"
                );
            }
        }
        self.on_headers(Side::Request, end_of_stream)
    }

    #[inline(never)]
    pub fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.on_body(Side::Request, body_size, end_of_stream)
    }

    #[inline(never)]
    pub fn on_http_request_trailers(&mut self, _: usize) -> Action {
        self.on_trailers(Side::Request)
    }

    #[inline(never)]
    pub fn on_http_response_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if self.flow.answered() {
            return Action::Continue;
        }
        self.on_headers(Side::Response, end_of_stream)
    }

    #[inline(never)]
    pub fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.flow.answered() {
            return Action::Continue;
        }
        if let Some(why) = &self.replacement {
            let text = if end_of_stream { why.as_bytes() } else { b"" };
            if let Err(status) = host::set_buffer(BufferType::HttpResponseBody, body_size, text) {
                log!(
                    Warn,
                    "replacing the response body failed with host status {status:?}"
                );
            }
            return Action::Continue;
        }
        self.on_body(Side::Response, body_size, end_of_stream)
    }

    #[inline(never)]
    pub fn on_http_response_trailers(&mut self, _: usize) -> Action {
        if self.flow.answered() {
            return Action::Continue;
        }
        self.on_trailers(Side::Response)
    }
}
