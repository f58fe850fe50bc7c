//! Envoy and Istio configuration around the pull engine: Istio's `WasmPlugin` (`wasmplugin`),
//! the ECDS resources and filter-chain entries made from it (`render`), Envoy configuration
//! whose Wasm names remote modules made to name cached files (`convert`) or one given file
//! (`rewrite`), dynamic-module filters pointed at a cached `lib<name>.so` (`dynamic_modules`),
//! the one walk that finds the Wasm in Envoy configuration (`sites`), and the
//! RBAC filter that stands in for a module that cannot be fetched (`fallback`). It uses the
//! pull engine's public face only (`crate::pull`, `Cache`, `PullRequest`, ...); the engine
//! knows nothing of it.

pub mod convert;
pub mod dynamic_modules;
pub mod fallback;
pub mod image_volumes;
pub mod render;
pub mod rewrite;
pub mod sites;
pub mod wasmplugin;
