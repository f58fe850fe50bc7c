//! The crate's layers, read from its source: the engine (`src/engine/`) names neither the
//! emulated Envoy nor the runner, the emulated Envoy (`src/envoy/`) does not name the runner,
//! no wing reaches another through the crate root's re-exports or a `super::` that climbs
//! out of it, every module is `foo.rs` + `foo/` (no `mod.rs`), and no source file is over
//! 650 lines.

use std::path::{Path, PathBuf};

const WINGS: [&str; 3] = ["engine", "envoy", "runner"];

/// The wings a file of `wing` may name: itself and those below it.
fn allowed(wing: &str) -> &'static [&'static str] {
    match wing {
        "engine" => &["engine"],
        "envoy" => &["engine", "envoy"],
        _ => &["engine", "envoy", "runner"],
    }
}

/// The names that follow `crate::` in `code` (comments left out): `crate::a::b` gives `a`,
/// `crate::{a, b::c}` gives `a` and `b`.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let mut start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 1 => start = true,
                        c if c.is_whitespace() => {}
                        _ if start && depth == 1 => {
                            names.push(ident(&group[i..]));
                            start = false;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        break;
                    }
                }
            } else {
                names.push(ident(rest));
            }
        }
    }
    names
}

/// The most `super::` in a row in `code` (comments left out).
fn deepest_super(code: &str) -> usize {
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(|line| {
            let mut runs = Vec::new();
            let (mut rest, mut run) = (line, 0);
            while let Some(i) = rest.find("super::") {
                run = if i == 0 && run > 0 { run + 1 } else { 1 };
                runs.push(run);
                rest = &rest[i + "super::".len()..];
            }
            runs
        })
        .max()
        .unwrap_or(0)
}

/// What is wrong with `code`, a file of `wing` whose module is `depth` levels below the crate
/// root (`engine.rs` is 1, `engine/host.rs` 2).
fn violations(wing: &str, depth: usize, code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for name in crate_paths(code) {
        if !WINGS.contains(&name.as_str()) {
            found.push(format!("names crate::{name}, not through a wing"));
        } else if !allowed(wing).contains(&name.as_str()) {
            found.push(format!(
                "the {wing} wing names crate::{name}, a wing above it"
            ));
        }
    }
    if deepest_super(code) >= depth {
        found.push(format!("a super:: path climbs out of the {wing} wing"));
    }
    found
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn no_wing_names_one_above_it_and_files_stay_short() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut checked = [0; 3];
    let mut problems = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&src).unwrap();
        let parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        assert_ne!(
            parts.last().unwrap(),
            "mod",
            "{}: use foo.rs + foo/, not foo/mod.rs",
            relative.display()
        );
        let code = std::fs::read_to_string(path).unwrap();
        if code.lines().count() > 650 {
            problems.push(format!("{}: over 650 lines", relative.display()));
        }
        let Some(w) = WINGS.iter().position(|w| *w == parts[0]) else {
            continue;
        };
        checked[w] += 1;
        for p in violations(WINGS[w], parts.len(), &code) {
            problems.push(format!("{}: {p}", relative.display()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Each wing has its face and its modules: a layout change that empties one fails here
    // rather than passing without checking anything.
    assert!(
        checked.iter().all(|n| *n >= 5),
        "files checked per wing: {checked:?}"
    );
}

#[test]
fn the_check_finds_arrows_upward() {
    assert!(violations(
        "engine",
        2,
        "use crate::engine::abi;\nuse crate::engine::{host, vm};"
    )
    .is_empty());
    assert!(!violations("engine", 2, "use crate::envoy::http::Request;").is_empty());
    assert!(!violations("engine", 2, "use crate::{engine::abi, runner::run};").is_empty());
    assert!(!violations(
        "envoy",
        3,
        "    let r = crate::runner::report::Verdict::Passed;"
    )
    .is_empty());
    assert!(!violations("engine", 2, "use crate::Proxy;").is_empty());
    assert!(!violations("engine", 2, "use super::super::envoy;").is_empty());
    assert!(violations("engine", 3, "use super::super::abi;").is_empty());
    assert!(violations("engine", 2, "//! Above it, crate::envoy::proxy drives it.").is_empty());
}
