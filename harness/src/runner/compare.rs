//! The differential comparison: each step of a scenario run in the harness and then in real
//! Envoy, each side checked against the step's expectations and the two against each other.
//! The scenario is loaded once and both sides run the same [`Step`], so a step's two outcomes
//! are paired by the step itself.

mod differences;
pub mod generated;
mod logs;
mod swap;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::envoy::http::Exchange;
use crate::envoy::proxy::TcpOutcome;
use crate::runner::real_envoy::log::{EnvoyLogReader, EnvoyRecord};
use crate::runner::real_envoy::{EnvoyError, RealEnvoy};
use crate::runner::report::{ClockAdvance, Startup, StepOutcome, StepReport, Verdict};
use crate::runner::run::{expects_refusal, startup_verdict, HarnessRun, RunOptions};
use crate::runner::scenario::expect::{self, WrittenLog};
use crate::runner::scenario::{AdvanceStep, ConnectionCase, RequestCase, Scenario, Step};

/// Real Envoy has no virtual clock: an `advance` step waits in real time (so its timers fire
/// too), at most this long.
pub const MAX_REAL_WAIT: Duration = Duration::from_secs(10);
/// How long after a step Envoy's log has it all: Envoy flushes its log file every 50 ms
/// (`--file-flush-interval-msec`).
const LOG_SETTLE: Duration = Duration::from_millis(150);

pub use differences::compare;
use differences::{compare_calls, compare_connections, without_timer_calls};
pub use logs::LogComparison;

/// One step, in the harness and in real Envoy.
#[derive(Debug, Clone, Serialize)]
pub struct ComparedStep {
    /// The step in the harness: its name, outcome, failed expectations, logs and calls.
    pub harness: StepReport,
    /// What the step did in real Envoy.
    pub envoy: StepOutcome,
    /// Expectations that failed on Envoy.
    pub envoy_failures: Vec<String>,
    /// Where Envoy and the harness disagree.
    pub differences: Vec<String>,
    /// The guest's log lines in both, thread by thread, or why they cannot be compared.
    pub logs: LogComparison,
}

impl ComparedStep {
    pub fn name(&self) -> &str {
        &self.harness.name
    }

    pub fn passed(&self) -> bool {
        self.harness.failures.is_empty()
            && self.envoy_failures.is_empty()
            && self.differences.is_empty()
            && !self.logs.differs()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ComparisonReport {
    pub scenario: PathBuf,
    pub verdict: Verdict,
    /// How the harness started, or why it could not.
    pub harness: Startup,
    /// Why real Envoy could not start, or why its run was not compared.
    pub envoy_error: Option<String>,
    /// `expect_start` checked against Envoy's start-up (or its refusal).
    pub envoy_startup_failures: Vec<String>,
    /// The lines both wrote while starting, compared (none if either did not start).
    pub startup_logs: Option<LogComparison>,
    pub cases: Vec<ComparedStep>,
}

/// Runs `path` in the harness and in real Envoy with the same worker count and log level.
pub fn run_comparison(envoy_bin: &Path, path: &Path, opts: &RunOptions) -> ComparisonReport {
    let mut report = ComparisonReport {
        scenario: path.to_path_buf(),
        verdict: Verdict::CannotStart,
        harness: Startup::default(),
        envoy_error: None,
        envoy_startup_failures: Vec::new(),
        startup_logs: None,
        cases: Vec::new(),
    };
    let scenario = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            report.harness.error = Some(e.to_string());
            return report;
        }
    };
    let Some((mut harness, mut real, mut reader)) =
        start_both(envoy_bin, &scenario, opts, &mut report)
    else {
        return report;
    };
    if expects_refusal(&scenario) {
        return report;
    }
    for step in &scenario.requests {
        let compared =
            run_compared_step(&mut harness, &mut real, &mut reader, &scenario, step, opts);
        if !compared.passed() {
            report.verdict = Verdict::Failed;
        }
        report.cases.push(compared);
    }
    report
}

/// Starts the scenario's proxy in the harness and real Envoy, and compares how each started
/// (into `report`); `None` when the steps cannot run on both.
fn start_both(
    envoy_bin: &Path,
    scenario: &Scenario,
    opts: &RunOptions,
    report: &mut ComparisonReport,
) -> Option<(HarnessRun, RealEnvoy, EnvoyLogReader)> {
    let (harness, startup) = HarnessRun::start(scenario, opts);
    report.harness = startup;
    let harness_verdict = startup_verdict(&report.harness);
    let bootstrap = opts.bootstrap_for(scenario);
    let started = RealEnvoy::start_answering(
        envoy_bin,
        &bootstrap,
        opts.workers_for(scenario),
        opts.log_level_for(scenario),
        crate::runner::real_envoy::metadata::seeded_keys(scenario.requests.iter().filter_map(
            |s| match s {
                Step::Request(case) => Some(&case.request.dynamic_metadata),
                _ => None,
            },
        )),
        &standing_calls(scenario),
    );
    let real = match started {
        Ok(r) => r,
        Err(e) => {
            envoy_refused(e, scenario, harness_verdict, report);
            return None;
        }
    };
    let mut reader = EnvoyLogReader::new(&real.log_path).with_stderr(&real.stderr_path);
    std::thread::sleep(LOG_SETTLE);
    let envoy_startup = reader.since_last();
    if let Some(want) = &scenario.expect_start {
        let lines: Vec<EnvoyRecord> = envoy_startup
            .iter()
            .filter(|r| r.is_startup())
            .cloned()
            .collect();
        let written = logs::envoy_written(&lines, &reader);
        report.envoy_startup_failures = expect::check_start(want, true, &written);
    }
    let Some(harness) = harness else {
        report.envoy_error = Some("envoy accepted a configuration the harness refused".into());
        report.verdict = Verdict::Failed;
        return None;
    };
    report.startup_logs = Some(logs::compare_startup(
        &harness.log_records(),
        &envoy_startup,
        &reader,
        harness.ticking(),
    ));
    report.verdict = harness_verdict;
    if !report.envoy_startup_failures.is_empty()
        || report
            .startup_logs
            .as_ref()
            .is_some_and(LogComparison::differs)
    {
        report.verdict = Verdict::Failed;
    }
    Some((harness, real, reader))
}

/// Envoy did not start: both refusing the configuration is agreement; anything else is not.
fn envoy_refused(
    e: EnvoyError,
    scenario: &Scenario,
    harness_verdict: Verdict,
    report: &mut ComparisonReport,
) {
    if let (EnvoyError::Exited { log, .. }, Some(want)) = (&e, &scenario.expect_start) {
        let lines: Vec<&EnvoyRecord> = log.iter().filter(|r| r.is_startup()).collect();
        let written = crate::runner::scenario::expect::WrittenLog::envoy(
            lines.iter().map(|r| r.line()).collect(),
        );
        report.envoy_startup_failures = expect::check_start(want, false, &written);
    }
    report.verdict = match harness_verdict {
        Verdict::CannotStart => Verdict::CannotStart,
        Verdict::Passed
            if expects_refusal(scenario) && report.envoy_startup_failures.is_empty() =>
        {
            Verdict::Passed
        }
        _ => Verdict::Failed,
    };
    report.envoy_error = Some(e.to_string());
}

/// One step on both sides: its outcomes, then the lines each wrote meanwhile, compared, and
/// Envoy's lines checked against the step's expectations where they can be.
fn run_compared_step(
    harness: &mut HarnessRun,
    real: &mut RealEnvoy,
    reader: &mut EnvoyLogReader,
    scenario: &Scenario,
    step: &Step,
    opts: &RunOptions,
) -> ComparedStep {
    let workers = opts.workers_for(scenario);
    let ticking = harness.ticking();
    let in_harness = harness.step(step);
    let conditions = step_conditions(step, ticking, workers);
    if matches!(step, Step::Shutdown(_)) {
        // Lines still waiting for Envoy's log flush belong before the signal.
        std::thread::sleep(LOG_SETTLE);
        reader.since_last();
    }
    if !matches!(step, Step::Request(_)) {
        // Callouts made meanwhile (by ticks, queues) get the scenario's own answers.
        real.answer_calls(&standing_calls(scenario));
    }
    let started = Instant::now();
    let mut compared = compare_step(real, scenario, step, in_harness, ticking);
    let mut envoy_lines = Vec::new();
    // What kept Envoy from running the step as the harness did, if anything.
    let mut unexplained = Vec::new();
    if matches!(compared.envoy, StepOutcome::Swap { .. }) {
        let deadline = started + crate::runner::real_envoy::SWAP_DEADLINE;
        match swap::lines_after_swap(&compared.harness.log_records, reader, deadline) {
            Ok(lines) => envoy_lines = lines,
            Err((lines, why)) => {
                envoy_lines = lines;
                unexplained.push(why);
            }
        }
    }
    if !matches!(step, Step::Shutdown(_)) {
        std::thread::sleep(LOG_SETTLE);
    }
    envoy_lines.extend(reader.since_last());
    unexplained.extend(real.take_unpaced());
    let request_ids = matches!(step, Step::Request(case) if generated::envoy_generates_request_id(&case.to_request()));
    let (h, e) = generated::mask_lines(&compared.harness.log_records, &envoy_lines, request_ids);
    let logs = logs::compare(&h, &e, reader, conditions);
    compared.logs = logs.unless(&unexplained);
    // Envoy's lines for the step hold its expectations too, unless something the harness
    // does not reproduce can add or change lines (with several workers only the counts
    // tied to a worker are left out).
    let checkable = matches!(
        conditions,
        logs::Conditions::Quiet | logs::Conditions::Workers
    );
    if checkable || matches!(step, Step::Shutdown(_)) {
        check_envoy_logs(step, &envoy_lines, reader, &mut compared.envoy_failures);
    }
    compared
}

/// What, in Envoy, can add lines to a step or change them, which the harness does not
/// reproduce exactly. Bodies are not among them: the harness hands a body to the filters as
/// Envoy's codec for the step's protocol does (HTTP/2: a DATA frame a chunk; HTTP/1.1: a
/// socket read a chunk, which the driver's client and upstreams pace, then the end of
/// stream on its own).
fn step_conditions(step: &Step, ticking: bool, workers: usize) -> logs::Conditions {
    match step {
        Step::Advance(_) => logs::Conditions::Advance,
        _ if ticking => logs::Conditions::Ticking,
        Step::Request(case) => {
            let request = case.to_request();
            if crate::envoy::http::metadata::has_unordered_map(&request.dynamic_metadata) {
                logs::Conditions::UnorderedMetadata
            } else if workers > 1 {
                logs::Conditions::Workers
            } else {
                logs::Conditions::Quiet
            }
        }
        Step::Connection(_) if workers > 1 => logs::Conditions::Workers,
        _ => logs::Conditions::Quiet,
    }
}

/// A request's, a connection's or a shutdown's log expectations, checked against Envoy's
/// lines for the step too (a request's and a connection's only when no timer can add lines
/// to it; an advance's stay the harness's: Envoy's ticks run in real time).
fn check_envoy_logs(
    step: &Step,
    lines: &[EnvoyRecord],
    reader: &EnvoyLogReader,
    failures: &mut Vec<String>,
) {
    let (contains, counts) = match step {
        Step::Request(r) => (&r.expect.logs, &r.expect.log_counts),
        Step::Connection(c) => (&c.expect.logs, &c.expect.log_counts),
        Step::Shutdown(sd) => (&sd.expect.logs, &sd.expect.log_counts),
        Step::Swap(sw) => (&sw.expect.logs, &sw.expect.log_counts),
        Step::Advance(_) => return,
    };
    // Envoy's kernel, not the harness's round robin, picks a connection's worker; at
    // shutdown and in an ECDS update every thread takes part.
    let counts: Vec<_> = counts
        .iter()
        .filter(|c| c.worker.is_none() || matches!(step, Step::Shutdown(_) | Step::Swap(_)))
        .cloned()
        .collect();
    let guest: Vec<EnvoyRecord> = lines
        .iter()
        .filter(|r| r.is_guest_or_vm())
        .cloned()
        .collect();
    expect::check_logs(
        contains,
        &counts,
        &logs::envoy_written(&guest, reader),
        failures,
    );
}

/// Runs `step` in real Envoy and compares it with the harness's run of the same step.
fn compare_step(
    real: &mut RealEnvoy,
    scenario: &Scenario,
    step: &Step,
    harness: StepReport,
    ticking: bool,
) -> ComparedStep {
    let mut compared = ComparedStep {
        harness,
        envoy: StepOutcome::NotSent,
        envoy_failures: Vec::new(),
        differences: Vec::new(),
        logs: LogComparison::Same,
    };
    match step {
        Step::Request(case) => envoy_request(real, scenario, case, &mut compared, ticking),
        Step::Connection(c) => envoy_connection(real, c, &mut compared),
        Step::Advance(adv) => compared.envoy = envoy_advance(adv),
        Step::Shutdown(_) => {
            compared.envoy_failures = envoy_shutdown(real);
            compared.envoy = StepOutcome::Shutdown;
        }
        Step::Swap(sw) => match real.swap_ecds(&sw.swap_ecds.filter, &sw.swap_ecds.with) {
            Ok(()) => {
                compared.envoy = StepOutcome::Swap {
                    changed: Vec::new(),
                }
            }
            Err(e) => compared.envoy_failures.push(e.to_string()),
        },
    }
    compared
}

/// The scenario's own canned callout answers (top-level `http_calls` / `grpc_calls`), which
/// serve every step and the time before the first.
fn standing_calls(scenario: &Scenario) -> crate::runner::real_envoy::Canned {
    crate::runner::real_envoy::Canned {
        http: scenario.http_calls.iter().map(|c| c.to_canned()).collect(),
        // An entry the harness refused is reported by the harness's run.
        grpc: scenario
            .grpc_calls
            .iter()
            .filter_map(|c| c.to_canned().ok())
            .collect(),
    }
}

/// A request through Envoy, with the callout clusters' upstreams answering as the scenario's
/// canned replies say. Its log expectations are checked on Envoy's lines for the step by
/// [`check_envoy_logs`]; who made a local reply Envoy cannot say.
fn envoy_request(
    real: &mut RealEnvoy,
    scenario: &Scenario,
    case: &RequestCase,
    compared: &mut ComparedStep,
    ticking: bool,
) {
    let mut expect = case.expect.clone();
    expect.logs.clear();
    expect.log_counts.clear();
    expect.local_reply = None;
    let canned = crate::runner::real_envoy::Canned {
        http: case
            .http_calls
            .iter()
            .chain(&scenario.http_calls)
            .map(|c| c.to_canned())
            .collect(),
        // An entry the harness refused is reported by the harness's run.
        grpc: case
            .grpc_calls
            .iter()
            .chain(&scenario.grpc_calls)
            .filter_map(|c| c.to_canned().ok())
            .collect(),
    };
    // A stream the harness saw held is sent so that Envoy's hold ends the step too (the
    // client closes once Envoy shows it held), not a 30 s timeout.
    let held = compared
        .harness
        .outcome
        .exchange()
        .is_some_and(|ex| ex.stalled().is_some());
    let (listener, request, reply) = (
        case.listener.as_deref(),
        &case.to_request(),
        &case.upstream_reply(),
    );
    let sent = if held {
        real.send_may_hold(listener, request, reply, &canned)
    } else {
        real.send_with_calls(listener, request, reply, &canned)
    };
    let (ex, envoy_calls) = match sent {
        // Calls Envoy's ticks made meanwhile are timing: the step's logs say why.
        Ok((ex, calls)) if ticking => (ex, without_timer_calls(&compared.harness.calls, calls)),
        Ok(sent) => sent,
        Err(e) => {
            compared.envoy_failures.push(e.to_string());
            return;
        }
    };
    compared.envoy_failures = expect::check_exchange(&expect, &ex, &WrittenLog::envoy(Vec::new()));
    if let Some(want) = &expect.calls {
        expect::check_calls(want, &envoy_calls, &mut compared.envoy_failures);
    }
    if let Some(h) = compared.harness.outcome.exchange() {
        compared.differences = compare(h, &ex);
    }
    compare_calls(
        &compared.harness.calls,
        &envoy_calls,
        &mut compared.differences,
    );
    compared.envoy = StepOutcome::Request(ex);
}

/// A connection through Envoy: the cluster it reached and the bytes are checked and compared
/// (who closed is the harness's reading); its log lines are by [`check_envoy_logs`].
fn envoy_connection(real: &mut RealEnvoy, c: &ConnectionCase, compared: &mut ComparedStep) {
    let out = match real.connect(c.listener.as_deref(), &c.events()) {
        Ok(out) => out,
        Err(e) => {
            compared.envoy_failures.push(e.to_string());
            return;
        }
    };
    expect::check_connection_bytes(&c.expect, &out, &mut compared.envoy_failures);
    if let Some(h) = compared.harness.outcome.connection() {
        compare_connections(h, &out, &mut compared.differences);
    }
    compared.envoy = StepOutcome::Connection(out);
}

/// An advance in real time, so Envoy's timers fire too; its log expectations are the
/// harness's alone, as for requests.
fn envoy_advance(adv: &AdvanceStep) -> StepOutcome {
    let wait = adv.advance.0.min(MAX_REAL_WAIT);
    std::thread::sleep(wait);
    StepOutcome::Advance(ClockAdvance {
        by: crate::envoy::proxy::format_duration(wait),
        ticks: None,
    })
}

/// A shutdown step through real Envoy: SIGTERM, and wait for the exit; its log expectations
/// are checked on the lines Envoy wrote meanwhile by [`check_envoy_logs`].
fn envoy_shutdown(real: &mut RealEnvoy) -> Vec<String> {
    match real.shutdown(Duration::from_secs(20)) {
        Ok(()) => Vec::new(),
        Err(e) => vec![e.to_string()],
    }
}

impl fmt::Display for ComparisonReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scenario {} — harness vs real Envoy",
            self.scenario.display()
        )?;
        if let Some(e) = &self.harness.error {
            writeln!(f, "  harness: cannot start: {e}")?;
        }
        if let Some(e) = &self.envoy_error {
            writeln!(f, "  envoy: {e}")?;
        }
        for failure in &self.harness.startup_failures {
            writeln!(f, "  FAIL at startup: harness expected: {failure}")?;
        }
        for failure in &self.envoy_startup_failures {
            writeln!(f, "  FAIL at startup: envoy expected: {failure}")?;
        }
        if let Some(logs) = self
            .startup_logs
            .as_ref()
            .filter(|l| **l != LogComparison::Same)
        {
            if f.alternate() {
                writeln!(f, "  startup {logs:#}")?;
            } else {
                writeln!(f, "  startup {logs}")?;
            }
        }
        for step in &self.cases {
            if f.alternate() {
                write!(f, "{step:#}")?;
            } else {
                write!(f, "{step}")?;
            }
        }
        let failed = self.cases.iter().filter(|c| !c.passed()).count();
        writeln!(
            f,
            "  {} passed, {} failed",
            self.cases.len() - failed,
            failed
        )
    }
}

impl ComparedStep {
    /// The log comparison unless the lines are the same; `{:#}` adds the lines of a step
    /// that cannot be compared.
    fn write_logs(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.logs {
            LogComparison::Same => Ok(()),
            logs if f.alternate() => writeln!(f, "       {logs:#}"),
            logs => writeln!(f, "       {logs}"),
        }
    }
}

impl fmt::Display for ComparedStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.passed() { "ok  " } else { "FAIL" };
        writeln!(f, "  {mark} {}", self.name())?;
        let harness_failures = self
            .harness
            .failures
            .iter()
            .map(|x| ("harness expected", x));
        let envoy_failures = self.envoy_failures.iter().map(|x| ("envoy expected", x));
        let differences = self.differences.iter().map(|x| ("differs", x));
        match (&self.harness.outcome, &self.envoy) {
            (StepOutcome::Advance(h), envoy) => {
                let waited = envoy.advance().map_or("0s", |a| a.by.as_str());
                writeln!(
                    f,
                    "       harness: clock +{}, {} tick(s) | envoy: waited {waited} of real time",
                    h.by,
                    h.ticks.unwrap_or_default(),
                )?;
                for (what, x) in harness_failures {
                    writeln!(f, "       {what}: {x}")?;
                }
                self.write_logs(f)?;
                return Ok(());
            }
            (_, StepOutcome::Shutdown) => {
                writeln!(
                    f,
                    "       harness: roots got on_done / on_delete | envoy: exited on SIGTERM, its shutdown log checked"
                )?;
                for (what, x) in harness_failures.chain(envoy_failures) {
                    writeln!(f, "       {what}: {x}")?;
                }
                self.write_logs(f)?;
                return Ok(());
            }
            (StepOutcome::Swap { changed }, envoy) => {
                let applied = match envoy {
                    StepOutcome::Swap { .. } => "update applied",
                    _ => "not applied",
                };
                let harness = if changed.is_empty() {
                    "no plugin changed".to_string()
                } else {
                    format!("new configuration for {}", changed.join(", "))
                };
                writeln!(f, "       harness: {harness} | envoy: {applied}")?;
            }
            (StepOutcome::Connection(h), envoy) => {
                let bytes = |c: &TcpOutcome| {
                    format!(
                        "upstream got {:?}, client got {:?}",
                        String::from_utf8_lossy(&c.upstream_received),
                        String::from_utf8_lossy(&c.downstream_received)
                    )
                };
                let envoy = envoy
                    .connection()
                    .map_or_else(|| "no connection".into(), bytes);
                writeln!(f, "       harness: {} | envoy: {envoy}", bytes(h))?;
            }
            (harness, envoy) => {
                let status = |ex: Option<&Exchange>| match ex.and_then(|e| e.response()) {
                    Some(r) => format!("{} {:?}", r.status, String::from_utf8_lossy(&r.body)),
                    None => "no response".into(),
                };
                let reached = |ex: Option<&Exchange>| match ex.and_then(|e| e.upstream.as_ref()) {
                    Some(u) => format!("upstream {:?}", u.cluster),
                    None => "no upstream".into(),
                };
                let (h, e) = (harness.exchange(), envoy.exchange());
                writeln!(
                    f,
                    "       harness: {:<28} {:<20} | envoy: {:<28} {}",
                    status(h),
                    reached(h),
                    status(e),
                    reached(e)
                )?;
            }
        }
        for (what, x) in harness_failures.chain(envoy_failures).chain(differences) {
            writeln!(f, "       {what}: {x}")?;
        }
        self.write_logs(f)?;
        Ok(())
    }
}
