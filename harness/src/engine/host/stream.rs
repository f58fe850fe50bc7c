//! Stream control: local replies, continue/close, the effective context, `proxy_done`.
//! Envoy defers the effect of each until the current VM call returns, so
//! these only record intent in the stream state; the HTTP driver acts on it afterwards.

use wasmtime::{Caller, Linker};

use super::{finish, hostcall, memory, HostState, LocalReply};
use crate::engine::abi::{self, Status, StreamType};

#[allow(clippy::too_many_arguments)]
fn proxy_send_local_response(
    caller: Caller<'_, HostState>,
    status_code: i32,
    details_ptr: i32,
    details_size: i32,
    body_ptr: i32,
    body_size: i32,
    headers_ptr: i32,
    headers_size: i32,
    grpc_status: i32,
) -> wasmtime::Result<i32> {
    let mut caller = caller;
    hostcall(|| {
        let details = memory::read_string(&caller, details_ptr, details_size)?;
        let body = memory::read(&caller, body_ptr, body_size)?;
        let headers = abi::decode_pairs(&memory::read(&caller, headers_ptr, headers_size)?)
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        // Envoy acts only on HTTP streams and answers Ok regardless.
        if let Some(s) = caller.data_mut().http_stream() {
            s.stop_forced = true;
            s.local_reply = Some(LocalReply {
                status: status_code as u16,
                details: details
                    .chars()
                    .map(|c| if c.is_whitespace() { '_' } else { c })
                    .collect(),
                body,
                headers,
                grpc_status: (0..=16)
                    .contains(&grpc_status)
                    .then_some(grpc_status as u32),
            });
        }
        Ok(())
    })
}

fn continue_stream(state: &mut HostState, ty: StreamType) -> Result<(), Status> {
    match ty {
        StreamType::Upstream => Err(Status::Unimplemented),
        StreamType::HttpRequest | StreamType::HttpResponse => {
            if let Some(s) = state.http_stream() {
                if ty == StreamType::HttpRequest {
                    s.continue_request = true;
                } else {
                    s.continue_response = true;
                }
            }
            Ok(())
        }
        StreamType::Downstream => {
            if let Some(s) = state.tcp_stream() {
                s.continue_downstream = true;
            }
            Ok(())
        }
    }
}

fn proxy_continue_stream(mut caller: Caller<'_, HostState>, ty: i32) -> wasmtime::Result<i32> {
    let ty = StreamType::from_raw(ty);
    finish(
        ty.ok_or(Status::BadArgument)
            .and_then(|ty| continue_stream(caller.data_mut(), ty))
            .map_err(Into::into),
    )
}

fn proxy_close_stream(mut caller: Caller<'_, HostState>, ty: i32) -> wasmtime::Result<i32> {
    hostcall(|| {
        StreamType::from_raw(ty).ok_or(Status::BadArgument)?;
        let state = caller.data_mut();
        if let Some(s) = state.http_stream() {
            s.reset = true;
        } else if let Some(s) = state.tcp_stream() {
            s.close = true;
        }
        Ok(())
    })
}

fn proxy_continue_request(mut caller: Caller<'_, HostState>) -> wasmtime::Result<i32> {
    finish(continue_stream(caller.data_mut(), StreamType::HttpRequest).map_err(Into::into))
}

fn proxy_continue_response(mut caller: Caller<'_, HostState>) -> wasmtime::Result<i32> {
    finish(continue_stream(caller.data_mut(), StreamType::HttpResponse).map_err(Into::into))
}

/// ABI 0.1.0: Envoy re-matches the route when the router runs, which the harness always does.
fn proxy_clear_route_cache(_caller: Caller<'_, HostState>) -> wasmtime::Result<i32> {
    finish(Ok(()))
}

fn proxy_set_effective_context(
    mut caller: Caller<'_, HostState>,
    id: i32,
) -> wasmtime::Result<i32> {
    let state = caller.data_mut();
    let id = id as u32;
    if id != 0 && !state.contexts.contains_key(&id) {
        return finish(Err(Status::BadArgument.into()));
    }
    state.effective = (id != 0).then_some(id);
    finish(Ok(()))
}

/// A root whose `proxy_on_done` returned false at shutdown says it has finished: its
/// `proxy_on_delete` follows once the current callback returns (cpp-host defers it so it never
/// runs inside this call). Any other caller gets `NotFound`.
fn proxy_done(mut caller: Caller<'_, HostState>) -> wasmtime::Result<i32> {
    let state = caller.data_mut();
    let root = state.root_of(state.context_id());
    match root.and_then(|r| state.pending_done.iter().position(|&p| p == r)) {
        Some(i) => {
            let root = state.pending_done.remove(i);
            state.done_now.push(root);
            finish(Ok(()))
        }
        None => finish(Err(Status::NotFound.into())),
    }
}

pub fn add_to_linker(linker: &mut wasmtime::Linker<HostState>) -> wasmtime::Result<()> {
    let l: &mut Linker<HostState> = linker;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        proxy_send_local_response,
    )?;
    l.func_wrap("env", "proxy_continue_stream", proxy_continue_stream)?;
    l.func_wrap("env", "proxy_close_stream", proxy_close_stream)?;
    l.func_wrap("env", "proxy_continue_request", proxy_continue_request)?;
    l.func_wrap("env", "proxy_continue_response", proxy_continue_response)?;
    l.func_wrap("env", "proxy_clear_route_cache", proxy_clear_route_cache)?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        proxy_set_effective_context,
    )?;
    l.func_wrap("env", "proxy_done", proxy_done)?;
    Ok(())
}
