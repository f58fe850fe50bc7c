//! `rate-limit` on a stream: find the key's entry in the bucket table (shared data, a size
//! fixed by configuration; see [`crate::bucket_table`]), take a token from it with a
//! compare-and-swap on that entry (so workers never hand out the same token twice), and
//! answer 429 with `retry-after` when there is none. Idle entries are taken over by new keys
//! as they come, so nothing sweeps and no worker keeps a list of keys. Counted: requests
//! allowed and limited (`allowed_total`, `limited_total`), those the overflow bucket decided
//! (`overflow_total`) and those let through because shared data failed (`failed_open_total`).

use crate::quote::Quoted;
use std::rc::Rc;

use proxy_wasm::types::{Action, MapType, Status};

use super::metrics::{Counter, Metrics};
use super::{host, log, shared};
use crate::bucket_table::{classify, fingerprint, slot_key, slots, Entry, Slot};
use crate::config::VmConfig;
use crate::keyed_hash::Secret;
use crate::rate_limit::{strip_port, Bucket, Decision, KeySource, RateLimit};

pub struct Limiter {
    config: RateLimit,
    prefix: String,
    plugin: String,
    allowed: Counter,
    limited: Counter,
    overflow: Counter,
    failed_open: Counter,
}

/// How a take ended, when it did not end in a decision.
enum Outcome {
    Decided(Decision),
    /// Another worker changed the slot between the read and the write: look again.
    Raced,
}

impl Limiter {
    #[inline(never)]
    pub fn new(config: RateLimit, vm: &VmConfig) -> Self {
        let m = Metrics::new("rate-limit");
        let plugin = match m.plugin() {
            "" => "rate-limit".to_string(),
            name => name.to_string(),
        };
        let limiter = Self {
            config,
            prefix: vm.shared_data_prefix.clone(),
            plugin,
            allowed: m.counter("allowed_total"),
            limited: m.counter("limited_total"),
            overflow: m.counter("overflow_total"),
            failed_open: m.counter("failed_open_total"),
        };
        if let Err(e) = limiter.secret() {
            log!(Warn, "rate-limit: {e}; it is created at first use");
        }
        limiter.create_table();
        limiter
    }

    /// The process's fingerprint secret, from shared data (every worker's VM reads the same
    /// one); the first VM to find none stores a random one. Read on every request, so a VM
    /// that lost the race to create it adopts the one that stayed.
    fn secret(&self) -> Result<Secret, String> {
        let key = format!("{}rate-limit.secret", self.prefix);
        for _ in 0..shared::MAX_CAS_ATTEMPTS {
            let (value, cas) = host::shared_data(&key).map_err(|s| {
                format!(
                    "reading shared data {} failed with host status {s:?}",
                    Quoted(&key)
                )
            })?;
            let text = value.as_deref().map(String::from_utf8_lossy);
            let written = match text.as_deref() {
                Some(t) if !t.is_empty() => {
                    return Secret::from_hex(t)
                        .ok_or_else(|| format!("shared data {} is not a secret", Quoted(&key)))
                }
                // The ABI has no create-if-absent: create it empty, then fill it with a
                // compare-and-swap, so two VMs never both think theirs is the one.
                None => host::set_shared_data(&key, b"", 0),
                Some(_) => host::set_shared_data(&key, Secret::random().to_hex().as_bytes(), cas),
            };
            match written {
                Ok(()) | Err(Status::CasMismatch) => {}
                Err(s) => {
                    return Err(format!(
                        "writing shared data {} failed with host status {s:?}",
                        Quoted(&key)
                    ))
                }
            }
        }
        Err(format!(
            "shared data {}: gave up after {} compare-and-swap attempts",
            Quoted(&key),
            shared::MAX_CAS_ATTEMPTS
        ))
    }

    /// Creates every slot not there yet, empty, before this worker serves a request: a write
    /// creating a key is unconditional (the ABI has no create-if-absent), so done later it
    /// could wipe another worker's entry. Envoy's memory for the table is taken here, once.
    fn create_table(&self) {
        let mut failed = 0u32;
        for slot in (0..self.config.buckets).map(Some).chain([None]) {
            let key = slot_key(&self.prefix, &self.plugin, slot);
            match host::shared_data(&key) {
                Ok((Some(_), _)) => {}
                Ok((None, _)) => {
                    if host::set_shared_data(&key, b"", 0).is_err() {
                        failed += 1;
                    }
                }
                Err(_) => failed += 1,
            }
        }
        if failed > 0 {
            log!(
                Warn,
                "rate-limit: {failed} of {} table entries could not be created; they are created at first use",
                self.config.buckets
            );
        }
    }

    fn key(&self) -> Option<String> {
        match &self.config.key {
            KeySource::Header(name) => host::header_text(MapType::HttpRequestHeaders, name),
            KeySource::ClientAddress => {
                host::property_text(&["source", "address"]).map(|a| strip_port(&a).to_string())
            }
        }
    }

    /// Takes a token for `key`; a failure of the shared data lets the request through (and
    /// says so).
    fn take(&self, key: &str) -> Decision {
        let secret = match self.secret() {
            Ok(s) => s,
            Err(e) => {
                log!(Warn, "rate limit not applied: {e}");
                self.failed_open.add(1);
                return Decision::Allowed { remaining: 0 };
            }
        };
        let fp = fingerprint(secret, key.as_bytes());
        for _ in 0..shared::MAX_CAS_ATTEMPTS {
            match self.try_take(fp) {
                Ok(Outcome::Decided(d)) => return d,
                Ok(Outcome::Raced) => {}
                Err(e) => {
                    log!(Warn, "rate limit not applied: {e}");
                    self.failed_open.add(1);
                    return Decision::Allowed { remaining: 0 };
                }
            }
        }
        self.failed_open.add(1);
        log!(
            Warn,
            "rate limit not applied: gave up after {} compare-and-swap attempts (other workers kept changing the key's entries)",
            shared::MAX_CAS_ATTEMPTS
        );
        Decision::Allowed { remaining: 0 }
    }

    /// One walk of the key's slots: its own entry if it has one, else the first slot free
    /// or idle, else the overflow bucket.
    #[inline(never)]
    fn try_take(&self, fp: u64) -> Result<Outcome, String> {
        let now = host::now_ns();
        let mut claim: Option<(String, u32)> = None;
        for slot in slots(fp, self.config.buckets) {
            let key = slot_key(&self.prefix, &self.plugin, Some(slot));
            let (value, cas) = host::shared_data(&key).map_err(|s| {
                format!(
                    "reading shared data {} failed with host status {s:?}",
                    Quoted(&key)
                )
            })?;
            match classify(&self.config, value.as_deref(), fp, now) {
                Slot::Mine(bucket) => return self.write(&key, fp, Some(bucket), cas, now),
                Slot::Free if value.is_none() => {
                    // Not created at start-up (it failed then): create it, then claim it
                    // with a real token on the next walk.
                    if claim.is_none() {
                        if let Err(status) = host::set_shared_data(&key, b"", 0) {
                            return Err(format!(
                                "creating shared data {} failed with host status {status:?}",
                                Quoted(&key)
                            ));
                        }
                        return Ok(Outcome::Raced);
                    }
                }
                Slot::Free | Slot::Idle => {
                    if claim.is_none() {
                        claim = Some((key, cas));
                    }
                }
                Slot::Busy => {}
            }
        }
        if let Some((key, cas)) = claim {
            return self.write(&key, fp, None, cas, now);
        }
        let key = slot_key(&self.prefix, &self.plugin, None);
        self.overflow.add(1);
        shared::update(&key, |old| {
            let bucket = Entry::decode(old)?.map(|e| e.bucket);
            let (bucket, decision) = self.config.take(bucket, now);
            let entry = Entry {
                fingerprint: 0,
                bucket,
            };
            Ok((entry.encode(), decision))
        })
        .map(Outcome::Decided)
    }

    /// Takes a token from `bucket` (a fresh one when claiming) and stores the entry if the
    /// slot's token is still `cas`.
    fn write(
        &self,
        key: &str,
        fp: u64,
        bucket: Option<Bucket>,
        cas: u32,
        now: u64,
    ) -> Result<Outcome, String> {
        let (bucket, decision) = self.config.take(bucket, now);
        let entry = Entry {
            fingerprint: fp,
            bucket,
        };
        match host::set_shared_data(key, entry.encode().as_bytes(), cas) {
            Ok(()) => Ok(Outcome::Decided(decision)),
            Err(Status::CasMismatch) => Ok(Outcome::Raced),
            Err(status) => Err(format!(
                "writing shared data {} failed with host status {status:?}",
                Quoted(key)
            )),
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

/// The callbacks [`super::stream`]'s contexts route here, each compiled on its own (see
/// `plugin::PluginContext::configure`).
impl LimitFilter {
    #[inline(never)]
    pub fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let key = self.limiter.key().unwrap_or_default();
        match self.limiter.take(&key) {
            Decision::Allowed { .. } => {
                self.limiter.allowed.add(1);
                Action::Continue
            }
            Decision::Limited { retry_after_secs } => {
                self.limiter.limited.add(1);
                log!(Debug, "rate limited: {key}");
                let retry = retry_after_secs.to_string();
                if let Err(status) = host::send_local_response(
                    429,
                    "rate_limited",
                    b"rate limited\n",
                    &[("retry-after", &retry)],
                ) {
                    log!(
                        Warn,
                        "429 reply failed with host status {status:?}; request continues"
                    );
                    return Action::Continue;
                }
                Action::Pause
            }
        }
    }
}
