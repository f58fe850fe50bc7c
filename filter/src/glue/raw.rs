//! The proxy-wasm imports the filter calls itself, each returning the host's status instead
//! of panicking on it (a panic traps the VM, and every later request
//! on that worker then gets the failure policy). Memory the host hands back was allocated
//! by the module's `proxy_on_memory_allocate` (a `Vec<u8>` of exactly that length), so it is
//! taken back the same way.

/// Proxy-wasm statuses the glue branches on.
pub const OK: u32 = 0;
pub const NOT_FOUND: u32 = 1;
pub const EMPTY: u32 = 7;
pub const CAS_MISMATCH: u32 = 8;

pub const REQUEST_HEADERS: u32 = 0;
pub const RESPONSE_HEADERS: u32 = 2;
pub const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;

pub const REQUEST_BODY: u32 = 0;
pub const RESPONSE_BODY: u32 = 1;
pub const VM_CONFIGURATION: u32 = 6;
pub const PLUGIN_CONFIGURATION: u32 = 7;

pub const COUNTER: u32 = 0;

pub const HTTP_RESPONSE_STREAM: u32 = 1;

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
    fn proxy_http_call(
        upstream: *const u8,
        upstream_len: usize,
        headers: *const u8,
        headers_len: usize,
        body: *const u8,
        body_len: usize,
        trailers: *const u8,
        trailers_len: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
}

/// Takes ownership of host-returned memory.
fn owned(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the host wrote `len` bytes into a buffer it got from proxy_on_memory_allocate,
    // which allocates a Vec<u8> with capacity `len`.
    unsafe { Vec::from_raw_parts(ptr, len, len) }
}

/// Calls a getter that returns `(ptr, len)`; `Ok(None)` for `NotFound` / `Empty`.
fn get(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Result<Option<Vec<u8>>, u32> {
    let (mut p, mut l) = (std::ptr::null_mut(), 0);
    match call(&mut p, &mut l) {
        OK => Ok(Some(owned(p, l))),
        NOT_FOUND | EMPTY => Ok(None),
        status => Err(status),
    }
}

/// The level below which Envoy drops the module's log lines (its `wasm` logger's); `None` if
/// the host cannot say.
pub fn host_log_level() -> Option<u32> {
    let mut level = 0;
    // SAFETY: out-pointer to a local.
    match unsafe { proxy_get_log_level(&mut level) } {
        OK => Some(level),
        _ => None,
    }
}

pub fn log(level: u32, msg: &str) {
    // Nothing sensible to do if logging itself fails.
    // SAFETY: pointer and length of a live &str.
    unsafe { proxy_log(level, msg.as_ptr(), msg.len()) };
}

pub fn buffer(kind: u32, max: usize) -> Result<Option<Vec<u8>>, u32> {
    // SAFETY: out-pointers to locals.
    get(|p, l| unsafe { proxy_get_buffer_bytes(kind, 0, max, p, l) })
}

/// Replaces the first `size` bytes of a buffer with `data`.
pub fn set_buffer(kind: u32, size: usize, data: &[u8]) -> u32 {
    // SAFETY: pointer and length of a live slice.
    unsafe { proxy_set_buffer_bytes(kind, 0, size, data.as_ptr(), data.len()) }
}

pub fn header(map: u32, name: &str) -> Result<Option<Vec<u8>>, u32> {
    // SAFETY: pointer and length of a live &str, out-pointers to locals.
    get(|p, l| unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), p, l) })
}

/// A header as text; absent, unreadable or not UTF-8 is `None`.
pub fn header_text(map: u32, name: &str) -> Option<String> {
    header(map, name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
}

pub fn replace_header(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: pointers and lengths of live &strs.
    unsafe {
        proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    }
}

pub fn add_header(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: pointers and lengths of live &strs.
    unsafe {
        proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    }
}

pub fn remove_header(map: u32, name: &str) -> u32 {
    // SAFETY: pointer and length of a live &str.
    unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) }
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
    status: u32,
    details: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> u32 {
    let headers = serialize_map(headers);
    // SAFETY: pointers and lengths of live buffers.
    unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    }
}

/// Sends an HTTP request to a cluster; its answer comes to the root's
/// `proxy_on_http_call_response` with the token returned here.
pub fn http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u32,
) -> Result<u32, u32> {
    let headers = serialize_map(headers);
    let trailers = serialize_map(&[]);
    let mut token = 0;
    // SAFETY: pointers and lengths of live buffers, out-pointer to a local.
    match unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms,
            &mut token,
        )
    } {
        OK => Ok(token),
        status => Err(status),
    }
}

/// A property by path (`["source", "address"]`), as bytes.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, u32> {
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
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, u32), u32> {
    let mut cas = 0;
    // SAFETY: pointer and length of a live &str, out-pointers to locals.
    let value =
        get(|p, l| unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), p, l, &mut cas) })?;
    Ok((value, cas))
}

/// Stores `value` if the key's CAS token is still `cas` (0: unconditionally).
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> u32 {
    // SAFETY: pointers and lengths of live buffers.
    unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) }
}

pub fn register_queue(name: &str) -> Result<u32, u32> {
    let mut id = 0;
    // SAFETY: pointer and length of a live &str, out-pointer to a local.
    match unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) } {
        OK => Ok(id),
        status => Err(status),
    }
}

/// `Ok(None)` until some VM registered the queue.
pub fn resolve_queue(vm_id: &str, name: &str) -> Result<Option<u32>, u32> {
    let mut id = 0;
    // SAFETY: pointers and lengths of live &strs, out-pointer to a local.
    match unsafe {
        proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut id,
        )
    } {
        OK => Ok(Some(id)),
        NOT_FOUND => Ok(None),
        status => Err(status),
    }
}

pub fn enqueue(id: u32, data: &[u8]) -> u32 {
    // SAFETY: pointer and length of a live slice.
    unsafe { proxy_enqueue_shared_queue(id, data.as_ptr(), data.len()) }
}

/// `Ok(None)` once the queue is empty.
pub fn dequeue(id: u32) -> Result<Option<Vec<u8>>, u32> {
    // SAFETY: out-pointers to locals.
    get(|p, l| unsafe { proxy_dequeue_shared_queue(id, p, l) })
}

pub fn set_tick_period_ms(ms: u32) -> u32 {
    // SAFETY: no pointers.
    unsafe { proxy_set_tick_period_milliseconds(ms) }
}

/// The host's clock (Envoy's real time; the harness's virtual one); 0 if it cannot be read.
pub fn now_ns() -> u64 {
    let mut t = 0;
    // SAFETY: out-pointer to a local.
    unsafe { proxy_get_current_time_nanoseconds(&mut t) };
    t
}

pub fn define_counter(name: &str) -> Result<u32, u32> {
    let mut id = 0;
    // SAFETY: pointer and length of a live &str, out-pointer to a local.
    match unsafe { proxy_define_metric(COUNTER, name.as_ptr(), name.len(), &mut id) } {
        OK => Ok(id),
        status => Err(status),
    }
}

pub fn increment(id: u32, by: u64) -> u32 {
    // SAFETY: no pointers.
    unsafe { proxy_increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX)) }
}

/// Resets a stream (the client sees the connection close, no response).
pub fn close_stream(stream: u32) -> u32 {
    // SAFETY: no pointers.
    unsafe { proxy_close_stream(stream) }
}
