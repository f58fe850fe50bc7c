//! The log against real Envoy 1.40: which guest lines the log level lets through and what
//! `proxy_get_log_level` answers, a trap in V8's words, a refused configuration and the
//! start-up lines, and the comparison of every step's lines thread by thread.

use std::path::{Path, PathBuf};

use wasm_harness::compare::LogComparison;
use wasm_harness::real_envoy::log::EnvoyLogReader;
use wasm_harness::real_envoy::RealEnvoy;
use wasm_harness::{LogLevel, Proxy, ProxyOptions, Request, RunOptions, UpstreamReply, Verdict};

use crate::support::*;

/// A copy of the shipped scenario `name` beside a copy of `bootstrap` whose module is the
/// assembled `guest` (real Envoy loads binary modules only).
pub(crate) fn shipped_with_binary_guest(
    dir: &Path,
    name: &str,
    bootstrap: &str,
    guest: &str,
) -> PathBuf {
    shipped_with_binary_guests(dir, name, bootstrap, &[guest])
}

fn options(level: Option<LogLevel>) -> RunOptions {
    RunOptions {
        workers: Some(1),
        log_level: level,
        ..Default::default()
    }
}

/// The guest's lines Envoy wrote for one request at `level`, and the harness's.
fn request_lines(level: LogLevel, path: &str) -> (Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "log-levels.wat");
    let b = bootstrap_variant(dir.path(), &module, Some(""), |_| {});
    let guest_text = |text: &str| text.split_once(": ").map(|(_, m)| m.to_string());

    let mut proxy = Proxy::from_bootstrap(
        &b,
        &ProxyOptions {
            log_level: level,
            ..ProxyOptions::with_workers(1)
        },
    )
    .unwrap();
    let from = proxy.log_len();
    proxy
        .round_trip(&Request::get(path), UpstreamReply::new(200))
        .unwrap();
    let harness: Vec<String> = proxy.logs()[from..]
        .iter()
        .map(|r| format!("[{}] {}", r.level.as_str(), r.message))
        .collect();

    let mut real = RealEnvoy::start_at_level(&envoy(), &b, 1, level).unwrap();
    let mut reader = EnvoyLogReader::new(&real.log_path);
    std::thread::sleep(std::time::Duration::from_millis(200));
    reader.since_last();
    real.send(None, &Request::get(path), &UpstreamReply::new(200))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let envoy: Vec<String> = reader
        .since_last()
        .iter()
        .filter(|r| r.logger == "wasm" && r.text.starts_with("wasm log"))
        .filter_map(|r| Some(format!("[{}] {}", r.level, guest_text(&r.text)?)))
        .collect();
    (harness, envoy)
}

#[test]
fn the_log_level_decides_which_guest_lines_are_written_as_in_envoy() {
    for (level, answer, first, absent) in [
        (
            LogLevel::Info,
            "2",
            "[info] on_request_headers: info line",
            "debug line",
        ),
        (
            LogLevel::Debug,
            "1",
            "[debug] on_request_headers: debug line",
            "trace line",
        ),
        (
            LogLevel::Trace,
            "0",
            "[trace] on_request_headers: trace line",
            "no such line",
        ),
        (
            LogLevel::Warn,
            "",
            "[warning] on_request_headers: warn line",
            "info line",
        ),
    ] {
        let (harness, envoy) = request_lines(level, "/");
        assert_eq!(harness, envoy, "at {level}");
        assert!(harness.iter().any(|l| l == first), "{level}: {harness:#?}");
        assert!(
            !harness.iter().any(|l| l.contains(absent)),
            "{level}: {harness:#?}"
        );
        // `proxy_get_log_level` answers the level (logged at info, so shown from info down).
        let answered = harness
            .iter()
            .any(|l| l.ends_with(&format!("host log level is {answer}")));
        assert_eq!(answered, !answer.is_empty(), "{level}: {harness:#?}");
    }
}

#[test]
fn the_cli_and_the_scenario_set_the_log_level() {
    let s = "testdata/scenarios/log-levels.yaml";
    let o = harness(&["run", s]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("[debug] wasm log logs logs log-levels: on_request_headers: debug line")
    );
    // -l overrides the scenario's level: at info no debug line is written, so the
    // scenario's expectation of one fails.
    let o = harness(&["run", "-l", "info", s]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!text(&o).contains("debug line\n"), "{}", text(&o));
    assert!(text(&o).contains("expected a line containing \"host log level is 1\""));
    let o = harness(&["run", "-l", "loud", s]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("expected one of trace, debug, info, warning"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_trap_is_reported_in_the_words_of_envoys_v8() {
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "traps.wat");
    let b = bootstrap_variant(dir.path(), &module, Some(""), |_| {});
    for (path, words) in [
        ("/unreachable", "Uncaught RuntimeError: unreachable"),
        (
            "/memory",
            "Uncaught RuntimeError: memory access out of bounds",
        ),
        ("/divide", "Uncaught RuntimeError: divide by zero"),
        (
            "/overflow",
            "Uncaught RuntimeError: divide result unrepresentable",
        ),
        (
            "/stack",
            "Uncaught RangeError: Maximum call stack size exceeded",
        ),
        (
            "/null",
            "Uncaught RuntimeError: function signature mismatch",
        ),
        (
            "/table",
            "Uncaught RuntimeError: table index is out of bounds",
        ),
        (
            "/wrong-type",
            "Uncaught RuntimeError: function signature mismatch",
        ),
    ] {
        let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
        let ex = proxy
            .round_trip(&Request::get(path), UpstreamReply::new(200))
            .unwrap();
        assert_eq!(ex.response_status(), Some(503));
        let harness = proxy
            .logs()
            .iter()
            .find(|r| r.message.starts_with("Function: "))
            .map(|r| (r.level, r.message.clone()))
            .unwrap();
        assert_eq!(harness.0, LogLevel::Error, "{path}");

        let mut real = RealEnvoy::start(&envoy(), &b, 1).unwrap();
        let mut reader = EnvoyLogReader::new(&real.log_path);
        let e = real
            .send(None, &Request::get(path), &UpstreamReply::new(200))
            .unwrap();
        assert_eq!(e.response_status(), Some(503));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let envoy = reader
            .since_last()
            .into_iter()
            .find(|r| r.is_vm_failure())
            .unwrap_or_else(|| panic!("{path}: Envoy wrote no failure"));
        assert_eq!(envoy.level, "error");
        let first = |m: &str| m.lines().next().unwrap().to_string();
        assert_eq!(
            first(&harness.1),
            format!("Function: proxy_on_request_headers failed: {words}"),
            "{path}"
        );
        assert_eq!(first(&harness.1), first(&envoy.text), "{path}");
        // The module names functions, so both print V8's backtrace; its first frame names
        // the same function (the offset is where each engine places the trap: the same
        // instruction, or the block it opens).
        let frame = |m: &str| {
            let lines: Vec<&str> = m.lines().take(3).collect();
            let function = lines[2].rsplit_once(" - ").map(|(_, f)| f.to_string());
            (lines[1].to_string(), function)
        };
        assert_eq!(frame(&harness.1), frame(&envoy.text), "{path}");
    }
}

#[test]
fn a_refused_configuration_is_expected_in_the_harness_and_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped_with_binary_guest(
        dir.path(),
        "log-rejected.yaml",
        "log-rejected.bootstrap.yaml",
        "log-levels.wat",
    );
    let o = harness(&["run", "testdata/scenarios/log-rejected.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = wasm_harness::run_comparison(&envoy(), &s, &options(None));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert!(report.harness.refused, "{report}");
    assert!(report.envoy_error.is_some(), "{report}");

    // An expectation Envoy's log does not meet fails on Envoy's side too.
    let text_of = std::fs::read_to_string(&s).unwrap();
    std::fs::write(
        &s,
        text_of.replace("Plugin logs failed to load", "Plugin logs exploded"),
    )
    .unwrap();
    let report = wasm_harness::run_comparison(&envoy(), &s, &options(None));
    assert_eq!(report.verdict, Verdict::Failed, "{report}");
    assert!(
        report
            .envoy_startup_failures
            .iter()
            .any(|f| f.contains("Plugin logs exploded")),
        "{report}"
    );
    assert!(!report.harness.startup_failures.is_empty(), "{report}");

    // Expecting a refusal of a configuration that starts fails in both, and without
    // `expect_start` a refusal is the exit-2 case.
    let accepting = dir.path().join("accepting.yaml");
    std::fs::write(
        &accepting,
        format!(
            "bootstrap: {}\nworkers: 1\nexpect_start: rejected\nrequests: []\n",
            root()
                .join("testdata/scenarios/log-levels.bootstrap.yaml")
                .display()
        ),
    )
    .unwrap();
    let o = harness(&["run", accepting.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("expected the configuration to be refused, but it started"));
    let plain = dir.path().join("plain.yaml");
    std::fs::write(
        &plain,
        format!(
            "bootstrap: {}\nrequests: []\n",
            root()
                .join("testdata/scenarios/log-rejected.bootstrap.yaml")
                .display()
        ),
    )
    .unwrap();
    assert_eq!(
        harness(&["run", plain.to_str().unwrap()]).status.code(),
        Some(2)
    );
}

#[test]
fn start_up_and_request_lines_are_compared_with_envoys_thread_by_thread() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped_with_binary_guest(
        dir.path(),
        "log-levels.yaml",
        "log-levels.bootstrap.yaml",
        "log-levels.wat",
    );
    let report = wasm_harness::run_comparison(&envoy(), &s, &options(None));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert!(report.envoy_startup_failures.is_empty(), "{report}");
    assert_eq!(report.startup_logs, Some(LogComparison::Same), "{report}");
    for case in &report.cases {
        assert_eq!(case.logs, LogComparison::Same, "{report}");
        assert!(case.envoy_failures.is_empty(), "{report}");
    }
    // At another level both write other lines, and still the same ones.
    let report = wasm_harness::run_comparison(&envoy(), &s, &options(Some(LogLevel::Trace)));
    assert_eq!(report.startup_logs, Some(LogComparison::Same), "{report}");
    assert!(
        report.cases[0]
            .harness
            .logs
            .iter()
            .any(|l| l.contains("on_request_headers: trace line")),
        "{report}"
    );
    assert_eq!(report.cases[0].logs, LogComparison::Same, "{report}");
}

#[test]
fn a_step_whose_lines_cannot_be_compared_says_why() {
    // tick.wat logs on every tick: during an advance, Envoy's timers run in real time.
    let dir = tempfile::tempdir().unwrap();
    let module = assembled(dir.path(), "tick.wat");
    let b = bootstrap_variant(dir.path(), &module, Some(""), |_| {});
    let s = dir.path().join("ticks.yaml");
    std::fs::write(
        &s,
        format!(
            "bootstrap: {}\nworkers: 1\nrequests:\n  - {{advance: 2500ms}}\n  - {{name: a request, request: {{path: /}}}}\n",
            b.display()
        ),
    )
    .unwrap();
    let report = wasm_harness::run_comparison(&envoy(), &s, &options(None));
    let (short, verbose) = (report.to_string(), format!("{report:#}"));
    for case in &report.cases {
        match &case.logs {
            LogComparison::Same => {}
            LogComparison::CannotCompare { why, lines } => {
                assert!(why.contains("real time"), "{why}");
                // The report gives the reason in one short line; the lines only verbosely.
                let said = short.lines().find(|l| l.contains(why.as_str())).unwrap();
                assert!(said.len() < 120, "{said}");
                for line in lines {
                    assert!(!short.contains(line.as_str()), "{short}");
                    assert!(verbose.contains(line.as_str()), "{verbose}");
                }
            }
            // Lines only one side's ticks added while the step ran: explained, and listed.
            LogComparison::Timing { lines } => assert!(!lines.is_empty(), "{report}"),
            LogComparison::Differs(d) => panic!("an unexplained difference: {d:?}\n{report}"),
        }
    }
    assert!(!report.cases.iter().any(|c| c.logs.differs()), "{report}");
    // The CLI's --verbose prints the longer report.
    let cli = harness(&["run", "--envoy", "--verbose", s.to_str().unwrap()]);
    assert_eq!(cli.status.code(), Some(0), "{}", text(&cli));
    assert!(text(&cli).contains("scenario"), "{}", text(&cli));
}

#[test]
fn on_log_reads_the_maps_envoys_access_log_phase_hands_it() {
    // Request and response headers (`:status` too) in on_log, request trailers NotFound,
    // every map read-only; none in on_done: the shipped scenario holds both sides to it.
    let dir = tempfile::tempdir().unwrap();
    let s = shipped_with_binary_guest(
        dir.path(),
        "log-maps.yaml",
        "log-maps.bootstrap.yaml",
        "log-maps.wat",
    );
    let report = wasm_harness::run_comparison(&envoy(), &s, &options(None));
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases[0].logs, LogComparison::Same, "{report}");
    assert!(report.cases[0].envoy_failures.is_empty(), "{report}");
}
