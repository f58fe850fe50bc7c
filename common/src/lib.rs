//! What the fetcher and the harness share, each in one place: Istio's duration grammar, the
//! Envoy type URLs, lock files, locks that survive a panic, whole-file writes, bounded reads of
//! regular files, the user's cache directory, YAML with bounded aliases, and for tests the real
//! Envoy.
//! Small on purpose: it depends on `tempfile`, `libc` and serde alone.

pub mod dirs;
pub mod duration;
#[cfg(feature = "test-support")]
pub mod envoy;
pub mod envoy_types;
pub mod fs;
pub mod regular_file;
pub mod sync;
pub mod yaml;
