//! How many workers the harness runs and how many VM instances that takes, checked before
//! anything starts: `workers: 0` is refused, as is a number no test needs, and the runtime is
//! sized so that no bootstrap runs out of instance slots half-way through starting.

use std::collections::HashSet;

use super::threads::VmKey;
use super::StartError;
use crate::envoy::bootstrap::Bootstrap;

/// The most workers the harness runs (Envoy's `--concurrency`). Each has its own instance of
/// every VM, so this bounds the memory a scenario can ask for.
pub const MAX_WORKERS: usize = 1024;

/// Refuses a worker count the harness cannot run.
pub(super) fn check_workers(workers: usize) -> Result<(), StartError> {
    match workers {
        0 => Err(StartError::NoWorkers),
        n if n > MAX_WORKERS => Err(StartError::TooManyWorkers {
            workers: n,
            limit: MAX_WORKERS,
        }),
        _ => Ok(()),
    }
}

/// VM instances alive at once at most: each distinct VM on the canary, the main thread and
/// every worker, plus one being re-created (`FAIL_RELOAD`) while the failed one still exists.
pub(super) fn instances_needed(bootstrap: &Bootstrap, workers: usize) -> usize {
    let keys: HashSet<VmKey> = bootstrap
        .listeners
        .iter()
        .flat_map(|l| l.plugins())
        .chain(bootstrap.services.iter().map(|s| &s.plugin))
        .map(VmKey::of)
        .collect();
    keys.len()
        .saturating_mul(workers.saturating_add(2))
        .saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_counts_outside_the_range_are_refused_naming_the_knob() {
        assert!(check_workers(1).is_ok() && check_workers(MAX_WORKERS).is_ok());
        let e = check_workers(0).unwrap_err().to_string();
        assert!(e.contains("workers: 0") && e.contains("--workers"), "{e}");
        let e = check_workers(MAX_WORKERS + 1).unwrap_err().to_string();
        assert!(e.contains("at most 1024") && e.contains("--workers"), "{e}");
    }
}
