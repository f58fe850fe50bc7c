//! The `rate-limit` role: a token bucket per key (a header's value, or the client's address),
//! held in shared data so every worker VM takes from the same bucket. The arithmetic is here,
//! with the clock passed in; the glue reads the bucket, calls [`take`], and writes it back
//! with compare-and-swap, retrying when another worker got there first.
//!
//! Tokens are counted in thousandths so a fractional refill rate (0.5 per second) is exact
//! without floating point, in the stored state and in the configuration (read from its
//! decimal text). A bucket is stored as text,
//! `<milli-tokens> <last-update-ns>`, inside a table entry of [`crate::bucket_table`], whose
//! size the configuration fixes.

use crate::quote::Quoted;

use serde::Deserialize;

use crate::stored;

pub use crate::rate_config::{KeySource, NumberText, Rate};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub key: KeySource,
    /// The bucket's size: how many requests may come at once.
    pub burst: u32,
    /// `refill_per_second` as written; [`RateLimit::validate`] reads it into
    /// [`RateLimit::refill_per_second`].
    #[serde(rename = "refill_per_second")]
    pub refill_text: NumberText,
    /// Tokens added back per second (fractions allowed, e.g. 0.5).
    #[serde(skip)]
    pub refill_per_second: Rate,
    /// A bucket unused this long (and refilled) may be taken over by another key.
    #[serde(default = "default_idle")]
    pub idle_seconds: u32,
    /// Table entries in shared data: keys active within `idle_seconds` beyond this share
    /// an overflow bucket. It bounds Envoy's memory, whatever keys clients send.
    #[serde(default = "default_buckets")]
    pub buckets: u32,
}

fn default_buckets() -> u32 {
    crate::bucket_table::DEFAULT_BUCKETS
}

fn default_idle() -> u32 {
    300
}

const NS_PER_SEC: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub milli_tokens: u64,
    pub updated_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed { remaining: u64 },
    Limited { retry_after_secs: u64 },
}

impl RateLimit {
    pub fn validate(&mut self) -> Result<(), String> {
        if let KeySource::Header(h) = &mut self.key {
            if !crate::header_ops::is_token(h.strip_prefix(':').unwrap_or(h)) {
                return Err(format!(
                    "key.header {}: not a valid HTTP header name",
                    Quoted(h)
                ));
            }
            *h = h.to_ascii_lowercase();
        }
        if self.burst == 0 {
            return Err("burst: must be at least 1".into());
        }
        self.refill_per_second = Rate::from_text(&self.refill_text)?;
        if self.idle_seconds == 0 {
            return Err("idle_seconds: must be at least 1".into());
        }
        let max = crate::bucket_table::MAX_BUCKETS;
        if self.buckets == 0 || self.buckets > max {
            return Err(format!(
                "buckets {}: must be between 1 and {max}",
                self.buckets
            ));
        }
        Ok(())
    }

    fn capacity(&self) -> u64 {
        u64::from(self.burst) * 1000
    }

    fn milli_per_second(&self) -> u64 {
        self.refill_per_second.milli.max(1)
    }

    pub fn idle_ns(&self) -> u64 {
        u64::from(self.idle_seconds) * 1_000_000_000
    }

    /// Refills `bucket` (a new one is full) up to `now_ns` and takes one token if there is
    /// one. The bucket returned is what to store, in both cases.
    pub fn take(&self, bucket: Option<Bucket>, now_ns: u64) -> (Bucket, Decision) {
        let (mut tokens, updated_ns) = self.refill(bucket, now_ns);
        let decision = if tokens >= 1000 {
            tokens -= 1000;
            Decision::Allowed {
                remaining: tokens / 1000,
            }
        } else {
            // At most 1000 * 10^9: within u64.
            let missing_ns = (1000 - tokens) * NS_PER_SEC / self.milli_per_second();
            Decision::Limited {
                retry_after_secs: missing_ns.div_ceil(NS_PER_SEC).max(1),
            }
        };
        let stored = Bucket {
            milli_tokens: tokens,
            updated_ns,
        };
        (stored, decision)
    }

    /// Whether a bucket may be emptied (made fresh): unused for `idle_seconds` *and* refilled
    /// to the burst by now. A fresh bucket is full, so emptying one still refilling would
    /// hand a client that waits `idle_seconds` a whole burst early.
    pub fn droppable(&self, bucket: &Bucket, now_ns: u64) -> bool {
        bucket.is_idle(now_ns, self.idle_ns())
            && self.refill(Some(*bucket), now_ns).0 >= self.capacity()
    }

    /// The bucket's milli-tokens at `now_ns` and the time they are counted up to. Only the
    /// time turned into whole milli-tokens is used up: the rest carries over, so a bucket
    /// updated more often than it earns a milli-token still refills (advancing to `now`
    /// would throw that time away on every request, and a busy bucket would never refill).
    /// A full bucket is counted up to `now`; a clock that went back refills nothing.
    fn refill(&self, bucket: Option<Bucket>, now_ns: u64) -> (u64, u64) {
        let cap = self.capacity();
        let Some(b) = bucket else {
            return (cap, now_ns);
        };
        let rate = self.milli_per_second();
        let elapsed = now_ns.saturating_sub(b.updated_ns);
        // `elapsed * rate / 10^9`, floored, in u64 arithmetic (a u128 division would link
        // compiler-builtins' 1 KB `u128_div_rem` into the module): whole seconds times the
        // rate, plus the rest of a second (under 10^9) times the rate (at most 10^9), under
        // 10^18. Past u64, the bucket is full whatever it held.
        let added = (elapsed / NS_PER_SEC)
            .checked_mul(rate)
            .and_then(|a| a.checked_add(elapsed % NS_PER_SEC * rate / NS_PER_SEC));
        let tokens = added.map_or(u64::MAX, |a| b.milli_tokens.saturating_add(a));
        let Some(added) = added.filter(|_| tokens < cap) else {
            return (cap, now_ns.max(b.updated_ns));
        };
        // `added * 10^9 / rate`, floored, the same way; at most `elapsed`.
        let used_ns = added / rate * NS_PER_SEC + added % rate * NS_PER_SEC / rate;
        (tokens, b.updated_ns.saturating_add(used_ns))
    }
}

impl Bucket {
    pub fn encode(&self) -> String {
        format!("{} {}", self.milli_tokens, self.updated_ns)
    }

    /// `None` for an absent or dropped bucket.
    pub fn decode(value: Option<&[u8]>) -> Result<Option<Self>, String> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let text = stored::text(value, "bucket")?;
        let bad = |problem| stored::malformed("bucket", text, problem);
        let Some((t, u)) = text.split_once(' ') else {
            return Err(bad(format_args!("expected `<milli-tokens> <ns>`")));
        };
        match (stored::number(t), stored::number(u)) {
            (Some(milli_tokens), Some(updated_ns)) => Ok(Some(Self {
                milli_tokens,
                updated_ns,
            })),
            _ => Err(bad(format_args!("expected two numbers"))),
        }
    }

    pub fn is_idle(&self, now_ns: u64, idle_ns: u64) -> bool {
        now_ns.saturating_sub(self.updated_ns) >= idle_ns
    }
}

/// `127.0.0.1:40001` -> `127.0.0.1`, `[::1]:5000` -> `::1`; an address without a port is
/// kept as it is.
pub fn strip_port(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.split_once(':') {
        Some((host, port)) if !port.contains(':') => host,
        _ => address,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;

    const S: u64 = 1_000_000_000;

    fn limit(json: &str) -> Result<RateLimit, String> {
        match PluginConfig::parse(json.as_bytes())? {
            PluginConfig::RateLimit(r) => Ok(r),
            other => Err(format!("parsed as {}", other.role())),
        }
    }

    fn two_per_second() -> RateLimit {
        limit(r#"{"role":"rate-limit","key":"client-address","burst":3,"refill_per_second":2}"#)
            .unwrap()
    }

    #[test]
    fn a_full_bucket_allows_burst_then_limits_then_refills() {
        let r = two_per_second();
        let mut b = None;
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (nb, d) = r.take(b, 10 * S);
            b = Some(nb);
            seen.push(d);
        }
        assert_eq!(
            seen,
            [
                Decision::Allowed { remaining: 2 },
                Decision::Allowed { remaining: 1 },
                Decision::Allowed { remaining: 0 },
                Decision::Limited {
                    retry_after_secs: 1
                },
            ]
        );
        // Half a second at 2/s is one token.
        let (nb, d) = r.take(b, 10 * S + S / 2);
        assert_eq!(d, Decision::Allowed { remaining: 0 });
        // A long pause refills to the burst, not beyond.
        let (_, d) = r.take(Some(nb), 1000 * S);
        assert_eq!(d, Decision::Allowed { remaining: 2 });
    }

    /// `refill` as a u128 computation, which it must equal.
    fn refill_u128(r: &RateLimit, b: Bucket, now_ns: u64) -> (u64, u64) {
        let rate = u128::from(r.milli_per_second());
        let elapsed = u128::from(now_ns.saturating_sub(b.updated_ns));
        let added = elapsed * rate / u128::from(S);
        let tokens = u128::from(b.milli_tokens) + added;
        if tokens >= u128::from(r.capacity()) {
            return (r.capacity(), now_ns.max(b.updated_ns));
        }
        let used = u64::try_from(added * u128::from(S) / rate).unwrap();
        (u64::try_from(tokens).unwrap(), b.updated_ns + used)
    }

    #[test]
    fn refill_in_u64_equals_the_exact_arithmetic_at_the_extremes() {
        for (burst, milli) in [(1, 1), (3, 500), (7, 2000), (u32::MAX, 1_000_000_000)] {
            let r = RateLimit {
                key: KeySource::ClientAddress,
                burst,
                refill_text: NumberText::default(),
                refill_per_second: Rate { milli },
                idle_seconds: 300,
                buckets: 1,
            };
            let cap = r.capacity();
            for milli_tokens in [0, 1, 999, cap / 2, cap - 1] {
                for updated_ns in [0, 1, S - 1, 7 * S + 3, u64::MAX / 2] {
                    for elapsed in [0, 1, 999_999, S - 1, S, 3 * S + 1, u64::MAX / 3, u64::MAX] {
                        let now = updated_ns.saturating_add(elapsed);
                        let b = Bucket {
                            milli_tokens,
                            updated_ns,
                        };
                        assert_eq!(
                            r.refill(Some(b), now),
                            refill_u128(&r, b, now),
                            "burst {burst}, {milli} milli/s, {b:?}, now {now}"
                        );
                    }
                }
            }
            // A clock that went back refills nothing.
            let b = Bucket {
                milli_tokens: 0,
                updated_ns: 10 * S,
            };
            assert_eq!(r.refill(Some(b), S), (0, 10 * S));
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let r = limit(
            r#"{"role":"rate-limit","key":{"header":"X-Key"},"burst":1,"refill_per_second":0.25}"#,
        )
        .unwrap();
        assert_eq!(r.key, KeySource::Header("x-key".into()));
        let (b, _) = r.take(None, 0);
        assert_eq!(
            r.take(Some(b), S).1,
            Decision::Limited {
                retry_after_secs: 3
            }
        );
    }

    #[test]
    fn a_bucket_hit_faster_than_it_earns_a_milli_token_still_refills() {
        // 0.5 per second is one milli-token every 2 ms; a request every millisecond must not
        // throw the half-earned milli-token away each time.
        let r = limit(
            r#"{"role":"rate-limit","key":"client-address","burst":1,"refill_per_second":0.5}"#,
        )
        .unwrap();
        let (mut b, d) = r.take(None, 0);
        assert_eq!(d, Decision::Allowed { remaining: 0 });
        let mut allowed = 0;
        for ms in 1..=4_000u64 {
            let (nb, d) = r.take(Some(b), ms * 1_000_000);
            b = nb;
            if matches!(d, Decision::Allowed { .. }) {
                allowed += 1;
            }
        }
        // Four seconds at 0.5 per second: two more requests get through.
        assert_eq!(allowed, 2);
    }

    #[test]
    fn only_an_idle_bucket_that_has_refilled_is_dropped() {
        // 100 tokens at 0.01 per second take 10 000 s to come back; idle after 300 s.
        let r = limit(
            r#"{"role":"rate-limit","key":"client-address","burst":100,"refill_per_second":0.01,"idle_seconds":300}"#,
        )
        .unwrap();
        let empty = Bucket {
            milli_tokens: 0,
            updated_ns: 0,
        };
        assert!(!r.droppable(&empty, 301 * S));
        assert!(!r.droppable(&empty, 9_999 * S));
        assert!(r.droppable(&empty, 10_000 * S));
        let full = Bucket {
            milli_tokens: 100_000,
            updated_ns: 0,
        };
        assert!(!r.droppable(&full, 299 * S));
        assert!(r.droppable(&full, 300 * S));
    }

    #[test]
    fn a_huge_gap_fills_the_bucket_without_overflow() {
        let r = two_per_second();
        let b = Bucket {
            milli_tokens: 0,
            updated_ns: 0,
        };
        let (stored, d) = r.take(Some(b), u64::MAX);
        assert_eq!(d, Decision::Allowed { remaining: 2 });
        assert_eq!(stored.updated_ns, u64::MAX);
    }

    #[test]
    fn a_clock_going_back_does_not_refill_or_wrap() {
        let r = two_per_second();
        let b = Bucket {
            milli_tokens: 0,
            updated_ns: 5 * S,
        };
        let (stored, d) = r.take(Some(b), S);
        assert!(matches!(d, Decision::Limited { .. }));
        assert_eq!(stored.updated_ns, 5 * S);
    }

    #[test]
    fn buckets_encode_and_go_idle() {
        let b = Bucket {
            milli_tokens: 2500,
            updated_ns: 7,
        };
        assert_eq!(b.encode(), "2500 7");
        assert_eq!(Bucket::decode(Some(b"2500 7")).unwrap(), Some(b));
        assert_eq!(Bucket::decode(Some(b"")).unwrap(), None);
        assert_eq!(Bucket::decode(None).unwrap(), None);
        assert!(Bucket::decode(Some(b"x 7")).is_err());
        assert!(Bucket::decode(Some(b"17")).is_err());
        assert!(b.is_idle(7 + 10, 10));
        assert!(!b.is_idle(7 + 9, 10));
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("127.0.0.1:40001"), "127.0.0.1");
        assert_eq!(strip_port("[::1]:5000"), "::1");
        assert_eq!(strip_port("10.0.0.1"), "10.0.0.1");
        assert_eq!(strip_port("fe80::1"), "fe80::1");
    }

    #[test]
    fn the_refill_rate_is_read_from_its_decimal_text() {
        let rate = |text: &str| {
            limit(&format!(
                r#"{{"role":"rate-limit","key":"client-address","burst":1,"refill_per_second":{text}}}"#
            ))
            .map(|r| (r.refill_per_second.milli, r.refill_per_second.to_string()))
        };
        for (text, milli, shown) in [
            ("2", 2000, "2"),
            ("0.5", 500, "0.5"),
            ("0.25", 250, "0.25"),
            ("0.001", 1, "0.001"),
            ("0.0015", 2, "0.002"),
            ("1.0019", 1002, "1.002"),
            ("2.5e-1", 250, "0.25"),
            ("1e6", 1_000_000_000, "1000000"),
            ("1000000.000", 1_000_000_000, "1000000"),
        ] {
            assert_eq!(rate(text), Ok((milli, shown.to_string())), "{text}");
        }
        for text in ["0", "-1", "-0", "0.0009", "1000000.0001", "1e7", "1e-400"] {
            assert_eq!(
                rate(text).unwrap_err(),
                format!("refill_per_second {text}: must be between 0.001 and 1000000")
            );
        }
        assert_eq!(
            rate(r#""1""#).unwrap_err(),
            "invalid type: string \"1\", expected a number at refill_per_second"
        );
    }

    #[test]
    fn bad_configurations_name_the_field() {
        for (json, want) in [
            (
                r#""key":"client-address","burst":0,"refill_per_second":1"#,
                "burst",
            ),
            (
                r#""key":"client-address","burst":1,"refill_per_second":0"#,
                "refill_per_second 0",
            ),
            (
                r#""key":"client-address","burst":1,"refill_per_second":1,"idle_seconds":0"#,
                "idle_seconds",
            ),
            (
                r#""key":{"header":"a b"},"burst":1,"refill_per_second":1"#,
                "key.header",
            ),
            (
                r#""key":"ip","burst":1,"refill_per_second":1"#,
                "unknown variant `ip`",
            ),
            (r#""burst":1,"refill_per_second":1"#, "missing field `key`"),
            (
                r#""key":"client-address","burst":1,"refill_per_second":1,"buckets":0"#,
                "buckets 0",
            ),
            (
                r#""key":"client-address","burst":1,"refill_per_second":1,"buckets":2000000"#,
                "buckets 2000000",
            ),
            (
                r#""key":"client-address","burst":1,"refill_per_second":1,"per":1"#,
                "unknown field `per`",
            ),
            (
                r#""key":"header","burst":1,"refill_per_second":1"#,
                "\"header\" needs a header name",
            ),
            (
                r#""key":{"header":5},"burst":1,"refill_per_second":1"#,
                "invalid type: integer `5`, expected a string at key.header",
            ),
            (
                r#""key":{"client-address":1},"burst":1,"refill_per_second":1"#,
                "takes no value",
            ),
            (
                r#""key":{"hdr":"x"},"burst":1,"refill_per_second":1"#,
                "unknown variant `hdr`, expected `header` or `client-address` at key",
            ),
            (
                r#""key":5,"burst":1,"refill_per_second":1"#,
                "invalid type: integer `5`",
            ),
            (
                r#""key":"client-address","burst":-1,"refill_per_second":1"#,
                "invalid value: integer `-1`, expected u32 at burst",
            ),
        ] {
            let e = limit(&format!(r#"{{"role":"rate-limit",{json}}}"#)).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
