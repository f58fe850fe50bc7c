//! The proxy's log, kept within a cap for the whole run: a guest that logs (or writes to
//! stdout) without end fills the cap, then its records are counted as dropped instead of
//! kept, so a run ends with its memory bounded and says what it left out.

use super::LogRecord;
use crate::engine::abi::LogLevel;

/// How many bytes of log records a run keeps (messages plus the names in their prefix).
pub const MAX_LOG_BYTES: usize = 64 << 20;

/// The most of one `fd_write` the harness gathers from the guest's iovecs into a record;
/// the rest counts as dropped.
pub const MAX_WRITE_BYTES: usize = 1 << 20;

/// What a record costs beyond its message, for the cap.
const RECORD_OVERHEAD: usize = 64;

#[derive(Debug, Default)]
pub struct LogBook {
    records: Vec<LogRecord>,
    kept_bytes: usize,
    dropped: Dropped,
    /// Envoy's log level (`-l`, default `info`): lines below it are not written.
    level: LogLevel,
}

/// Records (and bytes of messages) left out of the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// Whole records not kept.
    pub records: u64,
    /// Message bytes not kept, from dropped records and from cut `fd_write`s.
    pub bytes: u64,
}

impl LogBook {
    /// The level below which Envoy writes nothing, and `proxy_get_log_level` answers.
    pub fn level(&self) -> LogLevel {
        self.level
    }

    pub fn set_level(&mut self, level: LogLevel) {
        self.level = level;
    }

    /// Bytes of message a new record may still have.
    pub fn room(&self) -> usize {
        MAX_LOG_BYTES
            .saturating_sub(self.kept_bytes)
            .saturating_sub(RECORD_OVERHEAD)
    }

    /// Keeps `record` if it fits the cap, else counts it as dropped.
    pub fn push(&mut self, record: LogRecord) {
        let cost = record.message.len()
            + record.plugin.len()
            + record.root_id.len()
            + record.vm_id.len()
            + RECORD_OVERHEAD;
        if self.kept_bytes + cost > MAX_LOG_BYTES {
            self.drop_message(record.message.len() as u64);
            return;
        }
        self.kept_bytes += cost;
        self.records.push(record);
    }

    /// Counts a record of `bytes` that was never read from the guest.
    pub fn drop_message(&mut self, bytes: u64) {
        self.dropped.records += 1;
        self.dropped.bytes = self.dropped.bytes.saturating_add(bytes);
    }

    /// Counts bytes cut from a record that was kept.
    pub fn drop_bytes(&mut self, bytes: u64) {
        self.dropped.bytes = self.dropped.bytes.saturating_add(bytes);
    }

    pub fn records(&self) -> &[LogRecord] {
        &self.records
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn dropped(&self) -> Dropped {
        self.dropped
    }
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the log reached the harness's cap of {} MiB for a run: {} record(s) and {} byte(s) of messages were not kept",
            MAX_LOG_BYTES >> 20,
            self.records,
            self.bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::abi::LogLevel;

    fn record(message: String) -> LogRecord {
        LogRecord {
            worker: Some(0),
            level: LogLevel::Info,
            source: crate::engine::host::logging::LogSource::Guest,
            plugin: String::new(),
            root_id: String::new(),
            vm_id: String::new(),
            stream: false,
            message,
        }
    }

    #[test]
    fn records_past_the_cap_are_counted_not_kept() {
        let mut book = LogBook::default();
        let big = "x".repeat(MAX_LOG_BYTES / 4);
        for _ in 0..5 {
            book.push(record(big.clone()));
        }
        assert_eq!(book.len(), 3);
        assert_eq!(
            book.dropped(),
            Dropped {
                records: 2,
                bytes: 2 * big.len() as u64
            }
        );
        assert!(book.room() < big.len());
        book.push(record("small".into()));
        assert_eq!(book.len(), 4);
    }
}
