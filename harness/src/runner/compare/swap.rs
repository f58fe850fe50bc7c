//! An ECDS swap's log lines in real Envoy. Envoy counts the update applied (`update_success`)
//! once its main thread has the new configuration; it then posts it to every worker, and
//! each thread's new root context writes its configure lines when it gets there. The step's
//! lines are read once every thread the harness saw write lines for the swap has written
//! one in Envoy too, or the swap's deadline passed: then the lines cannot be compared.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::engine::host::logging::LogSource;
use crate::engine::host::LogRecord;
use crate::runner::real_envoy::log::{EnvoyLogReader, EnvoyRecord};
use crate::runner::scenario::expect::LogThread;

const POLL: Duration = Duration::from_millis(50);

/// The threads that wrote lines: whether the main thread did, and how many workers.
fn threads_harness(records: &[LogRecord]) -> (bool, usize) {
    let guest = records.iter().filter(|r| r.source != LogSource::Harness);
    let (main, workers): (Vec<_>, Vec<_>) = guest.partition(|r| r.worker.is_none());
    let workers: BTreeSet<usize> = workers.iter().filter_map(|r| r.worker).collect();
    (!main.is_empty(), workers.len())
}

fn threads_envoy(records: &[EnvoyRecord], reader: &EnvoyLogReader) -> (bool, usize) {
    let mut main = false;
    let mut workers = BTreeSet::new();
    for r in records.iter().filter(|r| r.is_guest_or_vm()) {
        match reader.thread(r) {
            Some(LogThread::Main) => main = true,
            _ => {
                workers.insert(r.tid);
            }
        }
    }
    (main, workers.len())
}

/// Envoy's lines for a swap step: read until every thread the harness's `harness` lines came
/// from has written in Envoy too, at most until `deadline`. `Err` holds the lines read and
/// why they cannot be compared.
pub fn lines_after_swap(
    harness: &[LogRecord],
    reader: &mut EnvoyLogReader,
    deadline: Instant,
) -> Result<Vec<EnvoyRecord>, (Vec<EnvoyRecord>, String)> {
    let (want_main, want_workers) = threads_harness(harness);
    let mut lines = Vec::new();
    loop {
        lines.extend(reader.since_last());
        let (main, workers) = threads_envoy(&lines, reader);
        if (main || !want_main) && workers >= want_workers {
            return Ok(lines);
        }
        if Instant::now() > deadline {
            let why = format!(
                "envoy's log did not show the new configuration's lines on {} within the swap's deadline ({workers} of {want_workers} workers{})",
                if want_main { "main and every worker" } else { "every worker" },
                if want_main && !main { ", not main" } else { "" }
            );
            return Err((lines, why));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::abi::LogLevel;

    fn record(worker: Option<usize>) -> LogRecord {
        LogRecord {
            worker,
            level: LogLevel::Info,
            source: LogSource::Guest,
            plugin: "p".into(),
            root_id: String::new(),
            vm_id: "vm".into(),
            stream: false,
            message: "configured".into(),
        }
    }

    const MAIN: &str =
        "[2026-11-26 10:00:00.000][100][info][main] [server.cc:1] initializing epoch 0\n";
    const ON_MAIN: &str =
        "[2026-11-26 10:00:01.000][100][info][wasm] [context.cc:1] wasm log p: configured\n";
    const ON_WORKER: &str =
        "[2026-11-26 10:00:01.001][200][info][wasm] [context.cc:1] wasm log p: configured\n";

    /// A swap's lines are read once the workers have written theirs, not when the main
    /// thread has: until then they cannot be compared.
    #[test]
    fn a_swap_waits_for_every_thread_the_harness_configured() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("envoy.log");
        std::fs::write(&log, format!("{MAIN}{ON_MAIN}")).unwrap();
        let mut reader = EnvoyLogReader::new(&log);
        let harness = [record(None), record(Some(0))];
        let (lines, why) = lines_after_swap(&harness, &mut reader, Instant::now()).unwrap_err();
        assert_eq!(lines.len(), 2);
        assert!(why.contains("0 of 1 workers"), "{why}");
        std::fs::write(&log, format!("{MAIN}{ON_MAIN}{ON_WORKER}")).unwrap();
        let mut reader = EnvoyLogReader::new(&log);
        let lines = lines_after_swap(&harness, &mut reader, Instant::now()).unwrap();
        assert_eq!(lines.len(), 3);
    }
}
