//! What the fetcher keeps: the content-addressed cache (`cache`), its index of sources,
//! resources and uses (`index`), what leaves it and what never does (`lifecycle`: expiry, size
//! bounds, leases), the unboxing of a staged body before it is committed (`unbox`), and what
//! makes a file an Envoy dynamic module the cache may hold (`shared_object`).

pub mod cache;
pub mod index;
pub mod lifecycle;
pub mod shared_object;
pub mod unbox;
