//! Header, trailer and metadata maps (`proxy_*_header_map_*`) with Envoy's availability rules:
//! a map exists only while Envoy would hand it to the filter; reading a missing map gives an
//! empty list (pairs) or `BadArgument` (single value), writing it gives `BadArgument`.
//! In `proxy_on_log` (Envoy's access-log phase) the maps the stream ended with are read-only,
//! and a missing one answers `NotFound`.

use wasmtime::{Caller, Linker};

use super::{finish, hostcall, memory, ContextKind, HeaderMap, HostState};
use crate::engine::abi::{self, AbiVersion, MapType, Status};

fn map_ref(state: &HostState, ty: MapType) -> Option<&HeaderMap> {
    match ty {
        // Read-only, and only while the owning root's completion callback runs.
        MapType::HttpCallResponseHeaders | MapType::GrpcInitialMetadata => {
            return super::callouts::current_response(state).map(|r| &r.headers)
        }
        MapType::HttpCallResponseTrailers | MapType::GrpcTrailingMetadata => {
            return super::callouts::current_response(state).map(|r| &r.trailers)
        }
        _ => {}
    }
    let s = match state.contexts.get(&state.context_id())? {
        ContextKind::Http(s) => s,
        _ => return None,
    };
    if let Some(log) = &s.access_log {
        return match ty {
            MapType::RequestHeaders => log.request_headers.as_deref(),
            MapType::ResponseHeaders => log.response_headers.as_deref(),
            MapType::ResponseTrailers => log.response_trailers.as_deref(),
            _ => None,
        };
    }
    match ty {
        MapType::RequestHeaders => s.request_headers.as_ref(),
        MapType::RequestTrailers => s.request_trailers.as_ref(),
        MapType::ResponseHeaders => s.response_headers.as_ref(),
        MapType::ResponseTrailers => s.response_trailers.as_ref(),
        _ => None,
    }
}

/// Whether the current context is in Envoy's access-log phase (`proxy_on_log` of a stream).
fn in_access_log(state: &HostState) -> bool {
    matches!(state.contexts.get(&state.context_id()), Some(ContextKind::Http(s)) if s.access_log.is_some())
}

fn map_mut(state: &mut HostState, ty: MapType) -> Option<&mut HeaderMap> {
    let id = state.context_id();
    let s = match state.contexts.get_mut(&id)? {
        ContextKind::Http(s) => s,
        _ => return None,
    };
    let map = match ty {
        MapType::RequestHeaders => &mut s.request_headers,
        MapType::RequestTrailers => &mut s.request_trailers,
        MapType::ResponseHeaders => &mut s.response_headers,
        MapType::ResponseTrailers => &mut s.response_trailers,
        _ => return None,
    };
    // A body callback at end of stream that edits the trailers the message has not got adds
    // them, as Envoy's `getMap` does; the chain hands them on after this filter.
    if map.is_none() && s.addable_trailers == Some(ty) {
        *map = Some(HeaderMap::new());
    }
    map.as_mut()
}

use crate::engine::header_map::{add, get, remove, replace};

fn map_type(raw: i32) -> Result<MapType, Status> {
    MapType::from_raw(raw).ok_or(Status::BadArgument)
}

fn proxy_get_header_map_pairs(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = map_type(ty)?;
        let bytes = map_ref(caller.data(), ty)
            .map(|m| abi::encode_pairs(m))
            .unwrap_or_default();
        memory::copy_out(&mut caller, &bytes, ret_ptr, ret_size)
    })
}

fn proxy_set_header_map_pairs(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    ptr: i32,
    size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = map_type(ty)?;
        let pairs = abi::decode_pairs(&memory::read(&caller, ptr, size)?);
        let map = map_mut(caller.data_mut(), ty).ok_or(Status::BadArgument)?;
        map.clear();
        for (k, v) in pairs {
            add(map, k, v);
        }
        Ok(())
    })
}

fn proxy_get_header_map_value(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    key_ptr: i32,
    key_size: i32,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = map_type(ty)?;
        let value = memory::with_str(&mut caller, key_ptr, key_size, |key, state| {
            let map = match map_ref(state, ty) {
                Some(map) => map,
                // Envoy: a map may be absent in the access-log phase; that is no misuse.
                None if in_access_log(state) && state.abi == AbiVersion::V0_1_0 => {
                    return Ok(Vec::new())
                }
                None if in_access_log(state) => return Err(Status::NotFound),
                None => return Err(Status::BadArgument),
            };
            match get(map, key) {
                Some(v) => Ok(v.to_vec()),
                // ABI 0.1.0 modules get an empty value instead of NotFound.
                None if state.abi == AbiVersion::V0_1_0 => Ok(Vec::new()),
                None => Err(Status::NotFound),
            }
        })??;
        memory::copy_out(&mut caller, &value, ret_ptr, ret_size)
    })
}

/// The most entries a header map may reach through `proxy_add_header_map_value` /
/// `proxy_replace_header_map_value` (Envoy's codecs allow 100 by default).
pub const MAX_MAP_ENTRIES: usize = 8192;

/// The most bytes of names and values such a map may reach.
pub const MAX_MAP_BYTES: usize = 16 << 20;

/// Edits of a small map with a small header are not counted byte by byte (the common case,
/// on every request): such edits add at most this many entries of this size to what the
/// full check allowed.
const UNCOUNTED_ENTRIES: usize = 64;
const UNCOUNTED_BYTES: usize = 4096;

/// Refuses an edit that would take the map past [`MAX_MAP_ENTRIES`] or [`MAX_MAP_BYTES`]
/// (give or take `UNCOUNTED_ENTRIES` small headers), saying so in the log: a guest adding
/// headers in a loop must not exhaust the host.
fn check_growth(
    caller: &Caller<'_, HostState>,
    ty: MapType,
    adding: usize,
) -> Result<(), super::HostError> {
    let map = map_ref(caller.data(), ty).ok_or(Status::BadArgument)?;
    if map.len() < UNCOUNTED_ENTRIES && adding <= UNCOUNTED_BYTES {
        return Ok(());
    }
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if map.len() < MAX_MAP_ENTRIES && bytes.saturating_add(adding) <= MAX_MAP_BYTES {
        return Ok(());
    }
    super::logging::record(
        caller.data(),
        crate::engine::abi::LogLevel::Critical,
        format!(
            "header map {ty:?} would pass the harness's limit of {MAX_MAP_ENTRIES} entries or {MAX_MAP_BYTES} bytes ({} entries, {bytes} bytes, adding {adding}): refused (BadArgument)",
            map.len()
        ),
    );
    Err(Status::BadArgument.into())
}

fn edit(
    caller: &mut Caller<'_, HostState>,
    ty: i32,
    key_ptr: i32,
    key_size: i32,
    value: (i32, i32),
    op: fn(&mut HeaderMap, String, Vec<u8>),
) -> Result<(), super::HostError> {
    let ty = map_type(ty)?;
    let adding =
        memory::check(caller, key_ptr, key_size)? + memory::check(caller, value.0, value.1)?;
    // Envoy resolves the map (adding trailers where it may) before it edits it.
    map_mut(caller.data_mut(), ty).ok_or(Status::BadArgument)?;
    check_growth(caller, ty, adding)?;
    let key = memory::read_string(caller, key_ptr, key_size)?;
    let value = memory::read(caller, value.0, value.1)?;
    let map = map_mut(caller.data_mut(), ty).ok_or(Status::BadArgument)?;
    op(map, key, value);
    Ok(())
}

fn proxy_add_header_map_value(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    key_ptr: i32,
    key_size: i32,
    value_ptr: i32,
    value_size: i32,
) -> wasmtime::Result<i32> {
    finish(edit(
        &mut caller,
        ty,
        key_ptr,
        key_size,
        (value_ptr, value_size),
        add,
    ))
}

fn proxy_replace_header_map_value(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    key_ptr: i32,
    key_size: i32,
    value_ptr: i32,
    value_size: i32,
) -> wasmtime::Result<i32> {
    finish(edit(
        &mut caller,
        ty,
        key_ptr,
        key_size,
        (value_ptr, value_size),
        replace,
    ))
}

fn proxy_remove_header_map_value(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    key_ptr: i32,
    key_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = map_type(ty)?;
        memory::with_str(&mut caller, key_ptr, key_size, |key, state| {
            remove(map_mut(state, ty).ok_or(Status::BadArgument)?, key);
            Ok::<_, Status>(())
        })??;
        Ok(())
    })
}

/// Envoy answers with `HeaderMap::byteSize()` (keys plus values), not the serialized size.
fn proxy_get_header_map_size(
    mut caller: Caller<'_, HostState>,
    ty: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let ty = map_type(ty)?;
        if !matches!(
            ty,
            MapType::RequestHeaders
                | MapType::RequestTrailers
                | MapType::ResponseHeaders
                | MapType::ResponseTrailers
        ) {
            return Err(Status::BadArgument.into());
        }
        // Envoy sizes the map it would edit (`getMap`), which may add trailers.
        let size: usize = map_mut(caller.data_mut(), ty)
            .ok_or(Status::BadArgument)?
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        memory::write_u32(&mut caller, ret_size, size as u32)
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        proxy_get_header_map_pairs,
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        proxy_set_header_map_pairs,
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        proxy_get_header_map_value,
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        proxy_add_header_map_value,
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        proxy_replace_header_map_value,
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        proxy_remove_header_map_value,
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_size",
        proxy_get_header_map_size,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_headers_stay_in_front_and_replace_drops_all_values() {
        let mut m: HeaderMap = vec![(":path".into(), b"/".to_vec()), ("a".into(), b"1".to_vec())];
        add(&mut m, "A", b"2".to_vec());
        add(&mut m, ":Authority", b"h".to_vec());
        assert_eq!(m[1].0, ":authority");
        replace(&mut m, "a", b"3".to_vec());
        assert_eq!(
            m.iter().filter(|(k, _)| k == "a").collect::<Vec<_>>(),
            vec![&("a".to_string(), b"3".to_vec())]
        );
        assert_eq!(get(&m, "A"), Some(&b"3"[..]));
        remove(&mut m, "a");
        assert_eq!(get(&m, "a"), None);
    }
}
