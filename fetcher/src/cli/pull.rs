//! `wasm-fetcher pull`.

use std::path::PathBuf;
use std::time::Duration;

use wasm_fetcher::{settings, Cache, PullPolicy, PullRequest, Settings, Sha256};

use super::Failure;

#[derive(clap::Args)]
pub struct PullArgs {
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
    /// Image index platform, os/arch (e.g. wasip1/wasm, linux/amd64); for a dynamic module
    /// the default is this host's.
    #[arg(long)]
    platform: Option<String>,
    /// Pull an Envoy dynamic module (pushed with --layout dynamic-module) for this Envoy
    /// minor version (e.g. 1.40); prints the directory to name in
    /// ENVOY_DYNAMIC_MODULES_SEARCH_PATH, which holds lib<name>.so (--json: also the file's
    /// path, for `rewrite --module`). The module must be signed by --verify-key and loadable
    /// by that Envoy (its ELF structure and dynamic-module ABI).
    #[arg(long, value_parser = wasm_fetcher::dynamic_module::parse_envoy_version, conflicts_with_all = ["pull_policy", "resource_version"])]
    envoy_version: Option<String>,
    /// Take an unsigned dynamic module when no verify key is set (a dynamic module runs
    /// unsandboxed inside Envoy: without a key and without this flag it is refused).
    #[arg(long, requires = "envoy_version")]
    allow_unsigned_dynamic_modules: bool,
    /// Bound on the whole pull (waiting for another process's pull of the same source
    /// included), Go duration syntax; must be more than 0.
    #[arg(long, default_value = "30s", value_parser = settings::parse_timeout)]
    timeout: Duration,
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
    #[command(flatten)]
    trust: super::trust::TrustArgs,
    /// Pull oci:// images through the registry mirrors of containerd's hosts directory:
    /// DIR/<registry>/hosts.toml (or DIR/_default/hosts.toml), at most 64 KiB
    /// [default: $WASM_REGISTRY_CONFIG_DIR].
    #[arg(long, value_name = "DIR")]
    registry_config_dir: Option<PathBuf>,
}

/// A pull as the flags and the environment ask for it, every input read and checked.
pub struct PullOptions {
    pub request: PullRequest,
    pub cache: Cache,
    pub settings: Settings,
    pub timeout: Duration,
    pub json: bool,
    pub envoy_version: Option<String>,
}

impl PullOptions {
    pub fn from_args(args: PullArgs, progress: wasm_fetcher::Progress) -> anyhow::Result<Self> {
        let mut settings = Settings::from_env()?;
        settings.allow_foreign_layers = args.allow_foreign_layers;
        settings.allow_unsigned_dynamic_modules = args.allow_unsigned_dynamic_modules;
        args.trust.apply(&mut settings)?;
        if let Some(ca) = &args.ca_file {
            settings.add_ca_file(ca)?;
        }
        if let Some(dir) = args.registry_config_dir {
            settings.registry_config_dir = Some(dir);
        }
        let cache = Cache::open(&args.cache_dir.unwrap_or_else(Cache::default_dir))?;
        Ok(Self {
            request: PullRequest {
                url: args.url,
                sha256: args.sha256,
                policy: args.pull_policy,
                resource: args.resource,
                resource_version: args.resource_version,
                platform: args.platform,
                pull_secret: args.pull_secret,
                verify_key: None,
                verify_identity: None,
                progress,
            },
            cache,
            settings,
            timeout: args.timeout,
            json: args.json,
            envoy_version: args.envoy_version,
        })
    }
}

pub fn run(args: PullArgs) -> Result<(), Failure> {
    let message = format!("pulling {}", args.url);
    super::with_progress(args.url.clone(), &message, |progress| pull(args, progress))
}

fn pull(args: PullArgs, progress: wasm_fetcher::Progress) -> anyhow::Result<()> {
    let o = PullOptions::from_args(args, progress)?;
    if let Some(version) = &o.envoy_version {
        let pulled = super::within(o.timeout, async {
            Ok(
                wasm_fetcher::dynamic_module::pull(&o.request, version, &o.cache, &o.settings)
                    .await?,
            )
        })?;
        if o.json {
            println!("{}", serde_json::to_string(&pulled)?);
        } else {
            println!("{}", pulled.dir.display());
        }
        return Ok(());
    }
    let pulled = super::within(o.timeout, async {
        Ok(wasm_fetcher::pull(&o.request, &o.cache, &o.settings).await?)
    })?;
    if o.json {
        println!("{}", serde_json::to_string(&pulled)?);
    } else {
        println!("{}", pulled.path.display());
    }
    Ok(())
}
