//! `wasm-fetcher`: pull Wasm modules into a verified cache; point Envoy config at them.
//! Exit codes: 0 ok, 1 the operation failed (one line on stderr), 2 usage error.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use wasm_fetcher::{bootstrap, pull, Cache, PullRequest, Settings, Sha256};

#[derive(Parser)]
#[command(
    name = "wasm-fetcher",
    version,
    about = "Pull Wasm modules for Envoy into a verified local cache"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch a module (file://, http://, https://) into the cache and print its path.
    Pull {
        url: String,
        /// Required sha256 of the module (64 hex characters).
        #[arg(long, value_parser = Sha256::parse)]
        sha256: Option<Sha256>,
        /// Cache directory [default: $WASM_CACHE_DIR, else ~/.cache/wasm-fetcher].
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Print a JSON object (path, sha256, from_cache) instead of the path.
        #[arg(long)]
        json: bool,
    },
    /// Point every Wasm plugin of an Envoy bootstrap at a local module; writes YAML.
    Rewrite {
        bootstrap: PathBuf,
        #[arg(long)]
        module: PathBuf,
        /// Output file [default: stdout].
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("WASM_FETCHER_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Pull {
            url,
            sha256,
            cache_dir,
            json,
        } => {
            let result = run_pull(&url, sha256, cache_dir, json);
            if let Err(e) = result {
                eprintln!("wasm-fetcher: {url}: {e:#}");
                return ExitCode::from(1);
            }
        }
        Command::Rewrite {
            bootstrap,
            module,
            output,
        } => {
            if let Err(e) = run_rewrite(&bootstrap, &module, output.as_deref()) {
                eprintln!("wasm-fetcher: {}: {e:#}", bootstrap.display());
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}

fn run_pull(
    url: &str,
    sha256: Option<Sha256>,
    cache_dir: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let cache = Cache::open(&cache_dir.unwrap_or_else(Cache::default_dir))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let pulled = runtime.block_on(pull(
        &PullRequest {
            url: url.to_string(),
            sha256,
        },
        &cache,
        &settings,
    ))?;
    if json {
        println!("{}", serde_json::to_string(&pulled)?);
    } else {
        println!("{}", pulled.path.display());
    }
    Ok(())
}

fn run_rewrite(
    path: &std::path::Path,
    module: &std::path::Path,
    output: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).context("cannot read")?;
    let mut doc: serde_json::Value =
        serde_norway::from_str(&text).context("not valid YAML or JSON")?;
    bootstrap::point_wasm_code_at(&mut doc, module)?;
    let yaml = serde_norway::to_string(&doc)?;
    match output {
        Some(out) => {
            std::fs::write(out, yaml).with_context(|| format!("cannot write {}", out.display()))?
        }
        None => print!("{yaml}"),
    }
    Ok(())
}
