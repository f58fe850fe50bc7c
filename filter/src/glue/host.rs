//! The hostcalls the filter makes, each returning the host's status as the SDK's
//! [`Status`] instead of panicking on it.
//!
//! The SDK's own wrappers (`proxy_wasm::hostcalls`) panic on any status they do not expect
//! (`get_map_value` also on a header value that is not UTF-8), and a panic traps the VM:
//! every later request on that worker then gets the failure policy (rust-sdk#82, #185, #310).
//! Their imports also declare the result as the `Status` enum, so a code the SDK does not
//! list would be an invalid value. Here the imports return the plain `u32`, which
//! [`status`] reads into a `Status` (an unknown code is `InternalFailure`). The one hostcall
//! taken from the SDK is `dispatch_http_call`: its dispatcher routes the answer by a token
//! that only its wrapper registers, and the wrapper accepts every status Envoy's
//! `httpCall` returns (`Ok`, `BadArgument`, `InternalFailure`).
//!
//! Memory the host hands back was allocated by the SDK's `proxy_on_memory_allocate` (a
//! `Vec<u8>` of exactly that length), so it is taken back the same way.

use proxy_wasm::types::{BufferType, MapType, MetricType, Status, StreamType};

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, m: *const u8, ml: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_buffer_bytes(
        t: u32,
        start: usize,
        max: usize,
        p: *mut *mut u8,
        l: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(t: u32, start: usize, size: usize, p: *const u8, l: usize) -> u32;
    fn proxy_get_header_map_value(
        t: u32,
        k: *const u8,
        kl: usize,
        p: *mut *mut u8,
        l: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(t: u32, p: *mut *mut u8, l: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        t: u32,
        k: *const u8,
        kl: usize,
        v: *const u8,
        vl: usize,
    ) -> u32;
    fn proxy_add_header_map_value(t: u32, k: *const u8, kl: usize, v: *const u8, vl: usize) -> u32;
    fn proxy_remove_header_map_value(t: u32, k: *const u8, kl: usize) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_get_property(path: *const u8, path_len: usize, p: *mut *mut u8, l: *mut usize) -> u32;
    fn proxy_get_shared_data(
        k: *const u8,
        kl: usize,
        p: *mut *mut u8,
        l: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(k: *const u8, kl: usize, v: *const u8, vl: usize, cas: u32) -> u32;
    fn proxy_register_shared_queue(n: *const u8, nl: usize, id: *mut u32) -> u32;
    fn proxy_resolve_shared_queue(
        vm: *const u8,
        vml: usize,
        n: *const u8,
        nl: usize,
        id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(id: u32, p: *const u8, l: usize) -> u32;
    fn proxy_dequeue_shared_queue(id: u32, p: *mut *mut u8, l: *mut usize) -> u32;
    fn proxy_set_tick_period_milliseconds(ms: u32) -> u32;
    fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32;
    fn proxy_define_metric(kind: u32, n: *const u8, nl: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_close_stream(stream: u32) -> u32;
}

/// A host status as the SDK names it: `Ok(())` for `Ok`, the status otherwise. A code the
/// SDK does not list is `InternalFailure`.
pub fn status(code: u32) -> Result<(), Status> {
    Err(match code {
        0 => return Ok(()),
        1 => Status::NotFound,
        2 => Status::BadArgument,
        3 => Status::SerializationFailure,
        4 => Status::ParseFailure,
        7 => Status::Empty,
        8 => Status::CasMismatch,
        _ => Status::InternalFailure,
    })
}

/// Takes ownership of host-returned memory.
fn owned(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the host wrote `len` bytes into a buffer it got from the SDK's
    // proxy_on_memory_allocate, which allocates a Vec<u8> with capacity `len`.
    unsafe { Vec::from_raw_parts(ptr, len, len) }
}

/// Calls a getter that returns `(ptr, len)`; `Ok(None)` for `NotFound` / `Empty`.
fn get(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Result<Option<Vec<u8>>, Status> {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    match status(call(&mut p, &mut l)) {
        Ok(()) => Ok(Some(owned(p, l))),
        Err(Status::NotFound | Status::Empty) => Ok(None),
        Err(s) => Err(s),
    }
}

/// The level below which Envoy drops the module's log lines (its `wasm` logger's); `None` if
/// the host cannot say.
pub fn host_log_level() -> Option<u32> {
    let mut level = 0;
    // SAFETY: out-pointer to a local.
    status(unsafe { proxy_get_log_level(&mut level) }).ok()?;
    Some(level)
}

pub fn log(level: u32, msg: &str) {
    // Nothing sensible to do if logging itself fails.
    // SAFETY: pointer and length of a live &str.
    unsafe { proxy_log(level, msg.as_ptr(), msg.len()) };
}

pub fn buffer(kind: BufferType, max: usize) -> Result<Option<Vec<u8>>, Status> {
    // SAFETY: out-pointers to locals.
    get(|p, l| unsafe { proxy_get_buffer_bytes(kind as u32, 0, max, p, l) })
}

/// Replaces the first `size` bytes of a buffer with `data`.
pub fn set_buffer(kind: BufferType, size: usize, data: &[u8]) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    status(unsafe { proxy_set_buffer_bytes(kind as u32, 0, size, data.as_ptr(), data.len()) })
}

pub fn header(map: MapType, name: &str) -> Result<Option<Vec<u8>>, Status> {
    // SAFETY: pointer and length of a live &str, out-pointers to locals.
    get(|p, l| unsafe { proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), p, l) })
}

/// A header as text; absent, unreadable or not UTF-8 is `None`.
pub fn header_text(map: MapType, name: &str) -> Option<String> {
    header(map, name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
}

/// Every value of a header (one per header of that name, in order); an unreadable map or a
/// value that is not UTF-8 is `Err`.
pub fn header_values(map: MapType, name: &str) -> Result<Vec<String>, Status> {
    // SAFETY: out-pointers to locals.
    let pairs = get(|p, l| unsafe { proxy_get_header_map_pairs(map as u32, p, l) })?;
    let pairs = pairs.unwrap_or_default();
    let word = |at: usize| -> Result<usize, Status> {
        let bytes = pairs.get(at..at + 4).ok_or(Status::SerializationFailure)?;
        let mut four = [0u8; 4];
        four.copy_from_slice(bytes);
        Ok(u32::from_le_bytes(four) as usize)
    };
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let count = word(0)?;
    let mut values = Vec::new();
    let mut data = 4usize.saturating_add(count.saturating_mul(8));
    for i in 0..count {
        let (k, v) = (word(4 + i * 8)?, word(8 + i * 8)?);
        let key = pairs
            .get(data..data + k)
            .ok_or(Status::SerializationFailure)?;
        let value_at = data + k + 1;
        let value = pairs
            .get(value_at..value_at + v)
            .ok_or(Status::SerializationFailure)?;
        data = value_at + v + 1;
        if key.eq_ignore_ascii_case(name.as_bytes()) {
            let text = std::str::from_utf8(value).map_err(|_| Status::SerializationFailure)?;
            values.push(text.to_string());
        }
    }
    Ok(values)
}

pub fn replace_header(map: MapType, name: &str, value: &str) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live &strs.
    status(unsafe {
        proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

pub fn add_header(map: MapType, name: &str, value: &str) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live &strs.
    status(unsafe {
        proxy_add_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

pub fn remove_header(map: MapType, name: &str) -> Result<(), Status> {
    // SAFETY: pointer and length of a live &str.
    status(unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) })
}

/// Proxy-wasm's map encoding: count, then (key length, value length) pairs, then each key
/// and value followed by a NUL.
fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Answers the stream locally; `details` becomes Envoy's response code details.
pub fn send_local_response(
    code: u32,
    details: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Result<(), Status> {
    let headers = serialize_map(headers);
    // SAFETY: pointers and lengths of live buffers.
    status(unsafe {
        proxy_send_local_response(
            code,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

/// A property by path (`["source", "address"]`), as bytes.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let mut encoded = Vec::new();
    for (i, part) in path.iter().enumerate() {
        if i > 0 {
            encoded.push(0);
        }
        encoded.extend_from_slice(part.as_bytes());
    }
    // SAFETY: pointer and length of a live buffer, out-pointers to locals.
    get(|p, l| unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), p, l) })
}

pub fn property_text(path: &[&str]) -> Option<String> {
    property(path)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
}

/// The value (`None` when the key is absent) and its CAS token.
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, u32), Status> {
    let mut cas = 0;
    // SAFETY: pointer and length of a live &str, out-pointers to locals.
    let value =
        get(|p, l| unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), p, l, &mut cas) })?;
    Ok((value, cas))
}

/// Stores `value` if the key's CAS token is still `cas` (0: unconditionally).
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live buffers.
    status(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

pub fn register_queue(name: &str) -> Result<u32, Status> {
    let mut id = 0;
    // SAFETY: pointer and length of a live &str, out-pointer to a local.
    status(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// `Ok(None)` until some VM registered the queue.
pub fn resolve_queue(vm_id: &str, name: &str) -> Result<Option<u32>, Status> {
    let mut id = 0;
    // SAFETY: pointers and lengths of live &strs, out-pointer to a local.
    let code = unsafe {
        proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut id,
        )
    };
    match status(code) {
        Ok(()) => Ok(Some(id)),
        Err(Status::NotFound) => Ok(None),
        Err(s) => Err(s),
    }
}

pub fn enqueue(id: u32, data: &[u8]) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    status(unsafe { proxy_enqueue_shared_queue(id, data.as_ptr(), data.len()) })
}

/// `Ok(None)` once the queue is empty.
pub fn dequeue(id: u32) -> Result<Option<Vec<u8>>, Status> {
    // SAFETY: out-pointers to locals.
    get(|p, l| unsafe { proxy_dequeue_shared_queue(id, p, l) })
}

pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// The host's clock (Envoy's real time; the harness's virtual one); 0 if it cannot be read.
pub fn now_ns() -> u64 {
    let mut t = 0;
    // SAFETY: out-pointer to a local.
    unsafe { proxy_get_current_time_nanoseconds(&mut t) };
    t
}

pub fn define_counter(name: &str) -> Result<u32, Status> {
    let mut id = 0;
    // SAFETY: pointer and length of a live &str, out-pointer to a local.
    status(unsafe {
        proxy_define_metric(
            MetricType::Counter as u32,
            name.as_ptr(),
            name.len(),
            &mut id,
        )
    })?;
    Ok(id)
}

pub fn increment(id: u32, by: u64) -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX)) })
}

/// Resets a stream (the client sees the connection close, no response).
pub fn close_stream(stream: StreamType) -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_close_stream(stream as u32) })
}

/// Sends an HTTP request to a cluster through the SDK (see the module's doc); its answer
/// comes to the root's `on_http_call_response` with the token returned here.
pub fn http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u32,
) -> Result<u32, Status> {
    proxy_wasm::hostcalls::dispatch_http_call(
        cluster,
        headers.to_vec(),
        Some(body),
        Vec::new(),
        std::time::Duration::from_millis(timeout_ms.into()),
    )
}

/// The SDK's entry point (`_initialize`, which runs wasi-libc's constructors first).
mod start {
    use super::super::plugin;

    proxy_wasm::main! {{
        // The build aborts on panic, which traps the VM (Envoy then applies the plugin's failure
        // policy); the hook first logs the panic's message and place at `critical`, so the
        // operator sees why.
        std::panic::set_hook(Box::new(|info| {
            super::log(crate::config::LogLevel::Critical as u32, &info.to_string());
        }));
        proxy_wasm::set_root_context(|_| Box::new(plugin::PluginContext::new()));
    }}
}
