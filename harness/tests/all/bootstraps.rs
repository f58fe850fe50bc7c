//! Bootstraps through real Envoy and the harness: every shipped bootstrap and every variant in
//! `testdata/bootstraps/` passes `envoy --mode validate`, and the harness either runs it or
//! refuses it naming the field its `# harness: refuses FIELD` line gives (a bootstrap whose
//! plugin refuses its configuration is refused by both); a TypedStruct
//! bootstrap and a listener-less one run the same in both.

use std::path::{Path, PathBuf};

use wasm_harness::compare;
use wasm_harness::real_envoy::EnvoyError;
use wasm_harness::{RunOptions, Verdict};

use crate::support::*;

/// Every Envoy bootstrap the repository ships or tests with (Istio resources left out).
fn bootstraps() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["envoy-config", "testdata/scenarios", "testdata/bootstraps"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let is_bootstrap = match dir {
                "testdata/scenarios" => name.ends_with(".bootstrap.yaml"),
                _ => name.ends_with(".yaml") || name.ends_with(".json"),
            };
            if is_bootstrap
                && !std::fs::read_to_string(&path)
                    .unwrap()
                    .contains("kind: WasmPlugin")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// What the file says Envoy and the harness do with it.
#[derive(Debug)]
enum Expect {
    /// Both run it.
    Runs,
    /// Envoy runs it; the harness refuses it naming this field (`# harness: refuses FIELD`).
    HarnessRefuses(String),
    /// Both start the plugin, which refuses its configuration, so neither starts
    /// (`# both: the plugin refuses its configuration`).
    PluginRefuses,
}

fn expected(text: &str) -> Expect {
    if text.contains("# both: the plugin refuses its configuration") {
        return Expect::PluginRefuses;
    }
    text.lines()
        .find_map(|l| l.strip_prefix("# harness: refuses "))
        .map_or(Expect::Runs, |f| {
            Expect::HarnessRefuses(f.trim().to_string())
        })
}

/// The bootstrap as Envoy can load it: each `.wat` module (harness-only guests) assembled
/// into `dir`, every other path as written (run from the repository root).
fn for_envoy(dir: &Path, path: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string(path).unwrap();
    let wats: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("filename:"))
        .map(str::trim)
        .filter(|w| w.ends_with(".wat"))
        .map(str::to_string)
        .collect();
    if wats.is_empty() {
        return path.to_path_buf();
    }
    for wat in wats {
        let wasm = dir
            .join(Path::new(&wat).file_name().unwrap())
            .with_extension("wasm");
        std::fs::write(&wasm, wat::parse_file(root().join(&wat)).unwrap()).unwrap();
        text = text.replace(&wat, wasm.to_str().unwrap());
    }
    let copy = dir.join(path.file_name().unwrap());
    std::fs::write(&copy, text).unwrap();
    copy
}

#[test]
fn every_bootstrap_passes_envoy_validate_and_the_harness_runs_or_refuses_it_by_field() {
    filter_wasm();
    let dir = tempfile::tempdir().unwrap();
    let all = bootstraps();
    assert!(all.len() >= 12, "{all:?}");
    let mut refused = 0;
    for path in &all {
        let shown = path.strip_prefix(root()).unwrap().display().to_string();
        let verdict =
            wasm_harness::real_envoy::validate_in(&envoy(), &for_envoy(dir.path(), path), &root());
        let expect = expected(&std::fs::read_to_string(path).unwrap());
        match (&expect, verdict) {
            (Expect::PluginRefuses, Err(EnvoyError::Rejected(log))) => assert!(
                log.contains("Unable to create Wasm plugin"),
                "{shown}: Envoy should refuse to start its plugin:\n{log}"
            ),
            (Expect::PluginRefuses, other) => {
                panic!("{shown}: Envoy should refuse to start its plugin: {other:?}")
            }
            (_, verdict) => {
                if let Err(e) = verdict {
                    panic!("{shown} failed envoy --mode validate:\n{e}");
                }
            }
        }

        let o = harness(&["validate", &shown]);
        match expect {
            Expect::Runs => assert_eq!(o.status.code(), Some(0), "{shown}: {}", text(&o)),
            Expect::PluginRefuses => {
                assert_eq!(o.status.code(), Some(2), "{shown}: {}", text(&o));
                assert!(
                    text(&o).contains("Unable to create Wasm plugin"),
                    "{shown}: {}",
                    text(&o)
                );
            }
            Expect::HarnessRefuses(field) => {
                refused += 1;
                assert_eq!(
                    o.status.code(),
                    Some(2),
                    "{shown} should be refused: {}",
                    text(&o)
                );
                assert!(
                    text(&o).contains(&format!("bootstrap: {field}: ")),
                    "{shown} should be refused naming {field}: {}",
                    text(&o)
                );
            }
        }
    }
    assert!(refused >= 6, "{refused} refusals");
}

/// The SDK-example shape (a single-map `listeners`, a udpa TypedStruct around the Wasm filter)
/// answers as real Envoy does, request by request.
#[test]
fn a_typed_struct_bootstrap_runs_the_same_in_the_harness_and_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        std::fs::read_to_string(root().join("testdata/bootstraps/sdk-example.yaml")).unwrap();
    let b = dir.path().join("sdk-example.yaml");
    std::fs::write(
        &b,
        text.replace(
            "target/wasm32-wasip1/wasm-release/wasm_filter.wasm",
            filter_wasm().to_str().unwrap(),
        ),
    )
    .unwrap();
    let report = compare::run_comparison(
        &envoy(),
        &root().join("testdata/scenarios/sdk-example.yaml"),
        &RunOptions {
            workers: Some(1),
            bootstrap: Some(b),
            ..RunOptions::default()
        },
    );
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 2, "{report}");
    for case in &report.cases {
        assert!(case.differences.is_empty(), "{report}");
    }
    let routed = report.cases[0].envoy.exchange().unwrap();
    let up = routed.upstream.as_ref().expect("envoy routed the request");
    assert!(
        up.headers
            .iter()
            .any(|(k, v)| k == "x-added-by" && v == b"typed-struct"),
        "{report}"
    );
    let direct = report.cases[1].envoy.exchange().unwrap();
    assert_eq!(
        direct.response().unwrap().body,
        b"Hello from the direct response\n"
    );
}

/// The same, as a user runs it: relative module paths inside the TypedStruct, from the
/// repository root, through `wasm-harness run --envoy`.
#[test]
fn the_cli_compares_the_shipped_typed_struct_scenario_with_envoy() {
    filter_wasm();
    let o = harness(&["run", "--envoy", "testdata/scenarios/sdk-example.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("harness vs real Envoy"), "{}", text(&o));
    assert!(text(&o).contains("2 passed, 0 failed"), "{}", text(&o));
}

/// A bootstrap of Wasm services only: Envoy starts it (no listener to wait for) and its
/// singleton ticks on the main thread alone, logging the summary the harness logs.
#[test]
fn a_listener_less_bootstrap_ticks_the_same_in_the_harness_and_in_envoy() {
    filter_wasm();
    let scenario = root().join("testdata/scenarios/services-only.yaml");
    // The module path is relative to the repository root and tests run from harness/: the
    // comparison gets a copy with it absolute.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("testdata/bootstraps/services-only.yaml"))
        .unwrap()
        .replace(
            "target/wasm32-wasip1/wasm-release/wasm_filter.wasm",
            filter_wasm().to_str().unwrap(),
        );
    let b = dir.path().join("services-only.yaml");
    std::fs::write(&b, text).unwrap();
    let report = compare::run_comparison(
        &envoy(),
        &scenario,
        &RunOptions {
            workers: Some(2),
            bootstrap: Some(b.clone()),
            ..RunOptions::default()
        },
    );
    assert_eq!(report.verdict, Verdict::Passed, "{report}");
    assert_eq!(report.cases.len(), 2, "{report}");
    assert!(
        report.cases.iter().all(|c| c.envoy.advance().is_some()),
        "{report}"
    );

    // Envoy's own log: summaries from one thread only, worded as the harness words them.
    let real = wasm_harness::real_envoy::RealEnvoy::start(&envoy(), &b, 2).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let summaries = || -> Vec<String> {
        real.wasm_logs()
            .into_iter()
            .filter(|l| l.contains("stats summary: "))
            .collect()
    };
    while summaries().len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let seen = summaries();
    assert!(seen.len() >= 2, "{:#?}", real.wasm_logs());
    let threads: std::collections::BTreeSet<&str> =
        seen.iter().filter_map(|l| l.split("][").nth(1)).collect();
    assert_eq!(threads.len(), 1, "{seen:#?}");

    let mut proxy =
        wasm_harness::Proxy::from_bootstrap(&b, &wasm_harness::ProxyOptions::with_workers(2))
            .unwrap();
    proxy.advance(std::time::Duration::from_secs(2));
    let harness_lines: Vec<_> = proxy
        .logs()
        .iter()
        .filter(|l| l.message.contains("stats summary: "))
        .map(|l| (l.worker, l.message.clone()))
        .collect();
    assert_eq!(harness_lines.len(), 2, "{harness_lines:?}");
    for (worker, message) in &harness_lines {
        assert_eq!(*worker, None, "the singleton runs on the main thread");
        let summary = &message[message.find("stats summary: ").unwrap()..];
        assert!(
            seen[0].ends_with(summary),
            "envoy: {}\nharness: {summary}",
            seen[0]
        );
    }
    // A request has nowhere to go, in the harness as in Envoy.
    let e = proxy
        .round_trip(
            &wasm_harness::Request::get("/"),
            wasm_harness::UpstreamReply::new(200),
        )
        .unwrap_err();
    assert!(e.to_string().contains("no listener"), "{e}");
}
