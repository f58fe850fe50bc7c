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

#[cfg(test)]
mod alloc_meter;
pub mod cache;
pub mod dynamic_module;
pub mod envoy;
pub mod error;
mod guard;
mod index;
mod keys;
mod lifecycle;
mod net;
mod oci;
mod pin;
mod policy;
mod progress;
mod pull;
pub mod push;
pub mod reference;
pub mod regular_file;
pub mod serve;
pub mod settings;
pub mod shared_object;
pub mod signature;
mod source;
mod tls;
mod unbox;
mod verify;

pub use cache::Cache;
pub use error::FetchError;
pub use guard::{Refusal, Rule};
pub use pin::PinMatch;
pub use policy::PullPolicy;
pub use progress::{Event as ProgressEvent, Progress};
pub use pull::{list, pull, purge, Listed, PullRequest, Pulled};
pub use settings::Settings;
pub use source::image_volume;
pub use verify::{Digest, Sha256};
