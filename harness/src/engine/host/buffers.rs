//! `proxy_get_buffer_bytes`, `proxy_get_buffer_status`, `proxy_set_buffer_bytes` with Envoy's
//! availability rules: the plugin configuration only during `on_configure`, bodies only on
//! HTTP stream contexts, connection data only on TCP contexts, and Envoy's limited `set` (prepend/replace at 0, append at the end).

use wasmtime::{Caller, Linker};

use super::{finish, hostcall, memory, ContextKind, HostError, HostState};
use crate::engine::abi::{BufferType, Status};

/// The buffer's bytes, borrowed (a guest reading a large body piece by piece costs a copy
/// of each piece, not of the body), or the status Envoy gives when it has none to offer.
fn buffer_bytes(state: &HostState, ty: BufferType) -> Result<&[u8], Status> {
    let id = state.context_id();
    match ty {
        BufferType::VmConfiguration => Ok(state.vm_configuration.as_slice()),
        BufferType::PluginConfiguration => {
            let root = state.root_of(id);
            match (root, state.configuring) {
                (Some(r), Some(c)) if r == c => state
                    .plugin_of(id)
                    .map(|p| p.configuration.as_slice())
                    .ok_or(Status::NotFound),
                _ => Err(Status::NotFound),
            }
        }
        BufferType::HttpRequestBody | BufferType::HttpResponseBody => {
            let s = state.http_stream_ref().ok_or(Status::NotFound)?;
            Ok(if ty == BufferType::HttpRequestBody {
                &s.request_body
            } else {
                &s.response_body
            })
        }
        BufferType::DownstreamData | BufferType::UpstreamData => match state.contexts.get(&id) {
            Some(ContextKind::Tcp(s)) => Ok(if ty == BufferType::DownstreamData {
                &s.downstream_data
            } else {
                &s.upstream_data
            }),
            _ => Err(Status::NotFound),
        },
        BufferType::HttpCallResponseBody | BufferType::GrpcReceiveBuffer => {
            super::callouts::current_response(state)
                .map(|r| r.body.as_slice())
                .ok_or(Status::NotFound)
        }
        _ => Err(Status::NotFound),
    }
}

/// ABI 0.1.0's `proxy_get_configuration`: the plugin configuration while the plugin
/// configures, else the VM configuration (cpp-host `getConfiguration`).
fn proxy_get_configuration(
    mut caller: Caller<'_, HostState>,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    let state = caller.data();
    let bytes = match state.configuring {
        Some(root) => state
            .plugin_of(root)
            .map(|p| p.configuration.clone())
            .unwrap_or_default(),
        None => state.vm_configuration.as_ref().clone(),
    };
    finish(memory::copy_out(&mut caller, &bytes, ret_ptr, ret_size))
}

fn proxy_get_buffer_bytes(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    start: i32,
    max_size: i32,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = BufferType::from_raw(ty).ok_or(Status::BadArgument)?;
        let bytes = buffer_bytes(caller.data(), ty)?;
        let start = start as u32 as usize;
        let slice = if start >= bytes.len() {
            Vec::new()
        } else {
            let end = start
                .saturating_add(max_size as u32 as usize)
                .min(bytes.len());
            bytes[start..end].to_vec()
        };
        memory::copy_out(&mut caller, &slice, ret_ptr, ret_size)
    })
}

fn proxy_get_buffer_status(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    ret_size: i32,
    ret_flags: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = BufferType::from_raw(ty).ok_or(Status::BadArgument)?;
        let len = buffer_bytes(caller.data(), ty)?.len();
        memory::write_u32(&mut caller, ret_size, len as u32)?;
        // cpp-host never reports the EndOfStream flag.
        memory::write_u32(&mut caller, ret_flags, 0)
    })
}

/// The most a guest may grow a body or connection buffer to with `proxy_set_buffer_bytes`:
/// the size of the largest memory a guest has, so no guest could read more in one piece.
pub const MAX_BUFFER_BYTES: usize = memory::MAX_MEMORY_BYTES;

/// Envoy's `Buffer::copyFrom` rules for `proxy_set_buffer_bytes`.
pub fn apply_set(buf: &mut Vec<u8>, start: usize, size: usize, data: &[u8]) -> Result<(), Status> {
    if start == 0 {
        let drained = size.min(buf.len());
        buf.splice(..drained, data.iter().copied());
        Ok(())
    } else if start >= buf.len() {
        buf.extend_from_slice(data);
        Ok(())
    } else {
        Err(Status::BadArgument)
    }
}

fn proxy_set_buffer_bytes(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    start: i32,
    size: i32,
    data_ptr: i32,
    data_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = BufferType::from_raw(ty).ok_or(Status::BadArgument)?;
        let adding = memory::check(&caller, data_ptr, data_size)?;
        if buffer_bytes(caller.data(), ty)
            .map_or(0, <[u8]>::len)
            .saturating_add(adding)
            > MAX_BUFFER_BYTES
        {
            super::logging::record(
                caller.data(),
                crate::engine::abi::LogLevel::Critical,
                format!(
                    "proxy_set_buffer_bytes: adding {adding} bytes would take the {ty:?} buffer past the harness's limit of {MAX_BUFFER_BYTES} bytes: refused (BadArgument)"
                ),
            );
            return Err(Status::BadArgument.into());
        }
        let data = memory::read(&caller, data_ptr, data_size)?;
        let state = caller.data_mut();
        let id = state.context_id();
        let in_callback;
        let buf = match (ty, state.contexts.get_mut(&id)) {
            (BufferType::HttpRequestBody, Some(ContextKind::Http(s))) => {
                in_callback = s.body_callback == Some(ty);
                &mut s.request_body
            }
            (BufferType::HttpResponseBody, Some(ContextKind::Http(s))) => {
                in_callback = s.body_callback == Some(ty);
                &mut s.response_body
            }
            (BufferType::DownstreamData | BufferType::UpstreamData, Some(ContextKind::Tcp(s))) => {
                in_callback = s.in_data_callback == Some(ty);
                if ty == BufferType::DownstreamData {
                    &mut s.downstream_data
                } else {
                    &mut s.upstream_data
                }
            }
            (BufferType::DownstreamData | BufferType::UpstreamData, _) => {
                return Err(HostError::Status(Status::NotFound))
            }
            (BufferType::HttpRequestBody | BufferType::HttpResponseBody, _) => {
                return Err(HostError::Status(Status::NotFound))
            }
            _ => return Err(HostError::Status(Status::BadArgument)),
        };
        if buf.is_empty() && !in_callback {
            // No body in flight: Envoy has no buffer to modify.
            return Err(Status::BadArgument.into());
        }
        apply_set(buf, start as u32 as usize, size as u32 as usize, &data)?;
        Ok(())
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_configuration", proxy_get_configuration)?;
    linker.func_wrap("env", "proxy_get_buffer_bytes", proxy_get_buffer_bytes)?;
    linker.func_wrap("env", "proxy_get_buffer_status", proxy_get_buffer_status)?;
    linker.func_wrap("env", "proxy_set_buffer_bytes", proxy_set_buffer_bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::apply_set;
    use crate::engine::abi::Status;

    #[test]
    fn set_follows_envoy_copy_from() {
        let mut b = b"hello world".to_vec();
        apply_set(&mut b, 0, 5, b"HELLO").unwrap();
        assert_eq!(b, b"HELLO world");
        apply_set(&mut b, 0, 0, b">").unwrap();
        assert_eq!(b, b">HELLO world");
        apply_set(&mut b, 100, 0, b"!").unwrap();
        assert_eq!(b, b">HELLO world!");
        apply_set(&mut b, 0, usize::MAX, b"new").unwrap();
        assert_eq!(b, b"new");
        assert_eq!(apply_set(&mut b, 1, 1, b"x"), Err(Status::BadArgument));
    }
}
