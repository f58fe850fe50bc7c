//! HTTP and gRPC callouts and foreign functions. Arguments are checked exactly as Envoy checks
//! them (cluster known, required pseudo-headers, timeout sign); dispatching a valid callout is
//! not implemented yet, so it fails the way a send failure does in Envoy (`InternalFailure`)
//! and says so in the log, rather than pretending a reply came.

use wasmtime::{Caller, Linker};

use super::{finish, logging, memory, HostState};
use crate::abi::{self, LogLevel, Status};

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
    finish((|| {
        let cluster = memory::read_string(&caller, up_ptr, up_size)?;
        let headers = abi::decode_pairs(&memory::read(&caller, h_ptr, h_size)?);
        memory::read(&caller, b_ptr, b_size)?;
        memory::read(&caller, t_ptr, t_size)?;
        memory::write_u32(&mut caller, ret_token, 0)?;
        if timeout_ms < 0 || !caller.data().clusters.contains(&cluster) {
            return Err(Status::BadArgument.into());
        }
        for required in [":path", ":method", ":authority"] {
            if !headers.iter().any(|(k, _)| k == required) {
                return Err(Status::BadArgument.into());
            }
        }
        logging::record(
            caller.data(),
            LogLevel::Error,
            format!("wasm-harness: proxy_http_call to cluster {cluster:?} is not dispatched by this harness version; answering InternalFailure"),
        );
        Err(Status::InternalFailure.into())
    })())
}

#[allow(clippy::too_many_arguments)]
fn grpc_open(
    caller: &mut Caller<'_, HostState>,
    up_ptr: i32,
    up_size: i32,
    svc: (i32, i32),
    method: (i32, i32),
    md: (i32, i32),
) -> Result<(), super::HostError> {
    let cluster = memory::read_string(caller, up_ptr, up_size)?;
    memory::read(caller, svc.0, svc.1)?;
    memory::read(caller, method.0, method.1)?;
    memory::read(caller, md.0, md.1)?;
    if !caller.data().clusters.contains(&cluster) {
        return Err(Status::ParseFailure.into());
    }
    logging::record(
        caller.data(),
        LogLevel::Error,
        format!("wasm-harness: gRPC callouts to {cluster:?} are not dispatched by this harness version; answering InternalFailure"),
    );
    Err(Status::InternalFailure.into())
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_http_call", proxy_http_call)?;
    linker.func_wrap(
        "env",
        "proxy_grpc_call",
        |mut c: Caller<'_, HostState>,
         up: i32,
         ups: i32,
         s: i32,
         ss: i32,
         m: i32,
         ms: i32,
         md: i32,
         mds: i32,
         msg: i32,
         msgs: i32,
         _timeout: i32,
         _tok: i32| {
            finish(
                memory::read(&c, msg, msgs)
                    .and_then(|_| grpc_open(&mut c, up, ups, (s, ss), (m, ms), (md, mds))),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_stream",
        |mut c: Caller<'_, HostState>,
         up: i32,
         ups: i32,
         s: i32,
         ss: i32,
         m: i32,
         ms: i32,
         md: i32,
         mds: i32,
         _tok: i32| { finish(grpc_open(&mut c, up, ups, (s, ss), (m, ms), (md, mds))) },
    )?;
    // No callout is ever open, so every token is unknown.
    linker.func_wrap(
        "env",
        "proxy_grpc_send",
        |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32| Status::NotFound.code(),
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_cancel",
        |_: Caller<'_, HostState>, _: i32| Status::NotFound.code(),
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_close",
        |_: Caller<'_, HostState>, _: i32| Status::NotFound.code(),
    )?;
    linker.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |c: Caller<'_, HostState>,
         name: i32,
         name_size: i32,
         args: i32,
         args_size: i32,
         _ret: i32,
         _ret_size: i32| {
            finish((|| {
                memory::read(&c, name, name_size)?;
                memory::read(&c, args, args_size)?;
                // No foreign function is registered in the harness: Envoy's answer for an
                // unknown name.
                Err(Status::NotFound.into())
            })())
        },
    )?;
    Ok(())
}
