//! Paths and sockets: Envoy gives a guest no filesystem and no socket, and answers each call
//! with a fixed errno (out-parameters zeroed where cpp-host zeroes them).

use wasmtime::{Caller, Linker};

use super::super::{memory, HostState};
use super::{answer, NOENT, NOTSUP};

pub(super) fn add(linker: &mut Linker<HostState>, m: &str) -> wasmtime::Result<()> {
    answer!(linker, m, "path_open", (i32, i32, i32, i32, i32, i64, i64, i32, i32) => NOENT);
    answer!(linker, m, "path_filestat_get", (i32, i32, i32, i32, i32) => NOTSUP);
    answer!(linker, m, "path_create_directory", (i32, i32, i32) => NOTSUP);
    answer!(linker, m, "path_filestat_set_times", (i32, i32, i32, i32, i64, i64, i32) => NOTSUP);
    answer!(linker, m, "path_link", (i32, i32, i32, i32, i32, i32, i32) => NOTSUP);
    answer!(linker, m, "path_remove_directory", (i32, i32, i32) => NOTSUP);
    answer!(linker, m, "path_rename", (i32, i32, i32, i32, i32, i32) => NOTSUP);
    answer!(linker, m, "path_symlink", (i32, i32, i32, i32, i32) => NOTSUP);
    answer!(linker, m, "path_unlink_file", (i32, i32, i32) => NOTSUP);
    answer!(linker, m, "sock_shutdown", (i32, i32) => NOTSUP);
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
    Ok(())
}
