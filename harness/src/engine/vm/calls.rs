//! A callout's end delivered to the root context that made it, as Envoy's
//! `onHttpCallSuccess` / `onHttpCallFailure` and gRPC `onSuccess` / `onFailure` do.

use super::Vm;
use crate::engine::abi::Status;
use crate::engine::host;

/// How a callout ended, as the owning root is told.
#[derive(Debug, Clone)]
pub enum CallOutcome {
    /// A response (an upstream's, or one Envoy's router made up: 503, 504).
    Http(host::callouts::CallResponse),
    /// The stream was reset before a response: `(root, token, 0, 0, 0)`, status 11 "reset".
    HttpReset,
    /// A unary gRPC call's reply message (an implied OK; no close follows).
    GrpcMessage(Vec<u8>),
    /// A unary gRPC call that failed with this gRPC status.
    GrpcClose { status: u32, message: String },
}

impl Vm {
    /// Answers callout `token` on the root that owns it, as Envoy's `onHttpCallSuccess` /
    /// `onHttpCallFailure` and gRPC `onSuccess` / `onFailure` do. Skipped when the call was
    /// cancelled, the root is gone or the VM failed. Returns whether the guest was called.
    pub fn complete_call(&mut self, token: u32, outcome: CallOutcome) -> bool {
        let Some(root) = self.state_mut().callouts.in_flight.remove(&token) else {
            return false;
        };
        if !self.is_root(root) || self.failed.is_some() {
            return false;
        }
        let readable = |body, headers, trailers| {
            Some(host::callouts::CallResponse {
                root,
                headers,
                body,
                trailers,
            })
        };
        match outcome {
            CallOutcome::Http(r) => {
                let args = (
                    root as i32,
                    token as i32,
                    r.headers.len() as i32,
                    r.body.len() as i32,
                    r.trailers.len() as i32,
                );
                self.state_mut().callouts.response = readable(r.body, r.headers, r.trailers);
                self.call(
                    "proxy_on_http_call_response",
                    |e| e.on_http_call_response.as_ref(),
                    root,
                    args,
                );
            }
            CallOutcome::HttpReset => {
                let reset = (Status::BrokenConnection.code() as u32, b"reset".to_vec());
                self.state_mut().callouts.status.insert(root, reset);
                let args = (root as i32, token as i32, 0, 0, 0);
                self.call(
                    "proxy_on_http_call_response",
                    |e| e.on_http_call_response.as_ref(),
                    root,
                    args,
                );
            }
            CallOutcome::GrpcMessage(message) => {
                let args = (root as i32, token as i32, message.len() as i32);
                self.state_mut().callouts.response = readable(message, Vec::new(), Vec::new());
                self.call(
                    "proxy_on_grpc_receive",
                    |e| e.on_grpc_receive.as_ref(),
                    root,
                    args,
                );
            }
            CallOutcome::GrpcClose { status, message } => {
                let closed = (status, message.into_bytes());
                self.state_mut().callouts.status.insert(root, closed);
                let args = (root as i32, token as i32, status as i32);
                self.call(
                    "proxy_on_grpc_close",
                    |e| e.on_grpc_close.as_ref(),
                    root,
                    args,
                );
            }
        }
        self.state_mut().callouts.response = None;
        true
    }
}
