//! The OCI vocabulary, in one place: media types and manifests (`manifest`), the distribution
//! API client (`distribution`, `registry`), registry credentials (`auth`, and the Docker
//! credential helpers it may name, `cred_helper`), registry mirrors (`hosts`), and cosign
//! signatures stored beside an image (`cosign`). Image references are `crate::reference::oci`:
//! what a URL names comes before any registry is asked. The `oci://` source
//! (`crate::pull::source::oci`) and `crate::push` speak to registries through it.

pub mod auth;
pub mod cosign;
pub mod cred_helper;
pub mod distribution;
pub mod hosts;
pub mod manifest;
pub mod registry;
