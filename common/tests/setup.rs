//! `make test` installs every command the suites and the docs' examples start: a newcomer's
//! machine has Rust, Python 3 and `make` (the README's first screen), and CI's machine may
//! already have more, so only reading the code against the Makefile can tell. Each program a
//! test, benchmark or library starts by name (`Command::new("…")`), and each command an `sh`
//! example in README.md or docs/ runs, is either on every Debian machine, built or installed
//! by the Makefile, or in `TEST_APT` (`BENCH_APT` for benchmarks).

// A test states its assumptions with unwrap: a broken one is a failed run.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// What a fresh Debian machine with Rust, Python 3 and `make` has (essential packages:
/// coreutils, util-linux, bsdutils, grep, sed, findutils, tar, gzip; git holds the clone),
/// the shell's own words, and what the Makefile builds or installs by its own targets, by line:
/// the shell's words; essential packages; what the README asks for and the clone; the build.
const PRESENT: &str = "
    if then else elif fi for while until do done case esac in break continue exit return trap
    test [ echo printf read export set unset cd wait kill true false exec local shift : { } ! eval
    command source .
    bash sh cat cp mv rm ln ls mkdir mktemp chmod touch head tail cut tr sort uniq wc od seq sleep
    date env sha256sum stat dd tee basename dirname readlink realpath id uname timeout mkfifo grep
    sed find xargs tar gzip script unshare
    git make python3 cargo rustup
    wasm-fetcher wasm-harness envoy";

/// The commands of a Makefile variable of `cmd:package` pairs (`TEST_APT := a:b \` …).
fn apt_commands(makefile: &str, var: &str) -> BTreeSet<String> {
    let mut lines = makefile.lines();
    let mut text = String::new();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix(&format!("{var} :=")) {
            let mut current = rest.to_string();
            while current.ends_with('\\') {
                text.push_str(current.trim_end_matches('\\'));
                current = lines.next().unwrap_or_default().to_string();
            }
            text.push_str(&current);
            break;
        }
    }
    assert!(!text.is_empty(), "the Makefile has no {var}");
    text.split_whitespace()
        .filter_map(|pair| pair.split_once(':').map(|(cmd, _)| cmd.to_string()))
        .collect()
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The programs `code` starts by a literal name: `Command::new("name")`.
fn started_programs(code: &str) -> Vec<String> {
    code.match_indices("Command::new(\"")
        .filter_map(|(at, m)| {
            let rest = &code[at + m.len()..];
            rest.split_once('"').map(|(name, _)| name.to_string())
        })
        .collect()
}

/// `line` with quoted text blanked: single-quoted text is data; double-quoted text is too,
/// except what a `$( … )` inside it runs.
fn unquoted(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let (mut single, mut double, mut depth) = (false, false, 0usize);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double || depth > 0 => single = !single,
            '"' if !single && depth == 0 => double = !double,
            '$' if double && !single && chars.peek() == Some(&'(') => {
                depth += 1;
                out.push('$');
                continue;
            }
            ')' if double && depth > 0 => {
                depth -= 1;
                out.push(')');
                continue;
            }
            _ => {}
        }
        let blank = single || (double && depth == 0) || c == '\'' || c == '"';
        out.push(if blank { ' ' } else { c });
    }
    out
}

/// The commands an `sh` block runs: the first word of each pipeline stage, list element and
/// command substitution, after variable assignments and case patterns; heredoc bodies and
/// quoted text are data, and the block's own shell functions are not commands to install.
fn shell_commands(block: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut functions = Vec::new();
    let mut heredoc_end: Option<String> = None;
    let mut continued = false;
    for line in block.lines() {
        if let Some(end) = &heredoc_end {
            if line.trim() == end {
                heredoc_end = None;
            }
            continue;
        }
        if let Some(at) = line.find("<<") {
            let tag = line[at + 2..].trim_start_matches('-').trim_start();
            let tag: String = tag
                .trim_start_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !tag.is_empty() {
                heredoc_end = Some(tag);
            }
        }
        let code = unquoted(line);
        let code = code.split(" #").next().unwrap_or_default();
        if code.trim_start().starts_with('#') {
            continue;
        }
        if let Some((name, _)) = code.trim_start().split_once("()") {
            functions.push(name.trim().to_string());
        }
        let was_continued = continued;
        continued = code.trim_end().ends_with('\\');
        let mut starts: Vec<&str> = Vec::new();
        if !was_continued {
            starts.push(code);
        }
        for sep in ["|", ";", "&&", "$(", "`", "{ ", "then ", "do ", "else "] {
            for (i, _) in code.match_indices(sep) {
                starts.push(&code[i + sep.len()..]);
            }
        }
        for start in starts {
            // `a=$(cmd …)` runs cmd, which the `$(` start finds; `a=1 cmd` runs cmd; a case
            // pattern `x)` is followed by the command.
            let word = start
                .split_whitespace()
                .find(|w| {
                    let case_pattern = w.ends_with(')') && !w.contains('(');
                    let assignment = w.contains('=') && !w.contains("=$(") && !w.contains("=`");
                    *w != "!" && !case_pattern && !assignment
                })
                .filter(|w| !w.contains('='))
                .unwrap_or_default();
            let word = word.trim_matches(|c| matches!(c, '(' | ')' | '`' | ';' | '&'));
            if word.starts_with(|c: char| c.is_ascii_lowercase()) && !word.contains("()") {
                found.push(word.to_string());
            }
        }
    }
    found.retain(|w| !functions.contains(w));
    found
}

/// The `sh` blocks of a Markdown file.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        let fence = line.trim_start();
        match &mut current {
            Some(text) if fence.starts_with("```") => {
                blocks.push(std::mem::take(text));
                current = None;
            }
            Some(text) => {
                text.push_str(line);
                text.push('\n');
            }
            None if fence.starts_with("```sh") => current = Some(String::new()),
            None => {}
        }
    }
    blocks
}

#[test]
fn every_command_a_test_or_an_example_starts_is_installed_by_make_test() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let test_apt = apt_commands(&makefile, "TEST_APT");
    let bench_apt = apt_commands(&makefile, "BENCH_APT");
    let present = |cmd: &str, bench: bool| {
        PRESENT.split_whitespace().any(|p| p == cmd)
            || test_apt.contains(cmd)
            || (bench && bench_apt.contains(cmd))
    };
    let mut missing = Vec::new();
    let mut files = Vec::new();
    for krate in ["common", "fetcher", "filter", "harness"] {
        for dir in ["src", "tests", "benches"] {
            rust_files(&root().join(krate).join(dir), &mut files);
        }
    }
    let mut programs = 0;
    for file in &files {
        let bench = file.components().any(|c| c.as_os_str() == "benches");
        if file.ends_with("common/tests/setup.rs") {
            continue;
        }
        for program in started_programs(&std::fs::read_to_string(file).unwrap()) {
            programs += 1;
            if !present(&program, bench) {
                missing.push(format!("{}: starts {program}", file.display()));
            }
        }
    }
    let mut docs = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        docs.push(entry.unwrap().path());
    }
    let mut commands = 0;
    for doc in docs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        for block in sh_blocks(&std::fs::read_to_string(doc).unwrap()) {
            for command in shell_commands(&block) {
                commands += 1;
                if !present(&command, false) {
                    missing.push(format!("{}: runs {command}", doc.display()));
                }
            }
        }
    }
    assert!(
        programs >= 10 && commands >= 50,
        "{programs} programs, {commands} commands"
    );
    assert!(
        missing.is_empty(),
        "not installed by `make test` (add it to TEST_APT, or to PRESENT if every machine has it):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_reader_finds_commands_but_not_heredoc_bodies_or_assignments() {
    let block = "X=1 docker-registry serve cfg &\nwithin() { for _ in $(seq 3); do \"$@\" && return; done; }\nwithin curl -s 'a|b; c'\ncase $(uname -m) in aarch64) other=x ;; esac\nfor i in $(seq 1 5); do curl -s x | grep -q y && break; done\ncat > f <<'EOF'\nnot_a_command: 1\nEOF\nsha=$(sha256sum f | cut -d' ' -f1)\n";
    let got = shell_commands(block);
    for want in [
        "docker-registry",
        "seq",
        "uname",
        "curl",
        "grep",
        "break",
        "cat",
        "sha256sum",
        "cut",
    ] {
        assert!(got.iter().any(|c| c == want), "{want} not in {got:?}");
    }
    for not in ["not_a_command:", "within", "b", "c'", "aarch64", "other"] {
        assert!(!got.iter().any(|c| c == not), "{not} in {got:?}");
    }
    assert_eq!(
        started_programs("Command::new(\"skopeo\").arg(x); tokio::process::Command::new(\"curl\")"),
        ["skopeo", "curl"]
    );
    let makefile = "TEST_APT := a:pa b:pb \\\n  c:pc\nOTHER := x:y\n";
    assert_eq!(
        apt_commands(makefile, "TEST_APT")
            .into_iter()
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}
