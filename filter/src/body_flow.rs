//! What `http-body-operation` does at each callback of a stream, as plain Rust: given what
//! the glue read (a declared `content-length`, a `content-encoding`, a chunk's size), the
//! decider answers with a step the glue executes (refuse, replace the response, reset it,
//! hold the body, rewrite it, pass it on) and keeps the stream's per-side state.
//!
//! Headers cannot wait for the body: Envoy turns a paused headers callback into "stop
//! everything", so no body callback would come. A `content-length` over the buffer is
//! therefore refused in the headers callback (413 / 502); a body that outgrows the buffer
//! without announcing it is caught in a body callback, where a request still gets its 413
//! but a response's headers are already on their way, so the stream is reset.

use crate::body_ops::{BodyOperation, BodySide, Overflow, Rewrite};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Request => "request",
            Side::Response => "response",
        }
    }

    /// The local reply when a body cannot be handled: status and response code details.
    pub fn refusal(self) -> (u32, &'static str) {
        match self {
            Side::Request => (413, "request_body_too_large"),
            Side::Response => (502, "response_body_too_large"),
        }
    }
}

/// The headers callback's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadersStep {
    /// Nothing to do: continue.
    Continue,
    /// Answer locally with the side's refusal (413 / 502) and this reason.
    Refuse(String),
    /// The response becomes a 502 whose body is this reason (its headers are in hand, its
    /// body will be swapped chunk by chunk).
    ReplaceResponse(String),
    /// The body is in this content-encoding: it goes on untouched (rewriting compressed
    /// bytes would corrupt them).
    PassEncoded(String),
    /// The body will be held and rewritten: drop `content-length`, its new size is unknown.
    Hold,
}

/// A body callback's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyStep {
    /// This filter already answered: stop.
    Stop,
    /// Answer locally with the side's refusal and this reason.
    Refuse(String),
    /// The response's headers are gone: reset the stream, for this reason.
    ResetResponse(String),
    /// Send the chunk on.
    Pass,
    /// The body outgrew `max_buffer_bytes` (this many) under `on_overflow: pass`: send it on
    /// unmodified from now on, and log it.
    PassOverflowing(u64),
    /// Hold the chunk until the end of the stream.
    Hold,
    /// The whole body is in: read it and rewrite it.
    Rewrite,
}

/// What to do once the side's rewrite is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewriteStep {
    /// Nothing changed: continue.
    Keep,
    /// Write this body in place of the old one; the text says what was done.
    Write(Vec<u8>, String),
    /// Send it on unmodified, logging this reason (at info for a body that is not JSON,
    /// at warning for one that would outgrow the buffer).
    PassNotJson(String),
    PassTooLarge(String),
    Refuse(String),
    ResetResponse(String),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SideState {
    /// Bytes already sent on (not held), for the request size limit.
    passed: u64,
    /// The rest flows untouched: past `max_buffer_bytes` with the `pass` policy, or a body
    /// in a content-encoding.
    overflowed: bool,
    /// A local reply was sent (or the stream reset); later callbacks only stop.
    answered: bool,
}

/// One stream's decisions and state.
#[derive(Debug, Clone, Default)]
pub struct BodyFlow {
    request: SideState,
    response: SideState,
}

fn side(ops: &BodyOperation, which: Side) -> &BodySide {
    match which {
        Side::Request => &ops.request,
        Side::Response => &ops.response,
    }
}

impl BodyFlow {
    fn state(&mut self, which: Side) -> &mut SideState {
        match which {
            Side::Request => &mut self.request,
            Side::Response => &mut self.response,
        }
    }

    /// This filter's own local reply (or reset) is under way: let the rest through
    /// untouched.
    pub fn answered(&self) -> bool {
        self.request.answered || self.response.answered
    }

    /// Records that the glue answered (or reset) on `which`.
    pub fn mark_answered(&mut self, which: Side) {
        self.state(which).answered = true;
    }

    /// The headers callback. `declared` reads `content-length` and `encoding` the
    /// `content-encoding`, each only if the decision needs it.
    pub fn headers(
        &mut self,
        ops: &BodyOperation,
        which: Side,
        end_of_stream: bool,
        declared: impl Fn() -> Option<u64>,
        encoding: impl FnOnce() -> Option<String>,
    ) -> HeadersStep {
        if which == Side::Request {
            if let Some(max) = ops.request.max_bytes {
                if let Some(len) = declared().filter(|len| *len > max) {
                    return HeadersStep::Refuse(format!(
                        "content-length {len} is over the {max}-byte limit"
                    ));
                }
            }
        }
        if end_of_stream || !side(ops, which).rewrites() {
            return HeadersStep::Continue;
        }
        let limit = ops.max_buffer_bytes;
        if ops.on_overflow == Overflow::Reject {
            if let Some(len) = declared().filter(|len| *len > limit) {
                let why = format!(
                    "content-length {len} is over max_buffer_bytes ({limit}): the body cannot be rewritten"
                );
                return match which {
                    Side::Request => HeadersStep::Refuse(why),
                    Side::Response => HeadersStep::ReplaceResponse(why),
                };
            }
        }
        // Any whitespace, not only ASCII's: Envoy passes `identity` followed by a Unicode
        // space, and a body so labelled must not skip the redaction.
        if let Some(e) = encoding().filter(|e| !e.trim().eq_ignore_ascii_case("identity")) {
            self.state(which).overflowed = true;
            return HeadersStep::PassEncoded(e);
        }
        HeadersStep::Hold
    }

    /// A body callback with `size` bytes buffered so far (Envoy's `body_size`).
    pub fn body(
        &mut self,
        ops: &BodyOperation,
        which: Side,
        size: u64,
        end_of_stream: bool,
    ) -> BodyStep {
        if self.state(which).answered {
            return BodyStep::Stop;
        }
        let holding = side(ops, which).rewrites() && !self.state(which).overflowed;
        if which == Side::Request {
            if let Some(max) = ops.request.max_bytes {
                if self.request.passed.saturating_add(size) > max {
                    return BodyStep::Refuse(format!("the body is over the {max}-byte limit"));
                }
            }
        }
        if !holding {
            let state = self.state(which);
            state.passed = state.passed.saturating_add(size);
            return BodyStep::Pass;
        }
        let limit = ops.max_buffer_bytes;
        if size > limit {
            return match (ops.on_overflow, which) {
                (Overflow::Reject, Side::Response) => {
                    BodyStep::ResetResponse(format!("body over max_buffer_bytes ({limit})"))
                }
                (Overflow::Reject, Side::Request) => BodyStep::Refuse(format!(
                    "the body is over max_buffer_bytes ({limit}) and cannot be rewritten"
                )),
                (Overflow::Pass, _) => {
                    let state = self.state(which);
                    state.overflowed = true;
                    state.passed = state.passed.saturating_add(size);
                    BodyStep::PassOverflowing(limit)
                }
            };
        }
        if end_of_stream {
            BodyStep::Rewrite
        } else {
            BodyStep::Hold
        }
    }

    /// Rewrites the whole `body` of `which` and says what to do with the result.
    pub fn rewrite(&self, ops: &BodyOperation, which: Side, body: &[u8]) -> RewriteStep {
        let limit = usize::try_from(ops.max_buffer_bytes).unwrap_or(usize::MAX);
        match side(ops, which).rewrite(body, limit) {
            Rewrite::Unchanged => RewriteStep::Keep,
            Rewrite::Changed(new, what) => RewriteStep::Write(new, what),
            Rewrite::NotJson(e) => RewriteStep::PassNotJson(e),
            Rewrite::TooLarge(limit) => {
                let why = format!("the rewritten body would be over max_buffer_bytes ({limit})");
                match (ops.on_overflow, which) {
                    (Overflow::Pass, _) => RewriteStep::PassTooLarge(why),
                    (Overflow::Reject, Side::Request) => RewriteStep::Refuse(why),
                    (Overflow::Reject, Side::Response) => RewriteStep::ResetResponse(why),
                }
            }
        }
    }

    /// Trailers arrived: `true` when a body that was to be rewritten goes on unmodified
    /// (the glue logs it), `None` when this filter already answered.
    pub fn trailers(&self, ops: &BodyOperation, which: Side) -> Option<bool> {
        let state = match which {
            Side::Request => &self.request,
            Side::Response => &self.response,
        };
        if state.answered {
            return None;
        }
        Some(side(ops, which).rewrites() && !state.overflowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;

    fn ops(json: &str) -> BodyOperation {
        match PluginConfig::parse(json.as_bytes()).unwrap() {
            PluginConfig::HttpBodyOperation(o) => o,
            other => panic!("{}", other.role()),
        }
    }

    fn rewriting(on_overflow: &str) -> BodyOperation {
        ops(&format!(
            r#"{{"role":"http-body-operation","max_buffer_bytes":100,"on_overflow":"{on_overflow}",
            "request":{{"max_bytes":1000,"replace":[{{"from":"a","to":"bbbb"}}]}},
            "response":{{"redact_json":{{"keys":["k"]}}}}}}"#
        ))
    }

    const NONE: fn() -> Option<u64> = || None;

    #[test]
    fn a_declared_size_is_refused_before_the_body() {
        let o = rewriting("reject");
        let mut f = BodyFlow::default();
        assert_eq!(
            f.headers(&o, Side::Request, false, || Some(1001), || None),
            HeadersStep::Refuse("content-length 1001 is over the 1000-byte limit".into())
        );
        assert!(matches!(
            f.headers(&o, Side::Request, false, || Some(101), || None),
            HeadersStep::Refuse(why) if why.contains("max_buffer_bytes (100)")
        ));
        assert!(matches!(
            f.headers(&o, Side::Response, false, || Some(101), || None),
            HeadersStep::ReplaceResponse(_)
        ));
        // With `pass`, a big declared body is held and handled when it comes.
        let o = rewriting("pass");
        assert_eq!(
            f.headers(&o, Side::Response, false, || Some(101), || None),
            HeadersStep::Hold
        );
        // No body, or nothing to rewrite: nothing to do.
        assert_eq!(
            f.headers(&o, Side::Response, true, NONE, || None),
            HeadersStep::Continue
        );
        let plain = ops(r#"{"role":"http-body-operation"}"#);
        assert_eq!(
            f.headers(&plain, Side::Response, false, NONE, || None),
            HeadersStep::Continue
        );
    }

    #[test]
    fn an_encoded_body_passes_untouched_to_its_end() {
        let o = rewriting("reject");
        let mut f = BodyFlow::default();
        assert_eq!(
            f.headers(&o, Side::Response, false, NONE, || Some("gzip".into())),
            HeadersStep::PassEncoded("gzip".into())
        );
        assert_eq!(f.body(&o, Side::Response, 5000, true), BodyStep::Pass);
        assert_eq!(f.trailers(&o, Side::Response), Some(false));
        let mut f = BodyFlow::default();
        assert_eq!(
            f.headers(&o, Side::Response, false, NONE, || Some(" Identity".into())),
            HeadersStep::Hold
        );
    }

    /// Envoy 1.40 hands an upstream's `content-encoding: identity<U+00A0>` to the filter as
    /// it is (it refuses VT and DEL, not UTF-8 spaces). Trimmed with `str::trim` that was
    /// `identity` and the JSON was redacted; it must not now reach the client unredacted.
    #[test]
    fn an_identity_encoding_padded_with_a_unicode_space_is_still_redacted() {
        let o = rewriting("pass");
        for padded in ["identity\u{a0}", "\u{2003}identity", "identity\u{3000}"] {
            let mut f = BodyFlow::default();
            assert_eq!(
                f.headers(&o, Side::Response, false, NONE, || Some(padded.into())),
                HeadersStep::Hold,
                "{}",
                padded.escape_default()
            );
        }
    }

    #[test]
    fn bodies_are_held_then_rewritten_or_handled_as_on_overflow_says() {
        let mut f = BodyFlow::default();
        let o = rewriting("pass");
        assert_eq!(f.body(&o, Side::Response, 60, false), BodyStep::Hold);
        assert_eq!(f.body(&o, Side::Response, 90, true), BodyStep::Rewrite);
        assert_eq!(
            f.body(&o, Side::Response, 101, false),
            BodyStep::PassOverflowing(100)
        );
        // Overflowed: the rest goes on as it comes.
        assert_eq!(f.body(&o, Side::Response, 500, true), BodyStep::Pass);

        let o = rewriting("reject");
        let mut f = BodyFlow::default();
        assert!(matches!(
            f.body(&o, Side::Response, 101, false),
            BodyStep::ResetResponse(_)
        ));
        f.mark_answered(Side::Response);
        assert_eq!(f.body(&o, Side::Response, 1, true), BodyStep::Stop);
        assert_eq!(f.trailers(&o, Side::Response), None);
        assert!(f.answered());
        let mut f = BodyFlow::default();
        assert!(matches!(
            f.body(&o, Side::Request, 101, false),
            BodyStep::Refuse(why) if why.contains("max_buffer_bytes (100)")
        ));
    }

    #[test]
    fn the_request_limit_counts_bytes_that_passed() {
        let o = ops(r#"{"role":"http-body-operation","request":{"max_bytes":10}}"#);
        let mut f = BodyFlow::default();
        assert_eq!(f.body(&o, Side::Request, 6, false), BodyStep::Pass);
        assert_eq!(
            f.body(&o, Side::Request, 5, true),
            BodyStep::Refuse("the body is over the 10-byte limit".into())
        );
        assert_eq!(f.trailers(&o, Side::Request), Some(false));
    }

    #[test]
    fn a_rewrite_is_written_kept_or_handled_as_on_overflow_says() {
        let f = BodyFlow::default();
        let o = rewriting("reject");
        assert_eq!(
            f.rewrite(&o, Side::Request, b"xax"),
            RewriteStep::Write(b"xbbbbx".to_vec(), "1 x \"a\"".into())
        );
        assert_eq!(f.rewrite(&o, Side::Request, b"xyz"), RewriteStep::Keep);
        assert!(matches!(
            f.rewrite(&o, Side::Response, b"<p>"),
            RewriteStep::PassNotJson(_)
        ));
        let grows = vec![b'a'; 30];
        assert!(matches!(
            f.rewrite(&o, Side::Request, &grows),
            RewriteStep::Refuse(why) if why.contains("(100)")
        ));
        let json = format!(r#"[{}{{"k":1}}]"#, r#"{"k":1},"#.repeat(20));
        assert!(matches!(
            f.rewrite(&o, Side::Response, json.as_bytes()),
            RewriteStep::ResetResponse(_)
        ));
        let o = rewriting("pass");
        assert!(matches!(
            f.rewrite(&o, Side::Response, json.as_bytes()),
            RewriteStep::PassTooLarge(_)
        ));
    }
}
