//! The crate's wings, read from its source (`src/lib.rs` has the map). Lowest first: the
//! ground floor (the single files at `src/`), `reference/`, `store/`, `oci/`, `pull/`, then
//! `push/` beside `pull/`, then the configuration code (`envoy/`) and `serve/`. A wing names
//! only itself and the wings below it, and only by a module path (`crate::store::cache::Cache`,
//! not the crate root's re-export `crate::Cache`); the configuration code names the engine only
//! through what `lib.rs` makes public; no two top-level modules reach each other (a circle);
//! and no source file is over 650 lines.

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

/// The wings below the configuration code, lowest first, and what each may name besides the
/// ground floor and itself. `None` for a ground-floor file.
fn allowed(module: &str) -> Option<&'static [&'static str]> {
    Some(match module {
        "reference" => &["reference"],
        "store" => &["reference", "store"],
        "oci" => &["reference", "store", "oci"],
        "pull" => &["reference", "store", "oci", "pull"],
        "push" => &["reference", "store", "oci", "push"],
        _ => return None,
    })
}

/// The ground floor: the single files at `src/` (the CLI's and the crate root aside).
fn ground_floor() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| module_of(&p))
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

/// What is wrong with a file of top-level module `module` that names `refs`.
fn violations(module: &str, refs: &BTreeSet<String>, ground: &BTreeSet<String>) -> Vec<String> {
    let own: &[&str] = match allowed(module) {
        Some(wings) => wings,
        None if ground.contains(module) => &[],
        None => return Vec::new(),
    };
    refs.iter()
        .filter(|r| !ground.contains(*r) && !own.contains(&r.as_str()))
        .map(|r| {
            if allowed(r).is_some() || r == "envoy" || r == "serve" {
                format!("the {module} wing names crate::{r}, a wing above it or beside it")
            } else {
                format!("the {module} wing names crate::{r}, not a module below it")
            }
        })
        .collect()
}

#[test]
fn each_wing_names_only_the_wings_below_it() {
    let ground = ground_floor();
    for expected in ["error", "digest", "guard", "net", "settings"] {
        assert!(
            ground.contains(expected),
            "{expected} not on the ground floor: {ground:?}"
        );
    }
    let mut checked = BTreeMap::<String, usize>::new();
    let mut wrong = Vec::new();
    for (path, module, refs) in graph() {
        *checked.entry(module.clone()).or_default() += 1;
        for v in violations(&module, &refs, &ground) {
            wrong.push(format!("{}: {v}", path.display()));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Each wing still has its rooms: a layout change that empties one fails here rather than
    // passing without checking anything.
    for wing in ["reference", "store", "oci", "pull", "push"] {
        assert!(
            checked.get(wing).is_some_and(|n| *n >= 2),
            "{wing}: {checked:?}"
        );
    }
}

#[test]
fn files_stay_short() {
    let long: Vec<String> = rust_files(&src())
        .into_iter()
        .filter(|p| std::fs::read_to_string(p).unwrap().lines().count() > 650)
        .map(|p| p.display().to_string())
        .collect();
    assert!(long.is_empty(), "over 650 lines: {long:#?}");
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
fn no_two_modules_reach_each_other() {
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
    for a in edges.keys() {
        for b in edges.keys().filter(|b| a < *b) {
            if reaches(a, b) && reaches(b, a) {
                circles.push(format!("{a} <-> {b}"));
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
    let ground: BTreeSet<String> = ["error", "net"].map(String::from).into();
    let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert!(violations("store", &names(&["error", "reference"]), &ground).is_empty());
    assert_eq!(violations("store", &names(&["pull"]), &ground).len(), 1);
    assert_eq!(violations("oci", &names(&["Cache"]), &ground).len(), 1);
    assert_eq!(violations("error", &names(&["store"]), &ground).len(), 1);
    assert_eq!(violations("push", &names(&["pull"]), &ground).len(), 1);
    assert!(violations("serve", &names(&["pull", "envoy"]), &ground).is_empty());
}
