//! The CLI edge of `render`, `prefetch` and `convert` (Wasm and dynamic-module filters): flags,
//! reading the inputs, printing.
//! Every input is read and checked before anything is fetched or written, so a refused input
//! leaves the output as it was.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use wasm_fetcher::envoy::render::{self, Outcome};
use wasm_fetcher::envoy::wasmplugin::WasmPlugin;
use wasm_fetcher::envoy::{convert, dynamic_modules, image_volumes};
use wasm_fetcher::{regular_file, settings, Cache, PullPolicy, Settings};

#[derive(Args, Debug)]
pub struct Fetching {
    /// Cache directory [default: $WASM_CACHE_DIR, else ~/.cache/wasm-fetcher].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Bound on each module's pull, Go duration syntax; must be more than 0.
    #[arg(long, default_value = "30s", value_parser = settings::parse_timeout)]
    timeout: Duration,
    /// Extra trusted CA certificates for HTTPS sources and registries: a regular PEM file.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    #[command(flatten)]
    trust: super::trust::TrustArgs,
    /// Read oci:// modules from the image volumes the kubelet mounted under DIR (one per
    /// reference, DIR/wasm-<hash>/plugin.wasm), checked in place and never cached
    /// [default: $WASM_IMAGE_VOLUME_ROOT].
    #[arg(long, value_name = "DIR")]
    image_volume_root: Option<PathBuf>,
    /// Pull oci:// images through the registry mirrors of containerd's hosts directory:
    /// DIR/<registry>/hosts.toml (or DIR/_default/hosts.toml), at most 64 KiB
    /// [default: $WASM_REGISTRY_CONFIG_DIR].
    #[arg(long, value_name = "DIR")]
    registry_config_dir: Option<PathBuf>,
}

impl Fetching {
    fn open(&self) -> anyhow::Result<(Cache, Settings)> {
        let mut settings = Settings::from_env()?;
        if let Some(ca) = &self.ca_file {
            settings.add_ca_file(ca)?;
        }
        self.trust.apply(&mut settings)?;
        if let Some(root) = &self.image_volume_root {
            settings.image_volume_root = Some(root.clone());
        }
        if let Some(dir) = &self.registry_config_dir {
            settings.registry_config_dir = Some(dir.clone());
        }
        let dir = self.cache_dir.clone().unwrap_or_else(Cache::default_dir);
        Ok((Cache::open(&dir)?, settings))
    }
}

#[derive(Args, Debug)]
pub struct RenderArgs {
    /// WasmPlugin resources (extensions.istio.io/v1alpha1), YAML or JSON; a file may hold
    /// several documents separated by `---`.
    #[arg(required = true, value_name = "WASMPLUGIN.yaml")]
    files: Vec<PathBuf>,
    /// Write one ECDS file per plugin (<namespace>.<name>.yaml) into DIR, each replaced
    /// atomically, and print the filter-chain entries [default: print the ECDS resources].
    #[arg(long, short, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Who may read the ECDS files written into --output, as `serve --ecds-mode` says: 0640
    /// (the default), 0600, or 0644 (every user of the node may read the values).
    #[arg(long, value_enum, default_value = "0640", requires = "output")]
    ecds_mode: super::serve::EcdsMode,
    /// The ECDS directory as Envoy sees it, named by the filter-chain entries [default: the
    /// absolute path of --output].
    #[arg(long, value_name = "DIR")]
    envoy_dir: Option<PathBuf>,
    /// Where pull secrets are mounted, a directory per namespace: imagePullSecret NAME of a
    /// plugin in namespace NS reads DIR/NS/NAME/.dockerconfigjson (a Kubernetes Secret
    /// volume). Without it a named secret is not used.
    #[arg(long, value_name = "DIR")]
    pull_secrets: Option<PathBuf>,
    /// Overrides every plugin's imagePullPolicy; Never serves only what the cache holds
    /// (after `prefetch`).
    #[arg(long, value_enum)]
    pull_policy: Option<PullPolicy>,
    /// Plan image-volume delivery: resolve each oci:// module's tag to its digest at the
    /// registry and write to FILE the pod-template patch (strategic merge) that mounts each
    /// image read-only under --image-volume-root, with the plugins' pull policies and pull
    /// secrets; the ECDS files name the mounted modules.
    #[arg(long, value_name = "FILE", requires = "image_volume_root")]
    image_volumes: Option<PathBuf>,
    /// The containers of the pod that get the image volumes' mounts (with --image-volumes);
    /// `init:NAME` is an init container (a native sidecar).
    #[arg(long, value_name = "NAME", default_values = ["init:wasm-fetcher", "envoy"])]
    mount_into: Vec<String>,
    #[command(flatten)]
    fetching: Fetching,
}

#[derive(Args, Debug)]
pub struct PrefetchArgs {
    /// WasmPlugin resources whose modules to pull into the cache.
    #[arg(required = true, value_name = "WASMPLUGIN.yaml")]
    files: Vec<PathBuf>,
    /// As for render: imagePullSecret NAME in namespace NS reads DIR/NS/NAME/.dockerconfigjson.
    #[arg(long, value_name = "DIR")]
    pull_secrets: Option<PathBuf>,
    #[command(flatten)]
    fetching: Fetching,
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Envoy Wasm configuration, YAML or JSON: a Wasm filter config, a TypedExtensionConfig,
    /// a list of them, a discovery response, or a bootstrap (a regular file of at most 64 MiB).
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// Output file, replaced atomically; JSON when it ends in .json, YAML when it ends in
    /// .yaml or .yml, else the input's format [default: stdout].
    #[arg(long, short, value_name = "OUT")]
    output: Option<PathBuf>,
    /// The Envoy minor version (e.g. 1.40) to pull dynamic modules for: a dynamic-module
    /// filter whose module.remote.http_uri.uri is oci:// is pointed at the cached
    /// lib<name>.so built for it.
    #[arg(long, value_parser = wasm_fetcher::dynamic_module::parse_envoy_version)]
    envoy_version: Option<String>,
    /// The os/arch of those dynamic modules [default: this host's].
    #[arg(long, requires = "envoy_version")]
    platform: Option<String>,
    /// Take unsigned dynamic modules when no verify key is set (a dynamic module runs
    /// unsandboxed inside Envoy: without a key and without this flag it is refused).
    #[arg(long)]
    allow_unsigned_dynamic_modules: bool,
    #[command(flatten)]
    fetching: Fetching,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Every plugin in `files`, in order; any refused document refuses them all. Two plugins with
/// one namespace and name would write one file: refused too.
fn read_plugins(files: &[PathBuf]) -> anyhow::Result<Vec<WasmPlugin>> {
    let mut all: Vec<WasmPlugin> = Vec::new();
    for path in files {
        let bytes = regular_file::read_input(
            path,
            "WasmPlugin file",
            wasm_fetcher::envoy::wasmplugin::MAX_FILE_BYTES,
        )?;
        let text = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
        let plugins = WasmPlugin::parse_all(&text).with_context(|| path.display().to_string())?;
        for p in plugins {
            if all.iter().any(|q| q.qualified_name() == p.qualified_name()) {
                anyhow::bail!(
                    "{}: WasmPlugin {} is given twice (a namespace and name name one plugin)",
                    path.display(),
                    p.qualified_name()
                );
            }
            all.push(p);
        }
    }
    Ok(all)
}

fn warn_fallback(subject: &str, outcome: &Outcome) {
    if let Outcome::Fallback { fallback, error } = outcome {
        let what = match fallback {
            wasm_fetcher::envoy::fallback::Fallback::AllowAll => {
                "fail-open: allow-all RBAC in its place"
            }
            wasm_fetcher::envoy::fallback::Fallback::DenyAll => {
                "fail-closed: deny-all RBAC in its place"
            }
        };
        eprintln!("wasm-fetcher: {subject}: cannot fetch the module ({error}); {what}");
    }
}

pub fn render(args: RenderArgs) -> anyhow::Result<()> {
    let plugins = read_plugins(&args.files)?;
    let (cache, mut settings) = args.fetching.open()?;
    let options = render::Options {
        pull_secrets: args.pull_secrets.clone(),
        pull_policy: args.pull_policy,
    };
    let envoy_dir = match (&args.envoy_dir, &args.output) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(out)) => Some(std::path::absolute(out)?),
        (None, None) => None,
    };
    if let Some(out) = &args.output {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    }
    // Planning image volumes asks the registry; reading them is the node's `serve`.
    let planned_root = match &args.image_volumes {
        Some(_) => settings.image_volume_root.take(),
        None => None,
    };
    let rt = runtime()?;
    let mut printed = Vec::new();
    let mut volumes = Vec::new();
    for p in &plugins {
        let request = render::plan(p, &options);
        let timeout = args.fetching.timeout;
        let mut pulled = rt.block_on(render::pull_within(&request, &cache, &settings, timeout));
        if let Some(root) = &planned_root {
            let fetched = pulled.as_ref().map_err(|e| {
                let e = wasm_fetcher::error::chain(e);
                anyhow::anyhow!("{}: cannot resolve {}: {e}", p.qualified_name(), p.url)
            })?;
            if let Some((volume, _, in_mount)) =
                image_volumes::volume(p, fetched, root, args.pull_policy)?
            {
                volumes.push(volume);
                pulled = Ok(in_mount);
            }
        }
        let resource = render::resource(p, pulled.as_ref());
        warn_fallback(&p.qualified_name(), &resource.outcome);
        match &args.output {
            Some(dir) => {
                resource.write_with_mode(dir, args.ecds_mode.file_mode())?;
            }
            None => printed.push(format!("# {}\n{}", resource.file_name, resource.to_yaml())),
        }
    }
    rt.shutdown_background();
    if let (Some(file), Some(root)) = (&args.image_volumes, &planned_root) {
        let patch = image_volumes::pod_patch(&plugins, &volumes, root, &args.mount_into);
        let text = format!(
            "# The image volumes of {} WasmPlugin(s): a strategic-merge patch of a pod template.\n{}",
            plugins.len(),
            serde_norway::to_string(&patch)?
        );
        render::write_atomically(file, text.as_bytes())?;
    }
    match envoy_dir {
        Some(dir) if args.output.is_some() => print!(
            "# Filter-chain entries in Istio's order: http_filters go before the router,\n\
             # network_filters before the terminal network filter.\n{}",
            serde_norway::to_string(&render::filter_chain(&plugins, &dir))?
        ),
        _ => print!("{}", printed.join("---\n")),
    }
    Ok(())
}

pub fn prefetch(args: PrefetchArgs) -> anyhow::Result<()> {
    let plugins = read_plugins(&args.files)?;
    let (cache, settings) = args.fetching.open()?;
    let options = render::Options {
        pull_secrets: args.pull_secrets.clone(),
        pull_policy: None,
    };
    let rt = runtime()?;
    let mut failed = Vec::new();
    for p in &plugins {
        let request = render::plan(p, &options);
        let timeout = args.fetching.timeout;
        match rt.block_on(render::pull_within(&request, &cache, &settings, timeout)) {
            Ok(pulled) => println!("{} {}", p.qualified_name(), pulled.path.display()),
            Err(e) => failed.push(format!(
                "{}: {}",
                p.qualified_name(),
                wasm_fetcher::error::chain(&e)
            )),
        }
    }
    rt.shutdown_background();
    if !failed.is_empty() {
        anyhow::bail!(
            "{} of {} modules not cached: {}",
            failed.len(),
            plugins.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// JSON text (rather than YAML): what the first character says.
fn looks_like_json(text: &str) -> bool {
    text.trim_start().starts_with(['{', '['])
}

pub fn convert(args: ConvertArgs) -> anyhow::Result<()> {
    let path = &args.input;
    let named = || path.display().to_string();
    let (text, mut doc) = super::read_document(path, "input")?;
    // Checked before the cache is opened or anything fetched.
    let remote = convert::sites(&doc).with_context(named)?;
    let native = dynamic_modules::remote_sites(&doc)
        .map_err(anyhow::Error::msg)
        .with_context(named)?;
    let target = match (&args.envoy_version, native.first()) {
        (Some(v), _) => Some(dynamic_modules::Target {
            envoy_version: v.clone(),
            platform: args.platform.clone(),
        }),
        (None, Some(site)) => anyhow::bail!(
            "{}: {}: a dynamic module from a registry is pulled for one Envoy: pass --envoy-version (e.g. 1.40)",
            named(),
            site.at
        ),
        (None, None) => None,
    };
    let json = match args.output.as_deref().and_then(Path::extension) {
        Some(e) if e == "json" => true,
        Some(e) if e == "yaml" || e == "yml" => false,
        _ => looks_like_json(&text),
    };
    // Nothing remote: passed through as it came, as Istio's agent passes such a resource.
    if remote.is_empty() && native.is_empty() && json == looks_like_json(&text) {
        return emit(args.output.as_deref(), text.as_bytes());
    }
    let (cache, mut settings) = args.fetching.open()?;
    settings.allow_unsigned_dynamic_modules = args.allow_unsigned_dynamic_modules;
    let rt = runtime()?;
    let outcome = rt.block_on(async {
        let converted = convert::convert(&mut doc, &cache, &settings, args.fetching.timeout)
            .await
            .map_err(anyhow::Error::from)?;
        if let Some(target) = &target {
            let limit = args.fetching.timeout;
            dynamic_modules::convert(&mut doc, &native, target, &cache, &settings, limit)
                .await
                .map_err(anyhow::Error::msg)?;
        }
        anyhow::Ok(converted)
    });
    rt.shutdown_background();
    let converted = outcome.with_context(named)?;
    for c in &converted {
        warn_fallback(&format!("{} ({})", c.at, c.url), &c.outcome);
    }
    let out = if json {
        serde_json::to_string_pretty(&doc)? + "\n"
    } else {
        serde_norway::to_string(&doc)?
    };
    emit(args.output.as_deref(), out.as_bytes())
}

/// `bytes` to stdout, or replacing `output` atomically.
fn emit(output: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    match output {
        Some(o) => render::write_atomically(o, bytes)?,
        None => {
            use std::io::Write;
            std::io::stdout().write_all(bytes)?;
        }
    }
    Ok(())
}
