//! Guest memory access with cpp-host's rules: a slice is valid when `ptr + len <= memory size`
//! (so `(0, 0)` is a valid empty slice), results are copied into memory the guest allocates,
//! and an empty result is written as `(0, 0)` without calling the allocator.

use wasmtime::Caller;

use super::{HostError, HostState};
use crate::engine::abi::Status;

/// Envoy's cap on a VM's linear memory (`PROXY_WASM_HOST_MAX_WASM_MEMORY_SIZE_BYTES`).
pub const MAX_MEMORY_BYTES: usize = 1 << 30;

pub(super) fn bounds(
    len_total: usize,
    ptr: i32,
    len: i32,
) -> Result<std::ops::Range<usize>, HostError> {
    span(len_total, ptr, len as u32 as usize)
}

/// The range of `len` bytes at guest address `ptr`, if all of it is inside memory of
/// `len_total` bytes. `len` is the host's own length, never cut to 32 bits: a host value
/// longer than any guest memory is refused, not written in part.
fn span(len_total: usize, ptr: i32, len: usize) -> Result<std::ops::Range<usize>, HostError> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len).ok_or(Status::InvalidMemoryAccess)?;
    if end > len_total {
        return Err(Status::InvalidMemoryAccess.into());
    }
    Ok(start..end)
}

/// The guest's whole memory, borrowed (for reading many slices without copying them).
pub fn all<'a>(caller: &'a Caller<'_, HostState>) -> Result<&'a [u8], HostError> {
    Ok(caller
        .data()
        .memory
        .ok_or(Status::InvalidMemoryAccess)?
        .data(caller))
}

/// Checks that (`ptr`, `len`) is inside the guest's memory without copying it; its length.
pub fn check(caller: &Caller<'_, HostState>, ptr: i32, len: i32) -> Result<usize, HostError> {
    Ok(bounds(all(caller)?.len(), ptr, len)?.len())
}

pub fn read(caller: &Caller<'_, HostState>, ptr: i32, len: i32) -> Result<Vec<u8>, HostError> {
    let mem = caller
        .data()
        .memory
        .ok_or(Status::InvalidMemoryAccess)?
        .data(caller);
    Ok(mem[bounds(mem.len(), ptr, len)?].to_vec())
}

pub fn read_string(
    caller: &Caller<'_, HostState>,
    ptr: i32,
    len: i32,
) -> Result<String, HostError> {
    // Valid UTF-8 (nearly always) keeps the one allocation `read` made.
    Ok(String::from_utf8(read(caller, ptr, len)?)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// Lends `f` the guest's string at (`ptr`, `len`) together with the host state, without
/// copying it: for keys that are only looked up.
pub fn with_str<R>(
    caller: &mut Caller<'_, HostState>,
    ptr: i32,
    len: i32,
    f: impl FnOnce(&str, &mut HostState) -> R,
) -> Result<R, HostError> {
    let memory = caller.data().memory.ok_or(Status::InvalidMemoryAccess)?;
    let (mem, state) = memory.data_and_store_mut(&mut *caller);
    let bytes = &mem[bounds(mem.len(), ptr, len)?];
    Ok(f(&String::from_utf8_lossy(bytes), state))
}

pub fn write(caller: &mut Caller<'_, HostState>, ptr: i32, bytes: &[u8]) -> Result<(), HostError> {
    let memory = caller.data().memory.ok_or(Status::InvalidMemoryAccess)?;
    let mem = memory.data_mut(&mut *caller);
    let range = span(mem.len(), ptr, bytes.len())?;
    mem[range].copy_from_slice(bytes);
    Ok(())
}

pub fn write_u32(caller: &mut Caller<'_, HostState>, ptr: i32, v: u32) -> Result<(), HostError> {
    write(caller, ptr, &v.to_le_bytes())
}

pub fn write_u64(caller: &mut Caller<'_, HostState>, ptr: i32, v: u64) -> Result<(), HostError> {
    write(caller, ptr, &v.to_le_bytes())
}

/// Allocates `bytes.len()` in the guest (its malloc) and copies `bytes` there; the address.
pub fn alloc_in_guest(caller: &mut Caller<'_, HostState>, bytes: &[u8]) -> Result<i32, HostError> {
    let alloc = caller
        .data()
        .allocator
        .clone()
        .ok_or(Status::InvalidMemoryAccess)?;
    // No guest memory holds more than i32::MAX bytes: a longer value cannot be handed over.
    let size = i32::try_from(bytes.len()).map_err(|_| Status::InvalidMemoryAccess)?;
    let ptr = alloc.call(&mut *caller, size)?;
    if ptr == 0 {
        return Err(Status::InvalidMemoryAccess.into());
    }
    write(caller, ptr, bytes)?;
    Ok(ptr)
}

/// cpp-host's `copyToPointerSize`: allocate in the guest, copy, then write the pointer and the
/// size. An allocator that returns 0 or an out-of-range pointer yields `InvalidMemoryAccess`.
pub fn copy_out(
    caller: &mut Caller<'_, HostState>,
    bytes: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> Result<(), HostError> {
    let mut ptr = 0i32;
    if !bytes.is_empty() {
        ptr = alloc_in_guest(caller, bytes)?;
    }
    write_u32(caller, ptr_ptr, ptr as u32)?;
    write_u32(caller, size_ptr, bytes.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_value_longer_than_32_bits_is_refused_not_cut() {
        assert!(matches!(span(1 << 16, 8, 16), Ok(r) if r == (8..24)));
        // 4 GiB + 4 bytes would be 4 bytes if cut to 32 bits, and fit.
        assert!(span(1 << 16, 0, (1 << 32) + 4).is_err());
        assert!(span(1 << 16, -1, 1).is_err());
        assert!(span(usize::MAX, -1, usize::MAX).is_err());
        assert!(matches!(bounds(16, 0, 0), Ok(r) if r.is_empty()));
        assert!(bounds(16, 8, 9).is_err());
    }
}
