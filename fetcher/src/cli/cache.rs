//! `wasm-fetcher ls` and `wasm-fetcher purge`: the cache as it stands.

use std::path::PathBuf;

use wasm_fetcher::{Cache, Settings};

use super::Failure;

#[derive(clap::Args)]
pub struct PurgeArgs {
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

/// The cache a flag names (or the default one) and the settings from the environment.
fn open(cache_dir: Option<PathBuf>) -> anyhow::Result<(Cache, Settings)> {
    let settings = Settings::from_env()?;
    let cache = Cache::open(&cache_dir.unwrap_or_else(Cache::default_dir))?;
    Ok((cache, settings))
}

pub fn purge(args: PurgeArgs) -> Result<(), Failure> {
    let run = || -> anyhow::Result<()> {
        let (cache, settings) = open(args.cache_dir)?;
        for sha in wasm_fetcher::purge(&cache, &settings)? {
            println!("purged sha256:{sha}");
        }
        Ok(())
    };
    run().map_err(|e| Failure::new("purge", e))
}

pub fn ls(args: LsArgs) -> Result<(), Failure> {
    let run = || -> anyhow::Result<()> {
        let (cache, settings) = open(args.cache_dir)?;
        let modules = wasm_fetcher::list(&cache, &settings)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&modules)?);
            return Ok(());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        println!(
            "{:<14} {:>10} {:>12} {:>12}  SOURCE",
            "SHA256", "SIZE", "LAST USE", "EXPIRES IN"
        );
        for m in modules {
            let source = if m.source.is_empty() {
                "(unknown: the cache index was rebuilt)"
            } else {
                &m.source
            };
            let kind = m
                .dynamic_module
                .as_ref()
                .map(|d| format!(" [dynamic module {} for {}]", d.file, d.platform))
                .unwrap_or_default();
            println!(
                "{:<14} {:>10} {:>11}s {:>11}s  {}{}{kind}",
                &m.sha256.hex()[..12],
                m.size,
                now.saturating_sub(m.last_used),
                m.expires.saturating_sub(now),
                source,
                m.manifest_digest
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            );
        }
        Ok(())
    };
    run().map_err(|e| Failure::new("ls", e))
}
