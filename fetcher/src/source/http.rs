//! `http://` and `https://` sources, with Istio's retry rules: a timeout per attempt, at most
//! `WASM_HTTP_REQUEST_MAX_RETRIES` attempts with backoff between them, retrying only network
//! errors and 5xx other than 501/505/511; only 200 is success.

use std::time::Duration;

use crate::cache::Staging;
use crate::error::FetchError;
use crate::settings::Settings;

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
    let mut builder = reqwest::Client::builder().timeout(settings.http_timeout);
    for ca in &settings.extra_roots {
        for cert in
            reqwest::Certificate::from_pem_bundle(&ca.data).map_err(|e| FetchError::Network {
                attempts: 0,
                message: format!("--ca-file is not PEM: {e}"),
            })?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    let client = builder.build().map_err(|e| FetchError::Network {
        attempts: 0,
        message: format!("cannot build HTTP client: {e}"),
    })?;
    let mut last = None;
    for attempt in 1..=settings.http_attempts {
        if attempt > 1 {
            tokio::time::sleep(backoff(attempt - 2)).await;
            staging.reset()?;
        }
        match attempt_once(&client, url, staging, settings).await {
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

fn classify(e: reqwest::Error, settings: &Settings) -> FetchError {
    if e.is_timeout() {
        FetchError::TimedOut {
            attempts: 1,
            per_attempt: settings.http_timeout,
        }
    } else {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        FetchError::Network {
            attempts: 1,
            message,
        }
    }
}

async fn attempt_once(
    client: &reqwest::Client,
    url: &url::Url,
    staging: &mut Staging,
    settings: &Settings,
) -> Result<(), Attempt> {
    let mut resp = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| Attempt::Retry(classify(e, settings)))?;
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
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => staging.write(&chunk).map_err(Attempt::Final)?,
            Ok(None) => break,
            Err(e) => {
                let got = staging.size();
                return Err(Attempt::Retry(match expected {
                    Some(exp) if got < exp && !e.is_timeout() => {
                        FetchError::Truncated { got, expected: exp }
                    }
                    _ => classify(e, settings),
                }));
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
