//! Canned replies to a scenario's callouts: what the harness answers an HTTP or gRPC call
//! with, and what real Envoy's callout upstreams answer.

use serde::Deserialize;

use super::UpstreamSpec;
use crate::envoy::http;

/// `{cluster: auth, path: /check, reply: {status: 200, ...}}`, `{cluster: auth, reset: true}`
/// or `{cluster: auth, silent: true}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpCallSpec {
    pub cluster: String,
    /// Matches calls whose `:path` starts with this.
    #[serde(default)]
    pub path: Option<String>,
    /// The upstream's reply (default: 200, no body).
    #[serde(default)]
    pub reply: Option<UpstreamSpec>,
    /// The upstream closes the connection without answering (Envoy's router: 503).
    #[serde(default)]
    pub disconnect: bool,
    /// The call fails before a response: the guest sees `(0, 0, 0)` and status 11 "reset"
    /// (harness only: real Envoy does this on e.g. a response over the buffer limit).
    #[serde(default)]
    pub reset: bool,
    /// The upstream takes the request and never answers: a call with a timeout gets Envoy's
    /// 504 `upstream request timeout` when it runs out, one without (timeout 0) nothing, so
    /// a stream waiting for it stays paused.
    #[serde(default)]
    pub silent: bool,
}

impl HttpCallSpec {
    pub fn to_canned(&self) -> http::CannedHttpCall {
        http::CannedHttpCall {
            cluster: self.cluster.clone(),
            path_prefix: self.path.clone(),
            answer: if self.silent {
                http::HttpCallAnswer::Silent
            } else if self.reset {
                http::HttpCallAnswer::Reset
            } else if self.disconnect {
                http::HttpCallAnswer::Disconnect
            } else {
                http::HttpCallAnswer::Reply(self.reply.clone().unwrap_or_default().to_reply())
            },
        }
    }
}

/// `{cluster: rl, service: pkg.Svc, method: Check, message: "..."}`, or with `status: N`
/// (and `status_message`) a failed call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcCallSpec {
    pub cluster: String,
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    /// The reply message as text.
    #[serde(default)]
    pub message: Option<String>,
    /// The reply message as base64 (serialized protobuf is rarely text).
    #[serde(default)]
    pub message_base64: Option<String>,
    /// A gRPC status other than 0 makes the call fail with it.
    #[serde(default)]
    pub status: u32,
    #[serde(default)]
    pub status_message: String,
}

impl GrpcCallSpec {
    pub fn to_canned(&self) -> Result<http::CannedGrpcCall, String> {
        let answer = if self.status != 0 {
            http::GrpcCallAnswer::Status {
                code: self.status,
                message: self.status_message.clone(),
            }
        } else {
            let message = match (&self.message, &self.message_base64) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "grpc_calls entry for {:?}: give message or message_base64, not both",
                        self.cluster
                    ))
                }
                (Some(text), None) => text.clone().into_bytes(),
                (None, Some(b64)) => {
                    crate::envoy::bootstrap::base64_decode(b64).ok_or_else(|| {
                        format!(
                            "grpc_calls entry for {:?}: message_base64 is not valid base64",
                            self.cluster
                        )
                    })?
                }
                (None, None) => Vec::new(),
            };
            http::GrpcCallAnswer::Message(message)
        };
        Ok(http::CannedGrpcCall {
            cluster: self.cluster.clone(),
            service: self.service.clone(),
            method: self.method.clone(),
            answer,
        })
    }
}
