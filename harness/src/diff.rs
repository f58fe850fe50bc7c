//! Differential runs: the same scenario through the harness and through real Envoy, each
//! checked against the scenario's expectations and against each other.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::envoy::RealEnvoy;
use crate::http::{CallRecord, Exchange};
use crate::run::{self, RunOptions, ScenarioReport, Verdict};
use crate::scenario::{self, Scenario, Step};

/// Headers whose values legitimately differ between two runs (clock, ids, timing); only
/// their presence is compared.
const VOLATILE: &[&str] = &["x-request-id", "x-envoy-upstream-service-time"];
/// Not compared at all: `date` is Envoy's wall clock, which the harness does not add, and an
/// HTTP/1.1 upstream cannot observe `:scheme`.
const IGNORED: &[&str] = &["date", ":scheme"];
/// Real Envoy has no virtual clock: an `advance` step waits in real time (so its timers fire
/// too), at most this long.
pub const MAX_REAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Clone, Serialize)]
pub struct DiffCase {
    pub name: String,
    /// Expectations that failed on Envoy.
    pub envoy_failures: Vec<String>,
    /// Where Envoy and the harness disagree.
    pub differences: Vec<String>,
    pub envoy: Option<Exchange>,
    /// For an advance step: how long real Envoy was left to run (e.g. `3s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_waited: Option<String>,
    /// For a connection step: what each side received through real Envoy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_connection: Option<crate::proxy::TcpOutcome>,
    /// For a shutdown step: Envoy was stopped with SIGTERM and its exit logs checked.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub envoy_exited: bool,
}

/// A shutdown step through real Envoy: SIGTERM, wait for the exit, and check the step's log
/// expectations against the Wasm lines Envoy wrote meanwhile. Envoy's lines name threads by
/// id, not worker number, so counts tied to a worker stay the harness's alone.
fn envoy_shutdown(real: &mut RealEnvoy, name: &str, expect: &scenario::LogExpect) -> DiffCase {
    // Lines still waiting for Envoy's 50 ms log flush belong before the signal.
    std::thread::sleep(std::time::Duration::from_millis(150));
    let before = real.wasm_logs().len();
    let mut failures = Vec::new();
    match real.shutdown(std::time::Duration::from_secs(20)) {
        Ok(()) => {
            let lines = real.wasm_logs().split_off(before);
            for needle in &expect.logs {
                if !lines.iter().any(|l| l.contains(needle.as_str())) {
                    failures.push(format!(
                        "log: expected a line containing {needle:?}, Envoy wrote {} lines at shutdown",
                        lines.len()
                    ));
                }
            }
            for want in expect.log_counts.iter().filter(|c| c.worker.is_none()) {
                let got = lines
                    .iter()
                    .filter(|l| l.contains(want.contains.as_str()))
                    .count();
                if got != want.count {
                    failures.push(format!(
                        "log: expected {} line(s) containing {:?}, Envoy wrote {got}",
                        want.count, want.contains
                    ));
                }
            }
        }
        Err(e) => failures.push(e.to_string()),
    }
    DiffCase {
        name: name.to_string(),
        envoy_failures: failures,
        differences: Vec::new(),
        envoy: None,
        envoy_waited: None,
        envoy_connection: None,
        envoy_exited: true,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    pub harness: ScenarioReport,
    pub envoy_error: Option<String>,
    pub cases: Vec<DiffCase>,
    pub verdict: Verdict,
}

fn normalize(headers: &[(String, Vec<u8>)]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        if IGNORED.contains(&k.as_str()) {
            continue;
        }
        let value = if VOLATILE.contains(&k.as_str()) {
            "<any>".to_string()
        } else {
            String::from_utf8_lossy(v).into_owned()
        };
        out.entry(k.clone()).or_default().push(value);
    }
    out
}

fn diff_headers(
    what: &str,
    harness: &[(String, Vec<u8>)],
    envoy: &[(String, Vec<u8>)],
    out: &mut Vec<String>,
) {
    let (h, e) = (normalize(harness), normalize(envoy));
    for (k, hv) in &h {
        match e.get(k) {
            None => out.push(format!(
                "{what} header {k:?}: harness {hv:?}, envoy has none"
            )),
            Some(ev) if ev != hv => {
                out.push(format!("{what} header {k:?}: harness {hv:?}, envoy {ev:?}"))
            }
            _ => {}
        }
    }
    for (k, ev) in &e {
        if !h.contains_key(k) {
            out.push(format!(
                "{what} header {k:?}: envoy {ev:?}, harness has none"
            ));
        }
    }
}

/// Every way two exchanges differ in what a client or an upstream could observe.
pub fn compare(harness: &Exchange, envoy: &Exchange) -> Vec<String> {
    let mut out = Vec::new();
    match (&harness.upstream, &envoy.upstream) {
        (Some(h), Some(e)) => {
            if h.cluster != e.cluster {
                out.push(format!(
                    "upstream cluster: harness {:?}, envoy {:?}",
                    h.cluster, e.cluster
                ));
            }
            diff_headers("upstream request", &h.headers, &e.headers, &mut out);
            if h.body != e.body {
                out.push("upstream request body differs".into());
            }
        }
        (Some(_), None) => out.push("the harness reached the upstream, envoy did not".into()),
        (None, Some(_)) => out.push("envoy reached the upstream, the harness did not".into()),
        (None, None) => {}
    }
    match (&harness.response, &envoy.response) {
        (Some(h), Some(e)) => {
            if h.status != e.status {
                out.push(format!(
                    "response status: harness {}, envoy {}",
                    h.status, e.status
                ));
            }
            diff_headers("response", &h.headers, &e.headers, &mut out);
            if h.body != e.body {
                out.push(format!(
                    "response body: harness {:?}, envoy {:?}",
                    String::from_utf8_lossy(&h.body),
                    String::from_utf8_lossy(&e.body)
                ));
            }
        }
        (h, e) => {
            if h.is_some() != e.is_some() {
                out.push(format!(
                    "response: harness {}, envoy {}",
                    if h.is_some() { "answered" } else { "none" },
                    if e.is_some() { "answered" } else { "none" }
                ));
            }
        }
    }
    out
}

/// Runs `path` in the harness and in real Envoy with the same worker count.
/// HTTP callouts as their upstreams saw them (Envoy's gRPC calls are not observed).
fn compare_calls(harness: &[CallRecord], envoy: &[CallRecord], out: &mut Vec<String>) {
    let harness: Vec<&CallRecord> = harness.iter().filter(|c| c.kind == "http").collect();
    if harness.len() != envoy.len() {
        out.push(format!(
            "http callouts: harness made {}, envoy's upstreams saw {}",
            harness.len(),
            envoy.len()
        ));
        return;
    }
    for (n, (h, e)) in harness.iter().zip(envoy).enumerate() {
        let what = format!("callout {} to {:?}", n + 1, h.cluster);
        if h.cluster != e.cluster {
            out.push(format!("{what}: envoy sent it to {:?} instead", e.cluster));
        }
        diff_headers(&what, &h.headers, &e.headers, out);
        if h.body != e.body {
            out.push(format!(
                "{what} body: harness {:?}, envoy {:?}",
                String::from_utf8_lossy(&h.body),
                String::from_utf8_lossy(&e.body)
            ));
        }
    }
}

pub fn run_differential(envoy_bin: &Path, path: &Path, opts: &RunOptions) -> DiffReport {
    let harness = run::run_scenario(path, opts);
    let mut report = DiffReport {
        harness,
        envoy_error: None,
        cases: Vec::new(),
        verdict: Verdict::Passed,
    };
    let scenario = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            report.envoy_error = Some(e.to_string());
            report.verdict = Verdict::CannotStart;
            return report;
        }
    };
    let workers = opts.workers.or(scenario.workers).unwrap_or(2);
    let mut real = match RealEnvoy::start(envoy_bin, &opts.bootstrap_for(&scenario), workers) {
        Ok(r) => r,
        Err(e) => {
            // Both refusing the configuration is agreement; anything else is not.
            report.verdict = if report.harness.verdict == Verdict::CannotStart {
                Verdict::CannotStart
            } else {
                Verdict::Failed
            };
            report.envoy_error = Some(e.to_string());
            return report;
        }
    };
    if report.harness.verdict == Verdict::CannotStart {
        report.envoy_error = Some("envoy accepted a configuration the harness refused".into());
        report.verdict = Verdict::Failed;
        return report;
    }
    for (step, hcase) in scenario.requests.iter().zip(&report.harness.cases) {
        let case = match step {
            Step::Request(case) => case,
            Step::Connection(c) => {
                let mut case = DiffCase {
                    name: step.name(),
                    envoy_failures: Vec::new(),
                    differences: Vec::new(),
                    envoy: None,
                    envoy_waited: None,
                    envoy_connection: None,
                    envoy_exited: false,
                };
                match real.connect(c.listener.as_deref(), &c.events()) {
                    Ok(out) => {
                        // Only the bytes: who closed is the harness's reading, and Envoy's log
                        // is not split per connection.
                        let expect = scenario::ConnectionExpect {
                            upstream_received: c.expect.upstream_received.clone(),
                            downstream_received: c.expect.downstream_received.clone(),
                            ..Default::default()
                        };
                        case.envoy_failures = scenario::check_connection(&expect, &out, &[]);
                        if let Some(h) = &hcase.connection {
                            for (what, hb, eb) in [
                                (
                                    "upstream received",
                                    &h.upstream_received,
                                    &out.upstream_received,
                                ),
                                (
                                    "client received",
                                    &h.downstream_received,
                                    &out.downstream_received,
                                ),
                            ] {
                                if hb != eb {
                                    case.differences.push(format!(
                                        "{what}: harness {:?}, envoy {:?}",
                                        String::from_utf8_lossy(hb),
                                        String::from_utf8_lossy(eb)
                                    ));
                                }
                            }
                        }
                        case.envoy_connection = Some(out);
                    }
                    Err(e) => case.envoy_failures.push(e.to_string()),
                }
                if !case.envoy_failures.is_empty() || !case.differences.is_empty() {
                    report.verdict = Verdict::Failed;
                }
                report.cases.push(case);
                continue;
            }
            Step::Shutdown(sd) => {
                report
                    .cases
                    .push(envoy_shutdown(&mut real, &step.name(), &sd.expect));
                if report
                    .cases
                    .last()
                    .is_some_and(|c| !c.envoy_failures.is_empty())
                {
                    report.verdict = Verdict::Failed;
                }
                continue;
            }
            Step::Advance(adv) => {
                // Its log expectations are the harness's alone, as for requests.
                let wait = adv.advance.0.min(MAX_REAL_WAIT);
                std::thread::sleep(wait);
                report.cases.push(DiffCase {
                    name: step.name(),
                    envoy_failures: Vec::new(),
                    differences: Vec::new(),
                    envoy: None,
                    envoy_waited: Some(crate::proxy::format_duration(wait)),
                    envoy_connection: None,
                    envoy_exited: false,
                });
                continue;
            }
        };
        let mut expect = case.expect.clone();
        // Envoy's log is not split per request, and it cannot say who made a local reply.
        expect.logs.clear();
        expect.log_counts.clear();
        expect.local_reply = None;
        // The callout clusters' upstreams answer as the scenario's canned replies say.
        let calls: Vec<_> = case
            .http_calls
            .iter()
            .chain(&scenario.http_calls)
            .map(|c| c.to_canned())
            .collect();
        let result = real.send_with_calls(
            case.listener.as_deref(),
            &case.to_request(),
            &case.upstream_reply(),
            &calls,
        );
        let (envoy_failures, differences, envoy) = match result {
            Ok((ex, envoy_calls)) => {
                let mut failures = scenario::check(&expect, &ex, &[]);
                if let Some(want) = &expect.calls {
                    scenario::check_calls(want, &envoy_calls, &mut failures);
                }
                let mut diffs = hcase
                    .exchange
                    .as_ref()
                    .map(|h| compare(h, &ex))
                    .unwrap_or_default();
                compare_calls(&hcase.calls, &envoy_calls, &mut diffs);
                (failures, diffs, Some(ex))
            }
            Err(e) => (vec![e.to_string()], Vec::new(), None),
        };
        if !envoy_failures.is_empty() || !differences.is_empty() {
            report.verdict = Verdict::Failed;
        }
        report.cases.push(DiffCase {
            name: case.name.clone(),
            envoy_failures,
            differences,
            envoy,
            envoy_waited: None,
            envoy_connection: None,
            envoy_exited: false,
        });
    }
    report.verdict = report.verdict.max(report.harness.verdict);
    report
}

impl std::fmt::Display for DiffReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "scenario {} — harness vs real Envoy",
            self.harness.scenario.display()
        )?;
        if let Some(e) = &self.harness.error {
            writeln!(f, "  harness: cannot start: {e}")?;
        }
        if let Some(e) = &self.envoy_error {
            writeln!(f, "  envoy: {e}")?;
        }
        for (h, d) in self.harness.cases.iter().zip(&self.cases) {
            let agree = d.differences.is_empty();
            let ok = h.failures.is_empty() && d.envoy_failures.is_empty() && agree;
            writeln!(f, "  {} {}", if ok { "ok  " } else { "FAIL" }, h.name)?;
            if let Some(by) = &h.advanced {
                writeln!(
                    f,
                    "       harness: clock +{by}, {} tick(s) | envoy: waited {} of real time",
                    h.ticks.unwrap_or_default(),
                    d.envoy_waited.as_deref().unwrap_or("0s")
                )?;
                for x in &h.failures {
                    writeln!(f, "       harness expected: {x}")?;
                }
                continue;
            }
            if d.envoy_exited {
                writeln!(
                    f,
                    "       harness: roots got on_done / on_delete | envoy: exited on SIGTERM, its shutdown log checked"
                )?;
                for x in h
                    .failures
                    .iter()
                    .map(|x| ("harness expected", x))
                    .chain(d.envoy_failures.iter().map(|x| ("envoy expected", x)))
                {
                    writeln!(f, "       {}: {}", x.0, x.1)?;
                }
                continue;
            }
            if let Some(hc) = &h.connection {
                let bytes = |c: &crate::proxy::TcpOutcome| {
                    format!(
                        "upstream got {:?}, client got {:?}",
                        String::from_utf8_lossy(&c.upstream_received),
                        String::from_utf8_lossy(&c.downstream_received)
                    )
                };
                writeln!(
                    f,
                    "       harness: {} | envoy: {}",
                    bytes(hc),
                    d.envoy_connection
                        .as_ref()
                        .map(bytes)
                        .unwrap_or_else(|| "no connection".into())
                )?;
                for x in h
                    .failures
                    .iter()
                    .map(|x| ("harness expected", x))
                    .chain(d.envoy_failures.iter().map(|x| ("envoy expected", x)))
                    .chain(d.differences.iter().map(|x| ("differs", x)))
                {
                    writeln!(f, "       {}: {}", x.0, x.1)?;
                }
                continue;
            }
            let status = |ex: &Option<Exchange>| match ex.as_ref().and_then(|e| e.response.as_ref())
            {
                Some(r) => format!("{} {:?}", r.status, String::from_utf8_lossy(&r.body)),
                None => "no response".into(),
            };
            let reached =
                |ex: &Option<Exchange>| match ex.as_ref().and_then(|e| e.upstream.as_ref()) {
                    Some(u) => format!("upstream {:?}", u.cluster),
                    None => "no upstream".into(),
                };
            writeln!(
                f,
                "       harness: {:<28} {:<20} | envoy: {:<28} {}",
                status(&h.exchange),
                reached(&h.exchange),
                status(&d.envoy),
                reached(&d.envoy)
            )?;
            for x in &h.failures {
                writeln!(f, "       harness expected: {x}")?;
            }
            for x in &d.envoy_failures {
                writeln!(f, "       envoy expected: {x}")?;
            }
            for x in &d.differences {
                writeln!(f, "       differs: {x}")?;
            }
        }
        let failed = self
            .harness
            .cases
            .iter()
            .zip(&self.cases)
            .filter(|(h, d)| {
                !(h.failures.is_empty() && d.envoy_failures.is_empty() && d.differences.is_empty())
            })
            .count();
        writeln!(
            f,
            "  {} passed, {} failed",
            self.cases.len() - failed,
            failed
        )
    }
}
