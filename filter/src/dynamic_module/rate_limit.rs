//! `rate-limit` as a dynamic module: the same bucket table as the Wasm module's
//! ([`crate::bucket_table`]: a configured number of slots, [`crate::bucket_table::WAYS`] per
//! key, idle-and-full entries taken over, one overflow bucket), held in process memory behind
//! a mutex instead of shared data. Every worker thread of the process takes from the same
//! table, so no compare-and-swap retries are needed and the table cannot fail: nothing is
//! let through unlimited. Counted as the Wasm module counts: `allowed_total`,
//! `limited_total`, `overflow_total`, and `failed_open_total`, defined so the series match
//! but never counted (nothing here fails open).

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use super::host::{log, Stream};
use super::metrics::{Counter, Metrics};
use super::Outcome;
use crate::body_flow::Side;
use crate::bucket_table::{classify_entry, fingerprint, slots, Entry, Slot};
use crate::keyed_hash::Secret;
use crate::rate_limit::{strip_port, Decision, KeySource, RateLimit};

struct Table {
    slots: Vec<Option<Entry>>,
    overflow: Option<crate::rate_limit::Bucket>,
}

pub struct Limiter {
    config: RateLimit,
    /// The fingerprints' key: random, chosen when Envoy creates the configuration (one
    /// table in process memory serves every worker, so one secret does).
    secret: Secret,
    table: Mutex<Table>,
    allowed: Counter,
    limited: Counter,
    overflow: Counter,
    /// Defined, never counted: see the module's doc.
    _failed_open: Counter,
}

/// Nanoseconds on a monotonic clock shared by every worker (the buckets only compare times
/// with each other, so its origin does not matter; a wall clock could go back).
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(elapsed).unwrap_or(u64::MAX)
}

impl Limiter {
    /// The table's memory (`buckets` entries of 32 bytes) is taken here, once, on the main
    /// thread.
    pub fn new(config: RateLimit, m: &Metrics) -> Self {
        let slots = vec![None; config.buckets as usize];
        Self {
            config,
            secret: Secret::random(),
            table: Mutex::new(Table {
                slots,
                overflow: None,
            }),
            allowed: m.counter("allowed_total"),
            limited: m.counter("limited_total"),
            overflow: m.counter("overflow_total"),
            _failed_open: m.counter("failed_open_total"),
        }
    }

    pub fn summary(&self) -> String {
        let c = &self.config;
        format!(
            "burst {}, {} per second, {} buckets in process memory",
            c.burst, c.refill_per_second, c.buckets
        )
    }

    /// Takes a token for `key` at `now`: its own entry if it has one, else the first slot
    /// free or idle, else the overflow bucket (then the answer's `true`).
    fn take(&self, key: &str, now: u64) -> (Decision, bool) {
        let fp = fingerprint(self.secret, key.as_bytes());
        // A panic while the lock was held cannot leave an entry half-written (each is one
        // assignment), so a poisoned table is still a good one.
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let mut claim = None;
        for slot in slots(fp, self.config.buckets) {
            let i = slot as usize;
            let entry = table.slots.get(i).copied().flatten();
            match classify_entry(&self.config, entry, fp, now) {
                Slot::Mine(bucket) => {
                    return (self.store(&mut table, i, fp, Some(bucket), now), false)
                }
                Slot::Free | Slot::Idle => {
                    claim.get_or_insert(i);
                }
                Slot::Busy => {}
            }
        }
        if let Some(i) = claim {
            return (self.store(&mut table, i, fp, None, now), false);
        }
        let (bucket, decision) = self.config.take(table.overflow, now);
        table.overflow = Some(bucket);
        (decision, true)
    }

    fn store(
        &self,
        table: &mut Table,
        i: usize,
        fp: u64,
        bucket: Option<crate::rate_limit::Bucket>,
        now: u64,
    ) -> Decision {
        let (bucket, decision) = self.config.take(bucket, now);
        if let Some(slot) = table.slots.get_mut(i) {
            *slot = Some(Entry {
                fingerprint: fp,
                bucket,
            });
        }
        decision
    }

    fn key(&self, stream: &Stream) -> String {
        match &self.config.key {
            KeySource::Header(name) => stream.header(Side::Request, name),
            KeySource::ClientAddress => stream.source_address().map(|a| strip_port(&a).to_string()),
        }
        .unwrap_or_default()
    }

    /// The request headers hook: continue, or answer 429 with `retry-after`.
    pub fn on_request_headers(&self, stream: &Stream) -> Outcome {
        let key = self.key(stream);
        let (decision, overflow) = self.take(&key, now_ns());
        if overflow {
            stream.count(self.overflow, 1);
        }
        match decision {
            Decision::Allowed { .. } => {
                stream.count(self.allowed, 1);
                Outcome::Continue
            }
            Decision::Limited { retry_after_secs } => {
                stream.count(self.limited, 1);
                log!(Debug, "rate limited: {key}");
                let retry = retry_after_secs.to_string();
                stream.send_response(
                    429,
                    "rate_limited",
                    b"rate limited\n",
                    &[("retry-after", &retry)],
                );
                Outcome::Stop
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::host::ConfigScope;
    use super::*;
    use crate::config::PluginConfig;

    const S: u64 = 1_000_000_000;

    fn limiter(buckets: u32) -> Limiter {
        let json = format!(
            r#"{{"role":"rate-limit","key":{{"header":"k"}},"burst":2,"refill_per_second":1,"idle_seconds":10,"buckets":{buckets}}}"#
        );
        match PluginConfig::parse(json.as_bytes()).unwrap() {
            PluginConfig::RateLimit(r) => {
                Limiter::new(r, &Metrics::new(&ConfigScope::none(), "p", "rate-limit"))
            }
            other => panic!("{}", other.role()),
        }
    }

    fn allowed((d, _): (Decision, bool)) -> bool {
        matches!(d, Decision::Allowed { .. })
    }

    #[test]
    fn a_key_has_its_burst_then_refills() {
        let l = limiter(64);
        assert!(allowed(l.take("a", S)));
        assert!(allowed(l.take("a", S)));
        assert_eq!(
            l.take("a", S),
            (
                Decision::Limited {
                    retry_after_secs: 1
                },
                false
            )
        );
        // Another key has its own bucket.
        assert!(allowed(l.take("b", S)));
        assert!(allowed(l.take("a", 2 * S)));
    }

    #[test]
    fn keys_beyond_the_table_share_the_overflow_bucket() {
        // One slot: the first key holds it while active; every other key shares overflow.
        let l = limiter(1);
        assert!(allowed(l.take("a", S)));
        assert!(allowed(l.take("b", S)));
        let (c, overflow) = l.take("c", S);
        assert!(
            allowed((c, overflow)) && overflow,
            "c: the overflow bucket's"
        );
        assert!(!allowed(l.take("d", S)), "b, c and d share two tokens");
        // `a` idle and refilled: its slot goes to the next new key.
        let later = 20 * S;
        assert!(allowed(l.take("e", later)));
        assert!(allowed(l.take("e", later)));
        assert!(!allowed(l.take("e", later)), "e has its own burst of 2");
        let table = l.table.lock().unwrap();
        assert_eq!(table.slots.len(), 1);
        assert_eq!(
            table.slots[0].unwrap().fingerprint,
            fingerprint(l.secret, b"e")
        );
    }
}
