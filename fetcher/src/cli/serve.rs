//! `wasm-fetcher serve`'s flags and process glue: signals to [`Control`], the runtime,
//! the metrics listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use wasm_fetcher::serve::{self, Control};
use wasm_fetcher::settings::parse_timeout;
use wasm_fetcher::{Cache, PullPolicy, Settings};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Directory of Istio WasmPlugin files (*.yaml, *.yml, *.json; hidden files ignored).
    #[arg(long)]
    pub plugins: PathBuf,
    /// Directory Envoy watches for ECDS files (path_config_source + watched_directory): one
    /// `<namespace>.<name>.yaml` per plugin, each replaced by a rename.
    #[arg(long)]
    pub ecds_dir: PathBuf,
    /// Cache directory [default: $WASM_CACHE_DIR, else ~/.cache/wasm-fetcher].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Where /metrics, /healthz and /readyz answer (loopback unless you say otherwise; port 0
    /// picks a free one, printed at start).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    /// Put before every metric name: `istio_agent_` gives Istio's agent's spelling.
    #[arg(long, default_value = "")]
    pub metrics_prefix: String,
    /// Overrides every plugin's imagePullPolicy (Never: an offline node serving a warmed cache).
    #[arg(long, value_enum)]
    pub pull_policy: Option<PullPolicy>,
    /// Where Kubernetes pull secrets are mounted: imagePullSecret NAME of a plugin in
    /// namespace NS reads DIR/NS/NAME/.dockerconfigjson.
    #[arg(long)]
    pub pull_secrets: Option<PathBuf>,
    /// How often the plugins directory is scanned when it gives no file events (inotify
    /// unavailable or exhausted), Go duration syntax.
    #[arg(long, default_value = "200ms", value_parser = parse_timeout)]
    pub poll_interval: Duration,
    /// How often it is scanned while file events come: the fallback for changes events miss
    /// (NFS, some overlayfs and FUSE mounts).
    #[arg(long, default_value = "10s", value_parser = parse_timeout)]
    pub rescan_interval: Duration,
    /// Hand a cached `oci://` module to a plugin only once the registry accepted that plugin's
    /// own credentials for it (KEP-2535; a node-wide cache serving many namespaces).
    #[arg(long)]
    pub recheck_credentials: bool,
    /// How often the modules in use are checked on disk (SIGHUP checks at once).
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    pub verify_interval: Duration,
    /// Bound on one plugin's pull, retries with backoff included; then its fallback is written.
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    pub pull_timeout: Duration,
    /// Extra trusted CA certificates for HTTPS sources and registries: a regular PEM file.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Bound on the bytes of all plugin files together: files past it (in name order) are not
    /// read, and /readyz names them.
    #[arg(long, env = "WASM_PLUGINS_MAX_BYTES", default_value_t = 64 << 20)]
    pub max_plugin_bytes: u64,
    /// Bound on pulls running at once; the others wait their turn.
    #[arg(long, env = "WASM_MAX_CONCURRENT_PULLS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_pulls: u32,
    /// Who may read the ECDS files, which hold pluginConfig and vmConfig.env values verbatim:
    /// 0640 (the default) when Envoy shares this process's group (a pod's fsGroup), 0600 when
    /// Envoy runs as this user, 0644 only when Envoy runs as another user without a shared
    /// group (every user of the node may then read the values).
    #[arg(long, value_enum, default_value = "0640")]
    pub ecds_mode: EcdsMode,
    #[command(flatten)]
    pub trust: super::trust::TrustArgs,
    /// Read oci:// modules from the image volumes the kubelet mounted under DIR
    /// (DIR/wasm-<hash>/plugin.wasm, as `render --image-volumes` plans them): checked in
    /// place, never cached nor purged [default: $WASM_IMAGE_VOLUME_ROOT].
    #[arg(long, value_name = "DIR")]
    pub image_volume_root: Option<PathBuf>,
    /// Copy each module read from an image volume into the cache (checked, whole, bounded by
    /// ISTIO_WASM_MAX_BINARY_SIZE_BYTES) and name the copy in the ECDS files: for an Envoy in
    /// another pod that mounts the cache and ECDS directories (a hostPath) read-only, so a
    /// module change rolls this pod, never Envoy. A copy goes once no ECDS file names it.
    #[arg(long)]
    pub copy_image_volumes: bool,
    /// Pull oci:// images through the registry mirrors of containerd's hosts directory:
    /// DIR/<registry>/hosts.toml (or DIR/_default/hosts.toml), at most 64 KiB
    /// [default: $WASM_REGISTRY_CONFIG_DIR].
    #[arg(long, value_name = "DIR")]
    pub registry_config_dir: Option<PathBuf>,
    /// The Envoy minor version (e.g. 1.40) that DynamicModule resources are pulled and checked
    /// for (docs/dynamic-module.md).
    #[arg(long, value_parser = wasm_fetcher::dynamic_module::parse_envoy_version, conflicts_with = "envoy_admin")]
    pub envoy_version: Option<String>,
    /// The admin address (HOST:PORT) of the Envoy served: DynamicModule resources are pulled
    /// and checked for the version its /server_info reports, asked at each conversion.
    #[arg(long, value_name = "HOST:PORT")]
    pub envoy_admin: Option<String>,
    /// Take unsigned dynamic modules when no verify key is set (a dynamic module runs
    /// unsandboxed inside Envoy: without a key and without this flag it is refused).
    #[arg(long)]
    pub allow_unsigned_dynamic_modules: bool,
}

/// Who may read the ECDS files `serve` and `render` write (they hold `pluginConfig` and
/// `vmConfig.env` values verbatim).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum EcdsMode {
    #[value(name = "0644")]
    WorldReadable,
    #[value(name = "0640")]
    GroupReadable,
    #[value(name = "0600")]
    Private,
}

impl EcdsMode {
    pub fn file_mode(self) -> wasm_common::fs::Mode {
        match self {
            Self::WorldReadable => wasm_common::fs::Mode::WorldReadable,
            Self::GroupReadable => wasm_common::fs::Mode::GroupReadable,
            Self::Private => wasm_common::fs::Mode::Private,
        }
    }
}

/// Runs `serve` until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = Settings::from_env()?;
    if let Some(ca) = &args.ca_file {
        settings.add_ca_file(ca)?;
    }
    args.trust.apply(&mut settings)?;
    if let Some(root) = &args.image_volume_root {
        settings.image_volume_root = Some(root.clone());
    }
    if args.copy_image_volumes {
        anyhow::ensure!(
            settings.image_volume_root.is_some(),
            "--copy-image-volumes copies modules from image volumes; say where they are mounted (--image-volume-root or WASM_IMAGE_VOLUME_ROOT)"
        );
        settings.copy_image_volumes = true;
    }
    if let Some(dir) = &args.registry_config_dir {
        settings.registry_config_dir = Some(dir.clone());
    }
    settings.allow_unsigned_dynamic_modules = args.allow_unsigned_dynamic_modules;
    settings.recheck_credentials = args.recheck_credentials;
    let cache = Cache::open(&args.cache_dir.clone().unwrap_or_else(Cache::default_dir))?;
    let mut options = serve::Options::new(&args.plugins, &args.ecds_dir, cache, settings);
    options.render.pull_policy = args.pull_policy;
    options.render.pull_secrets = args.pull_secrets.clone();
    options.poll = args.poll_interval;
    options.rescan = args.rescan_interval;
    options.verify_every = args.verify_interval;
    options.backoff.deadline = args.pull_timeout;
    options.metrics_prefix = args.metrics_prefix.clone();
    options.max_plugin_bytes = args.max_plugin_bytes;
    options.max_concurrent_pulls = args.max_concurrent_pulls as usize;
    options.ecds_mode = args.ecds_mode.file_mode();
    options.dynamic_target = match (&args.envoy_version, &args.envoy_admin) {
        (Some(v), _) => Some(serve::dynamic::Target::Version(v.clone())),
        (None, Some(admin)) => Some(serve::dynamic::Target::Admin(admin.clone())),
        (None, None) => None,
    };
    // One thread: the work is waiting on files and sockets. Hashing and index writes go to a
    // few blocking threads (each would keep its own malloc arena: 50 plugins pulled at once
    // must not leave 50 of them resident).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.metrics_addr)
            .await
            .with_context(|| format!("cannot listen on {} (--metrics-addr)", args.metrics_addr))?;
        let local = listener.local_addr()?;
        println!("serving /metrics, /healthz and /readyz on http://{local}");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        tokio::spawn(async move {
            loop {
                let c = tokio::select! {
                    _ = hup.recv() => Control::Reverify,
                    _ = term.recv() => Control::Stop,
                    _ = int.recv() => Control::Stop,
                };
                if tx.send(c).await.is_err() || c == Control::Stop {
                    return;
                }
            }
        });
        serve::run(options, Some(listener), rx).await?;
        anyhow::Ok(())
    })
}
