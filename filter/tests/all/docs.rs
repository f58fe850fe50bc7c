//! Every example in README.md and docs/*.md (files added later included) holds: each fenced
//! block is checked by its info string, so no example rots and none slips through unchecked.
//!
//! - `rust`: a doctest; the file must be included in `harness/src/lib.rs`'s `doc_examples`,
//!   where `cargo test` compiles and runs it.
//! - `yaml` / `json`: a whole document, parsed by the real parser its content calls for: an
//!   Envoy bootstrap by the harness's parser and `envoy --mode validate`; a scenario by the
//!   harness's scenario parser (and the bootstrap it names by the bootstrap parser); an Istio
//!   `WasmPlugin` by the same checks as `envoy-config/wasmplugins/`; a plugin or VM
//!   configuration by the filter's parsers. `yaml fragment` / `json fragment` is a partial
//!   snippet: it must still parse.
//! - `sh`: run by bash (`-euo pipefail`), in order, in one temp dir per Markdown file that has
//!   the repository's top-level entries linked in (so `envoy-config/…`, `testdata/…`, `target/…`
//!   read as from the repository root), with the built `wasm-fetcher` / `wasm-harness` and
//!   Envoy on `PATH` and `HOME` in the temp dir. Every address they use is loopback.
//! - `console`: an illustration (shown output, or a command needing a system the test does not
//!   start); not run.
//!
//! A block whose info string also names a file (` ```yaml hello.yaml `) is written to that file
//! in the temp dir first, so a later `sh` block can use it. Any other info string, or none, is
//! a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wasm_filter::config::{PluginConfig, VmConfig};
use wasm_harness::envoy::bootstrap::Bootstrap;
use wasm_harness::Scenario;

use crate::support::{envoy, root};

/// How long one `sh` block may run (a scenario through real Envoy takes a few seconds).
const SH_DEADLINE: Duration = Duration::from_secs(180);

/// One fenced block: where it starts (1-based line of the opening fence) and what it holds.
struct Block {
    line: usize,
    lang: String,
    fragment: bool,
    file: Option<String>,
    text: String,
}

/// What the walker did with the blocks, by kind (printed, and checked to be non-empty).
#[derive(Default, Debug)]
struct Tally {
    rust: usize,
    bootstrap: usize,
    scenario: usize,
    wasmplugin: usize,
    plugin_config: usize,
    vm_config: usize,
    fragment: usize,
    sh: usize,
    console: usize,
}

/// README.md and every docs/*.md, sorted.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The fenced blocks of a Markdown file, in order. A fence may be indented (inside a list
/// item); that indentation is taken off the block's lines. An unclosed fence is an error.
fn blocks(markdown: &str) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut open: Option<(Block, usize)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let mut words = info.split_whitespace();
                    let lang = words.next().unwrap_or("").to_string();
                    let mut block = Block {
                        line: i + 1,
                        lang,
                        fragment: false,
                        file: None,
                        text: String::new(),
                    };
                    for w in words {
                        match w {
                            "fragment" => block.fragment = true,
                            name if name.contains('.') => block.file = Some(name.to_string()),
                            _ => {
                                return Err(format!(
                                    "line {}: unknown word {w:?} in the info string",
                                    i + 1
                                ))
                            }
                        }
                    }
                    open = Some((block, indent));
                }
            }
            Some((block, fence_indent)) => {
                if trimmed.starts_with("```") {
                    let (block, _) = open.take().unwrap();
                    out.push(block);
                } else {
                    let cut = line
                        .char_indices()
                        .take_while(|(n, c)| *n < *fence_indent && *c == ' ')
                        .count();
                    block.text.push_str(&line[cut..]);
                    block.text.push('\n');
                }
            }
        }
    }
    match open {
        Some((block, _)) => Err(format!("line {}: the fence is never closed", block.line)),
        None => Ok(out),
    }
}

/// A temp dir that reads like the repository root: its top-level entries linked in.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(root()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), dir.path().join(&name)).unwrap();
    }
    std::fs::create_dir(dir.path().join("home")).unwrap();
    dir
}

/// The files the harness's `doc_examples` module includes, so their `rust` blocks run as
/// doctests.
fn doctest_files() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("harness/src/lib.rs")).unwrap();
    lib.split("include_str!(\"../../")
        .skip(1)
        .filter_map(|rest| rest.split('"').next().map(str::to_string))
        .collect()
}

fn check_json(block: &Block, tally: &mut Tally) -> Result<(), String> {
    let value: serde_json::Value =
        serde_json::from_str(&block.text).map_err(|e| format!("not JSON: {e}"))?;
    if block.fragment {
        tally.fragment += 1;
        return Ok(());
    }
    if value.get("role").is_some() {
        PluginConfig::parse(block.text.as_bytes())
            .map_err(|e| format!("the filter refuses this plugin configuration: {e}"))?;
        tally.plugin_config += 1;
        return Ok(());
    }
    let vm_keys = ["log_level", "queue_name", "shared_data_prefix"];
    if value
        .as_object()
        .is_some_and(|o| o.keys().all(|k| vm_keys.contains(&k.as_str())))
    {
        VmConfig::parse(block.text.as_bytes())
            .map_err(|e| format!("the filter refuses this VM configuration: {e}"))?;
        tally.vm_config += 1;
        return Ok(());
    }
    Err(
        "a JSON document of no kind the test knows (a plugin configuration names a `role`; \
         mark a partial snippet `json fragment`)"
            .into(),
    )
}

fn check_yaml(block: &Block, dir: &Path, tally: &mut Tally) -> Result<(), String> {
    let value: serde_json::Value =
        serde_norway::from_str(&block.text).map_err(|e| format!("not YAML: {e}"))?;
    if block.fragment {
        tally.fragment += 1;
        return Ok(());
    }
    let path = dir.join(
        block
            .file
            .clone()
            .unwrap_or_else(|| format!("doc-block-{}.yaml", block.line)),
    );
    std::fs::write(&path, &block.text).unwrap();
    if value.get("static_resources").is_some() {
        Bootstrap::load(&path).map_err(|e| format!("the harness refuses this bootstrap: {e}"))?;
        validate_in_envoy(&path, dir)?;
        tally.bootstrap += 1;
    } else if value.get("requests").is_some() {
        let scenario =
            Scenario::load(&path).map_err(|e| format!("the harness refuses this scenario: {e}"))?;
        Bootstrap::load(&scenario.bootstrap_path())
            .map_err(|e| format!("the bootstrap this scenario names does not load: {e}"))?;
        tally.scenario += 1;
    } else if value.get("kind").and_then(|k| k.as_str()) == Some("WasmPlugin") {
        crate::wasmplugins::check(&block.text)?;
        tally.wasmplugin += 1;
    } else {
        return Err(
            "a YAML document of no kind the test knows (bootstrap, scenario, \
                    WasmPlugin); mark a partial snippet `yaml fragment`"
                .into(),
        );
    }
    Ok(())
}

/// `envoy --mode validate`, from `dir` so relative module paths resolve as from the
/// repository root.
fn validate_in_envoy(path: &Path, dir: &Path) -> Result<(), String> {
    let out = Command::new(envoy())
        .args(["--mode", "validate", "--log-level", "error", "-c"])
        .arg(path)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run envoy: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "envoy --mode validate refuses this bootstrap:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs one `sh` block in `dir`, within [`SH_DEADLINE`].
fn run_sh(block: &Block, dir: &Path) -> Result<(), String> {
    let bin = root().join("target/release");
    for tool in ["wasm-fetcher", "wasm-harness"] {
        if !bin.join(tool).is_file() {
            return Err(format!(
                "{} is missing: run `cargo build --release --workspace` (or `make test`)",
                bin.join(tool).display()
            ));
        }
    }
    let envoy_dir = envoy().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        envoy_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = dir.join(format!("sh-{}.log", block.line));
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block.text])
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", dir.join("home"))
        .env("ENVOY_BIN", envoy())
        .env_remove("XDG_CACHE_HOME")
        .env_remove("WASM_CACHE_DIR")
        .env_remove("WASM_HARNESS_CACHE_DIR")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > SH_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {SH_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "exits with {status}\n--- stdout\n{}--- stderr\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
        ))
    }
}

/// Checks (or runs) one block of Markdown file `name`, in that file's temp dir.
fn check_block(
    name: &str,
    block: &Block,
    dir: &Path,
    doctests: &[String],
    tally: &mut Tally,
) -> Result<(), String> {
    if let Some(f) = &block.file {
        if f.contains('/') || f.starts_with('.') || dir.join(f).exists() {
            return Err(format!(
                "{f}: the file a block is saved as must be a new plain name"
            ));
        }
        std::fs::write(dir.join(f), &block.text).unwrap();
    }
    match block.lang.as_str() {
        "rust" => {
            tally.rust += 1;
            if doctests.iter().any(|d| d == name) {
                Ok(())
            } else {
                Err(format!(
                    "a rust block in a file harness/src/lib.rs does not include as doctests: \
                     add `#[doc = include_str!(\"../../{name}\")]` to its doc_examples module"
                ))
            }
        }
        "json" => check_json(block, tally),
        "yaml" => check_yaml(block, dir, tally),
        "sh" => {
            tally.sh += 1;
            run_sh(block, dir)
        }
        "console" => {
            tally.console += 1;
            Ok(())
        }
        other => Err(format!(
            "info string {other:?}: the test knows rust, yaml, json (each optionally \
             `fragment`), sh (run) and console (illustration)"
        )),
    }
}

/// Checks (or runs) every block of every file. Fails with every block that does not hold, each
/// named by file and line.
fn walk() -> Tally {
    let doctests = doctest_files();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for file in markdown_files() {
        let name = relative(&file);
        let text = std::fs::read_to_string(&file).unwrap();
        let blocks = match blocks(&text) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let dir = workdir();
        for block in &blocks {
            if let Err(e) = check_block(&name, block, dir.path(), &doctests, &mut tally) {
                failures.push(format!("{name}:{}: {e}", block.line));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} documentation example(s) do not hold:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    eprintln!("documentation examples: {tally:?}");
    tally
}

#[test]
fn every_documentation_example_holds() {
    let tally = walk();
    // The walker found what the docs are known to hold, so it cannot pass by finding nothing.
    assert!(
        tally.plugin_config >= 6,
        "{tally:?}: docs/filter.md shows every role"
    );
    assert!(
        tally.bootstrap >= 1 && tally.scenario >= 1 && tally.wasmplugin >= 1,
        "{tally:?}"
    );
    assert!(tally.rust >= 2 && tally.sh >= 5, "{tally:?}");
}

#[test]
fn a_block_that_does_not_hold_is_named_by_line() {
    let md =
        "text\n\n```json\n{\"role\": \"rate-limit\", \"key\": \"client-address\", \"burst\": 0, \"refill_per_second\": 1}\n```\n\n```toml\nx = 1\n```\n";
    let found = blocks(md).unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].line, 3);
    let err = check_json(&found[0], &mut Tally::default()).unwrap_err();
    assert!(err.contains("burst"), "{err}");
    assert_eq!(found[1].lang, "toml");
    let dir = tempfile::tempdir().unwrap();
    let err = check_block("x.md", &found[1], dir.path(), &[], &mut Tally::default()).unwrap_err();
    assert!(err.contains("info string \"toml\""), "{err}");
    let rust = &blocks("```rust\nfn main() {}\n```\n").unwrap()[0];
    let err = check_block("x.md", rust, dir.path(), &[], &mut Tally::default()).unwrap_err();
    assert!(err.contains("doc_examples"), "{err}");
    let sh = &blocks("```sh\nfalse\n```\n").unwrap()[0];
    let err = check_block("x.md", sh, dir.path(), &[], &mut Tally::default()).unwrap_err();
    assert!(err.contains("exits with"), "{err}");
    assert!(blocks("```sh\necho never closed\n").is_err());
}

#[test]
fn make_publishs_default_plugin_configuration_is_accepted_by_the_filter() {
    let text = std::fs::read(root().join("envoy-config/wasmplugins/plugin-config.json")).unwrap();
    PluginConfig::parse(&text)
        .unwrap_or_else(|e| panic!("envoy-config/wasmplugins/plugin-config.json: {e}"));
}
