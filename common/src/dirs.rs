//! Where per-user caches go.

use std::path::PathBuf;

/// `$XDG_CACHE_HOME`, else `~/.cache`, as the XDG base directory spec says; `None` when
/// neither is known (no `HOME`), so each tool decides its own fallback.
pub fn user_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })
}
