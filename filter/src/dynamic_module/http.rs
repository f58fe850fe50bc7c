//! The HTTP filter: a configuration shared by every stream of every worker, and per stream
//! the role's state and the hooks' work, on the safe [`Stream`] handle that
//! [`super::abi`]'s hooks hand in.

use std::sync::Arc;

use super::abi::Status as Outcome;
use super::body::{self, BodyRole, Event};
use super::headers;
use super::host::{log, ConfigScope, Stream};
use super::metrics::Metrics;
use super::rate_limit;
use super::{guard, plugin_config, tcp};
use crate::body_flow::Side;
use crate::body_ops::BodyOperation;
use crate::config::PluginConfig;
use crate::header_ops::HeaderOperation;

enum Role {
    Headers(HeaderOperation, headers::Counters),
    Body(BodyOperation, body::Counters),
    RateLimit(rate_limit::Limiter),
}

/// One filter configuration, shared by every stream of every worker.
pub struct FilterConfig {
    role: Role,
}

/// A stream's role state.
enum State {
    /// Whether `when` matched the request (the response is edited only then).
    Headers {
        matched: bool,
    },
    Body(body::BodyStream),
    RateLimit,
    /// A hook panicked: the request was failed closed; the rest of the stream is left to
    /// Envoy.
    Failed,
}

pub struct StreamFilter {
    config: Arc<FilterConfig>,
    state: State,
}

impl FilterConfig {
    /// The filter configuration, its counters defined in `scope`.
    pub fn new(name: &[u8], config: &[u8], scope: &ConfigScope) -> Result<Self, String> {
        let (plugin, config) = plugin_config(name, config)?;
        let m = Metrics::new(scope, &plugin, config.role());
        let role = match config {
            PluginConfig::HttpHeaderOperation(ops) => {
                Role::Headers(ops, headers::Counters::new(&m))
            }
            PluginConfig::HttpBodyOperation(ops) => Role::Body(ops, body::Counters::new(&m)),
            PluginConfig::RateLimit(c) => Role::RateLimit(rate_limit::Limiter::new(c, &m)),
            PluginConfig::TcpTotalDataSizeCounter(_) => {
                return Err(format!(
                    "role: {:?} is a network filter: configure it in \
                     envoy.filters.network.dynamic_modules, not envoy.filters.http.dynamic_modules",
                    tcp::ROLE
                ))
            }
            other => {
                return Err(format!(
                    "role: {:?} runs only in the Wasm module; as a dynamic module the roles are \
                     http-header-operation, http-body-operation, rate-limit and (as a network \
                     filter) tcp-total-data-size-counter",
                    other.role()
                ))
            }
        };
        Ok(Self { role })
    }

    pub fn summary(&self) -> String {
        match &self.role {
            Role::Headers(ops, _) => {
                let (req, resp) = ops.count();
                format!("configured role http-header-operation (request: {req} ops, response: {resp} ops)")
            }
            Role::Body(ops, _) => {
                format!("configured role http-body-operation ({})", ops.summary())
            }
            Role::RateLimit(l) => format!("configured role rate-limit ({})", l.summary()),
        }
    }
}

/// The fault the tests inject (see [`super::FAULT_MARKER`]).
#[cfg(feature = "fault")]
#[allow(clippy::panic)]
fn injected_fault(stream: &Stream) {
    if stream
        .header(Side::Request, "x-wasm-filter-fault")
        .as_deref()
        == Some("panic")
    {
        panic!("wasm-filter: injected fault (x-wasm-filter-fault: panic)");
    }
}

#[cfg(not(feature = "fault"))]
fn injected_fault(_: &Stream) {}

impl StreamFilter {
    pub fn new(config: Arc<FilterConfig>) -> Self {
        let state = match &config.role {
            Role::Headers(ops, _) => State::Headers {
                matched: ops.when.is_none(),
            },
            Role::Body(..) => State::Body(body::BodyStream::default()),
            Role::RateLimit(_) => State::RateLimit,
        };
        Self { config, state }
    }

    /// Runs one hook under [`guard`]. A panic fails the request closed: a 500 local reply
    /// (Envoy resets the stream instead when the response has started), and the stream's
    /// later hooks only continue.
    fn run(
        &mut self,
        stream: &Stream,
        hook: &str,
        f: impl FnOnce(&Role, &mut State, &Stream) -> Outcome,
    ) -> Outcome {
        if matches!(self.state, State::Failed) {
            return Outcome::Continue;
        }
        let (role, state) = (&self.config.role, &mut self.state);
        match guard(|| f(role, state, stream)) {
            Some(outcome) => outcome,
            None => {
                self.state = State::Failed;
                log!(
                    Error,
                    "panicked in the {hook} hook: the request fails closed (500)"
                );
                stream.send_response(500, "wasm_filter_panicked", b"internal error\n", &[]);
                Outcome::Stop
            }
        }
    }

    /// A body role's event, on `side`.
    fn body(&mut self, stream: &Stream, hook: &str, side: Side, event: Event) -> Outcome {
        self.run(stream, hook, |role, state, stream| match (role, state) {
            (Role::Body(ops, counters), State::Body(b)) => {
                b.on(&BodyRole { ops, counters }, stream, side, event)
            }
            _ => Outcome::Continue,
        })
    }

    pub fn on_request_headers(&mut self, stream: &Stream, end_of_stream: bool) -> Outcome {
        self.run(stream, "request headers", |role, state, stream| {
            injected_fault(stream);
            match (role, state) {
                (Role::Headers(ops, counters), State::Headers { matched }) => {
                    *matched = headers::on_request_headers(ops, counters, stream);
                    Outcome::Continue
                }
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Request,
                    Event::Headers { end_of_stream },
                ),
                (Role::RateLimit(l), _) => l.on_request_headers(stream),
                _ => Outcome::Continue,
            }
        })
    }

    pub fn on_request_body(&mut self, stream: &Stream, end_of_stream: bool) -> Outcome {
        let event = Event::Body { end_of_stream };
        self.body(stream, "request body", Side::Request, event)
    }

    pub fn on_request_trailers(&mut self, stream: &Stream) -> Outcome {
        self.body(stream, "request trailers", Side::Request, Event::Trailers)
    }

    pub fn on_response_headers(&mut self, stream: &Stream, end_of_stream: bool) -> Outcome {
        self.run(stream, "response headers", |role, state, stream| {
            match (role, state) {
                (Role::Headers(ops, _), State::Headers { matched: true }) => {
                    headers::on_response_headers(ops, stream);
                    Outcome::Continue
                }
                (Role::Body(ops, counters), State::Body(b)) => b.on(
                    &BodyRole { ops, counters },
                    stream,
                    Side::Response,
                    Event::Headers { end_of_stream },
                ),
                _ => Outcome::Continue,
            }
        })
    }

    pub fn on_response_body(&mut self, stream: &Stream, end_of_stream: bool) -> Outcome {
        let event = Event::Body { end_of_stream };
        self.body(stream, "response body", Side::Response, event)
    }

    pub fn on_response_trailers(&mut self, stream: &Stream) -> Outcome {
        self.body(stream, "response trailers", Side::Response, Event::Trailers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_the_wasm_modules_and_refusals_name_the_field() {
        let parse =
            |name: &[u8], config: &[u8]| FilterConfig::new(name, config, &ConfigScope::none());
        let ok = parse(
            b"wasm-filter",
            br#"{"role":"http-header-operation","request":{"remove":["x-a"]}}"#,
        )
        .unwrap();
        assert!(ok
            .summary()
            .starts_with("configured role http-header-operation"));
        let e = parse(b"wasm-filter", br#"{"role":"rate-limit","burst":1}"#)
            .err()
            .unwrap();
        assert!(e.contains("missing field `key`"), "{e}");
        let e = parse(
            b"wasm-filter",
            br#"{"role":"http-header-operation","reqest":{}}"#,
        )
        .err()
        .unwrap();
        assert!(e.contains("unknown field `reqest`"), "{e}");
        let e = parse(b"wasm-filter", br#"{"role":"tcp-total-data-size-counter"}"#)
            .err()
            .unwrap();
        assert!(
            e.starts_with("role: \"tcp-total-data-size-counter\""),
            "{e}"
        );
        let e = parse(b"other", b"{}").err().unwrap();
        assert!(e.contains("filter_name \"other\""), "{e}");
    }
}
