//! Time as the guest sees it: a virtual clock the scenario advances, so runs are reproducible,
//! and per-root tick timers (`proxy_set_tick_period_milliseconds`) that fire on that clock.

use std::time::Duration;

use wasm_common::sync::lock;
use wasmtime::{Caller, Linker};

use super::{finish, memory, HostState};

/// 2026-01-01T00:00:00Z: the wall clock every run starts at.
pub const START_WALL_NANOS: u64 = 1_767_225_600_000_000_000;

/// Envoy's steady clock (WASI's monotonic clock) counts from the machine's boot: every run
/// starts as if the machine had been up for an hour, so a guest never reads 0.
pub const START_STEADY_NANOS: u64 = 3_600_000_000_000;

#[derive(Debug, Default)]
pub struct VirtualClock {
    /// Nanoseconds since the harness started; wall time is `START_WALL_NANOS` plus this.
    pub elapsed_nanos: u64,
}

impl VirtualClock {
    pub fn wall_nanos(&self) -> u64 {
        START_WALL_NANOS.saturating_add(self.elapsed_nanos)
    }

    pub fn monotonic_nanos(&self) -> u64 {
        self.elapsed_nanos
    }

    /// WASI's monotonic clock: Envoy's steady clock, since the machine booted.
    pub fn steady_nanos(&self) -> u64 {
        START_STEADY_NANOS.saturating_add(self.elapsed_nanos)
    }

    /// Moves the clock to `nanos` since start; the clock never goes back.
    pub fn set_monotonic_nanos(&mut self, nanos: u64) {
        self.elapsed_nanos = self.elapsed_nanos.max(nanos);
    }
}

/// One root context's timer, as Envoy keeps it (`Wasm::setTimerPeriod`/`tickHandler`):
/// setting a period (re)arms it one full period from now, 0 disarms it, and after each
/// `proxy_on_tick` it is re-armed one period after the tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timer {
    pub period_ms: u32,
    /// When the next `proxy_on_tick` is due, in monotonic nanoseconds; `None`: disarmed.
    pub due_nanos: Option<u64>,
}

impl Timer {
    pub fn period(&self) -> Duration {
        Duration::from_millis(u64::from(self.period_ms))
    }

    /// `proxy_set_tick_period_milliseconds` at monotonic time `now`.
    pub fn set_period(&mut self, period_ms: u32, now: u64) {
        self.period_ms = period_ms;
        self.due_nanos = (period_ms > 0).then(|| now.saturating_add(ms_to_nanos(period_ms)));
    }

    /// After a tick that was due at `fired_at`: re-armed with the period as it is now (the
    /// guest may have changed or cleared it during `proxy_on_tick`), unless the guest has no
    /// `proxy_on_tick` at all, in which case Envoy never re-arms it.
    pub fn rearm_after_tick(&mut self, fired_at: u64, has_on_tick: bool) {
        if !has_on_tick || self.period_ms == 0 {
            self.due_nanos = None;
        } else if self.due_nanos.is_none_or(|d| d <= fired_at) {
            self.due_nanos = Some(fired_at.saturating_add(ms_to_nanos(self.period_ms)));
        }
        // Otherwise the guest set a new period during the tick, which armed it already.
    }
}

fn ms_to_nanos(ms: u32) -> u64 {
    u64::from(ms) * 1_000_000
}

pub fn wall_nanos(state: &HostState) -> u64 {
    lock(&state.shared.clock).wall_nanos()
}

pub fn monotonic_nanos(state: &HostState) -> u64 {
    lock(&state.shared.clock).monotonic_nanos()
}

pub fn steady_nanos(state: &HostState) -> u64 {
    lock(&state.shared.clock).steady_nanos()
}

fn proxy_get_current_time_nanoseconds(
    mut caller: Caller<'_, HostState>,
    ret: i32,
) -> wasmtime::Result<i32> {
    let now = wall_nanos(caller.data());
    finish(memory::write_u64(&mut caller, ret, now))
}

/// The timer belongs to the caller's root context, even when a stream context sets it. The
/// period is Envoy's `uint32_t` milliseconds.
fn proxy_set_tick_period_milliseconds(
    mut caller: Caller<'_, HostState>,
    period: i32,
) -> wasmtime::Result<i32> {
    let now = monotonic_nanos(caller.data());
    let state = caller.data_mut();
    let id = state.context_id();
    if let Some(root) = state.root_of(id) {
        state
            .timers
            .entry(root)
            .or_default()
            .set_period(period as u32, now);
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

/// A duration as a person writes it: `3s`, `1500ms`, `2m`, `250us`, `7ns`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    for (unit, size) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if nanos != 0 && nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_period_arms_the_timer_one_period_from_now() {
        let mut t = Timer::default();
        t.set_period(1000, 5 * S);
        assert_eq!(t.due_nanos, Some(6 * S));
        assert_eq!(t.period(), Duration::from_secs(1));
    }

    #[test]
    fn zero_disarms_and_resetting_restarts_the_phase() {
        let mut t = Timer::default();
        t.set_period(1000, 0);
        t.set_period(0, S / 2);
        assert_eq!(t.due_nanos, None);
        t.set_period(1000, S / 2);
        assert_eq!(t.due_nanos, Some(S + S / 2));
    }

    #[test]
    fn a_tick_rearms_one_period_after_it_fired() {
        let mut t = Timer::default();
        t.set_period(1000, 0);
        t.rearm_after_tick(S, true);
        assert_eq!(t.due_nanos, Some(2 * S));
    }

    #[test]
    fn a_period_changed_during_the_tick_wins() {
        let mut t = Timer::default();
        t.set_period(1000, 0);
        // During the tick at 1 s the guest asks for 250 ms ticks.
        t.set_period(250, S);
        t.rearm_after_tick(S, true);
        assert_eq!(t.due_nanos, Some(S + S / 4));
        // ... or stops them.
        t.set_period(0, S);
        t.rearm_after_tick(S, true);
        assert_eq!(t.due_nanos, None);
    }

    #[test]
    fn without_on_tick_the_timer_fires_once() {
        let mut t = Timer::default();
        t.set_period(1000, 0);
        t.rearm_after_tick(S, false);
        assert_eq!(t.due_nanos, None);
    }

    #[test]
    fn the_clock_never_goes_back() {
        let mut c = VirtualClock::default();
        c.set_monotonic_nanos(3 * S);
        c.set_monotonic_nanos(S);
        assert_eq!(c.monotonic_nanos(), 3 * S);
        assert_eq!(c.wall_nanos(), START_WALL_NANOS + 3 * S);
        assert_eq!(c.steady_nanos(), START_STEADY_NANOS + 3 * S);
    }

    #[test]
    fn durations_read_as_written() {
        assert_eq!(format_duration(Duration::from_secs(3)), "3s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(format_duration(Duration::ZERO), "0ns");
    }
}
