//! WASI preview 1 as Envoy (proxy-wasm-cpp-host) provides it, under both
//! `wasi_snapshot_preview1` and `wasi_unstable`: stdout and stderr go to the proxy log (info
//! and error), there is no filesystem or socket, clocks are the harness's virtual clock and
//! `random_get` is a seeded generator, so a run can be repeated exactly.
//!
//! This is deliberately not `wasmtime-wasi`: a module must see Envoy's answers (for example
//! `path_open` -> `NOENT`, `poll_oneoff` returning at once), not a real OS's. The rooms:
//! `fd` (the standard streams), `process` (clocks, randomness, environment, exit) and
//! `stubs` (paths and sockets, which Envoy refuses). docs/envoy-fidelity.md has the table.

mod fd;
mod process;
mod stubs;

use wasmtime::Linker;

use super::HostState;

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

/// Links a function that only answers `$code`, whatever its arguments (`$t`, after the
/// caller): the many WASI functions Envoy refuses or accepts without doing anything.
macro_rules! answer {
    ($linker:expr, $module:expr, $name:literal, ($($t:ty),*) => $code:expr) => {
        $linker.func_wrap(
            $module,
            $name,
            |_: wasmtime::Caller<'_, HostState>, $(_: $t),*| -> i32 { $code },
        )?
    };
}
use answer;

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    for m in ["wasi_snapshot_preview1", "wasi_unstable"] {
        fd::add(linker, m)?;
        stubs::add(linker, m)?;
        process::add(linker, m)?;
    }
    // Always linked by cpp-host for emscripten-built guests.
    linker.func_wrap(
        "env",
        "pthread_equal",
        |_: wasmtime::Caller<'_, HostState>, a: i32, b: i32| i32::from(a == b),
    )?;
    linker.func_wrap(
        "env",
        "emscripten_notify_memory_growth",
        |_: wasmtime::Caller<'_, HostState>, _: i32| (),
    )?;
    Ok(())
}
