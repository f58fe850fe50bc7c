//! `http://` and `https://` sources, with Istio's retry rules: a timeout per attempt, at most
//! `WASM_HTTP_REQUEST_MAX_RETRIES` attempts with backoff between them, retrying only network
//! errors and 5xx other than 501/505/511; only 200 is success.

use std::time::Duration;

use crate::error::FetchError;
use crate::settings::Settings;
use crate::store::cache::Staging;

fn retryable_status(status: u16) -> bool {
    (500..600).contains(&status) && !matches!(status, 501 | 505 | 511)
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100u64 << attempt.min(4))
}

pub async fn fetch(
    url: &url::Url,
    staging: &mut Staging,
    settings: &Settings,
) -> Result<(), FetchError> {
    let host = host_port(url);
    // As Istio: an HTTPS source whose host:port is in WASM_INSECURE_REGISTRIES (or `*`) is
    // fetched without certificate verification; every other one is verified.
    let client = crate::net::client(
        settings,
        settings.is_insecure_registry(&host),
        crate::net::Deadline::Total(settings.http_timeout),
    )?;
    // A literal address is checked before anything is sent (a proxy would reach it for us);
    // names are checked when resolved, redirects hop by hop.
    crate::guard::check_url(url, &settings.blocked_cidrs)?;
    let mut last = None;
    for attempt in 1..=settings.http_attempts {
        if attempt > 1 {
            tokio::time::sleep(backoff(attempt - 2)).await;
            staging.reset()?;
        }
        match attempt_once(&client, url, &host, staging, settings).await {
            Ok(()) => return Ok(()),

            Err(Attempt::Final(e)) => return Err(e),
            Err(Attempt::Retry(e)) => {
                tracing::debug!(%url, attempt, "retrying after: {e}");
                last = Some(e);
            }
        }
    }
    Err(match last {
        Some(FetchError::TimedOut { .. }) => FetchError::TimedOut {
            attempts: settings.http_attempts,
            per_attempt: settings.http_timeout,
        },
        Some(FetchError::Network { message, .. }) => FetchError::Network {
            attempts: settings.http_attempts,
            message,
        },
        Some(e) => e,
        None => FetchError::Network {
            attempts: 0,
            message: "no attempt made".into(),
        },
    })
}

enum Attempt {
    Retry(FetchError),
    Final(FetchError),
}

/// A failed attempt: timeouts and network errors are retried, an untrusted certificate is not
/// (it will not change by asking again).
fn classify(e: reqwest::Error, host: &str, settings: &Settings) -> Attempt {
    if let Some(refused) = crate::net::refused(&e) {
        return Attempt::Final(refused);
    }
    if e.is_timeout() {
        return Attempt::Retry(FetchError::TimedOut {
            attempts: 1,
            per_attempt: settings.http_timeout,
        });
    }
    match crate::error::untrusted_certificate(host, &e) {
        Some(untrusted) => Attempt::Final(untrusted),
        None => Attempt::Retry(FetchError::Network {
            attempts: 1,
            message: crate::error::chain(&e),
        }),
    }
}

/// `host:port` as WASM_INSECURE_REGISTRIES lists it (Go's `url.Host`: the port only when the
/// URL has one).
fn host_port(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

async fn attempt_once(
    client: &reqwest::Client,
    url: &url::Url,
    host: &str,
    staging: &mut Staging,
    settings: &Settings,
) -> Result<(), Attempt> {
    let mut resp = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| classify(e, host, settings))?;
    if let Some(e) = crate::net::unfollowed_redirect(&resp) {
        return Err(Attempt::Final(e));
    }
    let status = resp.status();
    if status.as_u16() != 200 {
        let e = FetchError::HttpStatus {
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or_default().to_string(),
        };
        return Err(if retryable_status(status.as_u16()) {
            Attempt::Retry(e)
        } else {
            Attempt::Final(e)
        });
    }
    let expected = resp.content_length();
    if let Some(len) = expected {
        if len > settings.max_size {
            return Err(Attempt::Final(FetchError::TooLarge {
                limit: settings.max_size,
            }));
        }
    }
    staging.started(expected);
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => staging.write(&chunk).map_err(Attempt::Final)?,
            Ok(None) => break,
            Err(e) => {
                let got = staging.size();
                return Err(match expected {
                    Some(exp) if got < exp && !e.is_timeout() => {
                        Attempt::Retry(FetchError::Truncated { got, expected: exp })
                    }
                    _ => classify(e, host, settings),
                });
            }
        }
    }
    if let Some(exp) = expected {
        if staging.size() < exp {
            return Err(Attempt::Retry(FetchError::Truncated {
                got: staging.size(),
                expected: exp,
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::retryable_status;

    #[test]
    fn only_some_5xx_are_retried() {
        assert!(retryable_status(500) && retryable_status(503) && retryable_status(504));
        assert!(!retryable_status(501) && !retryable_status(505) && !retryable_status(511));
        assert!(!retryable_status(404) && !retryable_status(200));
    }
}
