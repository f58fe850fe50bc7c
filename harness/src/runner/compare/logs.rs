//! The guest's log lines in the harness and in real Envoy, compared thread by thread: the
//! main thread's lines (the canary's, the main thread's instances', singleton services') in
//! order, and each worker's in order, workers matched as a set (Envoy's kernel, not the
//! harness's round robin, picks the worker a connection lands on). Only the lines both write
//! are compared: the guest's (`wasm log ...`) and a VM failure's first line (its backtrace's
//! depth is the engine's own); the harness's notes about itself are never in Envoy's log.
//!
//! A step whose lines cannot be compared says why ([`LogComparison::CannotCompare`]) in one
//! short line, and keeps the differences for `--verbose` and `--json`: a difference is either
//! explained there or reported as one, never left unexplained.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::engine::host::logging::LogSource;
use crate::engine::host::LogRecord;
use crate::runner::real_envoy::log::{EnvoyLogReader, EnvoyRecord};
use crate::runner::scenario::expect::{LogThread, WrittenLog};

/// How a step's log lines compare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogComparison {
    /// Each thread wrote the same lines, in the same order, in both.
    Same,
    /// Where the two logs disagree.
    Differs(Vec<String>),
    /// Why this step's lines cannot be compared (something the harness does not emulate),
    /// in one short line, and where the two logs disagree (shown with `--verbose`).
    CannotCompare { why: String, lines: Vec<String> },
    /// With a timer armed, each thread wrote the same lines but for some that only one side's
    /// ticks wrote while the step ran (Envoy's in real time, the harness's on its virtual
    /// clock): timing, not a difference. The extra lines are shown with `--verbose`.
    Timing { lines: Vec<String> },
}

impl LogComparison {
    pub fn differs(&self) -> bool {
        matches!(self, Self::Differs(_))
    }

    /// This comparison, or, when `why` names something that kept real Envoy from running the
    /// step as the harness did, why its differences cannot be compared.
    pub fn unless(self, why: &[String]) -> Self {
        if why.is_empty() {
            return self;
        }
        match self {
            Self::Same => Self::Same,
            Self::Timing { lines } => Self::Timing { lines },
            Self::Differs(lines) => Self::CannotCompare {
                why: why.join("; "),
                lines,
            },
            Self::CannotCompare { why: first, lines } => Self::CannotCompare {
                why: format!("{first}; {}", why.join("; ")),
                lines,
            },
        }
    }
}

impl fmt::Display for LogComparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Same => f.write_str("logs: the same on every thread"),
            Self::Differs(d) => write!(f, "logs differ: {}", d.join("; ")),
            Self::Timing { lines } => {
                write!(
                    f,
                    "logs: timing: the same but for {} line(s) ticks wrote while the step ran",
                    lines.len()
                )?;
                if f.alternate() {
                    for line in lines {
                        write!(f, "\n         {line}")?;
                    }
                }
                Ok(())
            }
            Self::CannotCompare { why, lines } => {
                write!(f, "logs: cannot compare: {why}")?;
                // `{:#}` (the CLI's `--verbose`): each difference on its own line.
                if f.alternate() {
                    for line in lines {
                        write!(f, "\n         {line}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// What may explain a difference in a step's lines: something of Envoy's the harness does
/// not reproduce exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conditions {
    /// Nothing but the step writes lines, and nothing in it depends on the network.
    Quiet,
    /// A timer is armed: Envoy's ticks fall into the step whenever real time says.
    Ticking,
    /// An `advance`: the harness's virtual clock against Envoy's real wait.
    Advance,
    /// Several workers: Envoy's kernel, not the harness's round robin, picks the worker of
    /// each connection, so each worker's VM has seen other traffic before this step.
    Workers,
    /// The request seeds dynamic metadata with a map of several entries.
    UnorderedMetadata,
}

/// A line as both sides write it, and the thread it came from (a worker's key: the
/// harness's number, Envoy's thread id).
type Line = (Thread, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Thread {
    Main,
    Worker(u64),
}

/// The first line of a record's text: a VM failure's backtrace is left out.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

fn harness_lines(records: &[LogRecord]) -> Vec<Line> {
    records
        .iter()
        .filter(|r| r.source != LogSource::Harness)
        .map(|r| {
            let thread = r.worker.map_or(Thread::Main, |w| Thread::Worker(w as u64));
            let text = format!("[{}] {}", r.level.as_str(), r.envoy_text());
            (thread, first_line(&text).to_string())
        })
        .collect()
}

fn envoy_lines(records: &[EnvoyRecord], reader: &EnvoyLogReader) -> Vec<Line> {
    records
        .iter()
        .filter(|r| r.is_guest_or_vm())
        .map(|r| {
            let thread = match reader.thread(r) {
                Some(LogThread::Main) => Thread::Main,
                _ => Thread::Worker(r.tid),
            };
            (thread, first_line(&r.line()).to_string())
        })
        .collect()
}

/// Envoy's records as the log checks read them, each with its thread where known.
pub fn envoy_written(records: &[EnvoyRecord], reader: &EnvoyLogReader) -> WrittenLog {
    let (lines, threads) = records.iter().map(|r| (r.line(), reader.thread(r))).unzip();
    WrittenLog::envoy_on_threads(lines, threads)
}

/// Compares the lines one step (or start-up) wrote in the harness and in Envoy.
pub fn compare(
    harness: &[LogRecord],
    envoy: &[EnvoyRecord],
    reader: &EnvoyLogReader,
    conditions: Conditions,
) -> LogComparison {
    if let Some(note) = harness.iter().find(|r| r.source == LogSource::Harness) {
        return LogComparison::CannotCompare {
            why: format!(
                "the harness wrote {:?}: what the guest does after that is not emulated",
                first_line(&note.message)
            ),
            lines: Vec::new(),
        };
    }
    if let Some(r) = harness
        .iter()
        .find(|r| r.source == LogSource::Vm && r.message.contains("the harness's deadline"))
    {
        return LogComparison::CannotCompare {
            why: format!(
                "{}: Envoy has no such deadline and would still be running it",
                first_line(&r.message)
            ),
            lines: Vec::new(),
        };
    }
    let differences = differ(&harness_lines(harness), &envoy_lines(envoy, reader));
    if differences.is_empty() {
        return LogComparison::Same;
    }
    if conditions == Conditions::Ticking {
        if let Some(extra) = ticks_only(&harness_lines(harness), &envoy_lines(envoy, reader)) {
            return LogComparison::Timing { lines: extra };
        }
    }
    let why = match conditions {
        Conditions::Quiet => return LogComparison::Differs(differences),
        Conditions::Workers => {
            "several workers: Envoy's kernel picks each connection's worker (one worker compares exactly)"
        }
        Conditions::UnorderedMetadata => {
            "the request's dynamic metadata holds a map of several entries, which Envoy lists in no fixed order"
        }
        Conditions::Ticking => "a timer is armed and Envoy's ticks run in real time",
        Conditions::Advance => {
            "Envoy's timers run in real time, not on the harness's virtual clock"
        }
    };
    LogComparison::CannotCompare {
        why: why.to_string(),
        lines: differences,
    }
}

/// Compares start-up's lines: which lines the main thread and the workers wrote, not how
/// often or in which order. Envoy starts each plugin's canary and main-thread instance in
/// turn and shares one root context among identical plugin configurations; the harness starts
/// every canary first, and its plugin keys are its own.
/// With `ticking` (a timer armed once started), Envoy's ticks may have run before the first
/// step, in real time: lines only Envoy wrote are then timing, and only the harness's are
/// looked for in Envoy's (start-up is compared up to the first tick).
pub fn compare_startup(
    harness: &[LogRecord],
    envoy: &[EnvoyRecord],
    reader: &EnvoyLogReader,
    ticking: bool,
) -> LogComparison {
    let distinct = |lines: Vec<Line>| {
        let mut main = std::collections::BTreeSet::new();
        let mut workers = std::collections::BTreeSet::new();
        for (thread, text) in lines {
            match thread {
                Thread::Main => main.insert(text),
                Thread::Worker(_) => workers.insert(text),
            };
        }
        (main, workers)
    };
    let (h_main, h_workers) = distinct(harness_lines(harness));
    let (e_main, e_workers) = distinct(envoy_lines(envoy, reader));
    let mut out = Vec::new();
    for (what, h, e) in [
        ("main thread", &h_main, &e_main),
        ("workers", &h_workers, &e_workers),
    ] {
        let only_harness: Vec<&String> = h.difference(e).collect();
        let only_envoy: Vec<&String> = e.difference(h).filter(|_| !ticking).collect();
        if !only_harness.is_empty() || !only_envoy.is_empty() {
            out.push(format!(
                "{what}: only the harness wrote {only_harness:?}, only Envoy wrote {only_envoy:?}"
            ));
        }
    }
    if out.is_empty() {
        LogComparison::Same
    } else {
        LogComparison::Differs(out)
    }
}

/// When one side's lines are the other's with lines added (the main thread's in order, the
/// workers' together), the lines added: what ticks wrote on one side only while a step ran.
/// `None` when each side wrote a line the other did not.
fn ticks_only(harness: &[Line], envoy: &[Line]) -> Option<Vec<String>> {
    let flat = |(main, workers): (Vec<String>, Vec<Vec<String>>)| {
        let mut workers: Vec<String> = workers.into_iter().flatten().collect();
        workers.sort();
        (main, workers)
    };
    let h = flat(by_thread(harness));
    let e = flat(by_thread(envoy));
    for (fewer, more, side) in [(&h, &e, "Envoy"), (&e, &h, "the harness")] {
        let main = added(&fewer.0, &more.0);
        let workers = added(&fewer.1, &more.1);
        if let (Some(main), Some(workers)) = (main, workers) {
            let main = main
                .into_iter()
                .map(|l| format!("main thread, {side} only: {l}"));
            let workers = workers
                .into_iter()
                .map(|l| format!("workers, {side} only: {l}"));
            return Some(main.chain(workers).collect());
        }
    }
    None
}

/// The lines of `more` beyond `fewer` when `fewer` is `more` with lines left out (in order).
fn added(fewer: &[String], more: &[String]) -> Option<Vec<String>> {
    let mut rest = fewer.iter().peekable();
    let mut extra = Vec::new();
    for line in more {
        if rest.peek() == Some(&line) {
            rest.next();
        } else {
            extra.push(line.clone());
        }
    }
    rest.peek().is_none().then_some(extra)
}

/// The main thread's lines in order, and each worker's, the workers sorted.
fn by_thread(lines: &[Line]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut main = Vec::new();
    let mut workers: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (thread, text) in lines {
        match thread {
            Thread::Main => main.push(text.clone()),
            Thread::Worker(w) => workers.entry(*w).or_default().push(text.clone()),
        }
    }
    let mut workers: Vec<Vec<String>> = workers.into_values().collect();
    workers.sort();
    (main, workers)
}

/// The main thread's lines in order, and the workers' sequences as a set.
fn differ(harness: &[Line], envoy: &[Line]) -> Vec<String> {
    let (h_main, h_workers) = by_thread(harness);
    let (e_main, e_workers) = by_thread(envoy);
    let mut out = Vec::new();
    if h_main != e_main {
        out.push(format!(
            "main thread: harness wrote {h_main:?}, Envoy wrote {e_main:?}"
        ));
    }
    if h_workers != e_workers {
        out.push(format!(
            "workers: harness wrote {h_workers:?}, Envoy wrote {e_workers:?}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::abi::LogLevel;

    fn record(worker: Option<usize>, source: LogSource, message: &str) -> LogRecord {
        LogRecord {
            worker,
            level: LogLevel::Info,
            source,
            plugin: "p".into(),
            root_id: String::new(),
            vm_id: "vm".into(),
            stream: false,
            message: message.into(),
        }
    }

    fn envoy(tid: u64, text: &str) -> EnvoyRecord {
        EnvoyRecord {
            tid,
            level: "info".into(),
            logger: "wasm".into(),
            text: text.into(),
        }
    }

    #[test]
    fn lines_only_ticks_added_while_a_timer_runs_are_timing_and_others_are_not() {
        let reader = EnvoyLogReader::new(std::path::Path::new("/nonexistent"));
        let harness = [record(Some(0), LogSource::Guest, "request /a")];
        let line = |m: &str| envoy(7, &format!("wasm log vm: {m}"));
        let with_tick = [line("tick 1"), line("request /a"), line("tick 2")];
        match compare(&harness, &with_tick, &reader, Conditions::Ticking) {
            LogComparison::Timing { lines } => {
                assert_eq!(lines.len(), 2, "{lines:?}");
                assert!(lines[0].contains("Envoy only") && lines[0].contains("tick 1"));
            }
            other => panic!("not timing: {other:?}"),
        }
        let other = [line("tick 1"), line("request /b")];
        assert!(matches!(
            compare(&harness, &other, &reader, Conditions::Ticking),
            LogComparison::CannotCompare { .. }
        ));
        assert!(compare(&harness, &with_tick, &reader, Conditions::Quiet).differs());
    }

    #[test]
    fn workers_are_matched_as_a_set_and_the_main_thread_in_order() {
        let reader = EnvoyLogReader::new(std::path::Path::new("/nonexistent"));
        let harness = [
            record(Some(0), LogSource::Guest, "a"),
            record(Some(1), LogSource::Guest, "b"),
        ];
        let same = [envoy(7, "wasm log vm: b"), envoy(9, "wasm log vm: a")];
        assert_eq!(
            compare(&harness, &same, &reader, Conditions::Quiet),
            LogComparison::Same
        );
        let other = [envoy(7, "wasm log vm: b")];
        assert!(compare(&harness, &other, &reader, Conditions::Quiet).differs());
        match compare(&harness, &other, &reader, Conditions::Advance) {
            LogComparison::CannotCompare { why, lines } => {
                assert!(why.contains("real time"), "{why}");
                assert!(!lines.is_empty());
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn a_step_that_cannot_be_compared_gives_its_reason_in_one_line_and_its_lines_on_request() {
        let reader = EnvoyLogReader::new(std::path::Path::new("/nonexistent"));
        let harness = [record(Some(0), LogSource::Guest, &"x".repeat(400))];
        let c = compare(&harness, &[], &reader, Conditions::Workers);
        let short = c.to_string();
        assert!(!short.contains('\n') && short.len() < 120, "{short}");
        assert!(!short.contains("xxxx"), "{short}");
        let verbose = format!("{c:#}");
        assert!(verbose.starts_with(&short), "{verbose}");
        assert!(
            verbose
                .lines()
                .skip(1)
                .any(|l| l.contains(&"x".repeat(400))),
            "{verbose}"
        );
        let json = serde_json::to_value(&c).unwrap();
        let lines = &json["cannot_compare"]["lines"];
        assert!(
            lines[0].as_str().unwrap().contains(&"x".repeat(400)),
            "{json}"
        );
    }

    #[test]
    fn a_harness_note_makes_the_step_not_comparable_and_says_which() {
        let reader = EnvoyLogReader::new(std::path::Path::new("/nonexistent"));
        let harness = [record(
            Some(0),
            LogSource::Harness,
            "wasm-harness: gRPC streams are not emulated",
        )];
        match compare(&harness, &[], &reader, Conditions::Quiet) {
            LogComparison::CannotCompare { why, .. } => {
                assert!(why.contains("gRPC streams are not emulated"), "{why}")
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn an_unpaced_message_explains_a_difference() {
        let why = vec!["the request's pieces from 1 on went to Envoy in one write".to_string()];
        let differs = LogComparison::Differs(vec!["worker line 1".into()]);
        let explained = differs.unless(&why);
        assert!(!explained.differs());
        assert!(explained
            .to_string()
            .contains("cannot compare: the request's pieces"));
        assert_eq!(LogComparison::Same.unless(&why), LogComparison::Same);
        let kept = LogComparison::Differs(Vec::new()).unless(&[]);
        assert!(kept.differs());
    }
}
