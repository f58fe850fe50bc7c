//! The standard streams: what a guest writes to stdout or stderr is one log line per write at
//! info or error, as Envoy logs it; every other descriptor is bad (`BADF`).

use wasmtime::{Caller, Linker};

use super::super::log_book::MAX_WRITE_BYTES;
use super::super::{logging, memory, HostError, HostState};
use super::{answer, errno, is_std, BADF, FAULT, NOSYS, NOTDIR, NOTSUP, SUCCESS};
use crate::engine::abi::LogLevel;

/// Concatenates the iovecs (8 bytes each: u32 buf, u32 len), reading them in place, keeping
/// at most `keep` bytes; every iovec is checked. Returns the bytes kept and the total size.
fn gather(
    caller: &Caller<'_, HostState>,
    iovs: i32,
    n: i32,
    keep: usize,
) -> Result<(Vec<u8>, u64), HostError> {
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

/// The line Envoy logs for one write: one trailing newline cut, so a lone `"\n"` is an empty
/// line; an empty write logs nothing.
fn line_of(bytes: &[u8], total: u64) -> Option<String> {
    if total == 0 {
        return None;
    }
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if text.ends_with('\n') {
        text.pop();
    }
    Some(text)
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
    let Ok((bytes, total)) = gather(&caller, iovs, n, keep) else {
        return Ok(FAULT);
    };
    let cut = total - bytes.len() as u64;
    if cut > 0 {
        logging::count_dropped(caller.data(), cut, bytes.is_empty());
    }
    if let Some(line) = line_of(&bytes, total).filter(|_| cut == 0 || !bytes.is_empty()) {
        let level = if fd == 1 {
            LogLevel::Info
        } else {
            LogLevel::Error
        };
        logging::guest(caller.data(), level, line);
    }
    // All of it counts as written, kept or not: the guest has nothing to retry.
    let written = u32::try_from(total).unwrap_or(u32::MAX);
    errno(memory::write_u32(&mut caller, nwritten, written))
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

/// `fd_seek` and `fd_close` log an error in Envoy and report success.
fn log_unsupported(caller: &Caller<'_, HostState>, what: &str) -> i32 {
    logging::record(
        caller.data(),
        LogLevel::Error,
        format!("wasi {what} is not supported"),
    );
    SUCCESS
}

fn std_ok(fd: i32) -> i32 {
    if is_std(fd) {
        SUCCESS
    } else {
        BADF
    }
}

pub(super) fn add(linker: &mut Linker<HostState>, m: &str) -> wasmtime::Result<()> {
    linker.func_wrap(m, "fd_write", write_std)?;
    linker.func_wrap(
        m,
        "fd_pwrite",
        |c: Caller<'_, HostState>, fd: i32, iovs: i32, n: i32, _: i64, nw: i32| {
            write_std(c, fd, iovs, n, nw)
        },
    )?;
    answer!(linker, m, "fd_read", (i32, i32, i32, i32) => NOSYS);
    answer!(linker, m, "fd_pread", (i32, i32, i32, i64, i32) => NOSYS);
    answer!(linker, m, "fd_fdstat_set_flags", (i32, i32) => NOSYS);
    answer!(linker, m, "fd_prestat_get", (i32, i32) => BADF);
    answer!(linker, m, "fd_prestat_dir_name", (i32, i32, i32) => NOSYS);
    answer!(linker, m, "fd_filestat_get", (i32, i32) => BADF);
    answer!(linker, m, "fd_advise", (i32, i64, i64, i32) => SUCCESS);
    linker.func_wrap(
        m,
        "fd_seek",
        |c: Caller<'_, HostState>, _: i32, _: i64, _: i32, _: i32| log_unsupported(&c, "fd_seek"),
    )?;
    linker.func_wrap(m, "fd_close", |c: Caller<'_, HostState>, _: i32| {
        log_unsupported(&c, "fd_close")
    })?;
    linker.func_wrap(m, "fd_fdstat_get", fd_fdstat_get)?;
    linker.func_wrap(m, "fd_tell", fd_tell)?;
    linker.func_wrap(
        m,
        "fd_allocate",
        |_: Caller<'_, HostState>, fd: i32, _: i64, _: i64| std_ok(fd),
    )?;
    linker.func_wrap(m, "fd_datasync", |_: Caller<'_, HostState>, fd: i32| {
        std_ok(fd)
    })?;
    linker.func_wrap(m, "fd_sync", |_: Caller<'_, HostState>, fd: i32| std_ok(fd))?;
    linker.func_wrap(
        m,
        "fd_fdstat_set_rights",
        |_: Caller<'_, HostState>, fd: i32, _: i64, _: i64| std_ok(fd),
    )?;
    linker.func_wrap(
        m,
        "fd_filestat_set_size",
        |_: Caller<'_, HostState>, fd: i32, _: i64| std_ok(fd),
    )?;
    linker.func_wrap(
        m,
        "fd_filestat_set_times",
        |_: Caller<'_, HostState>, fd: i32, _: i64, _: i64, _: i32| std_ok(fd),
    )?;
    linker.func_wrap(
        m,
        "fd_readdir",
        |mut c: Caller<'_, HostState>, _: i32, _: i32, _: i32, _: i64, ret: i32| {
            let _ = memory::write_u32(&mut c, ret, 0);
            NOTDIR
        },
    )?;
    linker.func_wrap(
        m,
        "fd_renumber",
        |_: Caller<'_, HostState>, fd: i32, to: i32| {
            if is_std(fd) && is_std(to) {
                NOTSUP
            } else {
                BADF
            }
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::line_of;

    #[test]
    fn a_write_is_one_line_without_its_last_newline() {
        assert_eq!(line_of(b"hello\n", 6).as_deref(), Some("hello"));
        assert_eq!(line_of(b"a\nb\n\n", 5).as_deref(), Some("a\nb\n"));
        // Envoy 1.40 logs a lone newline as an empty line; an empty write logs nothing.
        assert_eq!(line_of(b"\n", 1).as_deref(), Some(""));
        assert_eq!(line_of(b"", 0), None);
    }
}
