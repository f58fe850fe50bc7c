//! The OCI vocabulary: the distribution API client (`distribution`, `registry`) and registry
//! credentials (`auth`).

pub mod auth;
pub mod distribution;
pub mod registry;
