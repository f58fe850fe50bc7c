//! Runs scenarios in the harness and produces reports with scripts' exit codes:
//! 0 every expectation held, 1 one failed, 2 the run could not start.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::http::Exchange;
use crate::proxy::{Proxy, ProxyOptions};
use crate::scenario::{self, Scenario};

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

#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub name: String,
    pub failures: Vec<String>,
    pub exchange: Option<Exchange>,
    /// Log lines written while this request ran, in Envoy's format.
    pub logs: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: PathBuf,
    pub verdict: Verdict,
    /// Why the run could not start (verdict 2).
    pub error: Option<String>,
    /// Log lines from VM start and configuration.
    pub startup_logs: Vec<String>,
    pub cases: Vec<CaseReport>,
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
        cases: Vec::new(),
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
    report.startup_logs = proxy.logs().iter().map(ToString::to_string).collect();
    report.verdict = Verdict::Passed;
    for case in &scenario.requests {
        let before = proxy.log_len();
        let reply = case.upstream_reply();
        let result = proxy.send(
            case.listener.as_deref(),
            case.worker,
            &case.to_request(),
            &mut |_| reply.clone(),
        );
        let logs: Vec<String> = proxy.logs()[before..]
            .iter()
            .map(ToString::to_string)
            .collect();
        let (failures, exchange) = match result {
            Ok(ex) => (scenario::check(&case.expect, &ex, &logs), Some(ex)),
            Err(e) => (vec![e], None),
        };
        if !failures.is_empty() {
            report.verdict = Verdict::Failed;
        }
        report.cases.push(CaseReport {
            name: case.name.clone(),
            failures,
            exchange,
            logs,
        });
    }
    report
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
        for case in &self.cases {
            let mark = if case.failures.is_empty() {
                "ok  "
            } else {
                "FAIL"
            };
            let worker = case.exchange.as_ref().map(|e| e.worker).unwrap_or_default();
            writeln!(f, "  {mark} {} (worker {worker})", case.name)?;
            if let Some(ex) = &case.exchange {
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
            for line in &case.logs {
                writeln!(f, "       {line}")?;
            }
            for failure in &case.failures {
                writeln!(f, "       expected: {failure}")?;
            }
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

fn summary_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if text.len() > 60 {
        format!("{:?}...", &text[..60])
    } else {
        format!("{text:?}")
    }
}
