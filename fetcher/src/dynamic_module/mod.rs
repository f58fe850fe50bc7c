//! Envoy dynamic modules (native `lib<name>.so` files) through an OCI registry: `push --layout
//! dynamic-module` writes an image index with a manifest per file, each for the `os/arch` its
//! ELF header names, annotated with the Envoy minor versions the module loads on; `pull
//! --envoy-version` picks the child for a platform and an Envoy version, checks the ELF header
//! against that platform, and keeps the file as `<cache>/dynamic-modules/<sha256>/lib<name>.so`, a directory Envoy's
//! `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` can name.

mod pull;

pub use crate::shared_object as elf;
pub use crate::shared_object::{module_name, CONFIG, ENVOY_VERSIONS, LAYER, TITLE};
pub use pull::{pull, DynamicPulled};

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
