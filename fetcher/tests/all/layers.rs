//! The crate's layers, read from its source: the pull engine (everything but `envoy/`,
//! `serve/` and the CLI) never names the Envoy configuration code or `serve`; the
//! configuration code (`envoy/`) names the engine only through what `lib.rs` makes public; and
//! no two top-level modules, one of them a folder, depend on each other (a circle across
//! folders).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The top-level modules `text` names through `crate::` paths, comments left out
/// (`use crate::{a, b::c}` names `a` and `b`).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or_default();
                for item in inner.split(',') {
                    out.extend(ident(item.trim()));
                }
            } else {
                out.extend(ident(rest));
            }
        }
    }
    out
}

fn ident(s: &str) -> Option<String> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| s[..end].to_string())
}

/// The top-level module a file under `src/` belongs to (`envoy/render.rs` is `envoy`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// What `lib.rs` makes public: its `pub mod`s and the names of its `pub use`s.
fn public_face() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut face = BTreeSet::new();
    for line in lib.lines() {
        if let Some(m) = line.strip_prefix("pub mod ") {
            face.extend(ident(m));
        } else if let Some(u) = line.strip_prefix("pub use ") {
            let names = match u.split_once('{') {
                Some((_, group)) => group.split('}').next().unwrap_or_default().to_string(),
                None => u.rsplit("::").next().unwrap_or_default().to_string(),
            };
            for name in names.split(',') {
                let name = name.trim().trim_end_matches(';');
                let shown = name.rsplit(" as ").next().unwrap_or(name);
                face.extend(ident(shown.trim()));
            }
        }
    }
    face
}

/// Each file's top-level module and the top-level modules it names.
fn graph() -> Vec<(PathBuf, String, BTreeSet<String>)> {
    rust_files(&src())
        .into_iter()
        .filter(|p| {
            let m = module_of(p);
            m != "cli" && m != "main" && m != "lib"
        })
        .map(|p| {
            let refs = crate_refs(&std::fs::read_to_string(&p).unwrap());
            let m = module_of(&p);
            (p, m, refs)
        })
        .collect()
}

/// The modules above the pull engine.
const ABOVE_ENGINE: [&str; 2] = ["envoy", "serve"];

#[test]
fn the_pull_engine_never_names_the_configuration_code_or_serve() {
    let wrong: Vec<String> = graph()
        .into_iter()
        .filter(|(_, m, _)| !ABOVE_ENGINE.contains(&m.as_str()))
        .flat_map(|(p, _, refs)| {
            refs.into_iter()
                .filter(|r| ABOVE_ENGINE.contains(&r.as_str()))
                .map(move |r| format!("{} names crate::{r}", p.display()))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_configuration_code_uses_only_the_engines_public_face() {
    let face = public_face();
    for expected in ["pull", "Cache", "PullRequest", "Pulled", "envoy"] {
        assert!(face.contains(expected), "{expected} missing from {face:?}");
    }
    let wrong: Vec<String> = graph()
        .into_iter()
        .filter(|(_, m, _)| m == "envoy")
        .flat_map(|(p, _, refs)| {
            let face = face.clone();
            refs.into_iter()
                .filter(move |r| r != "envoy" && (!face.contains(r) || r == "serve"))
                .map(move |r| format!("{} names crate::{r}", p.display()))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn no_circle_runs_across_folders() {
    let folders: BTreeSet<String> = std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| module_of(&p.join("x.rs")))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, m, refs) in graph() {
        edges
            .entry(m.clone())
            .or_default()
            .extend(refs.into_iter().filter(|r| *r != m));
    }
    let reaches = |from: &str, to: &str| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
        while let Some(m) = todo.pop() {
            if m == to {
                return true;
            }
            if seen.insert(m.clone()) {
                todo.extend(edges.get(&m).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut circles = Vec::new();
    for folder in &folders {
        for other in edges.keys().filter(|m| *m != folder) {
            let counted_once = folder < other || !folders.contains(other);
            if counted_once && reaches(folder, other) && reaches(other, folder) {
                circles.push(format!("{folder} <-> {other}"));
            }
        }
    }
    assert!(circles.is_empty(), "{circles:#?}");
}

#[test]
fn the_reader_sees_grouped_and_plain_paths_but_not_comments() {
    let text = "use crate::{a, b::c, D as E};\nlet x = crate::f::g();\n// crate::h\n";
    let got: Vec<String> = crate_refs(text).into_iter().collect();
    assert_eq!(got, ["D", "a", "b", "f"]);
}
