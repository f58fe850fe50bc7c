//! `wasm-fetcher`: pull Wasm modules into a verified cache; point Envoy config at them.
//! Exit codes: 0 ok, 1 the operation failed (one line on stderr), 2 usage error.

mod serve_cmd;
mod sidecar_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use wasm_fetcher::{
    bootstrap, pull, regular_file, settings, Cache, PullPolicy, PullRequest, Settings, Sha256,
};

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
    Pull {
        /// oci://REGISTRY/REPO[:TAG][@sha256:DIGEST], https://..., http://... or file:///PATH.
        url: String,
        /// Pin (64 hex characters): the module's sha256; for oci:// also the image manifest or
        /// index digest. A mismatch fails and caches nothing.
        #[arg(long, value_parser = Sha256::parse)]
        sha256: Option<Sha256>,
        /// Cache directory [default: $WASM_CACHE_DIR, else ~/.cache/wasm-fetcher].
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// IfNotPresent | Always | Never [default: IfNotPresent; Always for an OCI `latest` or untagged reference; a pin makes it IfNotPresent].
        #[arg(long, value_enum)]
        pull_policy: Option<PullPolicy>,
        /// The resource the module is for [default: the URL].
        #[arg(long)]
        resource: Option<String>,
        /// The resource's version: with Always, the source is checked again only when it changes.
        #[arg(long)]
        resource_version: Option<String>,
        /// Docker config JSON with registry credentials (a decoded .dockerconfigjson): a
        /// regular file of at most 1 MiB.
        #[arg(long)]
        pull_secret: Option<PathBuf>,
        /// Image index platform, os/arch (e.g. wasip1/wasm, linux/amd64).
        #[arg(long)]
        platform: Option<String>,
        /// Bound on the whole pull (waiting for another process's pull of the same source
        /// included), Go duration syntax; must be more than 0.
        #[arg(long, default_value = "30s", value_parser = settings::parse_timeout)]
        timeout: std::time::Duration,
        /// Extra trusted CA certificates for HTTPS sources and registries: a regular PEM file
        /// (at most 4 MiB) holding at least one certificate.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// Print a JSON object (path, source, sha256, manifest_digest, pin, from_cache).
        #[arg(long)]
        json: bool,
        /// Fetch an image layer from the URLs its descriptor lists (foreign, non-distributable
        /// layers) before asking the registry; those URLs pass the same address guard.
        #[arg(long)]
        allow_foreign_layers: bool,
    },
    /// Push a Wasm module to an OCI registry; print the manifest digest and the module's sha256.
    Push {
        /// The module file (a core Wasm module, e.g. target/wasm32-wasip1/wasm-release/wasm_filter.wasm).
        module: PathBuf,
        /// oci://REGISTRY/REPO:TAG.
        url: String,
        /// wasm: Istio's Wasm artifact (2 layers: config and module), which Istio, Envoy
        /// Gateway and this fetcher pull; compat: a 1-layer OCI image whose tar.gz layer holds
        /// plugin.wasm, for registries and tools that take only images.
        #[arg(long, value_enum, default_value_t)]
        layout: wasm_fetcher::push::Layout,
        /// Refuse a module that exports no proxy_abi_version_* function.
        #[arg(long)]
        check_abi: bool,
        /// Docker config JSON with credentials for the registry (an entry with push access):
        /// a regular file of at most 1 MiB [default: $DOCKER_CONFIG/config.json or
        /// ~/.docker/config.json].
        #[arg(long)]
        pull_secret: Option<PathBuf>,
        /// A registry (host[:port]) to reach over unverified TLS or plain HTTP, added to
        /// WASM_INSECURE_REGISTRIES; repeatable. Loopback registries need no listing.
        #[arg(long, value_name = "HOST")]
        insecure_registry: Vec<String>,
        /// Extra trusted CA certificates for the registry: a regular PEM file.
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// Bound on the whole push, Go duration syntax; must be more than 0.
        #[arg(long, default_value = "60s", value_parser = settings::parse_timeout)]
        timeout: std::time::Duration,
        /// Print a JSON object (url, digest_url, manifest_digest, sha256, size, layout,
        /// abi_versions, outcome).
        #[arg(long, conflicts_with = "wasmplugin")]
        json: bool,
        /// Print an Istio WasmPlugin named NAME that pulls the pushed module by digest.
        #[arg(long, value_name = "NAME")]
        wasmplugin: Option<String>,
        /// With --wasmplugin: the WasmPlugin's pluginConfig, from a JSON or YAML file holding
        /// an object (the filter's role configuration).
        #[arg(long, value_name = "FILE", requires = "wasmplugin")]
        plugin_config: Option<PathBuf>,
    },
    /// Remove modules unused for longer than WASM_MODULE_EXPIRY (default 24h).
    Purge {
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// List cached modules: source, digests, size, last use, expiry.
    Ls {
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Istio WasmPlugin resources -> one Envoy ECDS file per plugin, modules pulled to the cache.
    Render(sidecar_cmd::RenderArgs),
    /// Pull the modules WasmPlugin resources name into the cache (then `render --pull-policy Never` offline).
    Prefetch(sidecar_cmd::PrefetchArgs),
    /// Envoy Wasm config naming remote modules -> the same config naming cached local files.
    Convert(sidecar_cmd::ConvertArgs),
    /// Keep Envoy ECDS files in step with a directory of Istio WasmPlugin files, pulling each
    /// module by its pull policy; /metrics, /healthz, /readyz on --metrics-addr.
    Serve(serve_cmd::ServeArgs),
    /// Point every Wasm plugin of an Envoy bootstrap at a local module; writes YAML.
    Rewrite {
        /// The Envoy bootstrap, YAML or JSON: a regular file of at most 64 MiB.
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
        // Quiet unless asked: a failure is the one line this program prints, not library logs.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WASM_FETCHER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Pull {
            url,
            sha256,
            cache_dir,
            pull_policy,
            resource,
            resource_version,
            pull_secret,
            platform,
            timeout,
            ca_file,
            json,
            allow_foreign_layers,
        } => {
            let bar = progress_bar(&format!("pulling {url}"));
            let req = PullRequest {
                url: url.clone(),
                sha256,
                policy: pull_policy,
                resource,
                resource_version,
                platform,
                pull_secret,
                progress: bar.as_ref().map(reporter).unwrap_or_default(),
            };
            let result = run_pull(
                &req,
                cache_dir,
                timeout,
                ca_file,
                json,
                allow_foreign_layers,
            );
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            if let Err(e) = result {
                return fail(&url, &e);
            }
        }
        Command::Push {
            module,
            url,
            layout,
            check_abi,
            pull_secret,
            insecure_registry,
            ca_file,
            timeout,
            json,
            wasmplugin,
            plugin_config,
        } => {
            let bar = progress_bar(&format!("pushing to {url}"));
            let req = wasm_fetcher::push::PushRequest {
                module,
                url: url.clone(),
                layout,
                check_abi,
                pull_secret,
                progress: bar.as_ref().map(reporter).unwrap_or_default(),
            };
            let output = match (json, wasmplugin) {
                (true, _) => PushOutput::Json,
                (false, Some(name)) => PushOutput::WasmPlugin(name, plugin_config),
                (false, None) => PushOutput::Text,
            };
            let result = run_push(&req, insecure_registry, ca_file, timeout, &output);
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            if let Err(e) = result {
                return fail(&url, &e);
            }
        }
        Command::Purge { cache_dir } => {
            if let Err(e) = run_purge(cache_dir) {
                return fail("purge", &e);
            }
        }
        Command::Ls { cache_dir, json } => {
            if let Err(e) = run_ls(cache_dir, json) {
                return fail("ls", &e);
            }
        }
        Command::Render(args) => {
            if let Err(e) = sidecar_cmd::render(args) {
                return fail("render", &e);
            }
        }
        Command::Prefetch(args) => {
            if let Err(e) = sidecar_cmd::prefetch(args) {
                return fail("prefetch", &e);
            }
        }
        Command::Convert(args) => {
            if let Err(e) = sidecar_cmd::convert(args) {
                return fail("convert", &e);
            }
        }
        Command::Serve(args) => {
            if let Err(e) = serve_cmd::run(args) {
                return fail("serve", &e);
            }
        }
        Command::Rewrite {
            bootstrap,
            module,
            output,
        } => {
            if let Err(e) = run_rewrite(&bootstrap, &module, output.as_deref()) {
                return fail("rewrite", &e);
            }
        }
    }
    ExitCode::SUCCESS
}

/// 2 for a URL that cannot name a module (a usage error, like a bad flag), 1 otherwise.
fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<wasm_fetcher::FetchError>() {
        Some(wasm_fetcher::FetchError::BadUrl { .. }) => 2,
        _ if e
            .downcast_ref::<wasm_fetcher::push::PushError>()
            .is_some_and(|p| p.is_usage()) =>
        {
            2
        }
        _ => 1,
    }
}

/// The one line a failure prints: what it was about, then the error and its causes, each said
/// once (an I/O error is often both a message and that message's source), with no URL's
/// userinfo in it.
fn fail(subject: &str, e: &anyhow::Error) -> ExitCode {
    let line = format!("{subject}: {}", wasm_fetcher::error::chain(e.as_ref()));
    eprintln!(
        "wasm-fetcher: {}",
        wasm_fetcher::reference::redact_userinfo(&line)
    );
    ExitCode::from(exit_code(e))
}

/// A progress bar on a terminal, nothing when stderr is piped. It stays hidden for the
/// first moments so a quick pull prints only its path; a URL's userinfo is never shown.
fn progress_bar(message: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
    let style = indicatif::ProgressStyle::with_template(
        "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(wasm_fetcher::reference::redact_userinfo(message));
    Some(bar)
}

fn reporter(bar: &indicatif::ProgressBar) -> wasm_fetcher::Progress {
    const QUIET_FOR: std::time::Duration = std::time::Duration::from_millis(300);
    let bar = bar.clone();
    let since = std::time::Instant::now();
    wasm_fetcher::Progress::new(move |event| {
        use wasm_fetcher::progress::Event;
        match event {
            Event::Started { total } => {
                if let Some(total) = total {
                    bar.set_length(total);
                }
                bar.set_position(0);
            }
            Event::Advanced(n) => bar.inc(n),
        }
        if bar.is_hidden() && since.elapsed() >= QUIET_FOR {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
    })
}

fn run_pull(
    req: &PullRequest,
    cache_dir: Option<PathBuf>,
    timeout: std::time::Duration,
    ca_file: Option<PathBuf>,
    json: bool,
    allow_foreign_layers: bool,
) -> anyhow::Result<()> {
    let mut settings = Settings::from_env()?;
    settings.allow_foreign_layers = allow_foreign_layers;
    if let Some(ca) = ca_file {
        settings.add_ca_file(&ca)?;
    }
    let cache = Cache::open(&cache_dir.unwrap_or_else(Cache::default_dir))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime
        .block_on(async { tokio::time::timeout(timeout, pull(req, &cache, &settings)).await });
    // A task still blocked in the kernel (opening a FIFO no one writes) is not waited for:
    // the deadline is the deadline. Whatever it was writing is a temp file in the cache's
    // `tmp/`, never a module or the index, and `purge` removes it.
    runtime.shutdown_background();
    let pulled =
        outcome.map_err(|_| anyhow::anyhow!("timed out after {timeout:?} (--timeout)"))??;
    if json {
        println!("{}", serde_json::to_string(&pulled)?);
    } else {
        println!("{}", pulled.path.display());
    }
    Ok(())
}

/// What a successful push prints.
enum PushOutput {
    Text,
    Json,
    WasmPlugin(String, Option<PathBuf>),
}

fn run_push(
    req: &wasm_fetcher::push::PushRequest,
    insecure_registries: Vec<String>,
    ca_file: Option<PathBuf>,
    timeout: std::time::Duration,
    output: &PushOutput,
) -> anyhow::Result<()> {
    let mut settings = Settings::from_env()?;
    settings.insecure_registries.extend(insecure_registries);
    // Read before anything is pushed: a bad file fails the command with nothing sent.
    let plugin_config = match output {
        PushOutput::WasmPlugin(_, Some(path)) => {
            Some(wasm_fetcher::push::read_plugin_config(path)?)
        }
        _ => None,
    };
    if let Some(ca) = ca_file {
        settings.add_ca_file(&ca)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async {
        tokio::time::timeout(timeout, wasm_fetcher::push::push(req, &settings)).await
    });
    runtime.shutdown_background();
    let pushed =
        outcome.map_err(|_| anyhow::anyhow!("timed out after {timeout:?} (--timeout)"))??;
    match output {
        PushOutput::Json => println!("{}", serde_json::to_string(&pushed)?),
        PushOutput::WasmPlugin(name, _) => print!(
            "{}",
            wasm_fetcher::push::wasm_plugin(&pushed, name, plugin_config.as_ref())
                .map_err(|e| anyhow::anyhow!("cannot write the WasmPlugin: {e}"))?
        ),
        PushOutput::Text => {
            let verb = match pushed.outcome {
                wasm_fetcher::push::Outcome::Pushed => "pushed",
                wasm_fetcher::push::Outcome::Unchanged => {
                    "unchanged (the tag already names this manifest; nothing sent)"
                }
            };
            println!("{verb} {} (layout {})", pushed.url, pushed.layout);
            println!("digest {}", pushed.manifest_digest);
            println!("sha256 {}", pushed.sha256);
        }
    }
    Ok(())
}

fn run_purge(cache_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let cache = Cache::open(&cache_dir.unwrap_or_else(Cache::default_dir))?;
    for sha in wasm_fetcher::purge(&cache, &settings)? {
        println!("purged sha256:{sha}");
    }
    Ok(())
}

fn run_ls(cache_dir: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let cache = Cache::open(&cache_dir.unwrap_or_else(Cache::default_dir))?;
    let modules = wasm_fetcher::list(&cache, &settings)?;
    if json {
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
        println!(
            "{:<14} {:>10} {:>11}s {:>11}s  {}{}",
            m.sha256.get(..12).unwrap_or(&m.sha256),
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
}

fn run_rewrite(
    path: &std::path::Path,
    module: &std::path::Path,
    output: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    // Each failure names the file once: the read error itself, the others by context.
    let bytes = regular_file::read_input(path, "bootstrap", regular_file::BOOTSTRAP_LIMIT)?;
    let named = || path.display().to_string();
    let text = String::from_utf8(bytes)
        .context("not UTF-8 text")
        .with_context(named)?;
    let mut doc: serde_json::Value = serde_norway::from_str(&text)
        .context("not valid YAML or JSON")
        .with_context(named)?;
    bootstrap::point_wasm_code_at(&mut doc, module).with_context(named)?;
    let yaml = serde_norway::to_string(&doc)?;
    match output {
        Some(out) => {
            std::fs::write(out, yaml).with_context(|| format!("cannot write {}", out.display()))?
        }
        None => print!("{yaml}"),
    }
    Ok(())
}
