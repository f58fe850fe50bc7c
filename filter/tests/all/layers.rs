//! The crate's layers, read from its source: the pure role logic (`src/*.rs`) names neither
//! runtime's glue (`src/glue/`, the proxy-wasm SDK's; `src/dynamic_module/`, Envoy's
//! dynamic-module ABI) nor the SDK, and holds no `unsafe`; the two glues do not name each
//! other, and each keeps its `unsafe` in one room (the Wasm module's `glue/host.rs`; the
//! dynamic module's `abi/` and `host.rs`); no source file is over 650 lines.

use std::path::{Path, PathBuf};

use crate::support::root;

/// The code lines of `text` (comment lines left out).
fn code(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| {
            let t = l.trim_start();
            !t.starts_with("//")
        })
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Where a file of `src/` may not reach, by the layer it is in.
fn forbidden(relative: &Path) -> &'static [&'static str] {
    let first = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("");
    let unsafe_room = UNSAFE_ROOMS.iter().any(|room| relative.starts_with(room));
    match (first, unsafe_room) {
        ("lib.rs", _) => &[],
        ("glue", true) => &["dynamic_module"],
        ("glue", false) => &["dynamic_module", "unsafe"],
        ("dynamic_module", true) => &["glue", "proxy_wasm"],
        ("dynamic_module", false) => &["glue", "proxy_wasm", "unsafe"],
        _ => &["glue", "dynamic_module", "proxy_wasm", "unsafe"],
    }
}

/// Where each runtime's calls across its foreign edge live: the only files (or directories)
/// under `src/` allowed `unsafe`.
const UNSAFE_ROOMS: [&str; 3] = [
    "glue/host.rs",
    "dynamic_module/abi",
    "dynamic_module/host.rs",
];

#[test]
fn pure_role_logic_never_names_either_runtime() {
    let src = root().join("filter/src");
    let mut wrong = Vec::new();
    for path in rust_files(&src) {
        let relative = path.strip_prefix(&src).unwrap().to_path_buf();
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in code(&text) {
            for name in forbidden(&relative) {
                let hit = match *name {
                    "unsafe" => {
                        line.contains("unsafe ")
                            || line.contains("unsafe{")
                            || line.contains("no_mangle")
                    }
                    "proxy_wasm" => line.contains("proxy_wasm"),
                    module => {
                        line.contains(&format!("crate::{module}"))
                            || line.contains(&format!("super::{module}"))
                            || line.contains(&format!("{module}::"))
                    }
                };
                if hit {
                    wrong.push(format!("{}:{n}: names {name}: {line}", relative.display()));
                }
            }
        }
        let lines = text.lines().count();
        if lines > 650 {
            wrong.push(format!("{}: {lines} lines, over 650", relative.display()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `#[allow(unsafe_code)]` (the crate denies it) opens exactly the rooms: it sits on their
/// `mod` lines and nowhere else.
#[test]
fn unsafe_code_is_allowed_only_on_the_rooms() {
    let src = root().join("filter/src");
    let mut doors = Vec::new();
    for path in rust_files(&src) {
        let relative = path.strip_prefix(&src).unwrap().to_path_buf();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.contains("allow(unsafe_code)") {
                let next = lines.get(i + 1).map_or("", |l| l.trim());
                let room = next
                    .strip_prefix("mod ")
                    .and_then(|m| m.strip_suffix(';'))
                    .map(|m| relative.with_file_name(m));
                doors.push(match room {
                    Some(room) => room.display().to_string(),
                    None => format!("{}:{}: {next}", relative.display(), i + 2),
                });
            }
        }
    }
    doors.sort();
    assert_eq!(
        doors,
        ["dynamic_module/abi", "dynamic_module/host", "glue/host"],
        "allow(unsafe_code) opens these"
    );
}

#[test]
fn the_check_sees_a_violation() {
    let line = "use crate::glue::host;";
    assert!(code(line).any(|(_, l)| l.contains("crate::glue")));
    assert!(forbidden(Path::new("body_flow.rs")).contains(&"glue"));
    assert!(forbidden(Path::new("glue/body.rs")).contains(&"dynamic_module"));
    assert!(forbidden(Path::new("glue/body.rs")).contains(&"unsafe"));
    assert!(!forbidden(Path::new("glue/host.rs")).contains(&"unsafe"));
    assert!(forbidden(Path::new("dynamic_module/tcp.rs")).contains(&"unsafe"));
    assert!(!forbidden(Path::new("dynamic_module/abi/http_hooks.rs")).contains(&"unsafe"));
}
