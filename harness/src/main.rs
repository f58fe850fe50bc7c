//! `wasm-harness`: run proxy-wasm scenarios in the harness, or against real Envoy too.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wasm_harness::bootstrap::Bootstrap;
use wasm_harness::proxy::{Proxy, ProxyOptions};
use wasm_harness::run::{self, RunOptions, Verdict};
use wasm_harness::{diff, envoy};

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
        /// Use this bootstrap instead of the one each scenario names.
        #[arg(long)]
        bootstrap: Option<PathBuf>,
    },
    /// Check a bootstrap and start its modules (canary and workers) without sending requests.
    Validate {
        bootstrap: PathBuf,
        #[arg(long)]
        workers: Option<usize>,
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
            bootstrap,
        } => run_all(
            &scenarios,
            &RunOptions { workers, bootstrap },
            with_envoy,
            json,
        ),
        Command::Validate { bootstrap, workers } => validate(&bootstrap, workers),
    };
    ExitCode::from(code.exit_code() as u8)
}

fn run_all(scenarios: &[PathBuf], opts: &RunOptions, with_envoy: bool, json: bool) -> Verdict {
    let mut worst = Verdict::Passed;
    let mut reports = Vec::new();
    let envoy_bin = if with_envoy {
        match envoy::find_envoy() {
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
        let (verdict, value, text) = match &envoy_bin {
            Some(bin) => {
                let r = diff::run_differential(bin, path, opts);
                (r.verdict, serde_json::to_value(&r), r.to_string())
            }
            None => {
                let r = run::run_scenario(path, opts);
                (r.verdict, serde_json::to_value(&r), r.to_string())
            }
        };
        worst = worst.max(verdict);
        if json {
            reports.push(value.unwrap_or_default());
        } else {
            print!("{text}");
        }
    }
    if json {
        let out = serde_json::json!({"verdict": worst, "scenarios": reports});
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    }
    worst
}

fn validate(path: &std::path::Path, workers: Option<usize>) -> Verdict {
    let options = ProxyOptions {
        workers: workers.unwrap_or(ProxyOptions::default().workers),
    };
    match Bootstrap::load(path)
        .map_err(Into::into)
        .and_then(|b| Proxy::new(b, &options))
    {
        Ok(proxy) => {
            for line in proxy.logs() {
                println!("{line}");
            }
            println!(
                "{}: ok ({} listener(s), {} worker(s))",
                path.display(),
                proxy.bootstrap.listeners.len(),
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
