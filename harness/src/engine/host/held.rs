//! What guests make the host hold between hostcalls (shared data, queued items, callouts not
//! yet answered), within one budget for the whole proxy: a guest that stores, enqueues or
//! calls out without end gets `InternalFailure` once the budget is spent, with one log line
//! saying why, instead of running the harness out of memory.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{logging, HostState};
use crate::engine::abi::{LogLevel, Status};

/// How many bytes guests may make the host hold at once, all VMs together.
pub const MAX_HELD_BYTES: usize = 256 << 20;

/// What one kept entry (a queued item and its notification, a shared-data key, a queue, a
/// pending callout, a metric id) costs the host beyond the guest's bytes, charged with them:
/// without it an empty item or key costs nothing, and a guest storing empties in a loop fills
/// the host's memory while the budget stays at zero.
pub const ENTRY_OVERHEAD: usize = 256;

#[derive(Debug, Default)]
pub struct Held {
    bytes: AtomicUsize,
    /// Set once the refusal has been logged, so a guest retrying in a loop logs it once.
    told: AtomicBool,
}

impl Held {
    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    fn try_hold(&self, n: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&t| t <= MAX_HELD_BYTES)
            })
            .is_ok()
    }

    /// Gives back `n` bytes held before.
    pub fn release(&self, n: usize) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }
}

/// Holds `n` more bytes for `what` (the hostcall), or refuses with `InternalFailure` and says
/// why in the log (once per run).
pub fn hold(state: &HostState, n: usize, what: &str) -> Result<(), Status> {
    let held = &state.shared.held;
    if held.try_hold(n) {
        return Ok(());
    }
    if !held.told.swap(true, Ordering::Relaxed) {
        logging::record(
            state,
            LogLevel::Critical,
            format!(
                "{what}: refused {n} bytes: guests already make the harness hold {} bytes of shared data, queued items and pending callouts, and it holds at most {MAX_HELD_BYTES} (InternalFailure)",
                held.bytes()
            ),
        );
    }
    Err(Status::InternalFailure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_never_passed_and_released_bytes_return() {
        let held = Held::default();
        assert!(held.try_hold(MAX_HELD_BYTES - 10));
        assert!(!held.try_hold(11));
        assert!(!held.try_hold(usize::MAX));
        assert!(held.try_hold(10));
        held.release(MAX_HELD_BYTES);
        assert_eq!(held.bytes(), 0);
        held.release(5);
        assert_eq!(held.bytes(), 0);
    }
}
