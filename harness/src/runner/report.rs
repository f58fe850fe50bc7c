//! What a scenario run reports: one outcome per step, the failed expectations, and the
//! verdict scripts read as an exit code (0 every expectation held, 1 one failed, 2 the run
//! could not start). The comparison with real Envoy reports Envoy's steps with the same
//! [`StepOutcome`].

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::engine::host::log_book::Dropped;
use crate::engine::host::LogRecord;
use crate::envoy::http::{CallRecord, Exchange};
use crate::envoy::proxy::TcpOutcome;

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

/// What one step did, in the harness or in real Envoy. In a JSON report the variant is the
/// key (`exchange`, `advance`, `connection`, `shutdown`, `not_sent`) beside the step's name.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// A request went through the filter chain (answered, reset or stalled on the way).
    #[serde(rename = "exchange")]
    Request(Exchange),
    /// The clock moved on: the harness's virtual clock, or real time for Envoy.
    Advance(ClockAdvance),
    /// A TCP connection: what each side received and who closed it.
    Connection(TcpOutcome),
    /// Every root context was told to finish; real Envoy got SIGTERM and exited.
    Shutdown,
    /// A filter's ECDS file was replaced; `changed`: the plugins (by name) that changed (the
    /// harness's reading; none for Envoy, whose stats say only that the update was applied).
    Swap { changed: Vec<String> },
    /// The step's traffic could not be sent (a listener of the other kind, a proxy that has
    /// shut down, a socket error, Envoy not running); the step's failures say why.
    NotSent,
}

/// How far an `advance` step moved the clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClockAdvance {
    /// e.g. `3s`; for real Envoy, the real time it was left to run.
    pub by: String,
    /// The `proxy_on_tick` calls it made, all workers together; Envoy's are not counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticks: Option<usize>,
}

impl StepOutcome {
    pub fn exchange(&self) -> Option<&Exchange> {
        match self {
            Self::Request(ex) => Some(ex),
            _ => None,
        }
    }

    pub fn connection(&self) -> Option<&TcpOutcome> {
        match self {
            Self::Connection(c) => Some(c),
            _ => None,
        }
    }

    pub fn advance(&self) -> Option<&ClockAdvance> {
        match self {
            Self::Advance(a) => Some(a),
            _ => None,
        }
    }
}

/// One step of a scenario as the harness ran it.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub name: String,
    #[serde(flatten)]
    pub outcome: StepOutcome,
    pub failures: Vec<String>,
    /// Log lines written while this step ran: `[worker N]`, then Envoy's format.
    pub logs: Vec<String>,
    /// The same lines as records (thread, source), for the comparison with real Envoy.
    #[serde(skip)]
    pub log_records: Vec<LogRecord>,
    /// HTTP and gRPC callouts made while this step ran, and how each was answered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallRecord>,
}

/// How the harness started a scenario's proxy.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Startup {
    /// Why the run could not start (verdict 2, unless `expect_start: rejected` wanted it).
    pub error: Option<String>,
    /// Whether the configuration was refused as Envoy refuses it (the canary rejected a
    /// plugin, or a module does not load), rather than being one the harness cannot run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// Whether the scenario wants it refused (`expect_start: rejected`).
    #[serde(skip)]
    pub refusal_expected: bool,
    /// Log lines from VM start and configuration (`[main]` for the canary VM).
    pub startup_logs: Vec<String>,
    /// Problems while starting that do not stop the run (a queue storm at startup).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub startup_failures: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: PathBuf,
    pub verdict: Verdict,
    #[serde(flatten)]
    pub startup: Startup,
    pub cases: Vec<StepReport>,
    /// What the run's log cap left out, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_dropped: Option<Dropped>,
}

/// A log line for reports: which thread wrote it (`main` for the canary VM Envoy runs at
/// configuration time, else the worker), then Envoy's own format.
pub fn report_line(record: &LogRecord) -> String {
    match record.worker {
        Some(w) => format!("[worker {w}] {record}"),
        None => format!("[main] {record}"),
    }
}

impl fmt::Display for Startup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.startup_logs {
            writeln!(f, "  {}", line.replace('\n', "\n    "))?;
        }
        for failure in &self.startup_failures {
            writeln!(f, "  FAIL at startup: {failure}")?;
        }
        Ok(())
    }
}

impl fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "scenario {}", self.scenario.display())?;
        if let Some(e) = &self.startup.error {
            if self.verdict == Verdict::CannotStart {
                return writeln!(f, "  cannot start: {e}");
            }
            writeln!(f, "  configuration refused: {e}")?;
        }
        write!(f, "{}", self.startup)?;
        for step in &self.cases {
            write!(f, "{step}")?;
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

impl fmt::Display for StepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.failures.is_empty() {
            "ok  "
        } else {
            "FAIL"
        };
        let name = &self.name;
        match &self.outcome {
            StepOutcome::Request(ex) => {
                writeln!(f, "  {mark} {name} (worker {})", ex.worker)?;
                if let Some(why) = ex.reset() {
                    writeln!(f, "       reset: {why}")?;
                }
                if let Some(resp) = ex.response() {
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
                for note in &ex.notes {
                    writeln!(f, "       note: {note}")?;
                }
            }
            StepOutcome::Connection(c) => {
                writeln!(f, "  {mark} {name} (worker {})", c.worker)?;
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
            StepOutcome::Advance(a) => writeln!(
                f,
                "  {mark} {name} (clock +{}, {} tick(s))",
                a.by,
                a.ticks.unwrap_or_default()
            )?,
            StepOutcome::Swap { changed } if changed.is_empty() => {
                writeln!(f, "  {mark} {name} (no filter changed)")?
            }
            StepOutcome::Swap { changed } => writeln!(
                f,
                "  {mark} {name} (new configuration: {})",
                changed.join(", ")
            )?,
            StepOutcome::Shutdown | StepOutcome::NotSent => writeln!(f, "  {mark} {name}")?,
        }
        for call in &self.calls {
            let pseudo = |name: &str| {
                crate::envoy::http::header(&call.headers, name)
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
        for line in &self.logs {
            // A VM failure's backtrace continues on lines of its own.
            writeln!(f, "       {}", line.replace('\n', "\n         "))?;
        }
        for failure in &self.failures {
            writeln!(f, "       expected: {failure}")?;
        }
        Ok(())
    }
}

/// The first 60 characters of a body, for a report line (cut on a character boundary).
pub(crate) fn summary_body(body: &[u8]) -> String {
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

    #[test]
    fn a_json_step_names_its_outcome_beside_its_name() {
        let step = StepReport {
            name: "tick".into(),
            outcome: StepOutcome::Advance(ClockAdvance {
                by: "3s".into(),
                ticks: Some(6),
            }),
            failures: Vec::new(),
            logs: Vec::new(),
            log_records: Vec::new(),
            calls: Vec::new(),
        };
        let v = serde_json::to_value(&step).unwrap();
        assert_eq!(v["name"], "tick");
        assert_eq!(v["advance"]["by"], "3s");
        assert_eq!(v["advance"]["ticks"], 6);
    }
}
