//! Scenario files: which bootstrap to load, which requests to send, what must hold.
//!
//! ```yaml
//! bootstrap: ../../envoy-config/bootstrap.yaml   # relative to this file
//! workers: 2                                     # optional, Envoy's --concurrency
//! requests:
//!   - name: adds a header
//!     request: {method: GET, path: /, authority: demo.local, headers: {x-a: "1"}}
//!     upstream: {status: 200, headers: {server: backend}, body: "hello"}
//!     expect:
//!       upstream: {headers: {x-added-by: wasm-filter}, absent: [x-internal-secret]}
//!       response: {status: 200, headers: {x-served-by: wasm-filter}, body: "hello"}
//!       local_reply: none
//! ```
//! Header checks are case-insensitive and a subset: the listed headers must be there with
//! these values, others may be there too; `absent` lists headers that must not be.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::host::HeaderMap;
use crate::http::{self, Exchange, LocalReplySource, Request, UpstreamReply};

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("scenario {path} is invalid: {message}")]
    Parse { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Path of the Envoy bootstrap, relative to the scenario file.
    pub bootstrap: PathBuf,
    #[serde(default)]
    pub workers: Option<usize>,
    #[serde(default)]
    pub requests: Vec<RequestCase>,
    #[serde(skip)]
    pub path: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestCase {
    pub name: String,
    #[serde(default)]
    pub listener: Option<String>,
    #[serde(default)]
    pub worker: Option<usize>,
    pub request: RequestSpec,
    #[serde(default)]
    pub upstream: UpstreamSpec,
    #[serde(default)]
    pub expect: Expect,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    #[serde(default = "default_method")]
    pub method: String,
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default = "default_authority")]
    pub authority: String,
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub body: String,
}

fn default_method() -> String {
    "GET".into()
}
fn default_path() -> String {
    "/".into()
}
fn default_authority() -> String {
    "localhost".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSpec {
    #[serde(default = "default_status")]
    pub status: u16,
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub body: String,
}

fn default_status() -> u16 {
    200
}

impl Default for UpstreamSpec {
    fn default() -> Self {
        Self {
            status: 200,
            headers: Headers::default(),
            body: String::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// What the upstream must have seen; implies the request reached it.
    #[serde(default)]
    pub upstream: Option<MessageExpect>,
    /// Whether the request must (true) or must not (false) reach an upstream.
    #[serde(default)]
    pub reached_upstream: Option<bool>,
    #[serde(default)]
    pub response: Option<ResponseExpect>,
    #[serde(default)]
    pub local_reply: Option<LocalReplyKind>,
    /// Substrings that must appear in log lines written while this request ran.
    #[serde(default)]
    pub logs: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageExpect {
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub absent: Vec<String>,
    #[serde(default)]
    pub body: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseExpect {
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub absent: Vec<String>,
    #[serde(default)]
    pub body: Option<String>,
}

/// Who answered instead of the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalReplyKind {
    None,
    Plugin,
    FailurePolicy,
    DirectResponse,
    NoRoute,
    NoCluster,
}

impl LocalReplyKind {
    pub fn of(source: Option<&LocalReplySource>) -> Self {
        match source {
            None => Self::None,
            Some(LocalReplySource::Plugin { .. }) => Self::Plugin,
            Some(LocalReplySource::FailurePolicy { .. }) => Self::FailurePolicy,
            Some(LocalReplySource::DirectResponse) => Self::DirectResponse,
            Some(LocalReplySource::NoRoute) => Self::NoRoute,
            Some(LocalReplySource::NoCluster { .. }) => Self::NoCluster,
        }
    }
}

/// Headers written as a map (`{name: value}`) or, to repeat a name, a list of one-entry maps.
/// Order is kept; names are lower-cased.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Headers;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of header names to values, or a list of such maps")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, ScalarString>()? {
                    out.push((k.to_ascii_lowercase(), v.0));
                }
                Ok(Headers(out))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some(h) = s.next_element::<Headers>()? {
                    out.extend(h.0);
                }
                Ok(Headers(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A header value written as a YAML scalar: `"1"`, `1` and `true` all mean the text.
struct ScalarString(String);

impl<'de> Deserialize<'de> for ScalarString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(Self(s)),
            serde_json::Value::Number(n) => Ok(Self(n.to_string())),
            serde_json::Value::Bool(b) => Ok(Self(b.to_string())),
            other => Err(de::Error::custom(format!(
                "a header value must be a string, not {other}"
            ))),
        }
    }
}

impl Headers {
    pub fn to_map(&self) -> HeaderMap {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect()
    }
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut s: Scenario = serde_norway::from_str(&text).map_err(|e| ScenarioError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        s.path = path.to_path_buf();
        Ok(s)
    }

    pub fn bootstrap_path(&self) -> PathBuf {
        self.path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&self.bootstrap)
    }
}

impl RequestCase {
    pub fn to_request(&self) -> Request {
        Request {
            method: self.request.method.clone(),
            path: self.request.path.clone(),
            authority: self.request.authority.clone(),
            headers: self.request.headers.to_map(),
            body: self.request.body.clone().into_bytes(),
        }
    }

    pub fn upstream_reply(&self) -> UpstreamReply {
        UpstreamReply {
            status: self.upstream.status,
            headers: self.upstream.headers.to_map(),
            body: self.upstream.body.clone().into_bytes(),
        }
    }
}

fn show(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

fn check_headers(
    what: &str,
    map: &HeaderMap,
    want: &Headers,
    absent: &[String],
    failures: &mut Vec<String>,
) {
    for (k, v) in &want.0 {
        let values: Vec<String> = map
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| show(v))
            .collect();
        if !values.iter().any(|got| got == v) {
            if values.is_empty() {
                failures.push(format!(
                    "{what} header {k:?}: expected {v:?}, but it is missing"
                ));
            } else {
                failures.push(format!(
                    "{what} header {k:?}: expected {v:?}, saw {values:?}"
                ));
            }
        }
    }
    for k in absent {
        if let Some(v) = http::header(map, k) {
            failures.push(format!(
                "{what} header {k:?}: expected absent, saw {:?}",
                show(v)
            ));
        }
    }
}

/// Checks one exchange against its expectations; returns every failed check, worded for a
/// person: what was expected and what was seen.
pub fn check(expect: &Expect, ex: &Exchange, logs: &[String]) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(why) = &ex.stalled {
        failures.push(format!("the request never completed: {why}"));
        return failures;
    }
    let must_reach = expect
        .reached_upstream
        .or(expect.upstream.as_ref().map(|_| true));
    match (must_reach, &ex.upstream) {
        (Some(true), None) => failures.push(format!(
            "expected the request to reach the upstream, but it did not (local reply: {:?})",
            LocalReplyKind::of(ex.local_reply.as_ref())
        )),
        (Some(false), Some(seen)) => failures.push(format!(
            "expected the request not to reach an upstream, but cluster {:?} received it",
            seen.cluster
        )),
        _ => {}
    }
    if let (Some(want), Some(seen)) = (&expect.upstream, &ex.upstream) {
        check_headers(
            "upstream request",
            &seen.headers,
            &want.headers,
            &want.absent,
            &mut failures,
        );
        if let Some(body) = &want.body {
            if seen.body != body.as_bytes() {
                failures.push(format!(
                    "upstream request body: expected {body:?}, saw {:?}",
                    show(&seen.body)
                ));
            }
        }
    }
    if let Some(want) = &expect.response {
        match &ex.response {
            None => failures.push("expected a response, but none was sent".into()),
            Some(resp) => {
                if let Some(status) = want.status {
                    if resp.status != status {
                        failures.push(format!(
                            "response status: expected {status}, saw {}",
                            resp.status
                        ));
                    }
                }
                check_headers(
                    "response",
                    &resp.headers,
                    &want.headers,
                    &want.absent,
                    &mut failures,
                );
                if let Some(body) = &want.body {
                    if resp.body != body.as_bytes() {
                        failures.push(format!(
                            "response body: expected {body:?}, saw {:?}",
                            show(&resp.body)
                        ));
                    }
                }
            }
        }
    }
    if let Some(kind) = expect.local_reply {
        let got = LocalReplyKind::of(ex.local_reply.as_ref());
        if got != kind {
            failures.push(format!(
                "local reply: expected {kind:?}, saw {got:?} ({:?})",
                ex.local_reply
            ));
        }
    }
    for needle in &expect.logs {
        if !logs.iter().any(|l| l.contains(needle.as_str())) {
            failures.push(format!(
                "log: expected a line containing {needle:?}, saw {} lines: {logs:?}",
                logs.len()
            ));
        }
    }
    failures
}
