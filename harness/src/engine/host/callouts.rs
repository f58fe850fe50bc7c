//! HTTP and gRPC callouts (`proxy_http_call`, `proxy_grpc_*`) and foreign functions.
//!
//! Arguments are checked exactly as Envoy checks them (cluster known, required pseudo-headers,
//! timeout sign). A valid call only records what was asked, on the proxy-wide list of pending
//! calls: the proxy answers it once the current callback has returned (Envoy's completions are
//! always asynchronous), by calling `proxy_on_http_call_response` / `proxy_on_grpc_receive` /
//! `proxy_on_grpc_close` on the root context that owns the call. What that callback may read
//! (map types 4–7, buffer types 4 and 5) and `proxy_get_status` live here too.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use wasm_common::sync::lock;
use wasmtime::{Caller, Linker};

use super::queues::Receiver;
use super::{finish, hostcall, memory, HeaderMap, HostState};
use crate::engine::abi::{self, Status};

/// cpp-host numbers callouts in steps of 4; the low bits say which kind a token is.
const CALLOUT_INCREMENT: u32 = 4;
const HTTP_CALL: u32 = 0;
const GRPC_CALL: u32 = 1;
const GRPC_STREAM: u32 = 2;

/// What a guest asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallRequest {
    Http {
        cluster: String,
        /// As the guest passed them, plus what Envoy adds: `content-length` for a body,
        /// `x-envoy-internal`, and `x-envoy-expected-rq-timeout-ms` with a timeout.
        headers: HeaderMap,
        body: Vec<u8>,
        trailers: HeaderMap,
        /// `None`: the guest passed 0, which Envoy takes as no timeout.
        timeout: Option<Duration>,
    },
    Grpc {
        cluster: String,
        service: String,
        method: String,
        metadata: HeaderMap,
        message: Vec<u8>,
        timeout: Option<Duration>,
    },
}

impl CallRequest {
    pub fn cluster(&self) -> &str {
        match self {
            Self::Http { cluster, .. } | Self::Grpc { cluster, .. } => cluster,
        }
    }
}

/// A call made and not yet answered.
#[derive(Debug, Clone)]
pub struct PendingCall {
    /// The root context owning the call, in its VM instance.
    pub receiver: Receiver,
    pub token: u32,
    pub request: CallRequest,
    /// Bytes held for it against [`super::held::MAX_HELD_BYTES`] until it is answered.
    pub held: usize,
}

/// Calls waiting for the proxy to answer, oldest first, from every VM.
pub type PendingCalls = VecDeque<PendingCall>;

/// What the owning root may read while its completion callback runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallResponse {
    pub root: u32,
    /// HTTP: the response headers (`:status` first). gRPC: initial metadata.
    pub headers: HeaderMap,
    /// HTTP: the response body. gRPC: the message.
    pub body: Vec<u8>,
    /// HTTP: the response trailers. gRPC: trailing metadata.
    pub trailers: HeaderMap,
}

/// Per VM instance: token counters, calls in flight, each root's last status.
#[derive(Debug, Default)]
pub struct CalloutState {
    next_http: u32,
    next_grpc_call: u32,
    next_grpc_stream: u32,
    /// Tokens in flight, with the root owning each; a cancelled call leaves this map and is
    /// never answered.
    pub in_flight: HashMap<u32, u32>,
    /// Per root: `(code, message)` for `proxy_get_status`.
    pub status: HashMap<u32, (u32, Vec<u8>)>,
    /// Set only while a completion callback runs.
    pub response: Option<CallResponse>,
}

impl CalloutState {
    fn next_token(&mut self, kind: u32) -> u32 {
        let counter = match kind {
            HTTP_CALL => &mut self.next_http,
            GRPC_CALL => &mut self.next_grpc_call,
            _ => &mut self.next_grpc_stream,
        };
        *counter += CALLOUT_INCREMENT;
        *counter + kind
    }
}

/// The response the current completion callback may read, if `state`'s current context
/// belongs to the root it was delivered to (Envoy keeps it on the root context).
pub fn current_response(state: &HostState) -> Option<&CallResponse> {
    let r = state.callouts.response.as_ref()?;
    (state.root_of(state.context_id()) == Some(r.root)).then_some(r)
}

/// Runs `make` (which reads and starts a call) with the bytes of the guest's `slices` held
/// for the call, checked before anything is copied; a call that does not start gives them
/// back. `make` gets the size, to record on the call.
fn holding(
    caller: &mut Caller<'_, HostState>,
    slices: &[(i32, i32)],
    what: &str,
    make: impl FnOnce(&mut Caller<'_, HostState>, usize) -> Result<(), super::HostError>,
) -> Result<(), super::HostError> {
    let size = slices
        .iter()
        .map(|&(p, n)| memory::check(caller, p, n))
        .sum::<Result<usize, _>>()?
        + std::mem::size_of::<PendingCall>()
        + super::held::ENTRY_OVERHEAD;
    super::held::hold(caller.data(), size, what)?;
    let made = make(caller, size);
    if made.is_err() {
        caller.data().shared.held.release(size);
    }
    made
}

/// Registers a call on the owning root and on the proxy's pending list; returns its token.
fn start(caller: &mut Caller<'_, HostState>, kind: u32, request: CallRequest, held: usize) -> u32 {
    let state = caller.data_mut();
    let root = state
        .root_of(state.context_id())
        .unwrap_or(state.context_id());
    let token = state.callouts.next_token(kind);
    state.callouts.in_flight.insert(token, root);
    let receiver = Receiver {
        instance: state.instance,
        worker: state.worker,
        root,
    };
    lock(&state.shared.calls).push_back(PendingCall {
        receiver,
        token,
        request,
        held,
    });
    state
        .shared
        .posted
        .store(true, std::sync::atomic::Ordering::Release);
    token
}

fn timeout(ms: i32) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

#[allow(clippy::too_many_arguments)]
fn proxy_http_call(
    mut caller: Caller<'_, HostState>,
    up_ptr: i32,
    up_size: i32,
    h_ptr: i32,
    h_size: i32,
    b_ptr: i32,
    b_size: i32,
    t_ptr: i32,
    t_size: i32,
    timeout_ms: i32,
    ret_token: i32,
) -> wasmtime::Result<i32> {
    let slices = [
        (up_ptr, up_size),
        (h_ptr, h_size),
        (b_ptr, b_size),
        (t_ptr, t_size),
    ];
    finish(holding(
        &mut caller,
        &slices,
        "proxy_http_call",
        |caller, size| {
            let cluster = memory::read_string(caller, up_ptr, up_size)?;
            let mut headers = abi::decode_pairs(&memory::read(caller, h_ptr, h_size)?);
            let body = memory::read(caller, b_ptr, b_size)?;
            let trailers = abi::decode_pairs(&memory::read(caller, t_ptr, t_size)?);
            memory::write_u32(caller, ret_token, 0)?;
            if timeout_ms < 0 || !caller.data().clusters.contains(&cluster) {
                return Err(Status::BadArgument.into());
            }
            for required in [":path", ":method", ":authority"] {
                if !headers.iter().any(|(k, _)| k == required) {
                    return Err(Status::BadArgument.into());
                }
            }
            for (k, _) in headers.iter_mut() {
                k.make_ascii_lowercase();
            }
            // Envoy's router answers a cluster with no endpoint inside the async client's
            // `send`, which then returns no request: the call fails as it is made.
            if caller
                .data()
                .shared
                .clusters_without_endpoints
                .get()
                .is_some_and(|c| c.contains(&cluster))
            {
                return Err(Status::InternalFailure.into());
            }
            // What Envoy's async client and router add on the way out.
            if !body.is_empty() {
                crate::engine::header_map::replace(
                    &mut headers,
                    "content-length",
                    body.len().to_string().into_bytes(),
                );
            }
            crate::engine::header_map::replace(&mut headers, "x-envoy-internal", b"true".to_vec());
            if timeout_ms > 0 {
                crate::engine::header_map::replace(
                    &mut headers,
                    "x-envoy-expected-rq-timeout-ms",
                    timeout_ms.to_string().into_bytes(),
                );
            }
            let request = CallRequest::Http {
                cluster,
                headers,
                body,
                trailers,
                timeout: timeout(timeout_ms),
            };
            let token = start(caller, HTTP_CALL, request, size);
            memory::write_u32(caller, ret_token, token)
        },
    ))
}

/// The parts of a gRPC call both `proxy_grpc_call` and `proxy_grpc_stream` read.
struct GrpcTarget {
    cluster: String,
    service: String,
    method: String,
    metadata: HeaderMap,
}

fn grpc_target(
    caller: &Caller<'_, HostState>,
    up: (i32, i32),
    svc: (i32, i32),
    method: (i32, i32),
    md: (i32, i32),
) -> Result<GrpcTarget, super::HostError> {
    let upstream = memory::read(caller, up.0, up.1)?;
    let service = memory::read_string(caller, svc.0, svc.1)?;
    let method = memory::read_string(caller, method.0, method.1)?;
    let metadata = abi::decode_pairs(&memory::read(caller, md.0, md.1)?);
    // Envoy first tries to parse a serialized GrpcService; the harness reads the common
    // form, a cluster name.
    let cluster = String::from_utf8(upstream).map_err(|_| Status::ParseFailure)?;
    if !caller.data().clusters.contains(&cluster) {
        return Err(Status::ParseFailure.into());
    }
    Ok(GrpcTarget {
        cluster,
        service,
        method,
        metadata,
    })
}

#[allow(clippy::too_many_arguments)]
fn proxy_grpc_call(
    mut caller: Caller<'_, HostState>,
    up: i32,
    up_size: i32,
    svc: i32,
    svc_size: i32,
    method: i32,
    method_size: i32,
    md: i32,
    md_size: i32,
    msg: i32,
    msg_size: i32,
    timeout_ms: i32,
    ret_token: i32,
) -> wasmtime::Result<i32> {
    let slices = [
        (up, up_size),
        (svc, svc_size),
        (method, method_size),
        (md, md_size),
        (msg, msg_size),
    ];
    finish(holding(
        &mut caller,
        &slices,
        "proxy_grpc_call",
        |caller, size| {
            let message = memory::read(caller, msg, msg_size)?;
            let t = grpc_target(
                caller,
                (up, up_size),
                (svc, svc_size),
                (method, method_size),
                (md, md_size),
            )?;
            // Validate the token pointer before starting anything.
            memory::write_u32(caller, ret_token, 0)?;
            let request = CallRequest::Grpc {
                cluster: t.cluster,
                service: t.service,
                method: t.method,
                metadata: t.metadata,
                message,
                timeout: timeout(timeout_ms),
            };
            let token = start(caller, GRPC_CALL, request, size);
            memory::write_u32(caller, ret_token, token)
        },
    ))
}

#[allow(clippy::too_many_arguments)]
fn proxy_grpc_stream(
    caller: Caller<'_, HostState>,
    up: i32,
    up_size: i32,
    svc: i32,
    svc_size: i32,
    method: i32,
    method_size: i32,
    md: i32,
    md_size: i32,
    _ret_token: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let t = grpc_target(
            &caller,
            (up, up_size),
            (svc, svc_size),
            (method, method_size),
            (md, md_size),
        )?;
        super::logging::record(
            caller.data(),
            abi::LogLevel::Error,
            format!(
                "wasm-harness: gRPC streams ({}/{} on {:?}) are not emulated; answering InternalFailure as a failed send",
                t.service, t.method, t.cluster
            ),
        );
        Err(Status::InternalFailure.into())
    })
}

/// Cancels or closes a call: for a unary call both end it (it is never answered).
fn end_call(state: &mut HostState, token: u32) -> Status {
    match token % CALLOUT_INCREMENT {
        GRPC_CALL | GRPC_STREAM => {}
        _ => return Status::BadArgument,
    }
    if state.callouts.in_flight.remove(&token).is_some() {
        Status::Ok
    } else {
        Status::NotFound
    }
}

fn proxy_grpc_send(
    caller: Caller<'_, HostState>,
    token: i32,
    msg: i32,
    msg_size: i32,
    _end_stream: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        memory::check(&caller, msg, msg_size)?;
        // Only stream tokens take messages, and no stream is ever open in the harness.
        if token as u32 % CALLOUT_INCREMENT != GRPC_STREAM {
            return Err(Status::BadArgument.into());
        }
        Err(Status::NotFound.into())
    })
}

/// `proxy_get_status`: the owning root's last callout status; `(0, "")` until one failed.
fn proxy_get_status(
    mut caller: Caller<'_, HostState>,
    code_ptr: i32,
    msg_ptr: i32,
    msg_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let state = caller.data();
        let root = state.root_of(state.context_id()).unwrap_or(0);
        let (code, message) = state
            .callouts
            .status
            .get(&root)
            .cloned()
            .unwrap_or_default();
        memory::write_u32(&mut caller, code_ptr, code)?;
        memory::copy_out(&mut caller, &message, msg_ptr, msg_size)
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_http_call", proxy_http_call)?;
    linker.func_wrap("env", "proxy_grpc_call", proxy_grpc_call)?;
    linker.func_wrap("env", "proxy_grpc_stream", proxy_grpc_stream)?;
    linker.func_wrap("env", "proxy_grpc_send", proxy_grpc_send)?;
    linker.func_wrap(
        "env",
        "proxy_grpc_cancel",
        |mut c: Caller<'_, HostState>, token: i32| end_call(c.data_mut(), token as u32).code(),
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_close",
        |mut c: Caller<'_, HostState>, token: i32| end_call(c.data_mut(), token as u32).code(),
    )?;
    linker.func_wrap("env", "proxy_get_status", proxy_get_status)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_follow_cpp_host_numbering() {
        let mut s = CalloutState::default();
        assert_eq!(s.next_token(HTTP_CALL), 4);
        assert_eq!(s.next_token(HTTP_CALL), 8);
        assert_eq!(s.next_token(GRPC_CALL), 5);
        assert_eq!(s.next_token(GRPC_STREAM), 6);
        assert_eq!(s.next_token(GRPC_CALL), 9);
    }
}
