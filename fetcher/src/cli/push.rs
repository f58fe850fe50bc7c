//! `wasm-fetcher push`.

use std::path::PathBuf;
use std::time::Duration;

use wasm_fetcher::push::{Layout, ModuleFile, Outcome, PushRequest, SignFormat};
use wasm_fetcher::{settings, Settings};

use super::Failure;

#[derive(clap::Args)]
pub struct PushArgs {
    /// The module file: a core Wasm module (e.g.
    /// target/wasm32-wasip1/wasm-release/wasm_filter.wasm); with --layout dynamic-module, one
    /// lib<name>.so per platform, each PATH or OS/ARCH=PATH (e.g.
    /// linux/arm64=target/aarch64-unknown-linux-gnu/release/libwasm_filter.so): the platform
    /// is read from the ELF header, and a file given as another platform is refused.
    #[arg(required = true, num_args = 1.., value_name = "MODULE", value_parser = parse_module)]
    modules: Vec<ModuleFile>,
    /// oci://REGISTRY/REPO:TAG.
    url: String,
    /// wasm: Istio's Wasm artifact (2 layers: config and module), which Istio, Envoy
    /// Gateway and this fetcher pull; compat: a 1-layer OCI image whose tar.gz layer holds
    /// plugin.wasm, for registries and tools that take only images.
    /// dynamic-module: Envoy dynamic modules (lib<name>.so, ELF shared objects) as one
    /// image index with a manifest per os/arch.
    #[arg(long, value_enum, default_value_t)]
    layout: Layout,
    /// With --layout dynamic-module: the Envoy minor versions it loads on, comma-separated
    /// (e.g. 1.40,1.41).
    #[arg(long, value_delimiter = ',', value_parser = wasm_fetcher::dynamic_module::parse_envoy_version)]
    envoy_versions: Vec<String>,
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
    timeout: Duration,
    /// Print a JSON object (url, digest_url, manifest_digest, sha256, size, layout,
    /// abi_versions, outcome; for dynamic modules also modules: platform, path, sha256, size
    /// and manifest_digest of each, with sha256 and size null when there are several).
    #[arg(long, conflicts_with = "wasmplugin")]
    json: bool,
    /// Print an Istio WasmPlugin named NAME that pulls the pushed module by digest.
    #[arg(long, value_name = "NAME")]
    wasmplugin: Option<String>,
    /// With --wasmplugin: the WasmPlugin's pluginConfig, from a JSON or YAML file holding
    /// an object (the filter's role configuration).
    #[arg(long, value_name = "FILE", requires = "wasmplugin")]
    plugin_config: Option<PathBuf>,
    /// Also sign the pushed image as cosign does (see --sign-format) with this PEM PKCS#8 ECDSA P-256 private key, as `openssl genpkey
    /// -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes; cosign's encrypted keys are not
    /// read (sign with `cosign sign --key` instead).
    #[arg(long, value_name = "FILE")]
    sign_key: Option<PathBuf>,
    /// With --sign-key: write a Sigstore bundle attached as an OCI 1.1 referrer (`bundle`, as
    /// cosign 3 does by default), or the legacy simple-signing payload under the
    /// sha256-<digest>.sig tag (`simple-signing`, as cosign 2 does).
    #[arg(long, value_enum, default_value = "bundle", requires = "sign_key")]
    sign_format: SignFormat,
}

fn parse_module(arg: &str) -> Result<ModuleFile, String> {
    ModuleFile::parse(arg)
}

/// What a successful push prints.
pub enum PushOutput {
    Text,
    Json,
    /// An Istio WasmPlugin with this name and plugin configuration.
    WasmPlugin(String, Option<serde_json::Value>),
}

/// A push as the flags and the environment ask for it, every input read and checked before
/// anything is sent.
pub struct PushOptions {
    pub request: PushRequest,
    pub settings: Settings,
    pub timeout: Duration,
    pub output: PushOutput,
}

impl PushOptions {
    pub fn from_args(args: PushArgs, progress: wasm_fetcher::Progress) -> anyhow::Result<Self> {
        if (args.layout == Layout::DynamicModule) == args.envoy_versions.is_empty() {
            anyhow::bail!("--envoy-versions goes with --layout dynamic-module, and it needs them");
        }
        if args.layout == Layout::DynamicModule && (args.wasmplugin.is_some() || args.check_abi) {
            anyhow::bail!(
                "--wasmplugin and --check-abi are for a Wasm module, not --layout dynamic-module"
            );
        }
        let mut settings = Settings::from_env()?;
        settings.insecure_registries.extend(args.insecure_registry);
        let output = match (args.json, args.wasmplugin) {
            (true, _) => PushOutput::Json,
            (false, Some(name)) => {
                let config = args
                    .plugin_config
                    .map(|path| wasm_fetcher::push::read_plugin_config(&path))
                    .transpose()?;
                PushOutput::WasmPlugin(name, config)
            }
            (false, None) => PushOutput::Text,
        };
        if let Some(ca) = &args.ca_file {
            settings.add_ca_file(ca)?;
        }
        Ok(Self {
            request: PushRequest {
                modules: args.modules,
                url: args.url,
                layout: args.layout,
                check_abi: args.check_abi,
                envoy_versions: args.envoy_versions,
                pull_secret: args.pull_secret,
                sign_key: args
                    .sign_key
                    .as_deref()
                    .map(wasm_fetcher::SignKey::read)
                    .transpose()?,
                sign_format: args.sign_format,
                progress,
            },
            settings,
            timeout: args.timeout,
            output,
        })
    }
}

pub fn run(args: PushArgs) -> Result<(), Failure> {
    let message = format!("pushing to {}", args.url);
    super::with_progress(args.url.clone(), &message, |progress| push(args, progress))
}

fn push(args: PushArgs, progress: wasm_fetcher::Progress) -> anyhow::Result<()> {
    let o = PushOptions::from_args(args, progress)?;
    let pushed = super::within(o.timeout, async {
        Ok(wasm_fetcher::push::push(&o.request, &o.settings).await?)
    })?;
    match &o.output {
        PushOutput::Json => println!("{}", serde_json::to_string(&pushed)?),
        PushOutput::WasmPlugin(name, config) => print!(
            "{}",
            wasm_fetcher::push::wasm_plugin(&pushed, name, config.as_ref())
                .map_err(|e| anyhow::anyhow!("cannot write the WasmPlugin: {e}"))?
        ),
        PushOutput::Text => {
            let verb = match pushed.outcome {
                Outcome::Pushed => "pushed",
                Outcome::Unchanged => {
                    "unchanged (the tag already names this manifest; nothing sent)"
                }
            };
            println!("{verb} {} (layout {})", pushed.url, pushed.layout);
            println!("digest {}", pushed.manifest_digest);
            if let Some(sha256) = &pushed.sha256 {
                println!("sha256 {sha256}");
            }
            if pushed.modules.len() > 1 {
                for m in &pushed.modules {
                    println!("{} sha256 {} ({})", m.platform, m.sha256, m.path.display());
                }
            }
        }
    }
    Ok(())
}
