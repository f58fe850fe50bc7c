//! Time as the guest sees it: a virtual clock the scenario advances, so runs are reproducible,
//! and per-root tick periods (`proxy_set_tick_period_milliseconds`).

use wasmtime::{Caller, Linker};

use super::{finish, memory, HostState};

/// 2026-01-01T00:00:00Z: the wall clock every run starts at.
pub const START_WALL_NANOS: u64 = 1_767_225_600_000_000_000;

#[derive(Debug, Default)]
pub struct VirtualClock {
    /// Nanoseconds since the harness started; wall time is `START_WALL_NANOS` plus this.
    pub elapsed_nanos: u64,
}

impl VirtualClock {
    pub fn wall_nanos(&self) -> u64 {
        START_WALL_NANOS + self.elapsed_nanos
    }

    pub fn monotonic_nanos(&self) -> u64 {
        self.elapsed_nanos
    }
}

pub fn wall_nanos(state: &HostState) -> u64 {
    state
        .shared
        .clock
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .wall_nanos()
}

pub fn monotonic_nanos(state: &HostState) -> u64 {
    state
        .shared
        .clock
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .monotonic_nanos()
}

fn proxy_get_current_time_nanoseconds(
    mut caller: Caller<'_, HostState>,
    ret: i32,
) -> wasmtime::Result<i32> {
    let now = wall_nanos(caller.data());
    finish(memory::write_u64(&mut caller, ret, now))
}

/// The period belongs to the caller's root context, even when a stream context sets it.
fn proxy_set_tick_period_milliseconds(
    mut caller: Caller<'_, HostState>,
    period: i32,
) -> wasmtime::Result<i32> {
    let state = caller.data_mut();
    let id = state.context_id();
    if let Some(root) = state.root_of(id) {
        state.tick_periods.insert(root, period as u32);
    }
    finish(Ok(()))
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        proxy_get_current_time_nanoseconds,
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        proxy_set_tick_period_milliseconds,
    )?;
    Ok(())
}
