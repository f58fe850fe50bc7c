//! Scenario files: which bootstrap to load, which requests to send, what must hold.
//!
//! ```yaml
//! bootstrap: ../../envoy-config/bootstrap.yaml   # relative to this file
//! workers: 2                                     # optional, Envoy's --concurrency
//! callout_budget: 10s     # optional: what one step's callouts to loopback upstreams may take
//! requests:
//!   - name: adds a header
//!     request: {method: GET, path: /, authority: demo.local, headers: {x-a: "1"}}
//!     upstream: {status: 200, headers: {server: backend}, body: "hello"}
//!     expect:
//!       upstream: {headers: {x-added-by: wasm-filter}, absent: [x-internal-secret]}
//!       response: {status: 200, headers: {x-served-by: wasm-filter}, body: "hello"}
//!       local_reply: none
//!   - advance: 3s            # move the virtual clock: ticks fire, queue notifications follow
//!     expect:
//!       log_counts: [{contains: "tick", count: 6}, {contains: "tick", worker: 0, count: 3}]
//! Callouts (`proxy_http_call`, unary `proxy_grpc_call`) get the first matching canned
//! reply, from the step's `http_calls` / `grpc_calls`, then the scenario's (which also serve
//! calls made by ticks and queues); an HTTP call without one goes to the cluster's endpoint if
//! it is on loopback. `expect.calls` lists every call the step must make, in order:
//! ```yaml
//! http_calls:                      # scenario-wide
//!   - {cluster: auth, path: /check, reply: {status: 200, headers: {x-user: alice}}}
//! requests:
//!   - name: denied
//!     request: {headers: {authorization: bad}}
//!     http_calls: [{cluster: auth, reply: {status: 403, body: "no"}}]   # this step only
//!     grpc_calls: [{cluster: ratelimit, service: rl.Svc, method: Check, status: 14, status_message: down}]
//!     expect:
//!       calls: [{cluster: auth, headers: {":path": /check, authorization: bad}}]
//!       response: {status: 403}
//!   - name: auth is down
//!     http_calls: [{cluster: auth, reset: true}]   # the call fails: (0, 0, 0), status 11 "reset"
//!     request: {}
//! ```
//! Header checks are case-insensitive and a subset: the listed headers must be there with
//! these values, others may be there too; `absent` lists headers that must not be.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

mod callouts;
pub mod expect;
mod headers;
mod swap;

pub use callouts::{GrpcCallSpec, HttpCallSpec};
pub use headers::Headers;
pub use swap::{SwapSpec, SwapStep, Swaps};

use crate::envoy::http::{Message, Request, UpstreamReply};
use expect::{ConnectionExpect, Expect, LogExpect};

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
    /// Envoy's log level (`-l`; default `info`): guest lines below it are not written.
    #[serde(default)]
    pub log_level: Option<crate::engine::abi::LogLevel>,
    /// What start-up must do: refuse the configuration, or write these log lines.
    #[serde(default)]
    pub expect_start: Option<expect::StartExpect>,
    /// How long one step's callouts may wait for loopback upstreams in all (default 60s).
    #[serde(default)]
    pub callout_budget: Option<DurationSpec>,
    /// Canned replies to HTTP callouts, for every step.
    #[serde(default)]
    pub http_calls: Vec<HttpCallSpec>,
    /// Canned replies to unary gRPC callouts, for every step.
    #[serde(default)]
    pub grpc_calls: Vec<GrpcCallSpec>,
    /// Requests and clock advances, run in order.
    #[serde(default)]
    pub requests: Vec<Step>,
    #[serde(skip)]
    pub path: PathBuf,
}

/// One item of `requests:`: a request, or `{advance: 5s}` moving the virtual clock.
#[derive(Debug, Clone)]
pub enum Step {
    Request(Box<RequestCase>),
    Advance(AdvanceStep),
    Connection(Box<ConnectionCase>),
    Shutdown(ShutdownStep),
    /// `swap_ecds:` a filter's discovery file replaced (see [`SwapStep`]).
    Swap(SwapStep),
}

impl Step {
    pub fn name(&self) -> String {
        match self {
            Step::Request(r) => r.name.clone(),
            Step::Advance(a) => a.name(),
            Step::Connection(c) => c.name.clone(),
            Step::Shutdown(s) => s.name.clone().unwrap_or_else(|| "shutdown".into()),
            Step::Swap(s) => s.name(),
        }
    }
}

impl<'de> Deserialize<'de> for Step {
    /// An item with an `advance` key is an advance, anything else a request; the error names
    /// the item, since YAML positions are lost on the way. The item is held as a YAML value,
    /// whose maps keep the written order (a `headers:` map is sent in that order).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_norway::Value::deserialize(d)?;
        let name = value
            .get("name")
            .and_then(|n| n.as_str())
            .map(str::to_owned);
        if let Some(by) = value.get("advance") {
            let label = match name {
                Some(name) => format!("advance step {name:?}"),
                None => format!("advance: {}", serde_json::to_string(by).unwrap_or_default()),
            };
            typed::<AdvanceStep>(value)
                .map(Step::Advance)
                .map_err(|e| de::Error::custom(format!("{label}: {e}")))
        } else if value.get("shutdown").is_some() {
            typed::<ShutdownStep>(value)
                .and_then(|s| {
                    if s.shutdown {
                        Ok(Step::Shutdown(s))
                    } else {
                        Err("`shutdown: false` means nothing: leave the step out".into())
                    }
                })
                .map_err(|e| de::Error::custom(format!("shutdown step: {e}")))
        } else if value.get("swap_ecds").is_some() {
            typed::<SwapStep>(value)
                .map(Step::Swap)
                .map_err(|e| de::Error::custom(format!("swap_ecds step: {e}")))
        } else if value.get("connection").is_some() {
            let label = match name {
                Some(name) => format!("connection {name:?}"),
                None => "a connection without a name".to_string(),
            };
            typed::<ConnectionCase>(value)
                .and_then(|c| c.validate().map(|()| c))
                .map(|c| Step::Connection(Box::new(c)))
                .map_err(|e| de::Error::custom(format!("{label}: {e}")))
        } else {
            let label = match name {
                Some(name) => format!("request {name:?}"),
                None => "a request without a name".to_string(),
            };
            typed::<RequestCase>(value)
                .and_then(|r| r.request.validate().map(|()| r))
                .map(|r| Step::Request(Box::new(r)))
                .map_err(|e| de::Error::custom(format!("{label}: {e}")))
        }
    }
}

/// A step's item as `T`; an error names the field it is about (`request.headers: invalid
/// type: ...`), which YAML positions cannot, the step having gone through a JSON value.
fn typed<T: serde::de::DeserializeOwned>(value: serde_norway::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })
}

/// A TCP connection to a listener whose chain ends in `tcp_proxy`:
/// ```yaml
/// - name: echo
///   listener: tcp            # optional, default: the first listener
///   worker: 0                # optional, default: round robin
///   connection:
///     - downstream: "hello"  # the client sends
///     - upstream: "world"    # the upstream sends back
///     - close: downstream    # the client closes (the upstream follows); or: upstream
///   expect:
///     upstream_received: "hello"
///     downstream_received: "world"
///     closed_by: client      # a substring of who closed it
/// ```
/// Without a `close`, the client closes after the last event.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionCase {
    pub name: String,
    #[serde(default)]
    pub listener: Option<String>,
    #[serde(default)]
    pub worker: Option<usize>,
    pub connection: Vec<TcpEventSpec>,
    #[serde(default)]
    pub expect: ConnectionExpect,
}

/// One event: exactly one of `downstream`, `upstream`, `close`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpEventSpec {
    #[serde(default)]
    pub downstream: Option<String>,
    #[serde(default)]
    pub upstream: Option<String>,
    #[serde(default)]
    pub close: Option<Side>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Downstream,
    Upstream,
}

impl ConnectionCase {
    fn validate(&self) -> Result<(), String> {
        for (i, e) in self.connection.iter().enumerate() {
            let given = [
                e.downstream.is_some(),
                e.upstream.is_some(),
                e.close.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                return Err(format!(
                    "connection[{i}]: give exactly one of downstream, upstream or close"
                ));
            }
        }
        Ok(())
    }

    pub fn events(&self) -> Vec<crate::envoy::proxy::TcpEvent> {
        use crate::envoy::proxy::TcpEvent;
        self.connection
            .iter()
            .map(|e| match (&e.downstream, &e.upstream, e.close) {
                (Some(d), _, _) => TcpEvent::Downstream(d.clone().into_bytes()),
                (_, Some(u), _) => TcpEvent::Upstream(u.clone().into_bytes()),
                (_, _, Some(Side::Upstream)) => TcpEvent::CloseUpstream,
                _ => TcpEvent::CloseDownstream,
            })
            .collect()
    }
}

/// `{advance: 5s}`: the virtual clock moves on; due ticks fire on every worker, and queue
/// notifications they cause are delivered. Expectations cover the log lines written meanwhile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdvanceStep {
    #[serde(default)]
    pub name: Option<String>,
    pub advance: DurationSpec,
    #[serde(default)]
    pub expect: LogExpect,
}

impl AdvanceStep {
    pub fn name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("advance {}", self.advance))
    }
}

/// `- shutdown: true`: Envoy's exit (or the removal of its plugins). Every root context gets
/// `proxy_on_done`, then `proxy_on_delete` (at once, or when it calls `proxy_done`); later
/// steps may only `advance`. `expect` checks the lines written meanwhile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownStep {
    #[serde(default)]
    pub name: Option<String>,
    pub shutdown: bool,
    #[serde(default)]
    pub expect: LogExpect,
}

/// A duration written with a unit: `5s`, `1500ms`, `0.5s`, `2m`, `1h`, `250us`, `10ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSpec(pub Duration);

impl fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&crate::envoy::proxy::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => parse_duration(&s)
                .map(DurationSpec)
                .map_err(de::Error::custom),
            other => Err(de::Error::custom(format!(
                "a duration needs a unit, like 5s or 1500ms; saw {other}"
            ))),
        }
    }
}

/// A duration in Go's syntax (`5s`, `1500ms`, `1h30m`), the grammar the fetcher's
/// environment variables use too.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    wasm_common::duration::parse(text).map_err(|e| format!("duration {text:?}: {e}"))
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
    /// Canned replies to HTTP callouts made during this step (before the scenario's).
    #[serde(default)]
    pub http_calls: Vec<HttpCallSpec>,
    /// Canned replies to unary gRPC callouts made during this step (before the scenario's).
    #[serde(default)]
    pub grpc_calls: Vec<GrpcCallSpec>,
    /// A filter that pauses the request in its headers callback may be resumed by a tick
    /// within this much virtual time (Envoy: within the tick's period of real time).
    #[serde(default)]
    pub wait_for_ticks: Option<DurationSpec>,
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
    /// More of the body, each arriving as its own chunk after `body`.
    #[serde(default)]
    pub body_chunks: Vec<String>,
    #[serde(default)]
    pub trailers: Headers,
    /// `{NAMESPACE: {KEY: VALUE}}`: the stream's dynamic metadata when the Wasm filters run.
    #[serde(default)]
    pub dynamic_metadata: crate::envoy::http::DynamicMetadata,
    /// `http1` (default), `http1_chunked` or `http2`: what the client speaks (see
    /// [`crate::envoy::http::Downstream`]).
    #[serde(default)]
    pub protocol: crate::envoy::http::Downstream,
}

impl RequestSpec {
    /// Over HTTP/1.1 only a chunked body has room for trailers.
    fn validate(&self) -> Result<(), String> {
        if self.protocol == crate::envoy::http::Downstream::Http1 && !self.trailers.0.is_empty() {
            return Err("request.trailers: an HTTP/1.1 request sent with a content-length has no trailers: use `protocol: http1_chunked` (Envoy hands them to the filters when the connection manager sets http_protocol_options.enable_trailers) or `protocol: http2`".into());
        }
        Ok(())
    }
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
    /// More of the body, each arriving as its own chunk after `body`.
    #[serde(default)]
    pub body_chunks: Vec<String>,
    #[serde(default)]
    pub trailers: Headers,
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
            body_chunks: Vec::new(),
            trailers: Headers::default(),
        }
    }
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = crate::engine::input::read_text(path, crate::engine::input::MAX_CONFIG_BYTES)
            .map_err(|source| ScenarioError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let mut s: Scenario =
            wasm_common::yaml::from_str(&text).map_err(|e| ScenarioError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        s.path = path.to_path_buf();
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        for step in &mut s.requests {
            if let Step::Swap(swap) = step {
                swap.resolve(&dir);
            }
        }
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
            message: Message {
                headers: self.request.headers.to_map(),
                body: self.request.body.clone().into_bytes(),
                body_chunks: self
                    .request
                    .body_chunks
                    .iter()
                    .map(|c| c.clone().into_bytes())
                    .collect(),
                trailers: self.request.trailers.to_map(),
            },
            dynamic_metadata: self.request.dynamic_metadata.clone(),
            protocol: self.request.protocol,
            tick_wait: self.wait_for_ticks.as_ref().map(|d| d.0),
        }
    }

    pub fn upstream_reply(&self) -> UpstreamReply {
        self.upstream.to_reply()
    }
}

impl UpstreamSpec {
    pub fn to_reply(&self) -> UpstreamReply {
        UpstreamReply {
            status: self.status,
            message: Message {
                headers: self.headers.to_map(),
                body: self.body.clone().into_bytes(),
                body_chunks: self
                    .body_chunks
                    .iter()
                    .map(|c| c.clone().into_bytes())
                    .collect(),
                trailers: self.trailers.to_map(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::expect::LogThread;
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration(" 10ns"), Ok(Duration::from_nanos(10)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("5 days")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("s").unwrap_err().contains("not a number"));
    }

    fn parse(yaml: &str) -> Result<Scenario, String> {
        serde_norway::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn requests_and_advances_mix_in_order() {
        let s = parse(
            "bootstrap: b.yaml\nrequests:\n  - {name: first, request: {path: /}}\n  - advance: 1500ms\n  - {name: later, advance: 2s, expect: {logs: [tick], log_counts: [{contains: tick, count: 2, worker: 1}, {contains: tick, count: 0, worker: main}]}}\n  - {name: last, request: {}, expect: {log_counts: [{contains: x, count: 0}]}}\n",
        )
        .unwrap();
        let names: Vec<String> = s.requests.iter().map(Step::name).collect();
        assert_eq!(names, ["first", "advance 1500ms", "later", "last"]);
        match &s.requests[2] {
            Step::Advance(a) => {
                assert_eq!(a.advance.0, Duration::from_secs(2));
                assert_eq!(a.expect.log_counts[0].worker, Some(LogThread::Worker(1)));
                assert_eq!(a.expect.log_counts[1].worker, Some(LogThread::Main));
            }
            other => panic!("expected an advance, got {other:?}"),
        }
    }

    #[test]
    fn headers_in_map_form_keep_the_written_order() {
        let s = parse(
            "bootstrap: b.yaml\nrequests:\n  - name: r\n    request: {headers: {x-zebra: 1, x-apple: 2, X-Mango: 3}}\n    upstream: {headers: {z: a, a: z}}\n",
        )
        .unwrap();
        let Step::Request(r) = &s.requests[0] else {
            panic!("expected a request");
        };
        let names: Vec<&str> = r
            .request
            .headers
            .0
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(names, ["x-zebra", "x-apple", "x-mango"]);
        let names: Vec<&str> = r
            .upstream
            .headers
            .0
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(names, ["z", "a"]);
    }

    #[test]
    fn trailers_need_a_protocol_that_carries_them() {
        let step = |protocol: &str| {
            parse(&format!(
                "bootstrap: b.yaml\nrequests:\n  - name: t\n    request: {{{protocol}trailers: {{x-sum: '1'}}}}\n"
            ))
        };
        let refused = step("").unwrap_err();
        assert!(
            refused.contains("request \"t\"") && refused.contains("http1_chunked"),
            "{refused}"
        );
        step("protocol: http1_chunked, ").unwrap();
        step("protocol: http2, ").unwrap();
    }

    #[test]
    fn a_bad_step_is_named_in_the_error() {
        let e = parse("bootstrap: b.yaml\nrequests:\n  - {name: tock, advance: 5}\n").unwrap_err();
        assert!(
            e.contains("advance step \"tock\"") && e.contains("needs a unit"),
            "{e}"
        );
        let e =
            parse("bootstrap: b.yaml\nrequests:\n  - {advance: 1s, request: {}}\n").unwrap_err();
        assert!(e.contains("unknown field `request`"), "{e}");
        let e = parse("bootstrap: b.yaml\nrequests:\n  - {name: r, reqest: {}}\n").unwrap_err();
        assert!(e.contains("request \"r\"") && e.contains("reqest"), "{e}");
    }
}
