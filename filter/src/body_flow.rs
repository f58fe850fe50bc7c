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

use crate::body_ops::{BodyOperation, BodySide, Overflow, Rewrite, Uninspectable};

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

    /// The local reply when a body is too large: status and response code details.
    pub fn refusal(self) -> (u32, &'static str) {
        match self {
            Side::Request => (413, "request_body_too_large"),
            Side::Response => (502, "response_body_too_large"),
        }
    }

    fn is_request(self) -> bool {
        self == Side::Request
    }
}

/// A local reply: status, Envoy's response code details, and the reason (the reply's body
/// and the log's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u32,
    pub details: &'static str,
    pub why: String,
}

impl Refusal {
    /// The side's "too large" reply (413 / 502).
    fn too_large(which: Side, why: String) -> Self {
        let (status, details) = which.refusal();
        Self {
            status,
            details,
            why,
        }
    }

    /// The configured reply to a body redaction cannot inspect.
    fn uninspectable(ops: &BodyOperation, which: Side, why: String) -> Self {
        let (status, details) = match which {
            Side::Request => (ops.refuse_status.request, "request_body_uninspectable"),
            Side::Response => (ops.refuse_status.response, "response_body_uninspectable"),
        };
        Self {
            status,
            details,
            why,
        }
    }
}

/// Whether the `content-encoding` values (one per header) leave the body as it is: no
/// header, or one that is exactly `identity` (in any case, as content-codings are). A list,
/// a parameter, padding, an empty value or a second header is not: a reader that ignores
/// what it does not know would see other bytes than the role did. `Err` describes it.
pub fn plain_encoding(values: &[String]) -> Result<(), String> {
    match values {
        [] => Ok(()),
        [one] if one.eq_ignore_ascii_case("identity") => Ok(()),
        [one] => Err(crate::quote::Quoted(one).to_string()),
        many => {
            let mut shown = String::new();
            for (i, v) in many.iter().enumerate() {
                if i > 0 {
                    shown.push_str(", ");
                }
                shown.push_str(&crate::quote::Quoted(v).to_string());
            }
            Err(format!("{shown} ({} headers)", many.len()))
        }
    }
}

/// The headers callback's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadersStep {
    /// Nothing to do: continue.
    Continue,
    /// Answer locally.
    Refuse(Refusal),
    /// The response becomes this status whose body is the reason (its headers are in
    /// hand, its body will be swapped chunk by chunk).
    ReplaceResponse(u32, String),
    /// The body is in this content-encoding (quoted): it goes on untouched (rewriting
    /// compressed bytes would corrupt them).
    PassEncoded(String),
    /// The body will be held and rewritten: drop `content-length`, its new size is unknown.
    Hold,
}

/// A body callback's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyStep {
    /// This filter already answered: stop.
    Stop,
    /// Answer locally.
    Refuse(Refusal),
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
    Refuse(Refusal),
    ResetResponse(String),
}

/// The trailers callback's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrailersStep {
    /// This filter already answered: stop.
    Stop,
    Continue,
    /// The held body goes on unmodified (logged).
    PassUnmodified,
    Refuse(Refusal),
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
        encodings: impl FnOnce() -> Vec<String>,
    ) -> HeadersStep {
        if which == Side::Request {
            if let Some(max) = ops.request.max_bytes {
                if let Some(len) = declared().filter(|len| *len > max) {
                    return HeadersStep::Refuse(Refusal::too_large(
                        which,
                        format!("content-length {len} is over the {max}-byte limit"),
                    ));
                }
            }
        }
        if end_of_stream || !side(ops, which).rewrites() {
            return HeadersStep::Continue;
        }
        let limit = ops.max_buffer_bytes;
        if overflow(ops, which) == Overflow::Reject {
            if let Some(len) = declared().filter(|len| *len > limit) {
                let why = format!(
                    "content-length {len} is over max_buffer_bytes ({limit}): the body cannot be rewritten"
                );
                return match which {
                    Side::Request => HeadersStep::Refuse(Refusal::too_large(which, why)),
                    Side::Response => HeadersStep::ReplaceResponse(which.refusal().0, why),
                };
            }
        }
        if let Err(e) = plain_encoding(&encodings()) {
            if ops.refuses(which.is_request(), Uninspectable::ContentEncoding) {
                let why = format!("content-encoding {e}: the body cannot be inspected");
                return match which {
                    Side::Request => HeadersStep::Refuse(Refusal::uninspectable(ops, which, why)),
                    Side::Response => HeadersStep::ReplaceResponse(ops.refuse_status.response, why),
                };
            }
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
                    return BodyStep::Refuse(Refusal::too_large(
                        which,
                        format!("the body is over the {max}-byte limit"),
                    ));
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
            return match (overflow(ops, which), which) {
                (Overflow::Reject, Side::Response) => {
                    BodyStep::ResetResponse(format!("body over max_buffer_bytes ({limit})"))
                }
                (Overflow::Reject, Side::Request) => BodyStep::Refuse(Refusal::too_large(
                    which,
                    format!("the body is over max_buffer_bytes ({limit}) and cannot be rewritten"),
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
            Rewrite::NotJson(e) => {
                if !ops.refuses(which.is_request(), Uninspectable::NotJson) {
                    return RewriteStep::PassNotJson(e);
                }
                let why = format!("body is not JSON serde_json reads ({e})");
                match which {
                    Side::Request => RewriteStep::Refuse(Refusal::uninspectable(ops, which, why)),
                    Side::Response => RewriteStep::ResetResponse(why),
                }
            }
            Rewrite::TooLarge(limit) => {
                let why = format!("the rewritten body would be over max_buffer_bytes ({limit})");
                match (overflow(ops, which), which) {
                    (Overflow::Pass, _) => RewriteStep::PassTooLarge(why),
                    (Overflow::Reject, Side::Request) => {
                        RewriteStep::Refuse(Refusal::too_large(which, why))
                    }
                    (Overflow::Reject, Side::Response) => RewriteStep::ResetResponse(why),
                }
            }
        }
    }

    /// The held body could not be read or written back (`why`): a side that redacts refuses
    /// it (`Some`), any other lets it go on unmodified (`None`, logged by the glue).
    pub fn unhandled(&self, ops: &BodyOperation, which: Side, why: String) -> Option<RewriteStep> {
        side(ops, which).redact_json.as_ref()?;
        Some(match which {
            Side::Request => RewriteStep::Refuse(Refusal::uninspectable(ops, which, why)),
            Side::Response => RewriteStep::ResetResponse(why),
        })
    }

    /// Trailers arrived: a body that was held to be rewritten was never seen with its end.
    pub fn trailers(&self, ops: &BodyOperation, which: Side) -> TrailersStep {
        let state = match which {
            Side::Request => &self.request,
            Side::Response => &self.response,
        };
        if state.answered {
            return TrailersStep::Stop;
        }
        if !side(ops, which).rewrites() || state.overflowed {
            return TrailersStep::Continue;
        }
        if !ops.refuses(which.is_request(), Uninspectable::Trailers) {
            return TrailersStep::PassUnmodified;
        }
        let why = "body has trailers: it cannot be inspected whole".to_string();
        match which {
            Side::Request => TrailersStep::Refuse(Refusal::uninspectable(ops, which, why)),
            Side::Response => TrailersStep::ResetResponse(why),
        }
    }
}

/// The overflow policy of a side: a side that redacts refuses what outgrows the buffer
/// unless the configuration opts out (`fail_open: ["over-buffer"]`).
fn overflow(ops: &BodyOperation, which: Side) -> Overflow {
    if ops.refuses(which.is_request(), Uninspectable::OverBuffer) {
        Overflow::Reject
    } else {
        ops.on_overflow
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

    /// Requests replace, responses redact; `extra` adds fields (`"fail_open": [...]`).
    fn rewriting_with(on_overflow: &str, extra: &str) -> BodyOperation {
        ops(&format!(
            r#"{{"role":"http-body-operation","max_buffer_bytes":100,"on_overflow":"{on_overflow}",
            "request":{{"max_bytes":1000,"replace":[{{"from":"a","to":"bbbb"}}]}},
            "response":{{"redact_json":{{"keys":["k"]}}}}{extra}}}"#
        ))
    }

    fn rewriting(on_overflow: &str) -> BodyOperation {
        rewriting_with(on_overflow, "")
    }

    const NONE: fn() -> Option<u64> = || None;
    const PLAIN: fn() -> Vec<String> = Vec::new;

    fn enc(values: &[&str]) -> impl FnOnce() -> Vec<String> {
        let v: Vec<String> = values.iter().map(|s| s.to_string()).collect();
        move || v
    }

    fn why_of(step: &HeadersStep) -> &str {
        match step {
            HeadersStep::Refuse(r) => &r.why,
            HeadersStep::ReplaceResponse(_, why) => why,
            _ => "",
        }
    }

    #[test]
    fn a_declared_size_is_refused_before_the_body() {
        let o = rewriting("reject");
        let mut f = BodyFlow::default();
        assert_eq!(
            f.headers(&o, Side::Request, false, || Some(1001), PLAIN),
            HeadersStep::Refuse(Refusal {
                status: 413,
                details: "request_body_too_large",
                why: "content-length 1001 is over the 1000-byte limit".into()
            })
        );
        let step = f.headers(&o, Side::Request, false, || Some(101), PLAIN);
        assert!(why_of(&step).contains("max_buffer_bytes (100)"), "{step:?}");
        assert!(matches!(
            f.headers(&o, Side::Response, false, || Some(101), PLAIN),
            HeadersStep::ReplaceResponse(502, _)
        ));
        // With `pass`, a big declared body is held and handled when it comes, on a side
        // that does not redact; a side that redacts refuses it unless it opts out.
        let o = rewriting("pass");
        assert_eq!(
            f.headers(&o, Side::Request, false, || Some(101), PLAIN),
            HeadersStep::Hold
        );
        assert!(matches!(
            f.headers(&o, Side::Response, false, || Some(101), PLAIN),
            HeadersStep::ReplaceResponse(502, _)
        ));
        let o = rewriting_with("pass", r#","fail_open":["over-buffer"]"#);
        assert_eq!(
            f.headers(&o, Side::Response, false, || Some(101), PLAIN),
            HeadersStep::Hold
        );
        // No body, or nothing to rewrite: nothing to do.
        assert_eq!(
            f.headers(&o, Side::Response, true, NONE, PLAIN),
            HeadersStep::Continue
        );
        let plain = ops(r#"{"role":"http-body-operation"}"#);
        assert_eq!(
            f.headers(&plain, Side::Response, false, NONE, PLAIN),
            HeadersStep::Continue
        );
    }

    #[test]
    fn only_no_encoding_or_exactly_identity_is_plain() {
        for plain in [&[][..], &["identity"], &["Identity"]] {
            let v: Vec<String> = plain.iter().map(|s| s.to_string()).collect();
            assert_eq!(plain_encoding(&v), Ok(()), "{plain:?}");
        }
        for not in [
            &["gzip"][..],
            &[""],
            &["identity;q=1"],
            &["x-none"],
            &["identity, identity"],
            &["identity", "identity"],
            &["identity", "gzip"],
            &["identity\u{a0}"],
            &["\u{2003}identity"],
            &[" identity"],
        ] {
            let v: Vec<String> = not.iter().map(|s| s.to_string()).collect();
            assert!(plain_encoding(&v).is_err(), "{not:?}");
        }
    }

    #[test]
    fn an_encoded_body_is_refused_where_it_is_redacted_and_passes_elsewhere() {
        let o = rewriting("reject");
        let mut f = BodyFlow::default();
        assert_eq!(
            f.headers(&o, Side::Response, false, NONE, enc(&["identity", "gzip"])),
            HeadersStep::ReplaceResponse(
                502,
                r#"content-encoding "identity", "gzip" (2 headers): the body cannot be inspected"#
                    .into()
            )
        );
        // The request side only replaces: its encoded body goes on untouched to its end.
        assert_eq!(
            f.headers(&o, Side::Request, false, NONE, enc(&["gzip"])),
            HeadersStep::PassEncoded("\"gzip\"".into())
        );
        assert_eq!(f.body(&o, Side::Request, 500, true), BodyStep::Pass);
        assert_eq!(f.trailers(&o, Side::Request), TrailersStep::Continue);
        // Opted out: the redacting side passes it on too.
        let o = rewriting_with("reject", r#","fail_open":["content-encoding"]"#);
        let mut f = BodyFlow::default();
        assert_eq!(
            f.headers(&o, Side::Response, false, NONE, enc(&["x-none"])),
            HeadersStep::PassEncoded("\"x-none\"".into())
        );
        // A request that redacts is refused with the configured status.
        let o = ops(
            r#"{"role":"http-body-operation","request":{"redact_json":{"keys":["k"]}},
            "refuse_status":{"request":400}}"#,
        );
        let mut f = BodyFlow::default();
        assert!(matches!(
            f.headers(&o, Side::Request, false, NONE, enc(&[""])),
            HeadersStep::Refuse(Refusal {
                status: 400,
                details: "request_body_uninspectable",
                ..
            })
        ));
    }

    #[test]
    fn bodies_are_held_then_rewritten_or_handled_as_on_overflow_says() {
        let mut f = BodyFlow::default();
        let o = rewriting_with("pass", r#","fail_open":["over-buffer"]"#);
        assert_eq!(f.body(&o, Side::Response, 60, false), BodyStep::Hold);
        assert_eq!(f.body(&o, Side::Response, 90, true), BodyStep::Rewrite);
        assert_eq!(
            f.body(&o, Side::Response, 101, false),
            BodyStep::PassOverflowing(100)
        );
        // Overflowed: the rest goes on as it comes.
        assert_eq!(f.body(&o, Side::Response, 500, true), BodyStep::Pass);

        // Without the opt-out, a redacting side is reset whatever `on_overflow` says.
        for policy in ["pass", "reject"] {
            let o = rewriting(policy);
            let mut f = BodyFlow::default();
            assert!(matches!(
                f.body(&o, Side::Response, 101, false),
                BodyStep::ResetResponse(_)
            ));
            f.mark_answered(Side::Response);
            assert_eq!(f.body(&o, Side::Response, 1, true), BodyStep::Stop);
            assert_eq!(f.trailers(&o, Side::Response), TrailersStep::Stop);
            assert!(f.answered());
        }
        let o = rewriting("reject");
        let mut f = BodyFlow::default();
        assert!(matches!(
            f.body(&o, Side::Request, 101, false),
            BodyStep::Refuse(r) if r.why.contains("max_buffer_bytes (100)") && r.status == 413
        ));
    }

    #[test]
    fn trailers_on_a_held_body_refuse_it_where_it_is_redacted() {
        let o = rewriting("pass");
        let f = BodyFlow::default();
        assert!(matches!(
            f.trailers(&o, Side::Response),
            TrailersStep::ResetResponse(_)
        ));
        // The request side only replaces: its body goes on unmodified (logged).
        assert_eq!(f.trailers(&o, Side::Request), TrailersStep::PassUnmodified);
        let o = rewriting_with("pass", r#","fail_open":["trailers"]"#);
        assert_eq!(f.trailers(&o, Side::Response), TrailersStep::PassUnmodified);
    }

    #[test]
    fn the_request_limit_counts_bytes_that_passed() {
        let o = ops(r#"{"role":"http-body-operation","request":{"max_bytes":10}}"#);
        let mut f = BodyFlow::default();
        assert_eq!(f.body(&o, Side::Request, 6, false), BodyStep::Pass);
        assert!(matches!(
            f.body(&o, Side::Request, 5, true),
            BodyStep::Refuse(r) if r.why == "the body is over the 10-byte limit"
        ));
        assert_eq!(f.trailers(&o, Side::Request), TrailersStep::Continue);
    }

    #[test]
    fn a_rewrite_is_written_kept_refused_or_handled_as_on_overflow_says() {
        let f = BodyFlow::default();
        let o = rewriting("reject");
        assert_eq!(
            f.rewrite(&o, Side::Request, b"xax"),
            RewriteStep::Write(b"xbbbbx".to_vec(), "1 x \"a\"".into())
        );
        assert_eq!(f.rewrite(&o, Side::Request, b"xyz"), RewriteStep::Keep);
        assert!(matches!(
            f.rewrite(&o, Side::Response, b"<p>"),
            RewriteStep::ResetResponse(_)
        ));
        let grows = vec![b'a'; 30];
        assert!(matches!(
            f.rewrite(&o, Side::Request, &grows),
            RewriteStep::Refuse(r) if r.why.contains("(100)")
        ));
        let json = format!(r#"[{}{{"k":1}}]"#, r#"{"k":1},"#.repeat(20));
        assert!(matches!(
            f.rewrite(&o, Side::Response, json.as_bytes()),
            RewriteStep::ResetResponse(_)
        ));
        let o = rewriting_with("pass", r#","fail_open":["not-json","over-buffer"]"#);
        assert!(matches!(
            f.rewrite(&o, Side::Response, json.as_bytes()),
            RewriteStep::PassTooLarge(_)
        ));
        assert!(matches!(
            f.rewrite(&o, Side::Response, b"<p>"),
            RewriteStep::PassNotJson(_)
        ));
        assert!(f.unhandled(&o, Side::Request, "x".into()).is_none());
        assert!(f.unhandled(&o, Side::Response, "x".into()).is_some());
    }
}
