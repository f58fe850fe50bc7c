//! Expectations on log lines (a step's, start-up's) and on start-up itself, and their checks
//! against the lines the harness or real Envoy wrote.

use serde::Deserialize;

use crate::engine::host::LogRecord;

/// Expectations on the log lines written during a step.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogExpect {
    /// Substrings that must each appear in some line.
    #[serde(default)]
    pub logs: Vec<String>,
    #[serde(default)]
    pub log_counts: Vec<LogCount>,
}

/// `{contains: "on_tick", count: 3, worker: 0}`: exactly `count` lines containing the
/// substring, written by `worker` if given (else by any VM).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogCount {
    pub contains: String,
    pub count: usize,
    /// Only lines from this worker (a number) or from the main thread (`main`).
    #[serde(default)]
    pub worker: Option<LogThread>,
}

/// Which thread's VMs wrote a log line: a worker, or `main` (the main thread's instances
/// and Wasm services, and the configuration canary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogThread {
    Worker(usize),
    Main,
}

impl LogThread {
    /// The thread a log record's `worker` names (`None`: the main thread).
    pub fn of(worker: Option<usize>) -> Self {
        worker.map_or(Self::Main, Self::Worker)
    }
}

impl std::fmt::Display for LogThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Worker(w) => write!(f, "worker {w}"),
            Self::Main => f.write_str("the main thread"),
        }
    }
}

impl<'de> Deserialize<'de> for LogThread {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Index(usize),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Index(w) => Ok(Self::Worker(w)),
            Raw::Name(n) if n == "main" => Ok(Self::Main),
            Raw::Name(n) => Err(serde::de::Error::custom(format!(
                "worker {n:?}: expected a worker number or `main`"
            ))),
        }
    }
}

/// Checks a step's log-only expectations (an advance, a shutdown).
pub fn check_log_expect(expect: &LogExpect, logs: &WrittenLog) -> Vec<String> {
    let mut failures = Vec::new();
    check_logs(&expect.logs, &expect.log_counts, logs, &mut failures);
    failures
}

/// Log lines written while a step ran, as the log checks read them: the harness's (each
/// with the thread that wrote it) or real Envoy's (whose threads are known while it runs).
pub struct WrittenLog {
    /// How a failure says what was seen: `saw` or `Envoy wrote`.
    seen: &'static str,
    lines: Vec<String>,
    /// The thread of each line, where known.
    threads: Vec<Option<LogThread>>,
}

impl WrittenLog {
    pub fn harness(records: &[LogRecord]) -> Self {
        Self {
            seen: "saw",
            lines: records.iter().map(ToString::to_string).collect(),
            threads: records
                .iter()
                .map(|r| Some(LogThread::of(r.worker)))
                .collect(),
        }
    }

    /// Lines the harness wrote on the main thread (the canary's, when a configuration is
    /// refused: its records are gone with the proxy, their lines are in the error).
    pub fn harness_main(lines: Vec<String>) -> Self {
        let threads = vec![Some(LogThread::Main); lines.len()];
        Self {
            seen: "saw",
            lines,
            threads,
        }
    }

    /// Envoy's lines whose threads are not known: counts tied to a thread are not checked.
    pub fn envoy(lines: Vec<String>) -> Self {
        let threads = vec![None; lines.len()];
        Self::envoy_on_threads(lines, threads)
    }

    /// Envoy's lines, each with its thread where known.
    pub fn envoy_on_threads(lines: Vec<String>, threads: Vec<Option<LogThread>>) -> Self {
        Self {
            seen: "Envoy wrote",
            lines,
            threads,
        }
    }
}

/// What start-up must do (`expect_start:`): `rejected` (Envoy refuses the configuration and
/// does not start; `wasm-harness run` exits 2 without it), or start, and in both cases the
/// lines written meanwhile (`on_vm_start`, `on_configure`, Envoy's refusal):
/// `{outcome: rejected, logs: [...], log_counts: [...]}`.
#[derive(Debug, Clone, Default)]
pub struct StartExpect {
    pub outcome: StartOutcome,
    pub log: LogExpect,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartOutcome {
    #[default]
    Started,
    Rejected,
}

impl<'de> Deserialize<'de> for StartExpect {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Block {
            #[serde(default)]
            outcome: StartOutcome,
            #[serde(default)]
            logs: Vec<String>,
            #[serde(default)]
            log_counts: Vec<LogCount>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Outcome(StartOutcome),
            Block(Block),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Outcome(outcome)) => Ok(Self {
                outcome,
                log: LogExpect::default(),
            }),
            Ok(Raw::Block(b)) => Ok(Self {
                outcome: b.outcome,
                log: LogExpect {
                    logs: b.logs,
                    log_counts: b.log_counts,
                },
            }),
            Err(_) => Err(serde::de::Error::custom(
                "expect_start: expected `rejected`, `started`, or {outcome: rejected|started, logs: [...], log_counts: [...]}",
            )),
        }
    }
}

/// Checks how start-up went against `expect_start`: the outcome, then the lines written.
pub fn check_start(want: &StartExpect, started: bool, logs: &WrittenLog) -> Vec<String> {
    let mut failures = Vec::new();
    match (want.outcome, started) {
        (StartOutcome::Rejected, true) => {
            failures.push("expected the configuration to be refused, but it started".into())
        }
        (StartOutcome::Started, false) => {
            failures.push("expected the configuration to start, but it was refused".into())
        }
        _ => {}
    }
    failures.extend(check_log_expect(&want.log, logs));
    failures
}

/// Checks the log lines written during a step: every `contains` substring in some line, and
/// every count exact (a count tied to a thread only where every matching line's thread is
/// known).
pub fn check_logs(
    contains: &[String],
    counts: &[LogCount],
    written: &WrittenLog,
    failures: &mut Vec<String>,
) {
    let (seen, lines) = (written.seen, &written.lines);
    for needle in contains {
        if !lines.iter().any(|l| l.contains(needle.as_str())) {
            failures.push(format!(
                "log: expected a line containing {needle:?}, {seen} {} lines: {lines:?}",
                lines.len()
            ));
        }
    }
    for want in counts {
        let matching = lines
            .iter()
            .zip(&written.threads)
            .filter(|(l, _)| l.contains(want.contains.as_str()));
        let got = match want.worker {
            None => matching.count(),
            Some(thread) => {
                let threads: Vec<Option<LogThread>> = matching.map(|(_, t)| *t).collect();
                if threads.iter().any(Option::is_none) {
                    continue;
                }
                threads.iter().filter(|t| **t == Some(thread)).count()
            }
        };
        if got != want.count {
            let whose = match want.worker {
                Some(w) => format!(" from {w}"),
                None => String::new(),
            };
            failures.push(format!(
                "log: expected {} line(s) containing {:?}{whose}, {seen} {got}",
                want.count, want.contains
            ));
        }
    }
}
