//! `wasm-fetcher`: pull Wasm modules into a verified cache; point Envoy config at them.
//! Exit codes: 0 ok, 1 the operation failed (one line on stderr), 2 usage error.
//!
//! Each subcommand is a flags struct that `cli::*` validates into options before anything
//! runs; a new subcommand is a variant here and its arm below.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Fetch a module (oci://, https://, http://, file://) into the cache and print its path.
    Pull(cli::pull::PullArgs),
    /// Push a Wasm module to an OCI registry; print the manifest digest and the module's sha256.
    Push(cli::push::PushArgs),
    /// Remove modules unused for longer than WASM_MODULE_EXPIRY (default 24h).
    Purge(cli::cache::PurgeArgs),
    /// List cached modules: source, digests, size, last use, expiry.
    Ls(cli::cache::LsArgs),
    /// Istio WasmPlugin resources -> one Envoy ECDS file per plugin, modules pulled to the cache.
    Render(cli::sidecar::RenderArgs),
    /// Pull the modules WasmPlugin resources name into the cache (then `render --pull-policy Never` offline).
    Prefetch(cli::sidecar::PrefetchArgs),
    /// Envoy Wasm config naming remote modules -> the same config naming cached local files.
    Convert(cli::sidecar::ConvertArgs),
    /// Keep Envoy ECDS files in step with a directory of Istio WasmPlugin files, pulling each
    /// module by its pull policy; /metrics, /healthz, /readyz on --metrics-addr.
    Serve(cli::serve::ServeArgs),
    /// Point every Wasm plugin of an Envoy bootstrap at a local module; writes YAML.
    Rewrite(cli::rewrite::RewriteArgs),
}

fn main() -> ExitCode {
    cli::init_logging();
    let outcome = match Cli::parse().command {
        Command::Pull(args) => cli::pull::run(args),
        Command::Push(args) => cli::push::run(args),
        Command::Purge(args) => cli::cache::purge(args),
        Command::Ls(args) => cli::cache::ls(args),
        Command::Rewrite(args) => cli::rewrite::run(args),
        Command::Render(args) => {
            cli::sidecar::render(args).map_err(|e| cli::Failure::new("render", e))
        }
        Command::Prefetch(args) => {
            cli::sidecar::prefetch(args).map_err(|e| cli::Failure::new("prefetch", e))
        }
        Command::Convert(args) => {
            cli::sidecar::convert(args).map_err(|e| cli::Failure::new("convert", e))
        }
        Command::Serve(args) => cli::serve::run(args).map_err(|e| cli::Failure::new("serve", e)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}
