//! The `http-body-operation` role: a request body size limit, JSON field redaction and
//! literal text replacement, on whole bodies gathered across chunks.
//!
//! A body to rewrite is held until its last chunk, up to `max_buffer_bytes`; past that the
//! role cannot rewrite it and does what `on_overflow` says (pass it on untouched and log, or
//! answer 413 for a request, 502 for a response). A request size limit needs no buffering: it
//! counts bytes as they pass and answers 413 as soon as the count goes over (or at once when
//! `content-length` already says so).

use crate::quote::Quoted;
use crate::redact::{redact, Redacted};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyOperation {
    #[serde(default)]
    pub request: BodySide,
    #[serde(default)]
    pub response: BodySide,
    /// The most a body to rewrite may grow to while it is held.
    #[serde(default = "default_max_buffer")]
    pub max_buffer_bytes: u64,
    #[serde(default)]
    pub on_overflow: Overflow,
    /// The cases where a body redaction cannot fully inspect goes on unredacted instead of
    /// being refused (by default every case is refused).
    #[serde(default)]
    pub fail_open: Vec<Uninspectable>,
    /// The status a body redaction cannot inspect is refused with.
    #[serde(default)]
    pub refuse_status: RefuseStatus,
}

/// A body redaction cannot fully inspect, named as `fail_open` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Uninspectable {
    /// serde_json cannot read it (not JSON, not UTF-8, a BOM, a lone surrogate, `NaN`,
    /// nested past 127, ...).
    NotJson,
    /// A `content-encoding` other than none or exactly `identity` (one header).
    ContentEncoding,
    /// Trailers came: the body was never seen whole with its end.
    Trailers,
    /// Bigger than `max_buffer_bytes`, before or after the rewrite.
    OverBuffer,
}

/// The status of a refusal, per side. The defaults: 415 for a request (RFC 9110's answer to
/// a body in a form, or a content-coding, the server does not take: the client can send it
/// plainly), 502 for a response (the upstream's answer cannot be delivered as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefuseStatus {
    #[serde(default = "default_request_refusal")]
    pub request: u32,
    #[serde(default = "default_response_refusal")]
    pub response: u32,
}

fn default_request_refusal() -> u32 {
    415
}

fn default_response_refusal() -> u32 {
    502
}

impl Default for RefuseStatus {
    fn default() -> Self {
        Self {
            request: default_request_refusal(),
            response: default_response_refusal(),
        }
    }
}

/// Half of Envoy's default per-connection buffer limit (1 MiB), which answers 413 / 500 on
/// its own when a held body outgrows it: this role's overflow policy must act first.
fn default_max_buffer() -> u64 {
    512 * 1024
}

/// A bigger hold needs `per_connection_buffer_limit_bytes` raised too. 64 MiB bounds what
/// one stream may pin.
pub const MAX_BUFFER_LIMIT: u64 = 64 * 1024 * 1024;

/// A mask is a marker, not content: a long one only multiplies bodies.
pub const MAX_MASK_BYTES: usize = 1024;

/// Keys to redact are field names, a handful in practice; the bound keeps building their
/// sorted list (one insertion each) cheap whatever the configuration holds.
pub const MAX_REDACT_KEYS: usize = 1024;

/// What to do with a body to rewrite that outgrows `max_buffer_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// Send it on unmodified and log it.
    #[default]
    Pass,
    /// 413 for a request, 502 for a response.
    Reject,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodySide {
    /// Requests only: bodies over this many bytes get 413.
    pub max_bytes: Option<u64>,
    pub redact_json: Option<Redact>,
    #[serde(default)]
    pub replace: Vec<Replace>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redact {
    /// In byte order, without repeats once validated: looked up by binary search for every
    /// key of a body.
    pub keys: Vec<String>,
    #[serde(default = "default_mask")]
    pub mask: String,
}

fn default_mask() -> String {
    "***".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replace {
    pub from: String,
    pub to: String,
}

/// A whole body, after the side's rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewrite {
    Unchanged,
    /// The new body, and what was done (for the debug log).
    Changed(Vec<u8>, String),
    /// Redaction was asked for and the body is not JSON: it goes on untouched.
    NotJson(String),
    /// The rewritten body would be over the limit (replacements longer than what they
    /// replace can multiply a body): it goes on as the overflow policy says.
    TooLarge(usize),
}

impl BodyOperation {
    pub fn validate(&mut self) -> Result<(), String> {
        if self.max_buffer_bytes == 0 || self.max_buffer_bytes > MAX_BUFFER_LIMIT {
            return Err(format!(
                "max_buffer_bytes {}: must be between 1 and {MAX_BUFFER_LIMIT}",
                self.max_buffer_bytes
            ));
        }
        if self.response.max_bytes.is_some() {
            return Err("response.max_bytes: a size limit applies to request bodies only".into());
        }
        if self.request.max_bytes == Some(0) {
            return Err("request.max_bytes: must be at least 1 (leave it out for no limit)".into());
        }
        for (at, status) in [
            ("request", self.refuse_status.request),
            ("response", self.refuse_status.response),
        ] {
            if !(400..=599).contains(&status) {
                return Err(format!(
                    "refuse_status.{at} {status}: must be between 400 and 599"
                ));
            }
        }
        self.request.validate("request")?;
        self.response.validate("response")
    }

    /// Whether a body of the side (`request`: true) that redaction cannot inspect for
    /// `case` is refused: the side redacts and the configuration did not opt out.
    pub fn refuses(&self, request: bool, case: Uninspectable) -> bool {
        let side = if request {
            &self.request
        } else {
            &self.response
        };
        side.redact_json.is_some() && !self.fail_open.contains(&case)
    }

    /// What `on_configure` logs.
    pub fn summary(&self) -> String {
        let side = |s: &BodySide| {
            let mut parts = String::new();
            if let Some(m) = s.max_bytes {
                push_item(&mut parts, format_args!("limit {m} bytes"));
            }
            if let Some(r) = &s.redact_json {
                push_item(&mut parts, format_args!("redact {} keys", r.keys.len()));
            }
            if !s.replace.is_empty() {
                push_item(&mut parts, format_args!("{} replacements", s.replace.len()));
            }
            if parts.is_empty() {
                parts.push_str("nothing");
            }
            parts
        };
        format!(
            "request: {}; response: {}",
            side(&self.request),
            side(&self.response)
        )
    }
}

impl BodySide {
    fn validate(&mut self, at: &str) -> Result<(), String> {
        if let Some(r) = &mut self.redact_json {
            if r.keys.len() > MAX_REDACT_KEYS {
                return Err(format!(
                    "{at}.redact_json.keys: {} keys, over the {MAX_REDACT_KEYS}-key limit",
                    r.keys.len()
                ));
            }
            r.keys.sort_unstable();
            r.keys.dedup();
            if r.keys.is_empty() {
                return Err(format!("{at}.redact_json.keys: list at least one key"));
            }
            if r.keys.iter().any(String::is_empty) {
                return Err(format!("{at}.redact_json.keys: a key must not be empty"));
            }
            if r.mask.len() > MAX_MASK_BYTES {
                return Err(format!(
                    "{at}.redact_json.mask: {} bytes, over the {MAX_MASK_BYTES}-byte limit",
                    r.mask.len()
                ));
            }
        }
        for (i, r) in self.replace.iter().enumerate() {
            if r.from.is_empty() {
                return Err(format!("{at}.replace[{i}].from: must not be empty"));
            }
        }
        Ok(())
    }

    /// Whether bodies of this side are held and rewritten.
    pub fn rewrites(&self) -> bool {
        self.redact_json.is_some() || !self.replace.is_empty()
    }

    /// Redaction first (on the JSON as sent), then each replacement in order. The result
    /// never grows past `limit` bytes (`max_buffer_bytes`): past it the rewrite stops and
    /// says so, before allocating more.
    pub fn rewrite(&self, body: &[u8], limit: usize) -> Rewrite {
        let mut done = String::new();
        let mut current: Option<Vec<u8>> = None;
        if let Some(r) = &self.redact_json {
            match redact(body, &r.keys, &r.mask, limit) {
                Redacted::NotJson(e) => return Rewrite::NotJson(e),
                Redacted::Unchanged => {}
                Redacted::TooLarge(_) => return Rewrite::TooLarge(limit),
                Redacted::Changed(b, n) => {
                    push_item(&mut done, format_args!("{n} values redacted"));
                    current = Some(b);
                }
            }
        }
        for r in &self.replace {
            let from = current.as_deref().unwrap_or(body);
            match replace_all(from, r.from.as_bytes(), r.to.as_bytes(), limit) {
                Replaced::None => {}
                Replaced::Done(b, n) => {
                    push_item(&mut done, format_args!("{n} x {}", Quoted(&r.from)));
                    current = Some(b);
                }
                Replaced::TooLarge => return Rewrite::TooLarge(limit),
            }
        }
        match current {
            Some(b) => Rewrite::Changed(b, done),
            None => Rewrite::Unchanged,
        }
    }
}

/// Appends `item` to a `, `-separated list (rather than collecting the items to join them:
/// `[String]::join` is a 1.3 KB function in the guest).
fn push_item(list: &mut String, item: std::fmt::Arguments) {
    if !list.is_empty() {
        list.push_str(", ");
    }
    // Writing to a `String` does not fail.
    let _ = std::fmt::Write::write_fmt(list, item);
}

#[derive(Debug, PartialEq, Eq)]
enum Replaced {
    None,
    /// The new body and how many occurrences were replaced.
    Done(Vec<u8>, usize),
    /// The result would be over the limit.
    TooLarge,
}

/// Every non-overlapping occurrence of `from`, left to right, as long as the result stays
/// within `limit` bytes.
fn replace_all(body: &[u8], from: &[u8], to: &[u8], limit: usize) -> Replaced {
    let mut out: Option<Vec<u8>> = None;
    let (mut at, mut copied, mut n) = (0, 0, 0);
    while let Some(rest) = body.get(at..) {
        if rest.len() < from.len() {
            break;
        }
        if rest.starts_with(from) {
            let kept = body.get(copied..at).unwrap_or_default();
            let o = out.get_or_insert_with(|| Vec::with_capacity(body.len().min(limit)));
            if o.len() + kept.len() + to.len() > limit {
                return Replaced::TooLarge;
            }
            o.extend_from_slice(kept);
            o.extend_from_slice(to);
            at += from.len();
            copied = at;
            n += 1;
        } else {
            at += 1;
        }
    }
    let Some(mut o) = out else {
        return Replaced::None;
    };
    let rest = body.get(copied..).unwrap_or_default();
    if o.len() + rest.len() > limit {
        return Replaced::TooLarge;
    }
    o.extend_from_slice(rest);
    Replaced::Done(o, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;

    fn parse(json: &str) -> Result<BodyOperation, String> {
        match PluginConfig::parse(json.as_bytes())? {
            PluginConfig::HttpBodyOperation(o) => Ok(o),
            other => Err(format!("parsed as {}", other.role())),
        }
    }

    #[test]
    fn parses_defaults() {
        let o = parse(r#"{"role":"http-body-operation"}"#).unwrap();
        assert_eq!(o.max_buffer_bytes, 512 * 1024);
        assert_eq!(o.on_overflow, Overflow::Pass);
        assert!(!o.request.rewrites() && !o.response.rewrites());
        assert_eq!(o.summary(), "request: nothing; response: nothing");
    }

    #[test]
    fn bad_configurations_name_the_field() {
        let long_mask = format!(
            r#"{{"request":{{"redact_json":{{"keys":["k"],"mask":"{}"}}}}}}"#,
            "m".repeat(1025)
        );
        let many_keys = format!(
            r#"{{"request":{{"redact_json":{{"keys":[{}]}}}}}}"#,
            (0..=MAX_REDACT_KEYS)
                .map(|i| format!(r#""k{i}""#))
                .collect::<Vec<_>>()
                .join(",")
        );
        for (json, want) in [
            (r#"{"max_buffer_bytes":0}"#, "max_buffer_bytes 0"),
            (r#"{"max_buffer_bytes":99999999999}"#, "max_buffer_bytes"),
            (r#"{"response":{"max_bytes":10}}"#, "response.max_bytes"),
            (r#"{"request":{"max_bytes":0}}"#, "request.max_bytes"),
            (
                r#"{"response":{"redact_json":{"keys":[]}}}"#,
                "response.redact_json.keys",
            ),
            (
                r#"{"response":{"redact_json":{"keys":[""]}}}"#,
                "must not be empty",
            ),
            (
                r#"{"request":{"replace":[{"from":"","to":"x"}]}}"#,
                "request.replace[0].from",
            ),
            (r#"{"on_overflow":"drop"}"#, "unknown variant `drop`"),
            (long_mask.as_str(), "request.redact_json.mask: 1025 bytes"),
            (
                many_keys.as_str(),
                "request.redact_json.keys: 1025 keys, over the 1024-key limit",
            ),
            (r#"{"response":{"redact":{}}}"#, "unknown field `redact`"),
            (r#"{"max_buffer_bytes":-1}"#, "invalid value"),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
            v["role"] = "http-body-operation".into();
            let e = parse(&v.to_string()).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }

    #[test]
    fn redacts_then_replaces() {
        let o = parse(
            r#"{"role":"http-body-operation","response":{
            "redact_json":{"keys":["token","b","token"],"mask":"[hidden]"},
            "replace":[{"from":"internal.example","to":"example.com"}]}}"#,
        )
        .unwrap();
        let keys = &o.response.redact_json.as_ref().unwrap().keys;
        assert_eq!(keys, &["b", "token"], "sorted, without repeats");
        match o.response.rewrite(
            br#"{"token":"abc","url":"https://internal.example/x"}"#,
            1024,
        ) {
            Rewrite::Changed(b, what) => {
                assert_eq!(
                    b,
                    br#"{"token":"[hidden]","url":"https://example.com/x"}"#.to_vec()
                );
                assert_eq!(what, "1 values redacted, 1 x \"internal.example\"");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            o.response.rewrite(b"<html>internal.example</html>", 1024),
            Rewrite::NotJson(_)
        ));
        assert_eq!(o.response.rewrite(br#"{"a":1}"#, 1024), Rewrite::Unchanged);
    }

    #[test]
    fn replacement_is_literal_and_non_overlapping() {
        const L: usize = 1024;
        assert_eq!(
            replace_all(b"aaaa", b"aa", b"b", L),
            Replaced::Done(b"bb".to_vec(), 2)
        );
        assert_eq!(
            replace_all(b"x.y.z", b".", b"::", L),
            Replaced::Done(b"x::y::z".to_vec(), 2)
        );
        assert_eq!(replace_all(b"abc", b"abcd", b"", L), Replaced::None);
        assert_eq!(replace_all(b"", b"a", b"", L), Replaced::None);
        assert_eq!(
            replace_all(b"\xff\x00ab", b"ab", b"", L),
            Replaced::Done(b"\xff\x00".to_vec(), 1)
        );
    }

    #[test]
    fn a_rewrite_never_grows_past_the_limit() {
        let o = parse(
            r#"{"role":"http-body-operation","request":{"replace":[{"from":"a","to":"0123456789"}]},
            "response":{"redact_json":{"keys":["k"],"mask":"a-rather-long-mask"}}}"#,
        )
        .unwrap();
        // 100 bytes become 1 000: over a 512-byte limit, stopped before it is built.
        let body = vec![b'a'; 100];
        assert_eq!(o.request.rewrite(&body, 512), Rewrite::TooLarge(512));
        assert!(
            matches!(o.request.rewrite(&body, 1000), Rewrite::Changed(b, _) if b.len() == 1000)
        );
        assert_eq!(o.response.rewrite(br#"{"k":1}"#, 10), Rewrite::TooLarge(10));
        assert_eq!(replace_all(b"xax", b"a", b"bbb", 4), Replaced::TooLarge);
        assert_eq!(
            replace_all(b"ax", b"a", b"bb", 3),
            Replaced::Done(b"bbx".to_vec(), 1)
        );
    }
}
