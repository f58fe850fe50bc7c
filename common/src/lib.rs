//! What the fetcher and the harness share, each in one place: Istio's duration grammar,
//! lock files, whole-file writes, the user's cache directory, and for tests the real Envoy.
//! Small on purpose: it depends on `tempfile` alone.

pub mod dirs;
pub mod duration;
#[cfg(feature = "test-support")]
pub mod envoy;
pub mod fs;
