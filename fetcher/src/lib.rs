//! Pulls Wasm modules for Envoy the way Istio's agent does, into a verified,
//! content-addressed cache, and rewrites Envoy configuration to load the cached file.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wasm_fetcher::FetchError> {
//! use wasm_fetcher::{pull, Cache, PullRequest, Settings};
//! let cache = Cache::open("/var/cache/wasm".as_ref())?;
//! let pulled = pull(
//!     &PullRequest { url: "https://example.com/filter.wasm".into(), ..Default::default() },
//!     &cache,
//!     &Settings::from_env()?,
//! ).await?;
//! println!("{}", pulled.path.display());
//! # Ok(()) }
//! ```

//! # The wings, lowest first
//! Each names only itself and the wings below it (`tests/all/layers.rs` checks it):
//!
//! | wing | what it holds |
//! |---|---|
//! | the ground floor (one file each) | `error`, `shown` (quoting others' text), `digest` (sha256 pins, the Wasm header), `regular_file` (bounded reads), `keys`, `keyless` (a trusted root and an identity policy), `guard` (the address guard), `net` (the HTTP client), `settings`, `progress` |
//! | `reference/` | what a module URL or an image reference names |
//! | `store/` | the cache, its index, expiry and leases, unboxing, the shared-object checks |
//! | `oci/` | the registry: manifests, the distribution API, credentials, mirrors, cosign |
//! | `pull/` | one pull: policy, pins, a source per scheme, the dynamic-module pull |
//! | `push/` | images and signatures written to a registry |
//! | `envoy/` | Envoy and Istio configuration, through this file's public names only |
//! | `serve/` | the sidecar's loop: watch, pull, write ECDS files, purge |

#[cfg(test)]
mod alloc_meter;
mod digest;
pub mod error;
mod guard;
pub mod keyless;
mod keys;
mod net;
mod progress;
pub mod regular_file;
pub mod settings;
pub mod shown;
mod signed;

pub mod reference;

mod store;

mod oci;

pub mod pull;

pub mod push;

pub mod envoy;

pub mod serve;

/// Envoy dynamic modules (native `lib<name>.so` files) through an OCI registry: `push --layout
/// dynamic-module` writes an image index with a manifest per file, each for the `os/arch` its
/// ELF header names, annotated with the Envoy minor versions the module loads on; `pull
/// --envoy-version` picks the child for a platform and an Envoy version, checks its signature
/// and that this Envoy can load it (`load_check`, against `envoy_abi`), and keeps the file as `<cache>/dynamic-modules/<sha256>/lib<name>.so`,
/// a directory Envoy's `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` can name.
pub mod dynamic_module {
    pub use crate::pull::dynamic_module::{pull, DynamicPulled};
    pub use crate::store::envoy_abi::{self, EnvoyAbi};
    pub use crate::store::load_check;
    pub use crate::store::shared_object as elf;
    pub use crate::store::shared_object::{
        module_name, parse_envoy_version, CONFIG, ENVOY_VERSIONS, LAYER, TITLE,
    };
}

pub use digest::{Digest, Sha256};
pub use error::FetchError;
pub use guard::{Refusal, Rule};
pub use keyless::{Identity, Matcher, TrustedRoot};
pub use keys::{SignKey, VerifyKey};
pub use oci::cosign::{verify_bundle, Requirement};
pub use progress::{Event as ProgressEvent, Progress};
pub use pull::pin::PinMatch;
pub use pull::policy::PullPolicy;
pub use pull::source::image_volume;
pub use pull::{list, pull, purge, Listed, PullRequest, Pulled};
pub use settings::Settings;
pub use store::cache::Cache;
