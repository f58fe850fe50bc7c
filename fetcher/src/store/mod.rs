//! What the fetcher keeps: the content-addressed cache (`cache`), its index of sources,
//! resources and uses (`index`), what leaves it and what never does (`lifecycle`: expiry, size
//! bounds, leases), the unboxing of a staged body before it is committed (`unbox`), what
//! makes a file an Envoy dynamic module the cache may hold (`shared_object`), whether a target
//! Envoy can load it (`load_check`), and each Envoy version's dynamic-module ABI (`envoy_abi`).

pub mod cache;
pub mod envoy_abi;
pub mod index;
pub mod lifecycle;
pub mod load_check;
pub mod shared_object;
pub mod unbox;
