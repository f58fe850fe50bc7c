//! Envoy dynamic modules (native `lib<name>.so` files) through an OCI registry: `push --layout
//! dynamic-module` writes an image index with one manifest per `os/arch`, each annotated with
//! the Envoy minor versions the module loads on; `pull --envoy-version` picks the child for a
//! platform and an Envoy version, checks the ELF header against that platform, and keeps the
//! file as `<cache>/dynamic-modules/<sha256>/lib<name>.so`, a directory Envoy's
//! `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` can name.

pub mod elf;
mod image;
mod pull;

pub use image::{build, module_name};
pub use pull::{pull, DynamicPulled};

/// The layer that is the shared object itself, uncompressed (`dlopen` takes the bytes as is).
pub const LAYER: &str = "application/vnd.wasm-fetcher.dynamic-module.layer.v1+elf";
/// The child manifest's config: `{"os", "architecture", "envoyVersions"}`.
pub const CONFIG: &str = "application/vnd.wasm-fetcher.dynamic-module.config.v1+json";
/// The Envoy minor versions a child loads on, comma-separated (`1.40,1.41`), on the index's
/// descriptor of each child and on the child manifest.
pub const ENVOY_VERSIONS: &str = "dev.wasm-fetcher.envoy.versions";
/// The file name Envoy looks for, on the layer.
pub const TITLE: &str = "org.opencontainers.image.title";

/// An Envoy minor version as the annotation lists it: `MAJOR.MINOR`, digits only.
pub fn parse_envoy_version(v: &str) -> Result<String, String> {
    let ok = v.split_once('.').is_some_and(|(major, minor)| {
        [major, minor]
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
    });
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{:?} is not an Envoy minor version such as 1.40",
            v.chars().take(40).collect::<String>()
        ))
    }
}
