//! `wasm-fetcher push`: a built module into an OCI registry, in a layout every puller takes
//! (`layout`), so a `WasmPlugin` can name it by digest. The module is checked before any
//! connection (`inspect`); the registry is reached exactly as a pull reaches it (credentials
//! from `crate::oci::auth`, `WASM_INSECURE_REGISTRIES`, `--ca-file`, the address guard, the per-read
//! timeout), with a token asked for `pull,push`.

mod dynamic_module;
pub mod inspect;
pub mod layout;
mod sign;
pub use sign::SignFormat;
pub(crate) mod upload;

use std::path::PathBuf;

pub use layout::Layout;

use crate::digest::Sha256;
use crate::error::FetchError;
use crate::oci::registry::Registry;
use crate::progress::Progress;
use crate::reference::oci::OciRef;
use crate::reference::Source;
use crate::settings::Settings;

/// One file to push, with the platform the command line gives it, if it does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleFile {
    pub path: PathBuf,
    /// `os/arch`, checked against the file's ELF header (dynamic modules only).
    pub platform: Option<String>,
}

impl From<PathBuf> for ModuleFile {
    fn from(path: PathBuf) -> Self {
        Self {
            path,
            platform: None,
        }
    }
}

impl ModuleFile {
    /// `PATH`, or `OS/ARCH=PATH` (`linux/arm64=target/aarch64-unknown-linux-gnu/release/libf.so`):
    /// what comes before the first `=` is a platform when it reads `linux/<arch>` (lower-case
    /// letters, digits and `_`; an ELF shared object is for Linux); a path that itself starts
    /// so is written `./linux/...`.
    pub fn parse(arg: &str) -> Result<Self, String> {
        let platform = arg.split_once('=').filter(|(p, _)| {
            p.strip_prefix("linux/").is_some_and(|arch| {
                !arch.is_empty()
                    && arch.len() <= 32
                    && arch
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            })
        });
        match platform {
            Some((_, "")) => Err(format!("{arg}: name the file after the `=`")),
            Some((platform, path)) => Ok(Self {
                path: path.into(),
                platform: Some(platform.to_string()),
            }),
            None if arg.is_empty() => Err("an empty module path".into()),
            None => Ok(PathBuf::from(arg).into()),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct PushRequest {
    /// The module files: one Wasm module, or one Envoy dynamic module per platform.
    pub modules: Vec<ModuleFile>,
    /// `oci://REGISTRY/REPO:TAG`.
    pub url: String,
    pub layout: Layout,
    /// Refuse a module that exports no `proxy_abi_version_*` function.
    pub check_abi: bool,
    /// Docker config JSON with credentials for the registry.
    pub pull_secret: Option<PathBuf>,
    /// Where the module's upload reports progress.
    pub progress: Progress,
    /// Also writes a cosign signature of the pushed manifest with this key.
    pub sign_key: Option<crate::keys::SignKey>,
    /// In which format.
    pub sign_format: SignFormat,
    /// With `Layout::DynamicModule`: the Envoy minor versions the module loads on.
    pub envoy_versions: Vec<String>,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The manifest was written under the tag (blobs the registry had were not sent again).
    Pushed,
    /// The tag already named this very manifest: nothing was sent.
    Unchanged,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Pushed {
    /// `oci://REGISTRY/REPO:TAG`, as given.
    pub url: String,
    /// `oci://REGISTRY/REPO@sha256:…`: the image by its manifest digest.
    pub digest_url: String,
    /// `sha256:…` of the manifest: what Istio checks a `WasmPlugin`'s `sha256` against.
    pub manifest_digest: String,
    /// Hex sha256 of the module itself; `None` when several dynamic modules were pushed
    /// (each is in `modules`).
    pub sha256: Option<String>,
    /// The module's size in bytes; `None` as `sha256` is.
    pub size: Option<u64>,
    pub layout: Layout,
    /// With `Layout::DynamicModule`: each file, by platform.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<PushedModule>,
    /// The module's `proxy_abi_version_*` exports.
    pub abi_versions: Vec<String>,
    pub outcome: Outcome,
}

/// One dynamic module of an index `push` wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PushedModule {
    pub platform: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    /// `sha256:…` of the child manifest that holds it.
    pub manifest_digest: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{0}")]
    Usage(String),
    #[error("not a Wasm module: {} ({reason}); push takes a core module, such as the filter `make filter` builds", path.display())]
    NotWasm { path: PathBuf, reason: String },
    #[error("not an Envoy dynamic module: {} ({reason})", path.display())]
    NotDynamicModule { path: PathBuf, reason: String },
    #[error("not a proxy-wasm module: {} exports no {}* function; build it with a proxy-wasm SDK, or push without --check-abi", path.display(), inspect::ABI_EXPORT_PREFIX)]
    NoAbi { path: PathBuf },
    #[error("denied: registry {registry} refused the push to {repository} (HTTP {status}); pass --pull-secret with a Docker config JSON whose entry for {registry} has push (write) access to {repository}")]
    Denied {
        registry: String,
        repository: String,
        status: u16,
    },
    #[error("refused media type: registry {registry} did not accept {what} ({detail}); try --layout compat, a plain OCI image that every registry takes")]
    MediaTypeRefused {
        registry: String,
        what: &'static str,
        detail: String,
    },
    /// An upload request answered with a redirect. Every upload request (the `POST` that
    /// opens an upload, the `PUT` of a blob or of the manifest) has this one rule, whether or
    /// not its body could be sent again: the distribution API moves an upload with `202` and a
    /// `Location`, never with a redirect, and a blob sent on to wherever one points would
    /// leave the registry the push was meant for.
    #[error("redirected upload: registry {registry} answered {what} with HTTP {status} to {to}; push follows no redirect on an upload (POST or PUT): push to the registry that redirects there directly")]
    UploadRedirected {
        registry: String,
        what: &'static str,
        status: u16,
        to: String,
    },
    #[error("dynamic modules too large: the files total {total} bytes, over the {bound} one push reads (one file per platform, each at most ISTIO_WASM_MAX_BINARY_SIZE_BYTES); push fewer or smaller files")]
    TooLarge { total: u64, bound: u64 },
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

impl PushError {
    /// A usage error (a reference that cannot name a push target), as opposed to a failure.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            PushError::Usage(_) | PushError::Fetch(FetchError::BadUrl { .. })
        )
    }
}

/// Where a push goes: an `oci://` reference with a tag and no digest (the digest is what the
/// push makes).
pub fn target(url: &str) -> Result<OciRef, PushError> {
    let bad = |reason: String| PushError::Fetch(FetchError::BadUrl { reason });
    let r = match Source::parse(url)? {
        Source::Oci(r) => r,
        _ => {
            return Err(bad(format!(
                "{}: push needs oci://REGISTRY/REPO:TAG",
                url.chars().take(200).collect::<String>()
            )))
        }
    };
    if r.digest.is_some() {
        return Err(bad(format!(
            "oci://{}/{}: push names a tag, not a digest; the digest is what the push prints",
            r.registry, r.repository
        )));
    }
    if r.tag.is_none() {
        return Err(bad(format!(
            "oci://{}/{}: name a tag (oci://{}/{}:TAG)",
            r.registry, r.repository, r.registry, r.repository
        )));
    }
    Ok(r)
}

/// Checks the module, builds the image and pushes it. Nothing is sent when the module or
/// the reference is refused; a tag that already names the same manifest is left alone.
pub async fn push(req: &PushRequest, settings: &Settings) -> Result<Pushed, PushError> {
    let r = target(&req.url)?;
    let tag = r.tag.clone().unwrap_or_default();
    let (image, pushed) = if req.layout == Layout::DynamicModule {
        dynamic_modules(req, settings)?
    } else {
        wasm_module(req, settings)?
    };
    let pushed = |outcome| Pushed {
        url: req.url.clone(),
        digest_url: format!(
            "oci://{}/{}@{}",
            r.registry, r.repository, image.manifest_digest
        ),
        manifest_digest: image.manifest_digest.clone(),
        outcome,
        ..pushed.clone()
    };
    let creds = crate::oci::auth::credentials(req.pull_secret.as_deref(), &r.registry).await?;
    let registry = Registry::new(&r, creds, settings).for_push();
    let d = registry.connect().await?;
    let outcome =
        if upload::current_digest(&d, &tag).await?.as_deref() == Some(&image.manifest_digest) {
            Outcome::Unchanged
        } else {
            for blob in &image.blobs {
                upload::ensure_blob(&d, blob, &req.progress).await?;
            }
            for (digest, child) in &image.children {
                upload::put_manifest(&d, digest, child, digest).await?;
            }
            upload::put_manifest(&d, &tag, &image.manifest, &image.manifest_digest).await?;
            Outcome::Pushed
        };
    if let Some(key) = &req.sign_key {
        let digest = crate::digest::parse_digest(&image.manifest_digest)?;
        match req.sign_format {
            SignFormat::SimpleSigning => sign::sign(&d, &digest, key).await?,
            SignFormat::Bundle => {
                let subject = sign::Subject {
                    digest: &digest,
                    media_type: upload::media_type_of(&image.manifest),
                    size: image.manifest.len(),
                };
                sign::sign_bundle(&d, &subject, key).await?
            }
        }
    }
    Ok(pushed(outcome))
}

/// What a push of a Wasm module sends: the one file, checked.
fn wasm_module(
    req: &PushRequest,
    settings: &Settings,
) -> Result<(layout::Image, Pushed), PushError> {
    let file = match req.modules.as_slice() {
        [one] if one.platform.is_none() => one,
        _ => {
            return Err(PushError::Usage(format!(
                "--layout {} pushes one module file, with no platform (several, or OS/ARCH=PATH, go with --layout dynamic-module)",
                req.layout
            )))
        }
    };
    let module = read_module(&file.path, settings.max_size)?;
    let abi_versions = inspect::abi_versions(&module).map_err(|reason| PushError::NotWasm {
        path: file.path.clone(),
        reason,
    })?;
    if req.check_abi && abi_versions.is_empty() {
        return Err(PushError::NoAbi {
            path: file.path.clone(),
        });
    }
    let image = layout::build(req.layout, &module, &abi_versions).map_err(|message| {
        FetchError::Registry {
            message: format!("cannot build the image: {message}"),
        }
    })?;
    let pushed = Pushed {
        sha256: Some(Sha256::of(&module).hex()),
        size: Some(module.len() as u64),
        abi_versions,
        ..unsent(req)
    };
    Ok((image, pushed))
}

/// What a push of dynamic modules sends: each file checked (its name, its ELF header, the
/// platform it is given as), then one index for all.
fn dynamic_modules(
    req: &PushRequest,
    settings: &Settings,
) -> Result<(layout::Image, Pushed), PushError> {
    if req.modules.is_empty() || req.modules.len() > dynamic_module::MAX_MODULES {
        return Err(PushError::Usage(format!(
            "{} module files: --layout dynamic-module pushes 1 to {}, one per platform",
            req.modules.len(),
            dynamic_module::MAX_MODULES
        )));
    }
    let refused = |file: &ModuleFile, reason: String| PushError::NotDynamicModule {
        path: file.path.clone(),
        reason,
    };
    // The sizes on disk are checked before anything is read; what was read is counted too,
    // in case a file grew since.
    let bound = dynamic_module::total_bound(settings.max_size);
    let too_large = |total: u64| PushError::TooLarge { total, bound };
    let on_disk = req
        .modules
        .iter()
        .map(|f| std::fs::metadata(&f.path).map_or(0, |m| m.len()))
        .fold(0, u64::saturating_add);
    if on_disk > bound {
        return Err(too_large(on_disk));
    }
    let mut total = 0u64;
    let mut read = Vec::new();
    for file in &req.modules {
        let bytes = read_module(&file.path, settings.max_size)?;
        total = total.saturating_add(bytes.len() as u64);
        if total > bound {
            return Err(too_large(total));
        }
        let file_name = file
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let platform = dynamic_module::check(&bytes, &file_name, file.platform.as_deref())
            .map_err(|reason| refused(file, reason))?;
        read.push((file, std::sync::Arc::new(bytes), file_name, platform));
    }
    let modules: Vec<dynamic_module::Module> = read
        .iter()
        .map(|(_, bytes, file_name, platform)| dynamic_module::Module {
            bytes: std::sync::Arc::clone(bytes),
            file_name,
            platform,
        })
        .collect();
    if let Err((at, reason)) = dynamic_module::conflict(&modules) {
        let file = req.modules.get(at).cloned().unwrap_or_default();
        return Err(refused(&file, reason));
    }
    let image = dynamic_module::build(&modules, &req.envoy_versions).map_err(PushError::Usage)?;
    let mut pushed_modules: Vec<PushedModule> = read
        .iter()
        .map(|(file, bytes, _, platform)| PushedModule {
            platform: platform.to_string(),
            path: file.path.clone(),
            sha256: Sha256::of(bytes).hex(),
            size: bytes.len() as u64,
            manifest_digest: String::new(),
        })
        .collect();
    // The index's children are in platform order too.
    pushed_modules.sort_by(|a, b| a.platform.cmp(&b.platform));
    for (m, (digest, _)) in pushed_modules.iter_mut().zip(&image.children) {
        m.manifest_digest = digest.clone();
    }
    let (sha256, size) = match pushed_modules.as_slice() {
        [one] => (Some(one.sha256.clone()), Some(one.size)),
        _ => (None, None),
    };
    let pushed = Pushed {
        sha256,
        size,
        modules: pushed_modules,
        ..unsent(req)
    };
    Ok((image, pushed))
}

/// A [`Pushed`] before the image is built and sent; the callers fill in the rest.
fn unsent(req: &PushRequest) -> Pushed {
    Pushed {
        url: req.url.clone(),
        digest_url: String::new(),
        manifest_digest: String::new(),
        sha256: None,
        size: None,
        layout: req.layout,
        modules: Vec::new(),
        abi_versions: Vec::new(),
        outcome: Outcome::Pushed,
    }
}

/// The module file, whole, if no puller would refuse its size.
fn read_module(path: &std::path::Path, limit: u64) -> Result<Vec<u8>, FetchError> {
    use crate::regular_file::{read, ReadError};
    read(path, limit).map_err(|e| match e {
        ReadError::TooLarge { limit } => FetchError::Read {
            what: "module",
            path: path.to_path_buf(),
            reason: format!(
                "larger than {limit} bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES), which pullers refuse"
            ),
        },
        other => crate::regular_file::named(other, "module", path),
    })
}

/// A `WasmPlugin` naming what was pushed, for Istio: the tag, pinned by `sha256`, which
/// for an `oci://` URL Istio (and Envoy Gateway) compare with the image's manifest digest,
/// not the module's sha256 (this fetcher accepts either). `plugin_config` becomes its
/// `pluginConfig`, the configuration the module is started with.
pub fn wasm_plugin(
    p: &Pushed,
    name: &str,
    plugin_config: Option<&serde_json::Value>,
) -> Result<String, String> {
    let mut spec = serde_json::json!({
        "url": p.url,
        "sha256": p.manifest_digest.trim_start_matches("sha256:"),
        "imagePullPolicy": "IfNotPresent",
    });
    if let Some(config) = plugin_config {
        spec["pluginConfig"] = config.clone();
    }
    let doc = serde_json::json!({
        "apiVersion": "extensions.istio.io/v1alpha1",
        "kind": "WasmPlugin",
        "metadata": {"name": name},
        "spec": spec,
    });
    let yaml = serde_norway::to_string(&doc).map_err(|e| e.to_string())?;
    let outcome = match p.outcome {
        Outcome::Pushed => "pushed",
        Outcome::Unchanged => "unchanged",
    };
    Ok(format!(
        "# {outcome} {url} (layout {layout})\n\
         # manifest digest: {manifest} (spec.sha256: Istio checks an oci:// module against it)\n\
         # module sha256:   {sha}\n\
         {yaml}",
        url = p.url,
        layout = p.layout,
        manifest = p.manifest_digest,
        sha = p.sha256.as_deref().unwrap_or("-"),
    ))
}

/// `--plugin-config`: a JSON or YAML object from a regular file of at most 1 MiB.
pub fn read_plugin_config(path: &std::path::Path) -> Result<serde_json::Value, FetchError> {
    use crate::regular_file::{read_input, PULL_SECRET_LIMIT};
    let bytes = read_input(path, "--plugin-config", PULL_SECRET_LIMIT)?;
    let bad = |reason: String| FetchError::Read {
        what: "--plugin-config",
        path: path.to_path_buf(),
        reason,
    };
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))?;
    let value: serde_json::Value =
        wasm_common::yaml::from_str(&text).map_err(|e| bad(format!("not JSON or YAML: {e}")))?;
    if !value.is_object() {
        return Err(bad(
            "expected an object (the plugin configuration, such as {\"role\": ...})".into(),
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_file_may_say_its_platform() {
        let given = |platform: &str, path: &str| ModuleFile {
            path: path.into(),
            platform: Some(platform.into()),
        };
        assert_eq!(
            ModuleFile::parse("linux/arm64=target/x/libf.so"),
            Ok(given("linux/arm64", "target/x/libf.so"))
        );
        for plain in [
            "libf.so",
            "./linux/arm64=libf.so",
            "a=b",
            "Linux/arm64=x",
            "dir/x=y/z",
        ] {
            assert_eq!(
                ModuleFile::parse(plain),
                Ok(PathBuf::from(plain).into()),
                "{plain}"
            );
        }
        assert!(ModuleFile::parse("linux/arm64=").is_err());
        assert!(ModuleFile::parse("").is_err());
    }

    #[test]
    fn dynamic_modules_over_the_total_bound_are_refused_before_any_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            max_size: 100,
            ..Settings::default()
        };
        // Each file within max_size, three of them over the bound; none is an ELF, which
        // would be the refusal if they were read.
        let modules: Vec<ModuleFile> = ["a", "b", "c"]
            .iter()
            .map(|d| {
                let path = dir.path().join(d).join("libf.so");
                std::fs::create_dir(dir.path().join(d)).unwrap();
                std::fs::write(&path, [0u8; 100]).unwrap();
                path.into()
            })
            .collect();
        let req = PushRequest {
            modules,
            layout: Layout::DynamicModule,
            envoy_versions: vec!["1.40".into()],
            ..PushRequest::default()
        };
        let e = dynamic_modules(&req, &settings).unwrap_err();
        assert!(
            matches!(
                e,
                PushError::TooLarge {
                    total: 300,
                    bound: 200
                }
            ),
            "{e}"
        );
        let text = e.to_string();
        assert!(text.contains("total 300 bytes, over the 200"), "{text}");
        // Two such files are within the bound: their refusal is their content.
        let two = PushRequest {
            modules: req.modules[..2].to_vec(),
            ..req
        };
        let e = dynamic_modules(&two, &settings).unwrap_err();
        assert!(matches!(e, PushError::NotDynamicModule { .. }), "{e}");
    }

    #[test]
    fn a_push_target_names_a_tag_in_an_oci_registry() {
        assert_eq!(
            target("oci://127.0.0.1:5000/team/filter:1.0")
                .unwrap()
                .tag
                .as_deref(),
            Some("1.0")
        );
        for (bad, words) in [
            ("oci://127.0.0.1:5000/team/filter", "name a tag"),
            (
                &format!("oci://127.0.0.1:5000/f:1@sha256:{}", "a".repeat(64)),
                "not a digest",
            ),
            ("https://example.com/f.wasm", "push needs oci://"),
            ("oci://host/Upper:1", "lower-case"),
            ("not a url", "invalid URL"),
        ] {
            let e = target(bad).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
            assert!(e.to_string().contains(words), "{bad}: {e}");
        }
    }
}
