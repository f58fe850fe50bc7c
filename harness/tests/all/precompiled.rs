//! `vm_config.allow_precompiled`: code precompiled into the module, honoured only as Envoy
//! honours it (the plugin's runtime must be able to load that section).

use serde_json::json;
use wasm_harness::engine::precompiled_section as precompiled;
use wasm_harness::engine::runtime::Runtime;

use crate::support::*;

/// A module whose bytecode adds `x-wat: 1` but whose wasmtime section holds the code of a
/// guest adding `x-wat: P`: which value the upstream sees tells which code ran.
fn decoy(dir: &std::path::Path) -> std::path::PathBuf {
    let source = std::fs::read_to_string(guest("add-header.wat")).unwrap();
    let bytecode = wat::parse_str(&source).unwrap();
    let other = wat::parse_str(source.replace(
        r#"(data (i32.const 32) "1")"#,
        r#"(data (i32.const 32) "P")"#,
    ))
    .unwrap();
    let runtime = Runtime::new().unwrap();
    let name = precompiled::section_name().expect("a platform Envoy names");
    let embedded = precompiled::embed(runtime.engine(), &other).unwrap();
    let code = precompiled::find_section(&embedded, &name)
        .unwrap()
        .unwrap();
    let module = dir.join("decoy.wasm");
    std::fs::write(
        &module,
        precompiled::with_section(&bytecode, &name, code).unwrap(),
    )
    .unwrap();
    module
}

fn vm_config(runtime: &'static str, allow: bool) -> impl FnOnce(&mut serde_json::Value) {
    move |doc| {
        let vm = doc.pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config/vm_config").unwrap();
        vm["runtime"] = json!(runtime);
        vm["allow_precompiled"] = json!(allow);
    }
}

fn request_expecting(value: &str) -> String {
    format!("  - {{name: which code ran, request: {{path: /}}, expect: {{upstream: {{headers: {{x-wat: '{value}'}}}}}}}}\n")
}

#[test]
fn precompiled_code_runs_only_for_a_wasmtime_plugin_that_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let module = decoy(dir.path());
    for (runtime, allow, expected, source) in [
        (
            precompiled::WASMTIME_RUNTIME,
            true,
            "P",
            "precompiled code from its section precompiled_wasmtime_v",
        ),
        (
            precompiled::WASMTIME_RUNTIME,
            false,
            "1",
            "from its bytecode",
        ),
        ("envoy.wasm.runtime.v8", true, "1", "from its bytecode"),
    ] {
        let case = dir.path().join(format!("{allow}-{runtime}"));
        std::fs::create_dir_all(&case).unwrap();
        let b = bootstrap_variant(&case, &module, None, vm_config(runtime, allow));
        let s = scenario(&case, &b, &request_expecting(expected));
        let o = harness_without_cache(&["run", s.to_str().unwrap()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{runtime} allow_precompiled={allow}: {}",
            text(&o)
        );
        let v = harness_without_cache(&["validate", b.to_str().unwrap()]);
        assert!(
            text(&v).contains(source),
            "{runtime} allow_precompiled={allow}: {}",
            text(&v)
        );
    }
}

#[test]
fn a_section_that_does_not_load_falls_back_to_the_bytecode() {
    let dir = tempfile::tempdir().unwrap();
    let bytecode = wat::parse_file(guest("add-header.wat")).unwrap();
    let name = precompiled::section_name().unwrap();
    let module = dir.path().join("stale.wasm");
    // What another wasmtime (or a damaged file) leaves: bytes this engine refuses.
    std::fs::write(
        &module,
        precompiled::with_section(&bytecode, &name, b"\x7fELF not this engine's code").unwrap(),
    )
    .unwrap();
    let b = bootstrap_variant(
        dir.path(),
        &module,
        None,
        vm_config(precompiled::WASMTIME_RUNTIME, true),
    );
    let s = scenario(dir.path(), &b, &request_expecting("1"));
    let o = harness_without_cache(&["run", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn the_precompile_command_makes_a_module_the_harness_loads_and_envoy_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("filter.precompiled.wasm");
    let o = harness(&[
        "precompile",
        filter_wasm().to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("bytes of precompiled code in section precompiled_wasmtime_v"));

    // The demo, on the precompiled filter, in the harness with a wasmtime plugin.
    let b = bootstrap_variant(
        dir.path(),
        &out,
        None,
        vm_config(precompiled::WASMTIME_RUNTIME, true),
    );
    let v = harness_without_cache(&["validate", b.to_str().unwrap()]);
    assert!(
        text(&v).contains("precompiled code from its section"),
        "{}",
        text(&v)
    );
    let demo = root().join("testdata/scenarios/header-ops.yaml");
    let o = harness(&[
        "run",
        "--bootstrap",
        b.to_str().unwrap(),
        demo.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Real Envoy (V8) runs the same module with allow_precompiled, and agrees on the demo.
    let v8 = dir.path().join("v8");
    std::fs::create_dir_all(&v8).unwrap();
    let b = bootstrap_variant(&v8, &out, None, vm_config("envoy.wasm.runtime.v8", true));
    let report = wasm_harness::run_comparison(
        &envoy(),
        &demo,
        &wasm_harness::RunOptions {
            workers: Some(1),
            bootstrap: Some(b),
            ..Default::default()
        },
    );
    assert_eq!(report.verdict, wasm_harness::Verdict::Passed, "{report}");

    // Not a module: nothing written, and the error says what is wrong.
    let bad = dir.path().join("bad.wasm");
    let o = harness(&[
        "precompile",
        root().join("README.md").to_str().unwrap(),
        "-o",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a Wasm module"), "{}", text(&o));
    assert!(!bad.exists());
}

#[test]
fn real_envoy_ignores_a_wasmtime_section_under_v8_as_the_harness_does() {
    let dir = tempfile::tempdir().unwrap();
    let module = decoy(dir.path());
    let b = bootstrap_variant(
        dir.path(),
        &module,
        None,
        vm_config("envoy.wasm.runtime.v8", true),
    );
    let s = scenario(dir.path(), &b, &request_expecting("1"));
    let report = differential(&s);
    assert_eq!(report.verdict, wasm_harness::Verdict::Passed, "{report}");
    let envoy_saw = report.cases[0]
        .envoy
        .exchange()
        .unwrap()
        .upstream
        .as_ref()
        .unwrap();
    assert!(
        envoy_saw
            .headers
            .iter()
            .any(|(k, v)| k == "x-wat" && v == b"1"),
        "{:?}",
        envoy_saw.headers
    );
}
