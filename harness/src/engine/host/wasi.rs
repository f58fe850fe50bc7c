//! WASI preview 1 as Envoy (proxy-wasm-cpp-host) provides it, under both
//! `wasi_snapshot_preview1` and `wasi_unstable`: stdout and stderr go to the proxy log (info
//! and error), there is no filesystem or socket, clocks are the harness's virtual clock and
//! `random_get` is a seeded generator, so a run can be repeated exactly.
//!
//! This is deliberately not `wasmtime-wasi`: a module must see Envoy's answers (for example
//! `path_open` -> `NOENT`, `poll_oneoff` returning at once), not a real OS's.

use wasmtime::{Caller, Linker};

use super::log_book::MAX_WRITE_BYTES;
use super::{logging, memory, time, HostState};
use crate::engine::abi::LogLevel;

const SUCCESS: i32 = 0;
const BADF: i32 = 8;
const NOTDIR: i32 = 20;
const FAULT: i32 = 21;
const INVAL: i32 = 28;
const NOENT: i32 = 44;
const NOSYS: i32 = 52;
const NOTSUP: i32 = 58;

/// Maps a memory error to WASI's `FAULT`.
fn errno(r: Result<(), super::HostError>) -> wasmtime::Result<i32> {
    match r {
        Ok(()) => Ok(SUCCESS),
        Err(super::HostError::Status(_)) => Ok(FAULT),
        Err(super::HostError::Trap(e)) => Err(e),
    }
}

fn is_std(fd: i32) -> bool {
    fd == 1 || fd == 2
}

/// Concatenates the iovecs (8 bytes each: u32 buf, u32 len), reading them in place, keeping
/// at most `keep` bytes; every iovec is checked. Returns the bytes kept and the total size.
fn gather(
    caller: &Caller<'_, HostState>,
    iovs: i32,
    n: i32,
    keep: usize,
) -> Result<(Vec<u8>, u64), super::HostError> {
    let mem = memory::all(caller)?;
    let table = &mem[memory::bounds(mem.len(), iovs, n.saturating_mul(8))?];
    let mut out = Vec::new();
    let mut total = 0u64;
    for iov in table.chunks_exact(8) {
        let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
        let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
        let range = memory::bounds(mem.len(), ptr, len)?;
        total = total.saturating_add(range.len() as u64);
        let take = range.len().min(keep - out.len());
        out.extend_from_slice(&mem[range.start..range.start + take]);
    }
    Ok((out, total))
}

fn write_std(
    mut caller: Caller<'_, HostState>,
    fd: i32,
    iovs: i32,
    n: i32,
    nwritten: i32,
) -> wasmtime::Result<i32> {
    if !is_std(fd) {
        return Ok(BADF);
    }
    let keep = logging::room(caller.data()).min(MAX_WRITE_BYTES);
    let (bytes, total) = match gather(&caller, iovs, n, keep) {
        Ok(b) => b,
        Err(_) => return Ok(FAULT),
    };
    let cut = total - bytes.len() as u64;
    if cut > 0 {
        logging::count_dropped(caller.data(), cut, bytes.is_empty());
    }
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if text.ends_with('\n') {
        text.pop();
    }
    if !text.is_empty() {
        let level = if fd == 1 {
            LogLevel::Info
        } else {
            LogLevel::Error
        };
        logging::guest(caller.data(), level, text);
    }
    // All of it counts as written, kept or not: the guest has nothing to retry.
    let written = u32::try_from(total).unwrap_or(u32::MAX);
    errno(memory::write_u32(&mut caller, nwritten, written))
}

fn fd_write(
    c: Caller<'_, HostState>,
    fd: i32,
    iovs: i32,
    n: i32,
    nw: i32,
) -> wasmtime::Result<i32> {
    write_std(c, fd, iovs, n, nw)
}

fn fd_pwrite(
    c: Caller<'_, HostState>,
    fd: i32,
    iovs: i32,
    n: i32,
    _off: i64,
    nw: i32,
) -> wasmtime::Result<i32> {
    write_std(c, fd, iovs, n, nw)
}

fn fd_fdstat_get(mut caller: Caller<'_, HostState>, fd: i32, ptr: i32) -> wasmtime::Result<i32> {
    if !is_std(fd) {
        return Ok(BADF);
    }
    let mut stat = [0u8; 24];
    stat[8..16].copy_from_slice(&64u64.to_le_bytes()); // rights_base = FD_WRITE
    errno(memory::write(&mut caller, ptr, &stat))
}

fn fd_tell(mut caller: Caller<'_, HostState>, fd: i32, ptr: i32) -> wasmtime::Result<i32> {
    if !is_std(fd) {
        return Ok(BADF);
    }
    errno(memory::write_u64(&mut caller, ptr, 0))
}

fn fd_readdir(
    mut caller: Caller<'_, HostState>,
    _fd: i32,
    _buf: i32,
    _len: i32,
    _cookie: i64,
    ptr: i32,
) -> wasmtime::Result<i32> {
    let _ = memory::write_u32(&mut caller, ptr, 0);
    Ok(NOTDIR)
}

fn fd_renumber(_c: Caller<'_, HostState>, fd: i32, to: i32) -> wasmtime::Result<i32> {
    Ok(if is_std(fd) && is_std(to) {
        NOTSUP
    } else {
        BADF
    })
}

/// `fd_seek` and `fd_close` log an error in Envoy and report success.
fn log_unsupported(caller: &Caller<'_, HostState>, what: &str) -> wasmtime::Result<i32> {
    logging::record(
        caller.data(),
        LogLevel::Error,
        format!("wasi {what} is not supported"),
    );
    Ok(SUCCESS)
}

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

fn environ_get(mut caller: Caller<'_, HostState>, array: i32, buf: i32) -> wasmtime::Result<i32> {
    let env = environ(caller.data());
    errno((|| {
        // Addresses past the end of i32 are the guest's fault, never an overflow.
        let fault = || super::HostError::Status(crate::engine::abi::Status::InvalidMemoryAccess);
        let mut at = buf;
        for (i, entry) in env.iter().enumerate() {
            let slot = i32::try_from(i)
                .ok()
                .and_then(|i| i.checked_mul(4))
                .and_then(|o| array.checked_add(o))
                .ok_or_else(fault)?;
            memory::write_u32(&mut caller, slot, at as u32)?;
            memory::write(&mut caller, at, entry)?;
            at = i32::try_from(entry.len())
                .ok()
                .and_then(|n| at.checked_add(n))
                .ok_or_else(fault)?;
        }
        Ok(())
    })())
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

fn clock_time_get(
    mut caller: Caller<'_, HostState>,
    id: i32,
    _precision: i64,
    ptr: i32,
) -> wasmtime::Result<i32> {
    let now = match id {
        0 => time::wall_nanos(caller.data()),
        1 => time::monotonic_nanos(caller.data()),
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

fn random_get(mut caller: Caller<'_, HostState>, buf: i32, len: i32) -> wasmtime::Result<i32> {
    let len = len as u32 as usize;
    if len > 65536 {
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

fn proc_exit(_c: Caller<'_, HostState>, code: i32) -> wasmtime::Result<()> {
    Err(wasmtime::Error::msg(format!("wasi proc_exit({code})")))
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    for m in ["wasi_snapshot_preview1", "wasi_unstable"] {
        linker.func_wrap(m, "fd_write", fd_write)?;
        linker.func_wrap(m, "fd_pwrite", fd_pwrite)?;
        linker.func_wrap(
            m,
            "fd_read",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32| NOSYS,
        )?;
        linker.func_wrap(
            m,
            "fd_pread",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i64, _: i32| NOSYS,
        )?;
        linker.func_wrap(
            m,
            "fd_seek",
            |c: Caller<'_, HostState>, _: i32, _: i64, _: i32, _: i32| {
                log_unsupported(&c, "fd_seek")
            },
        )?;
        linker.func_wrap(m, "fd_close", |c: Caller<'_, HostState>, _: i32| {
            log_unsupported(&c, "fd_close")
        })?;
        linker.func_wrap(m, "fd_fdstat_get", fd_fdstat_get)?;
        linker.func_wrap(
            m,
            "fd_fdstat_set_flags",
            |_: Caller<'_, HostState>, _: i32, _: i32| NOSYS,
        )?;
        linker.func_wrap(
            m,
            "fd_prestat_get",
            |_: Caller<'_, HostState>, _: i32, _: i32| BADF,
        )?;
        linker.func_wrap(
            m,
            "fd_prestat_dir_name",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32| NOSYS,
        )?;
        linker.func_wrap(
            m,
            "fd_filestat_get",
            |_: Caller<'_, HostState>, _: i32, _: i32| BADF,
        )?;
        linker.func_wrap(
            m,
            "fd_advise",
            |_: Caller<'_, HostState>, _: i32, _: i64, _: i64, _: i32| SUCCESS,
        )?;
        let std_ok = |fd: i32| if is_std(fd) { SUCCESS } else { BADF };
        linker.func_wrap(
            m,
            "fd_allocate",
            move |_: Caller<'_, HostState>, fd: i32, _: i64, _: i64| std_ok(fd),
        )?;
        linker.func_wrap(
            m,
            "fd_datasync",
            move |_: Caller<'_, HostState>, fd: i32| std_ok(fd),
        )?;
        linker.func_wrap(m, "fd_sync", move |_: Caller<'_, HostState>, fd: i32| {
            std_ok(fd)
        })?;
        linker.func_wrap(
            m,
            "fd_fdstat_set_rights",
            move |_: Caller<'_, HostState>, fd: i32, _: i64, _: i64| std_ok(fd),
        )?;
        linker.func_wrap(
            m,
            "fd_filestat_set_size",
            move |_: Caller<'_, HostState>, fd: i32, _: i64| std_ok(fd),
        )?;
        linker.func_wrap(
            m,
            "fd_filestat_set_times",
            move |_: Caller<'_, HostState>, fd: i32, _: i64, _: i64, _: i32| std_ok(fd),
        )?;
        linker.func_wrap(m, "fd_tell", fd_tell)?;
        linker.func_wrap(m, "fd_readdir", fd_readdir)?;
        linker.func_wrap(m, "fd_renumber", fd_renumber)?;
        linker.func_wrap(
            m,
            "path_open",
            |_: Caller<'_, HostState>,
             _: i32,
             _: i32,
             _: i32,
             _: i32,
             _: i32,
             _: i64,
             _: i64,
             _: i32,
             _: i32| NOENT,
        )?;
        linker.func_wrap(
            m,
            "path_filestat_get",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(
            m,
            "path_create_directory",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(
            m,
            "path_filestat_set_times",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, _: i64, _: i64, _: i32| {
                NOTSUP
            },
        )?;
        linker.func_wrap(
            m,
            "path_link",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| {
                NOTSUP
            },
        )?;
        linker.func_wrap(
            m,
            "path_readlink",
            |mut c: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, _: i32, ret: i32| {
                let _ = memory::write_u32(&mut c, ret, 0);
                NOTSUP
            },
        )?;
        linker.func_wrap(
            m,
            "path_remove_directory",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(
            m,
            "path_rename",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(
            m,
            "path_symlink",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(
            m,
            "path_unlink_file",
            |_: Caller<'_, HostState>, _: i32, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(
            m,
            "sock_accept",
            |mut c: Caller<'_, HostState>, _: i32, _: i32, ret: i32| {
                let _ = memory::write_u32(&mut c, ret, 0);
                NOTSUP
            },
        )?;
        linker.func_wrap(
            m,
            "sock_recv",
            |mut c: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, len: i32, flags: i32| {
                let _ = memory::write_u32(&mut c, len, 0);
                let _ = memory::write(&mut c, flags, &[0, 0]);
                NOTSUP
            },
        )?;
        linker.func_wrap(
            m,
            "sock_send",
            |mut c: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i32, len: i32| {
                let _ = memory::write_u32(&mut c, len, 0);
                NOTSUP
            },
        )?;
        linker.func_wrap(
            m,
            "sock_shutdown",
            |_: Caller<'_, HostState>, _: i32, _: i32| NOTSUP,
        )?;
        linker.func_wrap(m, "environ_sizes_get", environ_sizes_get)?;
        linker.func_wrap(m, "environ_get", environ_get)?;
        linker.func_wrap(m, "args_sizes_get", args_sizes_get)?;
        linker.func_wrap(m, "args_get", |_: Caller<'_, HostState>, _: i32, _: i32| {
            SUCCESS
        })?;
        linker.func_wrap(m, "clock_time_get", clock_time_get)?;
        linker.func_wrap(m, "clock_res_get", clock_res_get)?;
        linker.func_wrap(m, "random_get", random_get)?;
        linker.func_wrap(m, "poll_oneoff", poll_oneoff)?;
        linker.func_wrap(m, "sched_yield", |_: Caller<'_, HostState>| SUCCESS)?;
        linker.func_wrap(m, "proc_exit", proc_exit)?;
    }
    // Always linked by cpp-host for emscripten-built guests.
    linker.func_wrap(
        "env",
        "pthread_equal",
        |_: Caller<'_, HostState>, a: i32, b: i32| i32::from(a == b),
    )?;
    linker.func_wrap(
        "env",
        "emscripten_notify_memory_growth",
        |_: Caller<'_, HostState>, _: i32| (),
    )?;
    Ok(())
}
