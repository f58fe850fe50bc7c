//! Runs scenarios in the harness: starts the proxy a scenario's bootstrap describes, then runs
//! each step and checks its expectations against what happened and what was logged meanwhile.

use std::path::{Path, PathBuf};

use crate::engine::abi::LogLevel;
use crate::envoy::http::{CallRecord, CannedGrpcCall, CannedHttpCall};
use crate::envoy::proxy::{Proxy, ProxyOptions, StartError};
use crate::runner::report::{
    report_line, ClockAdvance, ScenarioReport, Startup, StepOutcome, StepReport, Verdict,
};
use crate::runner::scenario::expect::{self, StartOutcome, WrittenLog};
use crate::runner::scenario::{Scenario, Step, SwapStep, Swaps};

/// What a caller may change about a scenario without editing it.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the scenario's worker count.
    pub workers: Option<usize>,
    /// Runs the scenario against this bootstrap instead of the one it names (for example a
    /// copy whose module path points into the fetcher's cache).
    pub bootstrap: Option<PathBuf>,
    /// Overrides the scenario's log level (Envoy's `-l`).
    pub log_level: Option<LogLevel>,
}

impl RunOptions {
    pub fn bootstrap_for(&self, scenario: &Scenario) -> PathBuf {
        self.bootstrap
            .clone()
            .unwrap_or_else(|| scenario.bootstrap_path())
    }

    /// The worker count: this run's, else the scenario's, else Envoy's default for the harness.
    pub fn workers_for(&self, scenario: &Scenario) -> usize {
        self.workers
            .or(scenario.workers)
            .unwrap_or(ProxyOptions::default().workers)
    }

    /// Envoy's log level: this run's, else the scenario's, else Envoy's default (`info`).
    pub fn log_level_for(&self, scenario: &Scenario) -> LogLevel {
        self.log_level.or(scenario.log_level).unwrap_or_default()
    }
}

/// Runs one scenario file in the harness.
pub fn run_scenario(path: &Path, opts: &RunOptions) -> ScenarioReport {
    match Scenario::load(path) {
        Ok(scenario) => run_loaded(&scenario, opts),
        Err(e) => ScenarioReport {
            scenario: path.to_path_buf(),
            verdict: Verdict::CannotStart,
            startup: Startup {
                error: Some(e.to_string()),
                ..Startup::default()
            },
            cases: Vec::new(),
            log_dropped: None,
        },
    }
}

/// Runs a loaded scenario in the harness.
pub fn run_loaded(scenario: &Scenario, opts: &RunOptions) -> ScenarioReport {
    let (run, startup) = HarnessRun::start(scenario, opts);
    let mut report = ScenarioReport {
        scenario: scenario.path.clone(),
        verdict: startup_verdict(&startup),
        startup,
        cases: Vec::new(),
        log_dropped: None,
    };
    if let Some(mut run) = run {
        if report.verdict == Verdict::Passed && expects_refusal(scenario) {
            // The start-up failure says so; the steps are for a proxy that should not exist.
            report.verdict = Verdict::Failed;
            report.log_dropped = run.log_dropped();
            return report;
        }
        for step in &scenario.requests {
            let done = run.step(step);
            if !done.failures.is_empty() {
                report.verdict = Verdict::Failed;
            }
            report.cases.push(done);
        }
        report.log_dropped = run.log_dropped();
    }
    report
}

/// Whether the scenario wants its configuration refused (`expect_start: rejected`).
pub fn expects_refusal(scenario: &Scenario) -> bool {
    scenario
        .expect_start
        .as_ref()
        .is_some_and(|s| s.outcome == StartOutcome::Rejected)
}

/// The verdict a run has before its first step: a refusal `expect_start: rejected` wanted
/// passes or fails on its log expectations; any other failure to start is verdict 2.
pub fn startup_verdict(startup: &Startup) -> Verdict {
    if startup.error.is_some() && !(startup.refused && startup.refusal_expected) {
        Verdict::CannotStart
    } else if startup.startup_failures.is_empty() {
        Verdict::Passed
    } else {
        Verdict::Failed
    }
}

/// A scenario's proxy, started, with the scenario-wide canned callout replies.
pub struct HarnessRun {
    proxy: Proxy,
    http_calls: Vec<CannedHttpCall>,
    grpc_calls: Vec<CannedGrpcCall>,
    /// The bootstrap it runs, read again when a step swaps an ECDS file.
    bootstrap: PathBuf,
    swaps: Swaps,
}

impl HarnessRun {
    /// Starts the proxy; without one, `Startup::error` says why. Every canned reply is
    /// checked here, so a bad one stops the run before its first step.
    pub fn start(scenario: &Scenario, opts: &RunOptions) -> (Option<Self>, Startup) {
        let mut startup = Startup::default();
        let grpc_calls = match canned_grpc(scenario) {
            Ok(calls) => calls,
            Err(e) => {
                startup.error = Some(e);
                return (None, startup);
            }
        };
        let options = ProxyOptions {
            log_level: opts.log_level_for(scenario),
            ..ProxyOptions::with_workers(opts.workers_for(scenario))
        };
        startup.refusal_expected = expects_refusal(scenario);
        let mut proxy = match Proxy::from_bootstrap(&opts.bootstrap_for(scenario), &options) {
            Ok(p) => p,
            Err(e) => {
                startup.refused = matches!(e, StartError::Rejected { .. } | StartError::Vm(_));
                let lines = match &e {
                    StartError::Rejected { error, log } => {
                        startup.error =
                            Some(format!("configuration rejected by the canary VM: {error}"));
                        log.clone()
                    }
                    _ => {
                        startup.error = Some(e.to_string());
                        Vec::new()
                    }
                };
                startup.startup_logs = lines.iter().map(|l| format!("[main] {l}")).collect();
                if let Some(want) = &scenario.expect_start {
                    let written = WrittenLog::harness_main(lines);
                    startup.startup_failures = expect::check_start(want, false, &written);
                }
                return (None, startup);
            }
        };
        if let Some(budget) = scenario.callout_budget {
            proxy.set_callout_budget(budget.0);
        }
        startup.startup_logs = proxy.logs().iter().map(report_line).collect();
        startup.startup_failures = proxy
            .take_errors()
            .iter()
            .map(ToString::to_string)
            .collect();
        if let Some(want) = &scenario.expect_start {
            let written = WrittenLog::harness(&proxy.logs());
            let failures = expect::check_start(want, true, &written);
            startup.startup_failures.extend(failures);
        }
        let http_calls = scenario.http_calls.iter().map(|c| c.to_canned()).collect();
        let run = Self {
            proxy,
            http_calls,
            grpc_calls,
            bootstrap: opts.bootstrap_for(scenario),
            swaps: Swaps::default(),
        };
        (Some(run), startup)
    }

    /// Runs one step and checks its expectations against what happened and what was logged
    /// meanwhile; delivery problems (a queue storm) are failures of the step.
    pub fn step(&mut self, step: &Step) -> StepReport {
        self.set_canned_replies(step);
        let (swaps, bootstrap) = (&mut self.swaps, &self.bootstrap);
        run_step(&mut self.proxy, step, &mut |proxy, swap| {
            swaps.apply(proxy, bootstrap, swap)
        })
    }

    /// Whether a root context has a timer armed (see [`Proxy::ticking`]).
    pub fn ticking(&self) -> bool {
        self.proxy.ticking()
    }

    /// Every log record so far (after start: the start-up's).
    pub fn log_records(&self) -> Vec<crate::engine::host::LogRecord> {
        self.proxy.logs()
    }

    /// What the run's log cap left out, if anything.
    pub fn log_dropped(&self) -> Option<crate::engine::host::log_book::Dropped> {
        Some(self.proxy.log_dropped()).filter(|d| *d != Default::default())
    }

    /// The step's canned replies first, then the scenario's.
    fn set_canned_replies(&mut self, step: &Step) {
        let (mut http, mut grpc) = (Vec::new(), Vec::new());
        if let Step::Request(req) = step {
            http.extend(req.http_calls.iter().map(|c| c.to_canned()));
            // Checked in `start`.
            grpc.extend(req.grpc_calls.iter().filter_map(|c| c.to_canned().ok()));
        }
        http.extend(self.http_calls.iter().cloned());
        grpc.extend(self.grpc_calls.iter().cloned());
        self.proxy.set_http_call_replies(http);
        self.proxy.set_grpc_call_replies(grpc);
    }
}

/// The scenario-wide canned gRPC replies, after checking every step's too.
fn canned_grpc(scenario: &Scenario) -> Result<Vec<CannedGrpcCall>, String> {
    for step in &scenario.requests {
        if let Step::Request(req) = step {
            for spec in &req.grpc_calls {
                spec.to_canned()
                    .map_err(|e| format!("request {:?}: {e}", req.name))?;
            }
        }
    }
    scenario
        .grpc_calls
        .iter()
        .map(|spec| {
            spec.to_canned()
                .map_err(|e| format!("scenario {}: {e}", scenario.path.display()))
        })
        .collect()
}

/// How a run applies a `swap_ecds` step to its proxy: the filters that changed, or why not.
type Swapper<'a> = dyn FnMut(&mut Proxy, &SwapStep) -> Result<Vec<String>, String> + 'a;

/// What the step does to the proxy: its outcome, and why it was not sent if it was not.
fn play(proxy: &mut Proxy, step: &Step, swap: &mut Swapper) -> (StepOutcome, Vec<String>) {
    match step {
        Step::Request(req) => {
            let reply = req.upstream_reply();
            let sent = proxy.send(
                req.listener.as_deref(),
                req.worker,
                &req.to_request(),
                &mut |_| reply.clone(),
            );
            match sent {
                Ok(ex) => (StepOutcome::Request(ex), Vec::new()),
                Err(e) => (StepOutcome::NotSent, vec![e.to_string()]),
            }
        }
        Step::Advance(adv) => {
            let ticks = proxy.advance(adv.advance.0);
            let advance = ClockAdvance {
                by: adv.advance.to_string(),
                ticks: Some(ticks),
            };
            (StepOutcome::Advance(advance), Vec::new())
        }
        Step::Connection(c) => match proxy.connect(c.listener.as_deref(), c.worker, &c.events()) {
            Ok(out) => (StepOutcome::Connection(out), Vec::new()),
            Err(e) => (StepOutcome::NotSent, vec![e.to_string()]),
        },
        Step::Shutdown(_) => {
            proxy.shutdown();
            (StepOutcome::Shutdown, Vec::new())
        }
        Step::Swap(s) => match swap(proxy, s) {
            Ok(changed) => (StepOutcome::Swap { changed }, Vec::new()),
            Err(e) => (StepOutcome::NotSent, vec![e]),
        },
    }
}

/// The step's expectations against its outcome and the lines `written` meanwhile (`None`
/// for a step not sent, whose failure is why); notes for the report go to `logs`.
fn check_step(
    proxy: &Proxy,
    step: &Step,
    outcome: &StepOutcome,
    written: &WrittenLog,
    calls: &[CallRecord],
    logs: &mut Vec<String>,
) -> Option<Vec<String>> {
    let mut failures;
    match (step, outcome) {
        (Step::Request(req), StepOutcome::Request(ex)) => {
            failures = expect::check_exchange(&req.expect, ex, written);
            if let Some(want) = &req.expect.calls {
                expect::check_calls(want, calls, &mut failures);
            }
            let e = &req.expect;
            expect::check_state(proxy, &e.metrics, &e.shared_data, &mut failures);
        }
        (Step::Connection(c), StepOutcome::Connection(out)) => {
            failures = expect::check_connection(&c.expect, out, written);
            let e = &c.expect;
            expect::check_state(proxy, &e.metrics, &e.shared_data, &mut failures);
        }
        (Step::Advance(adv), _) => failures = expect::check_log_expect(&adv.expect, written),
        (Step::Swap(s), StepOutcome::Swap { .. }) => {
            failures = expect::check_log_expect(&s.expect, written)
        }
        (Step::Shutdown(sd), _) => {
            failures = expect::check_log_expect(&sd.expect, written);
            // Not a failure by itself (a root may finish on a later tick), but worth seeing.
            for p in proxy.pending_done() {
                let thread = p
                    .worker
                    .map_or("the main thread".to_string(), |w| format!("worker {w}"));
                logs.push(format!(
                    "root context {} on {thread} is waiting to call proxy_done",
                    p.root
                ));
            }
        }
        // Not sent: the failure is why.
        _ => return None,
    }
    Some(failures)
}

/// Runs one step on `proxy` with the canned replies it has, and checks the step.
fn run_step(proxy: &mut Proxy, step: &Step, swap: &mut Swapper) -> StepReport {
    let log_start = proxy.log_len();
    let dropped_before = proxy.log_dropped();
    let calls_start = proxy.call_records().len();
    let calls_dropped_before = proxy.call_records().dropped();
    let (outcome, mut failures) = play(proxy, step, swap);
    let records = proxy.logs_since(log_start);
    let mut logs: Vec<String> = records.iter().map(report_line).collect();
    let dropped = proxy.log_dropped();
    if dropped != dropped_before {
        logs.push(format!(
            "(this step's log was cut: {} record(s) and {} byte(s) not kept; {dropped})",
            dropped.records - dropped_before.records,
            dropped.bytes - dropped_before.bytes
        ));
    }
    let calls = proxy.call_records()[calls_start..].to_vec();
    let calls_dropped = proxy.call_records().dropped() - calls_dropped_before;
    if calls_dropped > 0 {
        logs.push(format!(
            "(this step's callouts were not all recorded: {calls_dropped} call(s) answered but not kept; the harness keeps at most {} MiB of call records for a run)",
            crate::envoy::proxy::MAX_CALL_RECORD_BYTES >> 20
        ));
    }
    let written = WrittenLog::harness(&records);
    if let Some(checked) = check_step(proxy, step, &outcome, &written, &calls, &mut logs) {
        failures = checked;
    }
    failures.extend(proxy.take_errors().iter().map(ToString::to_string));
    StepReport {
        name: step.name(),
        outcome,
        failures,
        logs,
        log_records: records.to_vec(),
        calls,
    }
}
