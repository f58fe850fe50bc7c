//! `wasm-fetcher rewrite`: an Envoy bootstrap pointed at a local module, Wasm or dynamic.

use std::path::PathBuf;

use anyhow::Context;
use wasm_fetcher::envoy::rewrite;

use super::Failure;

#[derive(clap::Args)]
pub struct RewriteArgs {
    /// The Envoy bootstrap, YAML or JSON: a regular file of at most 64 MiB.
    bootstrap: PathBuf,
    /// The module to load: a Wasm module (for the Wasm plugins) or an Envoy dynamic module,
    /// `lib<name>.so` (for the dynamic-module filters).
    #[arg(long)]
    module: PathBuf,
    /// Output file [default: stdout].
    #[arg(long, short)]
    output: Option<PathBuf>,
}

pub fn run(args: RewriteArgs) -> Result<(), Failure> {
    rewrite_file(&args).map_err(|e| Failure::new("rewrite", e))
}

fn rewrite_file(args: &RewriteArgs) -> anyhow::Result<()> {
    let path = &args.bootstrap;
    let (_, mut doc) = super::read_document(path, "bootstrap")?;
    let named = || path.display().to_string();
    rewrite::point_at(&mut doc, &args.module).with_context(named)?;
    let yaml = serde_norway::to_string(&doc)?;
    match &args.output {
        Some(out) => {
            std::fs::write(out, yaml).with_context(|| format!("cannot write {}", out.display()))?
        }
        None => print!("{yaml}"),
    }
    Ok(())
}
