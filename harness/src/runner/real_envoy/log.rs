//! Real Envoy's log, read back as records: which thread wrote each line, at which level, for
//! which logger, and the message (with the continuation lines a backtrace adds), so the
//! guest's lines can be checked and compared with the harness's thread by thread.
//!
//! Envoy's default format is `[%Y-%m-%d %T.%e][%t][%l][%n] [%g:%#] %v`: `%t` is the OS
//! thread id, which is the process id for the main thread (where the canary and the main
//! thread's plugin instances run) and a worker's own id otherwise; a worker's number comes
//! from its thread name (`wrk:worker_N`), read from `/proc` while Envoy runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::runner::scenario::expect::LogThread;

/// The most of Envoy's log the comparison reads.
pub const MAX_LOG_BYTES: u64 = 64 << 20;

/// One record of Envoy's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyRecord {
    /// The OS thread id (`%t`).
    pub tid: u64,
    /// Envoy's level word: `trace`, `debug`, `info`, `warning`, `error`, `critical`.
    pub level: String,
    /// The logger (`%n`): `wasm` for the guest's lines and VM failures.
    pub logger: String,
    /// The message after the source location, continuation lines included.
    pub text: String,
}

impl EnvoyRecord {
    /// A line the guest wrote (`wasm log ...`) or Envoy's report of a VM failure
    /// (`Function: NAME failed: ...`): what the harness writes too.
    pub fn is_guest_or_vm(&self) -> bool {
        self.logger == "wasm" && (self.text.starts_with("wasm log") || self.is_vm_failure())
    }

    pub fn is_vm_failure(&self) -> bool {
        self.logger == "wasm" && self.text.starts_with("Function: ")
    }

    /// Lines about Wasm or about refusing the configuration: what a start-up expectation
    /// reads (the guest's lines, the VM's, and Envoy's refusal).
    pub fn is_startup(&self) -> bool {
        self.logger == "wasm" || (self.logger == "main" && self.level == "critical")
    }

    /// `[level] text`, as the harness writes its own records.
    pub fn line(&self) -> String {
        format!("[{}] {}", self.level, self.text)
    }
}

/// Parses Envoy's log text in its default format; a line that does not start a record
/// continues the one before it.
pub fn parse(text: &str) -> Vec<EnvoyRecord> {
    let mut out: Vec<EnvoyRecord> = Vec::new();
    for line in text.lines() {
        match parse_line(line) {
            Some(rec) => out.push(rec),
            None => {
                if let Some(last) = out.last_mut() {
                    last.text.push('\n');
                    last.text.push_str(line);
                }
            }
        }
    }
    out
}

fn parse_line(line: &str) -> Option<EnvoyRecord> {
    let mut rest = line.strip_prefix('[')?;
    let mut fields = Vec::with_capacity(4);
    for _ in 0..4 {
        let end = rest.find(']')?;
        fields.push(&rest[..end]);
        rest = &rest[end + 1..];
        if fields.len() < 4 {
            rest = rest.strip_prefix('[')?;
        }
    }
    let tid = fields[1].parse().ok()?;
    // ` [file:line] message`
    let rest = rest.strip_prefix(" [")?;
    let end = rest.find("] ")?;
    Some(EnvoyRecord {
        tid,
        level: fields[2].to_string(),
        logger: fields[3].to_string(),
        text: rest[end + 2..].to_string(),
    })
}

/// Reads a running Envoy's log as it grows, and names its threads.
pub struct EnvoyLogReader {
    path: PathBuf,
    /// Envoy's stderr: where it logs once its log file is closed at exit (a singleton Wasm
    /// service's `on_done` / `on_delete` lines go there).
    exit_path: Option<PathBuf>,
    /// Records already handed out, of the log file and of stderr.
    seen: usize,
    exit_seen: usize,
    threads: HashMap<u64, LogThread>,
}

impl EnvoyLogReader {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            exit_path: None,
            seen: 0,
            exit_seen: 0,
            threads: HashMap::new(),
        }
    }

    /// The reader, reading the records Envoy writes to `stderr` after closing its log file
    /// too (after the log file's own).
    pub fn with_stderr(mut self, stderr: &Path) -> Self {
        self.exit_path = Some(stderr.to_path_buf());
        self
    }

    /// Every record so far.
    pub fn all(&mut self) -> Vec<EnvoyRecord> {
        let (mut records, exit) = self.read();
        records.extend(exit);
        records
    }

    /// The log file's records and stderr's, threads named.
    fn read(&mut self) -> (Vec<EnvoyRecord>, Vec<EnvoyRecord>) {
        let read = |p: &Path| {
            parse(&crate::engine::input::read_text(p, MAX_LOG_BYTES).unwrap_or_default())
        };
        let records = read(&self.path);
        let exit = self.exit_path.as_deref().map(read).unwrap_or_default();
        if let Some(first) = records.first() {
            // The first line (`initializing epoch 0`) is the main thread's.
            self.threads.entry(first.tid).or_insert(LogThread::Main);
        }
        for r in records.iter().chain(&exit) {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.threads.entry(r.tid) {
                if let Some(w) = worker_number(r.tid) {
                    slot.insert(LogThread::Worker(w));
                }
            }
        }
        (records, exit)
    }

    /// The records written since the last call (all of them the first time).
    pub fn since_last(&mut self) -> Vec<EnvoyRecord> {
        let (mut records, mut exit) = self.read();
        let mut new = records.split_off(self.seen.min(records.len()));
        self.seen = records.len() + new.len();
        let new_exit = exit.split_off(self.exit_seen.min(exit.len()));
        self.exit_seen = exit.len() + new_exit.len();
        new.extend(new_exit);
        new
    }

    /// Which thread wrote `record`, where known.
    pub fn thread(&self, record: &EnvoyRecord) -> Option<LogThread> {
        self.threads.get(&record.tid).copied()
    }
}

/// A worker's number from its thread name (`wrk:worker_N`), while the thread lives.
fn worker_number(tid: u64) -> Option<usize> {
    let name = std::fs::read_to_string(format!("/proc/{tid}/comm")).ok()?;
    name.trim().strip_prefix("wrk:worker_")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_continue_over_lines_that_start_no_record() {
        let text = "\
[2026-11-23 15:58:01.995][27605][error][wasm] [source/extensions/common/wasm/context.cc:1157] wasm log a b: about to trap
[2026-11-23 15:58:01.995][27605][error][wasm] [source/extensions/common/wasm/wasm_vm.cc:38] Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable
Proxy-Wasm plugin in-VM backtrace:
  0:  0x271 - unknown(function index:10)
[2026-11-23 15:58:02.300][27594][info][main] [source/server/server.cc:1159] exiting";
        let records = parse(text);
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].line(), "[error] wasm log a b: about to trap");
        assert!(records[1].is_vm_failure());
        assert!(records[1]
            .text
            .ends_with("\n  0:  0x271 - unknown(function index:10)"));
        assert_eq!(records[2].tid, 27594);
        assert!(!records[2].is_guest_or_vm());
    }
}
