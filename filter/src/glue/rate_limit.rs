//! `rate-limit` on a stream: find the key, take a token from its bucket in shared data (a
//! compare-and-swap update, so workers never hand out the same token twice), and answer 429
//! with `retry-after` when there is none. The root remembers which keys its worker used and,
//! on each tick, empties the buckets nobody used for `idle_seconds`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::{log, raw, shared};
use crate::config::VmConfig;
use crate::rate_limit::{bucket_key, strip_port, Bucket, Decision, KeySource, RateLimit};

/// Keys one worker tracks for idle dropping; past this, new keys are still limited but
/// their buckets are left for another worker (or a later tick) to drop.
const MAX_TRACKED_KEYS: usize = 100_000;

pub struct Limiter {
    config: RateLimit,
    prefix: String,
    plugin: String,
    /// Shared-data key -> when this worker last used it.
    used: RefCell<HashMap<String, u64>>,
    limited: Option<u32>,
}

impl Limiter {
    pub fn new(config: RateLimit, vm: &VmConfig) -> Self {
        let plugin = raw::property_text(&["plugin_name"]).unwrap_or_else(|| "rate-limit".into());
        let period = config.idle_seconds.saturating_mul(1000);
        let status = raw::set_tick_period_ms(period);
        if status != raw::OK {
            log!(
                Warn,
                "setting the tick period failed with host status {status}; idle buckets stay"
            );
        }
        let limited = raw::define_counter("rate_limit_limited").ok();
        Self {
            config,
            prefix: vm.shared_data_prefix.clone(),
            plugin,
            used: RefCell::new(HashMap::new()),
            limited,
        }
    }

    fn key(&self) -> String {
        let raw_key = match &self.config.key {
            KeySource::Header(name) => raw::header_text(raw::REQUEST_HEADERS, name),
            KeySource::ClientAddress => {
                raw::property_text(&["source", "address"]).map(|a| strip_port(&a).to_string())
            }
        };
        bucket_key(
            &self.prefix,
            &self.plugin,
            raw_key.as_deref().unwrap_or_default(),
        )
    }

    /// Takes a token; a failure of the shared data lets the request through (and says so).
    fn take(&self, key: &str) -> Decision {
        let now = raw::now_ns();
        let result = shared::update(key, |old| {
            let (bucket, decision) = self.config.take(Bucket::decode(old)?, now);
            Ok((bucket.encode(), decision))
        });
        let mut used = self.used.borrow_mut();
        if used.len() < MAX_TRACKED_KEYS || used.contains_key(key) {
            used.insert(key.to_string(), now);
        }
        match result {
            Ok(d) => d,
            Err(e) => {
                log!(Warn, "rate limit not applied: {e}");
                Decision::Allowed { remaining: 0 }
            }
        }
    }

    /// Empties the buckets this worker used that have been idle long enough, unless another
    /// worker used them since (its write changes the CAS token, so the drop fails).
    pub fn drop_idle(&self) {
        let now = raw::now_ns();
        let idle = self.config.idle_ns();
        let mut dropped = 0;
        self.used.borrow_mut().retain(|key, last| {
            if now.saturating_sub(*last) < idle {
                return true;
            }
            let Ok((value, cas)) = raw::shared_data(key) else {
                return true;
            };
            // Already empty, or unreadable: nothing to drop.
            let Ok(Some(bucket)) = Bucket::decode(value.as_deref()) else {
                return false;
            };
            // Another worker used it since: that worker tracks it now.
            if !bucket.is_idle(now, idle) {
                return false;
            }
            // Still refilling: emptying it would hand out a full burst early.
            if !self.config.droppable(&bucket, now) {
                return true;
            }
            if raw::set_shared_data(key, b"", cas) == raw::OK {
                dropped += 1;
            }
            false
        });
        if dropped > 0 {
            log!(Info, "rate-limit: dropped {dropped} idle buckets");
        }
    }
}

pub struct LimitFilter {
    limiter: Rc<Limiter>,
}

impl LimitFilter {
    pub fn new(limiter: Rc<Limiter>) -> Self {
        Self { limiter }
    }
}

impl Context for LimitFilter {}

impl HttpContext for LimitFilter {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let key = self.limiter.key();
        match self.limiter.take(&key) {
            Decision::Allowed { .. } => Action::Continue,
            Decision::Limited { retry_after_secs } => {
                if let Some(id) = self.limiter.limited {
                    raw::increment(id, 1);
                }
                log!(Debug, "rate limited: {key}");
                let retry = retry_after_secs.to_string();
                let status = raw::send_local_response(
                    429,
                    "rate_limited",
                    b"rate limited\n",
                    &[("retry-after", &retry)],
                );
                if status != raw::OK {
                    log!(
                        Warn,
                        "429 reply failed with host status {status}; request continues"
                    );
                    return Action::Continue;
                }
                Action::Pause
            }
        }
    }
}
