//! `wasm-harness`: run proxy-wasm scenarios in the harness, or against real Envoy too.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wasm_harness::engine::precompiled_section as precompiled;
use wasm_harness::engine::vm::{CodeSource, Runtime};
use wasm_harness::envoy::bootstrap::Bootstrap;
use wasm_harness::envoy::proxy::{Proxy, ProxyOptions};
use wasm_harness::runner::run;
use wasm_harness::{compare, real_envoy};
use wasm_harness::{ComparisonReport, LogLevel, RunOptions, ScenarioReport, Verdict};

#[derive(Parser)]
#[command(
    name = "wasm-harness",
    version,
    about = "A proxy-wasm host on wasmtime with Envoy's semantics"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenarios; exit 0 if every expectation holds, 1 if one fails, 2 if a run cannot start.
    Run {
        /// Scenario files (YAML).
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
        /// Worker threads (Envoy's --concurrency); default: the scenario's, else 2.
        #[arg(long)]
        workers: Option<usize>,
        /// Also send every request through real Envoy and report differences.
        #[arg(long)]
        envoy: bool,
        /// Print a machine-readable JSON report.
        #[arg(long)]
        json: bool,
        /// With --envoy, also print the log lines of a step that cannot be compared (the
        /// report gives only the reason; --json always holds them).
        #[arg(long, short = 'v')]
        verbose: bool,
        /// Use this bootstrap instead of the one each scenario names.
        #[arg(long)]
        bootstrap: Option<PathBuf>,
        /// Envoy's log level (-l): trace, debug, info, warning, error, critical; guest lines
        /// below it are not shown or matched. Default: the scenario's `log_level`, else info.
        #[arg(short = 'l', long = "log-level", value_parser = LogLevel::parse)]
        log_level: Option<LogLevel>,
    },
    /// Check a bootstrap and start its modules (canary and workers) without sending requests.
    Validate {
        bootstrap: PathBuf,
        #[arg(long)]
        workers: Option<usize>,
        /// Envoy's log level (-l), as for `run`.
        #[arg(short = 'l', long = "log-level", value_parser = LogLevel::parse, default_value = "info")]
        log_level: LogLevel,
    },
    /// Write MODULE with this host's machine code embedded, for plugins with
    /// `runtime: envoy.wasm.runtime.wasmtime` and `allow_precompiled: true` (other runtimes,
    /// and Envoy's V8, ignore the section and compile the bytecode beside it).
    Precompile {
        module: PathBuf,
        /// Where to write the module with its precompiled section.
        #[arg(long, short)]
        output: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("WASM_HARNESS_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run {
            scenarios,
            workers,
            envoy: with_envoy,
            json,
            verbose,
            bootstrap,
            log_level,
        } => run_all(
            &scenarios,
            &RunOptions {
                workers,
                bootstrap,
                log_level,
            },
            with_envoy,
            Output { json, verbose },
        ),
        Command::Validate {
            bootstrap,
            workers,
            log_level,
        } => validate(&bootstrap, workers, log_level),
        Command::Precompile { module, output } => match precompile(&module, &output) {
            Ok(()) => Verdict::Passed,
            Err(e) => {
                eprintln!("wasm-harness: {e:#}");
                Verdict::CannotStart
            }
        },
    };
    ExitCode::from(code.exit_code() as u8)
}

/// How `run` prints its reports.
struct Output {
    json: bool,
    verbose: bool,
}

fn run_all(scenarios: &[PathBuf], opts: &RunOptions, with_envoy: bool, output: Output) -> Verdict {
    let Output { json, verbose } = output;
    let mut worst = Verdict::Passed;
    let mut reports = Vec::new();
    let envoy_bin = if with_envoy {
        match real_envoy::find_envoy() {
            Ok(b) => Some(b),
            Err(e) => {
                eprintln!("wasm-harness: {e}");
                return Verdict::CannotStart;
            }
        }
    } else {
        None
    };
    for path in scenarios {
        let report = match &envoy_bin {
            Some(bin) => Report::Comparison(compare::run_comparison(bin, path, opts)),
            None => Report::Harness(run::run_scenario(path, opts)),
        };
        worst = worst.max(report.verdict());
        if json {
            reports.push(report);
        } else if verbose {
            print!("{report:#}");
        } else {
            print!("{report}");
        }
    }
    if json {
        // Written straight to stdout, with no JSON value built first: a report holding a large
        // body would take many times its size as a `serde_json::Value`.
        let out = JsonReport {
            verdict: worst,
            scenarios: reports,
        };
        let mut stdout = std::io::stdout().lock();
        let written = serde_json::to_writer_pretty(&mut stdout, &out)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(stdout));
        if let Err(e) = written {
            eprintln!("wasm-harness: cannot write the JSON report: {e}");
            return Verdict::CannotStart;
        }
    }
    worst
}

/// One scenario's report, from the harness alone or compared with real Envoy.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Report {
    Harness(ScenarioReport),
    Comparison(ComparisonReport),
}

impl Report {
    fn verdict(&self) -> Verdict {
        match self {
            Report::Harness(r) => r.verdict,
            Report::Comparison(r) => r.verdict,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Report::Harness(r) => r.fmt(f),
            Report::Comparison(r) => r.fmt(f),
        }
    }
}

#[derive(serde::Serialize)]
struct JsonReport {
    verdict: Verdict,
    scenarios: Vec<Report>,
}

fn validate(path: &std::path::Path, workers: Option<usize>, log_level: LogLevel) -> Verdict {
    let options = ProxyOptions {
        log_level,
        ..ProxyOptions::with_workers(workers.unwrap_or(ProxyOptions::default().workers))
    };
    match Bootstrap::load(path)
        .map_err(Into::into)
        .and_then(|b| Proxy::new(b, &options))
    {
        Ok(proxy) => {
            for line in proxy.logs() {
                println!("{line}");
            }
            for (module, code) in proxy.modules() {
                let how = match code {
                    CodeSource::Precompiled => format!(
                        "precompiled code from its section {}",
                        precompiled::section_name().unwrap_or_default()
                    ),
                    CodeSource::Cache => "compiled code from the harness's cache".into(),
                    CodeSource::Compiled => "compiled from its bytecode".into(),
                };
                println!("module {}: {how}", module.display());
            }
            println!(
                "{}: ok ({} listener(s), {} worker(s))",
                path.display(),
                proxy.bootstrap().listeners.len(),
                proxy.workers()
            );
            Verdict::Passed
        }
        Err(e) => {
            eprintln!("wasm-harness: {}: {e}", path.display());
            Verdict::CannotStart
        }
    }
}

fn precompile(module: &std::path::Path, output: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let bytes =
        wasm_harness::engine::input::read(module, wasm_harness::engine::input::MAX_MODULE_BYTES)
            .with_context(|| format!("cannot read {}", module.display()))?;
    let runtime = Runtime::new().map_err(|e| anyhow::anyhow!("cannot start wasmtime: {e:#}"))?;
    let out = precompiled::embed(runtime.engine(), &bytes)
        .with_context(|| format!("{}", module.display()))?;
    // Written whole then renamed, so a reader never sees half a module.
    let dir = output
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    // Readable by an Envoy running as another user, like the fetcher's cache files.
    let readable = wasm_common::fs::Mode::WorldReadable;
    wasm_common::fs::write_whole(dir, ".precompiling-", output, &out, readable, false)
        .with_context(|| format!("cannot write {}", output.display()))?;
    let section = precompiled::section_name().unwrap_or_default();
    let code = precompiled::find_section(&out, &section)?.map_or(0, <[u8]>::len);
    println!(
        "{}: {} bytes, of which {code} bytes of precompiled code in section {section}",
        output.display(),
        out.len(),
    );
    Ok(())
}
