//! Pulls that try again. Istio's agent never retries an OCI pull (istio#46033) and gives an
//! HTTP pull a fixed number of attempts; here every source gets exponential backoff within one
//! deadline, and only failures that can pass are retried (a wrong pin or a 404 will not).

use std::time::Duration;

use tokio::time::Instant;

use super::metrics::{FetchResult, Metrics};
use crate::error::FetchError;
use crate::{Cache, PullRequest, Pulled, Settings};

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    /// For the whole pull, every attempt and pause included.
    pub deadline: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(250),
            max: Duration::from_secs(8),
            deadline: Duration::from_secs(60),
        }
    }
}

/// Whether another attempt might succeed.
pub fn transient(e: &FetchError) -> bool {
    match e {
        FetchError::Network { .. }
        | FetchError::TimedOut { .. }
        | FetchError::Truncated { .. }
        | FetchError::TooLong { .. }
        | FetchError::Registry { .. }
        | FetchError::Io(_) => true,
        FetchError::HttpStatus { status, .. } => {
            *status == 408
                || *status == 429
                || (*status >= 500 && ![501, 505, 511].contains(status))
        }
        // Another process holds the index or a source lock longer than it should.
        FetchError::Cache { .. } => true,
        _ => false,
    }
}

/// [`crate::pull`] with retries, recording Istio's lookup and fetch counters.
pub async fn pull(
    req: &PullRequest,
    cache: &Cache,
    settings: &Settings,
    backoff: Backoff,
    metrics: &Metrics,
) -> Result<Pulled, FetchError> {
    let oci = req.url.starts_with("oci://");
    // A local file is no remote fetch (Istio's agent never sees `file://`: istiod inlines it).
    let remote = !req.url.starts_with("file://");
    let end = Instant::now() + backoff.deadline;
    let mut pause = backoff.first;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let outcome = crate::envoy::render::pull_within(req, cache, settings, left).await;
        match &outcome {
            Ok(p) => {
                metrics.lookup(p.from_cache);
                if remote && !p.from_cache {
                    metrics.fetch(FetchResult::Success);
                }
            }
            Err(FetchError::NotInCache) => metrics.lookup(false),
            Err(e) => {
                metrics.lookup(false);
                if remote {
                    metrics.fetch(FetchResult::of_error(e, oci));
                }
            }
        }
        match outcome {
            Err(e) if transient(&e) && Instant::now() + pause < end => {
                tracing::warn!(url = %crate::reference::redact_for_display(&req.url), error = %crate::reference::redact_for_display(&e.to_string()), retry_in = ?pause, "pull failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(backoff.max);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_can_pass_is_retried() {
        let status = |status| FetchError::HttpStatus {
            status,
            reason: String::new(),
        };
        assert!(transient(&status(503)));
        assert!(transient(&status(429)));
        assert!(!transient(&status(404)));
        assert!(!transient(&status(501)));
        assert!(!transient(&FetchError::NotInCache));
        assert!(!transient(&FetchError::ChecksumMismatch {
            expected: "a".into(),
            actual: "b".into()
        }));
    }
}
