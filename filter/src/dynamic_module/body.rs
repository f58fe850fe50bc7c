//! `http-body-operation` as a dynamic module: the glue that executes [`crate::body_flow`]'s
//! steps with Envoy's body callbacks, as the Wasm glue does with proxy-wasm's. Where the two
//! ABIs differ: a held chunk is kept by answering `StopIterationAndBuffer`, and the body so
//! far is what Envoy buffered plus the chunk just received. Counted where the Wasm glue
//! counts: bodies rewritten, passed unchanged, and over a limit (`rewritten_total`,
//! `passed_total`, `over_limit_total`), and body bytes each way (`request_bytes_total`,
//! `response_bytes_total`).

use super::host::{log, Stream};
use super::metrics::{Counter, Metrics};
use super::Outcome;
use crate::body_flow::{BodyFlow, BodyStep, HeadersStep, Refusal, RewriteStep, Side, TrailersStep};
use crate::body_ops::{BodyOperation, MAX_BUFFER_LIMIT};

/// What Envoy hands the role, one hook at a time.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Headers { end_of_stream: bool },
    Body { end_of_stream: bool },
    Trailers,
}

pub struct Counters {
    rewritten: Counter,
    passed: Counter,
    over_limit: Counter,
    request_bytes: Counter,
    response_bytes: Counter,
}

impl Counters {
    pub fn new(m: &Metrics) -> Self {
        Self {
            rewritten: m.counter("rewritten_total"),
            passed: m.counter("passed_total"),
            over_limit: m.counter("over_limit_total"),
            request_bytes: m.counter("request_bytes_total"),
            response_bytes: m.counter("response_bytes_total"),
        }
    }

    fn bytes(&self, stream: &Stream, which: Side, n: u64) {
        let counter = match which {
            Side::Request => self.request_bytes,
            Side::Response => self.response_bytes,
        };
        stream.count(counter, n);
    }
}

/// A role's configuration: what to do, and its counters.
pub struct BodyRole<'a> {
    pub ops: &'a BodyOperation,
    pub counters: &'a Counters,
}

/// One stream's state.
#[derive(Default)]
pub struct BodyStream {
    flow: BodyFlow,
    /// Set when the response became a 502: the text its body is replaced with.
    replacement: Option<String>,
}

impl BodyStream {
    /// One hook of the stream. Once this filter answered the request itself (a local reply,
    /// or the response reset), the response's hooks have nothing left to do.
    pub fn on(&mut self, role: &BodyRole, stream: &Stream, which: Side, event: Event) -> Outcome {
        if which == Side::Response && self.flow.answered() {
            return Outcome::Continue;
        }
        match event {
            Event::Headers { end_of_stream } => self.on_headers(role, stream, which, end_of_stream),
            Event::Body { end_of_stream } => self.on_body(role, stream, which, end_of_stream),
            Event::Trailers => self.on_trailers(role, stream, which),
        }
    }

    fn refuse(
        &mut self,
        role: &BodyRole,
        stream: &Stream,
        which: Side,
        refusal: Refusal,
    ) -> Outcome {
        stream.count(role.counters.over_limit, 1);
        let Refusal {
            status,
            details,
            why,
        } = refusal;
        log!(Info, "{} refused with {status}: {why}", which.name());
        stream.send_response(status, details, why.as_bytes(), &[]);
        self.flow.mark_answered(which);
        Outcome::Stop
    }

    /// A response whose headers are in hand but whose body cannot be rewritten: its status
    /// becomes 502 and its body is swapped for the reason (see the Wasm glue).
    fn replace_response(
        &mut self,
        role: &BodyRole,
        stream: &Stream,
        status: u32,
        why: String,
    ) -> Outcome {
        stream.count(role.counters.over_limit, 1);
        log!(Info, "response refused with {status}: {why}");
        let status = status.to_string();
        for (name, value) in [(":status", status.as_str()), ("content-type", "text/plain")] {
            if !stream.set_header(Side::Response, name, value) {
                log!(Warn, "setting response {name} was refused by Envoy");
            }
        }
        for name in ["content-length", "content-encoding"] {
            stream.remove_header(Side::Response, name);
        }
        self.replacement = Some(why);
        Outcome::Continue
    }

    fn reset_response(&mut self, role: &BodyRole, stream: &Stream, why: &str) -> Outcome {
        stream.count(role.counters.over_limit, 1);
        log!(
            Info,
            "response {why} after its headers were sent: stream reset"
        );
        stream.reset("response_body_too_large");
        self.flow.mark_answered(Side::Response);
        Outcome::StopNoBuffer
    }

    fn on_headers(
        &mut self,
        role: &BodyRole,
        stream: &Stream,
        which: Side,
        end_of_stream: bool,
    ) -> Outcome {
        let ops = role.ops;
        if which == Side::Request && ops.response.rewrites() {
            // Ask for the response as it is: a compressed one could not be rewritten.
            stream.remove_header(Side::Request, "accept-encoding");
        }
        let declared = || {
            stream
                .header(which, "content-length")
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // Every header of the name: a second one must not hide behind the first.
        let encoding = || stream.header_values(which, "content-encoding");
        match self
            .flow
            .headers(ops, which, end_of_stream, declared, encoding)
        {
            HeadersStep::Continue => Outcome::Continue,
            HeadersStep::Refuse(refusal) => self.refuse(role, stream, which, refusal),
            HeadersStep::ReplaceResponse(status, why) => {
                self.replace_response(role, stream, status, why)
            }
            HeadersStep::PassEncoded(encoding) => {
                stream.count(role.counters.passed, 1);
                log!(
                    Info,
                    "{} body is in content-encoding {encoding}: passed on unmodified",
                    which.name()
                );
                Outcome::Continue
            }
            HeadersStep::Hold => {
                stream.remove_header(which, "content-length");
                Outcome::Continue
            }
        }
    }

    fn on_body(
        &mut self,
        role: &BodyRole,
        stream: &Stream,
        which: Side,
        end_of_stream: bool,
    ) -> Outcome {
        if which == Side::Response {
            if let Some(why) = &self.replacement {
                let text = if end_of_stream { why.as_bytes() } else { b"" };
                if !stream.replace_body(Side::Response, text) {
                    log!(Warn, "replacing the response body was refused by Envoy");
                }
                return Outcome::Continue;
            }
        }
        let size = stream.body_size(which) as u64;
        match self.flow.body(role.ops, which, size, end_of_stream) {
            BodyStep::Stop => Outcome::StopNoBuffer,
            BodyStep::Refuse(refusal) => self.refuse(role, stream, which, refusal),
            BodyStep::ResetResponse(why) => self.reset_response(role, stream, &why),
            BodyStep::Pass => {
                role.counters.bytes(stream, which, size);
                Outcome::Continue
            }
            BodyStep::PassOverflowing(limit) => {
                role.counters.bytes(stream, which, size);
                stream.count(role.counters.over_limit, 1);
                log!(
                    Warn,
                    "{} body over max_buffer_bytes ({limit}): passed on unmodified",
                    which.name()
                );
                Outcome::Continue
            }
            BodyStep::Hold => Outcome::Stop,
            BodyStep::Rewrite => self.rewrite(role, stream, which),
        }
    }

    fn rewrite(&mut self, role: &BodyRole, stream: &Stream, which: Side) -> Outcome {
        let counters = role.counters;
        let limit = usize::try_from(MAX_BUFFER_LIMIT).unwrap_or(usize::MAX);
        let Some(body) = stream.body(which, limit) else {
            let why = "the body could not be read whole".to_string();
            if let Some(step) = self.flow.unhandled(role.ops, which, why) {
                return self.take(role, stream, which, step);
            }
            log!(
                Warn,
                "the {} body could not be read whole; passed on unmodified",
                which.name()
            );
            return Outcome::Continue;
        };
        counters.bytes(stream, which, body.len() as u64);
        let step = self.flow.rewrite(role.ops, which, &body);
        drop(body);
        self.take(role, stream, which, step)
    }

    /// Does what a rewrite came to.
    fn take(
        &mut self,
        role: &BodyRole,
        stream: &Stream,
        which: Side,
        step: RewriteStep,
    ) -> Outcome {
        let counters = role.counters;
        match step {
            RewriteStep::Keep => {
                stream.count(counters.passed, 1);
                Outcome::Continue
            }
            RewriteStep::Write(new, what) => {
                stream.count(counters.rewritten, 1);
                if stream.replace_body(which, &new) {
                    log!(Debug, "{} body rewritten: {what}", which.name());
                } else if let Some(step) = self.flow.unhandled(
                    role.ops,
                    which,
                    "writing the body was refused by Envoy".into(),
                ) {
                    return self.take(role, stream, which, step);
                } else {
                    log!(
                        Warn,
                        "writing the {} body was refused by Envoy; passed on unmodified",
                        which.name()
                    );
                }
                Outcome::Continue
            }
            RewriteStep::PassNotJson(e) => {
                stream.count(counters.passed, 1);
                log!(
                    Info,
                    "{} body is not JSON ({e}): passed on unmodified",
                    which.name()
                );
                Outcome::Continue
            }
            RewriteStep::PassTooLarge(why) => {
                stream.count(counters.over_limit, 1);
                log!(Warn, "{} {why}: passed on unmodified", which.name());
                Outcome::Continue
            }
            RewriteStep::Refuse(refusal) => self.refuse(role, stream, which, refusal),
            RewriteStep::ResetResponse(why) => self.reset_response(role, stream, &why),
        }
    }

    fn on_trailers(&mut self, role: &BodyRole, stream: &Stream, which: Side) -> Outcome {
        match self.flow.trailers(role.ops, which) {
            TrailersStep::Stop => Outcome::Stop,
            TrailersStep::Continue => Outcome::Continue,
            TrailersStep::PassUnmodified => {
                log!(
                    Warn,
                    "{} with trailers: its body is passed on unmodified",
                    which.name()
                );
                Outcome::Continue
            }
            TrailersStep::Refuse(refusal) => self.refuse(role, stream, which, refusal),
            TrailersStep::ResetResponse(why) => self.reset_response(role, stream, &why),
        }
    }
}
