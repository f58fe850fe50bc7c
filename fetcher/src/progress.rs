//! Download progress as byte counts, so a front end can draw it; the library draws nothing.

use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A download (or a retried attempt) begins; the total when the source says it.
    Started { total: Option<u64> },
    /// This many more bytes arrived.
    Advanced(u64),
}

/// Where a pull reports progress. The default reports nowhere.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<dyn Fn(Event) + Send + Sync>>);

impl Progress {
    pub fn new(f: impl Fn(Event) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(f)))
    }

    pub fn emit(&self, event: Event) {
        if let Some(f) = &self.0 {
            f(event);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(reporting)"
        } else {
            "Progress(none)"
        })
    }
}
