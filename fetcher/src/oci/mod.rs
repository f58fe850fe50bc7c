//! The OCI vocabulary, in one place: media types and manifests (`manifest`), image references
//! (`reference`), the distribution API client (`distribution`, `registry`) and registry
//! credentials (`auth`, and the Docker credential helpers it may name, `cred_helper`), registry
//! mirrors (`hosts`). The `oci://` source (`crate::source::oci`) and `crate::push` speak to
//! registries through it.

pub mod auth;
pub mod cred_helper;
pub mod distribution;
pub mod hosts;
pub mod manifest;
pub mod reference;
pub mod registry;
