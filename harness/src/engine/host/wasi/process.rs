//! What a language runtime reads while it starts: clocks, random bytes, the environment
//! (`vm_config.environment_variables`), no arguments; and how it yields, sleeps and exits.

use wasmtime::{Caller, Linker};

use super::super::{memory, time, HostError, HostState};
use super::{errno, INVAL, NOTSUP, SUCCESS};
use crate::engine::abi::Status;

fn environ(state: &HostState) -> Vec<Vec<u8>> {
    state
        .environment
        .iter()
        .map(|(k, v)| format!("{k}={v}\0").into_bytes())
        .collect()
}

fn environ_sizes_get(
    mut caller: Caller<'_, HostState>,
    count: i32,
    size: i32,
) -> wasmtime::Result<i32> {
    let env = environ(caller.data());
    let total: usize = env.iter().map(Vec::len).sum();
    errno(
        memory::write_u32(&mut caller, count, env.len() as u32)
            .and_then(|_| memory::write_u32(&mut caller, size, total as u32)),
    )
}

/// Writes the entries one after another at `buf`, and their addresses at `array`.
fn write_environ(
    caller: &mut Caller<'_, HostState>,
    array: i32,
    buf: i32,
) -> Result<(), HostError> {
    let env = environ(caller.data());
    // Addresses past the end of i32 are the guest's fault, never an overflow.
    let fault = || HostError::Status(Status::InvalidMemoryAccess);
    let mut at = buf;
    for (i, entry) in env.iter().enumerate() {
        let slot = i32::try_from(i)
            .ok()
            .and_then(|i| i.checked_mul(4))
            .and_then(|o| array.checked_add(o))
            .ok_or_else(fault)?;
        memory::write_u32(caller, slot, at as u32)?;
        memory::write(caller, at, entry)?;
        at = i32::try_from(entry.len())
            .ok()
            .and_then(|n| at.checked_add(n))
            .ok_or_else(fault)?;
    }
    Ok(())
}

fn args_sizes_get(
    mut caller: Caller<'_, HostState>,
    argc: i32,
    size: i32,
) -> wasmtime::Result<i32> {
    errno(
        memory::write_u32(&mut caller, argc, 0)
            .and_then(|_| memory::write_u32(&mut caller, size, 0)),
    )
}

/// Realtime is the virtual wall clock; monotonic is Envoy's steady clock, time since the
/// machine booted, which is never 0 (Go's runtime stops on a monotonic 0: "nanotime
/// returning zero"). Both move with the virtual clock.
fn clock_time_get(
    mut caller: Caller<'_, HostState>,
    id: i32,
    _precision: i64,
    ptr: i32,
) -> wasmtime::Result<i32> {
    let now = match id {
        0 => time::wall_nanos(caller.data()),
        1 => time::steady_nanos(caller.data()),
        _ => return Ok(NOTSUP),
    };
    errno(memory::write_u64(&mut caller, ptr, now))
}

fn clock_res_get(mut caller: Caller<'_, HostState>, id: i32, ptr: i32) -> wasmtime::Result<i32> {
    if id != 0 && id != 1 {
        return Ok(NOTSUP);
    }
    errno(memory::write_u64(&mut caller, ptr, 1))
}

/// Envoy's limit: at most 64 KiB a call.
const MAX_RANDOM_BYTES: usize = 65536;

fn random_get(mut caller: Caller<'_, HostState>, buf: i32, len: i32) -> wasmtime::Result<i32> {
    let len = len as u32 as usize;
    if len > MAX_RANDOM_BYTES {
        return Ok(INVAL);
    }
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        let r = caller.data_mut().next_random();
        bytes.extend_from_slice(&r.to_le_bytes());
    }
    bytes.truncate(len);
    errno(memory::write(&mut caller, buf, &bytes))
}

/// Returns at once with no events: Envoy never sleeps a worker for a guest.
fn poll_oneoff(
    mut caller: Caller<'_, HostState>,
    _in: i32,
    _out: i32,
    _n: i32,
    nevents: i32,
) -> wasmtime::Result<i32> {
    errno(memory::write_u32(&mut caller, nevents, 0))
}

pub(super) fn add(linker: &mut Linker<HostState>, m: &str) -> wasmtime::Result<()> {
    linker.func_wrap(m, "environ_sizes_get", environ_sizes_get)?;
    linker.func_wrap(
        m,
        "environ_get",
        |mut c: Caller<'_, HostState>, array: i32, buf: i32| {
            errno(write_environ(&mut c, array, buf))
        },
    )?;
    linker.func_wrap(m, "args_sizes_get", args_sizes_get)?;
    linker.func_wrap(m, "args_get", |_: Caller<'_, HostState>, _: i32, _: i32| {
        SUCCESS
    })?;
    linker.func_wrap(m, "clock_time_get", clock_time_get)?;
    linker.func_wrap(m, "clock_res_get", clock_res_get)?;
    linker.func_wrap(m, "random_get", random_get)?;
    linker.func_wrap(m, "poll_oneoff", poll_oneoff)?;
    linker.func_wrap(m, "sched_yield", |_: Caller<'_, HostState>| SUCCESS)?;
    // Envoy only notes the call (at trace level) and returns: the guest goes on, and
    // normally reaches `unreachable` right after, which fails the VM.
    linker.func_wrap(m, "proc_exit", |_: Caller<'_, HostState>, _: i32| ())?;
    Ok(())
}
