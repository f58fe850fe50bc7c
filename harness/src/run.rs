//! Runs scenarios in the harness and produces reports with scripts' exit codes:
//! 0 every expectation held, 1 one failed, 2 the run could not start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::host::LogRecord;
use crate::http::Exchange;
use crate::proxy::{Proxy, ProxyOptions};
use crate::scenario::{self, Scenario, Step};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Passed = 0,
    Failed = 1,
    CannotStart = 2,
}

impl Verdict {
    pub fn exit_code(self) -> i32 {
        self as i32
    }
}

/// One step of a scenario: a request, or a clock advance.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub name: String,
    pub failures: Vec<String>,
    pub exchange: Option<Exchange>,
    /// For an advance step: how far the virtual clock moved (e.g. `3s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advanced: Option<String>,
    /// For an advance step: how many `proxy_on_tick` calls it made, all workers together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticks: Option<usize>,
    /// Log lines written while this step ran: `[worker N]`, then Envoy's format.
    pub logs: Vec<String>,
    /// HTTP and gRPC callouts made while this step ran, and how each was answered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<crate::http::CallRecord>,
    /// For a connection step: what each side received and who closed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection: Option<crate::proxy::TcpOutcome>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: PathBuf,
    pub verdict: Verdict,
    /// Why the run could not start (verdict 2).
    pub error: Option<String>,
    /// Log lines from VM start and configuration (`[main]` for the canary VM).
    pub startup_logs: Vec<String>,
    /// Problems while starting that do not stop the run (a queue storm at startup).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub startup_failures: Vec<String>,
    pub cases: Vec<CaseReport>,
    /// What the run's log cap left out, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_dropped: Option<crate::host::log_book::Dropped>,
}

/// What a caller may change about a scenario without editing it.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the scenario's worker count.
    pub workers: Option<usize>,
    /// Runs the scenario against this bootstrap instead of the one it names (for example a
    /// copy whose module path points into the fetcher's cache).
    pub bootstrap: Option<PathBuf>,
}

impl RunOptions {
    pub fn bootstrap_for(&self, scenario: &Scenario) -> PathBuf {
        self.bootstrap
            .clone()
            .unwrap_or_else(|| scenario.bootstrap_path())
    }
}

/// Runs one scenario file in the harness.
pub fn run_scenario(path: &Path, opts: &RunOptions) -> ScenarioReport {
    let mut report = ScenarioReport {
        scenario: path.to_path_buf(),
        verdict: Verdict::CannotStart,
        error: None,
        startup_logs: Vec::new(),
        startup_failures: Vec::new(),
        cases: Vec::new(),
        log_dropped: None,
    };
    let scenario = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    let options = ProxyOptions {
        workers: opts
            .workers
            .or(scenario.workers)
            .unwrap_or(ProxyOptions::default().workers),
    };
    let mut proxy = match Proxy::from_bootstrap(&opts.bootstrap_for(&scenario), &options) {
        Ok(p) => p,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    if let Some(budget) = scenario.callout_budget {
        proxy.set_callout_budget(budget.0);
    }
    report.startup_logs = proxy.logs().iter().map(report_line).collect();
    report.startup_failures = proxy
        .take_errors()
        .iter()
        .map(ToString::to_string)
        .collect();
    report.verdict = if report.startup_failures.is_empty() {
        Verdict::Passed
    } else {
        Verdict::Failed
    };
    let mut http_calls = Vec::new();
    for spec in &scenario.http_calls {
        http_calls.push(spec.to_canned());
    }
    let mut grpc_calls = Vec::new();
    for spec in &scenario.grpc_calls {
        match spec.to_canned() {
            Ok(c) => grpc_calls.push(c),
            Err(e) => {
                report.verdict = Verdict::CannotStart;
                report.error = Some(format!("scenario {}: {e}", path.display()));
                return report;
            }
        }
    }
    for step in &scenario.requests {
        // The step's canned replies first, then the scenario's.
        let (mut http, mut grpc) = (Vec::new(), Vec::new());
        if let Step::Request(req) = step {
            http.extend(req.http_calls.iter().map(|c| c.to_canned()));
            for spec in &req.grpc_calls {
                match spec.to_canned() {
                    Ok(c) => grpc.push(c),
                    Err(e) => {
                        report.verdict = Verdict::CannotStart;
                        report.error = Some(format!("request {:?}: {e}", req.name));
                        return report;
                    }
                }
            }
        }
        http.extend(http_calls.iter().cloned());
        grpc.extend(grpc_calls.iter().cloned());
        proxy.set_http_call_replies(http);
        proxy.set_grpc_call_replies(grpc);
        let case = run_step(&mut proxy, step);
        if !case.failures.is_empty() {
            report.verdict = Verdict::Failed;
        }
        report.cases.push(case);
    }
    report.log_dropped = Some(proxy.log_dropped()).filter(|d| *d != Default::default());
    report
}

/// A log line for reports: which thread wrote it (`main` for the canary VM Envoy runs at
/// configuration time, else the worker), then Envoy's own format.
pub fn report_line(record: &LogRecord) -> String {
    match record.worker {
        Some(w) => format!("[worker {w}] {record}"),
        None => format!("[main] {record}"),
    }
}

/// Checks custom metrics and shared data after a step.
fn check_state(
    proxy: &Proxy,
    metrics: &BTreeMap<String, u64>,
    shared_data: &BTreeMap<String, BTreeMap<String, String>>,
    failures: &mut Vec<String>,
) {
    for (name, want) in metrics {
        match proxy.metric(name) {
            Some(v) if v == *want => {}
            Some(v) => failures.push(format!("metric {name}: expected {want}, got {v}")),
            None => failures.push(format!(
                "metric {name}: expected {want}, but the plugin never defined it"
            )),
        }
    }
    for (vm_id, keys) in shared_data {
        for (key, want) in keys {
            match proxy.shared_data(vm_id, key) {
                Some(v) if v == want.as_bytes() => {}
                Some(v) => failures.push(format!(
                    "shared data {vm_id}/{key}: expected {want:?}, got {:?}",
                    String::from_utf8_lossy(&v)
                )),
                None => failures.push(format!(
                    "shared data {vm_id}/{key}: expected {want:?}, but it is not set"
                )),
            }
        }
    }
}

/// Runs one step and checks its expectations against what happened and what was logged
/// meanwhile; delivery problems (a queue storm) are failures of the step.
pub fn run_step(proxy: &mut Proxy, step: &Step) -> CaseReport {
    let before = proxy.log_len();
    let dropped_before = proxy.log_dropped();
    let calls_before = proxy.call_records().len();
    let calls_dropped_before = proxy.call_records().dropped();
    let mut case = CaseReport {
        name: step.name(),
        failures: Vec::new(),
        exchange: None,
        advanced: None,
        ticks: None,
        logs: Vec::new(),
        calls: Vec::new(),
        connection: None,
    };
    let mut outcome = None;
    let mut connection = None;
    match step {
        Step::Request(req) => {
            let reply = req.upstream_reply();
            outcome = Some(proxy.send(
                req.listener.as_deref(),
                req.worker,
                &req.to_request(),
                &mut |_| reply.clone(),
            ));
        }
        Step::Advance(adv) => {
            case.ticks = Some(proxy.advance(adv.advance.0));
            case.advanced = Some(adv.advance.to_string());
        }
        Step::Connection(c) => {
            connection = Some(proxy.connect(c.listener.as_deref(), c.worker, &c.events()));
        }
        Step::Shutdown(_) => {
            proxy.shutdown();
        }
    }
    let records = proxy.logs_since(before);
    case.logs = records.iter().map(report_line).collect();
    let dropped = proxy.log_dropped();
    if dropped != dropped_before {
        case.logs.push(format!(
            "(this step's log was cut: {} record(s) and {} byte(s) not kept; {dropped})",
            dropped.records - dropped_before.records,
            dropped.bytes - dropped_before.bytes
        ));
    }
    case.calls = proxy.call_records()[calls_before..].to_vec();
    let calls_dropped = proxy.call_records().dropped() - calls_dropped_before;
    if calls_dropped > 0 {
        case.logs.push(format!(
            "(this step's callouts were not all recorded: {calls_dropped} call(s) answered but not kept; the harness keeps at most {} MiB of call records for a run)",
            crate::proxy::MAX_CALL_RECORD_BYTES >> 20
        ));
    }
    case.failures = match (step, outcome, connection) {
        (Step::Request(req), Some(Ok(ex)), _) => {
            let mut failures = scenario::check(&req.expect, &ex, &records);
            if let Some(want) = &req.expect.calls {
                scenario::check_calls(want, &case.calls, &mut failures);
            }
            check_state(
                proxy,
                &req.expect.metrics,
                &req.expect.shared_data,
                &mut failures,
            );
            case.exchange = Some(ex);
            failures
        }
        (Step::Connection(c), _, Some(Ok(out))) => {
            let mut failures = scenario::check_connection(&c.expect, &out, &records);
            check_state(
                proxy,
                &c.expect.metrics,
                &c.expect.shared_data,
                &mut failures,
            );
            case.connection = Some(out);
            failures
        }
        (_, Some(Err(e)), _) | (_, _, Some(Err(e))) => vec![e.to_string()],
        (Step::Advance(adv), _, _) => scenario::check_advance(adv, &records),
        (Step::Shutdown(sd), _, _) => {
            let failures = scenario::check_log_expect(&sd.expect, &records);
            // Not a failure by itself (a root may finish on a later tick), but worth seeing.
            for p in proxy.pending_done() {
                let thread = p
                    .worker
                    .map_or("the main thread".to_string(), |w| format!("worker {w}"));
                case.logs.push(format!(
                    "root context {} on {thread} is waiting to call proxy_done",
                    p.root
                ));
            }
            failures
        }
        _ => Vec::new(),
    };
    case.failures
        .extend(proxy.take_errors().iter().map(ToString::to_string));
    case
}

impl std::fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "scenario {}", self.scenario.display())?;
        if let Some(e) = &self.error {
            return writeln!(f, "  cannot start: {e}");
        }
        for line in &self.startup_logs {
            writeln!(f, "  {line}")?;
        }
        for failure in &self.startup_failures {
            writeln!(f, "  FAIL at startup: {failure}")?;
        }
        for case in &self.cases {
            let mark = if case.failures.is_empty() {
                "ok  "
            } else {
                "FAIL"
            };
            match (&case.exchange, &case.advanced) {
                (Some(ex), _) => writeln!(f, "  {mark} {} (worker {})", case.name, ex.worker)?,
                (None, None) if case.connection.is_some() => {
                    let c = case.connection.as_ref().expect("checked");
                    writeln!(f, "  {mark} {} (worker {})", case.name, c.worker)?;
                    writeln!(
                        f,
                        "       upstream {:?} received {}; client received {}; closed by {}",
                        c.cluster,
                        summary_body(&c.upstream_received),
                        summary_body(&c.downstream_received),
                        c.closed_by
                    )?;
                    for held in &c.held {
                        writeln!(f, "       note: {held}")?;
                    }
                }
                (None, Some(by)) => writeln!(
                    f,
                    "  {mark} {} (clock +{by}, {} tick(s))",
                    case.name,
                    case.ticks.unwrap_or_default()
                )?,
                (None, None) => writeln!(f, "  {mark} {}", case.name)?,
            }
            if let Some(ex) = &case.exchange {
                if let Some(why) = &ex.reset {
                    writeln!(f, "       reset: {why}")?;
                }
                if let Some(resp) = &ex.response {
                    writeln!(
                        f,
                        "       response: {} {}",
                        resp.status,
                        summary_body(&resp.body)
                    )?;
                }
                match &ex.upstream {
                    Some(seen) => writeln!(
                        f,
                        "       upstream {:?} saw: {}",
                        seen.cluster,
                        seen.headers
                            .iter()
                            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )?,
                    None => writeln!(f, "       upstream: not reached ({:?})", ex.local_reply)?,
                }
            }
            for note in case.exchange.iter().flat_map(|e| &e.notes) {
                writeln!(f, "       note: {note}")?;
            }
            for call in &case.calls {
                let pseudo = |name: &str| {
                    crate::http::header(&call.headers, name)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                let target = match pseudo(":method") {
                    m if m.is_empty() => pseudo(":path"),
                    m => format!("{m} {}", pseudo(":path")),
                };
                writeln!(
                    f,
                    "       {} call to {:?}: {target} -> {}",
                    call.kind, call.cluster, call.answer
                )?;
            }
            for line in &case.logs {
                writeln!(f, "       {line}")?;
            }
            for failure in &case.failures {
                writeln!(f, "       expected: {failure}")?;
            }
        }
        if let Some(dropped) = &self.log_dropped {
            writeln!(f, "  note: {dropped}")?;
        }
        let failed = self.cases.iter().filter(|c| !c.failures.is_empty()).count();
        writeln!(
            f,
            "  {} passed, {} failed",
            self.cases.len() - failed,
            failed
        )
    }
}

/// The first 60 characters of a body, for a report line (cut on a character boundary).
fn summary_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{:?}...", &text[..cut]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_summary_never_cuts_a_character() {
        let body = format!("a{}", "\u{20ac}".repeat(100));
        assert_eq!(
            summary_body(body.as_bytes()),
            format!("{:?}...", format!("a{}", "\u{20ac}".repeat(59)))
        );
        assert_eq!(summary_body(b"short"), "\"short\"");
        let replaced = summary_body(&[0xff; 70]);
        assert_eq!(replaced.chars().filter(|c| *c == '\u{fffd}').count(), 60);
    }
}
