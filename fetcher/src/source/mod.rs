//! Where modules come from: one module per scheme, each streaming into a cache `Staging`.
//! `crate::pull` picks the source from the parsed URL (`crate::reference::Source`).

pub mod distribution;
pub mod file;
pub mod http;
pub mod oci;
