//! What the fetcher and the harness share, each in one place: Istio's duration grammar,
//! lock files, whole-file writes, the user's cache directory, YAML with bounded aliases, and
//! for tests the real Envoy. Small on purpose: it depends on `tempfile` and serde alone.

pub mod dirs;
pub mod duration;
#[cfg(feature = "test-support")]
pub mod envoy;
pub mod fs;
pub mod yaml;
