//! Where `rate-limit` keeps its buckets: a table of a configured number of entries in shared
//! data, so no client can grow Envoy's memory by sending new keys (the ABI cannot delete a
//! shared-data key, so one key per client value would grow forever).
//!
//! A client key hashes (keyed by a secret of the process) to a 64-bit fingerprint and a
//! home slot; it may live in any of the
//! [`WAYS`] slots from its home on (wrapping). An entry is `<fingerprint> <milli-tokens>
//! <updated-ns>`; an empty value is a free slot. A lookup walks the ways in order and uses the
//! first entry carrying its fingerprint; a key with no entry claims the first slot that is
//! free or whose occupant is idle *and* refilled to its burst (so the occupant, coming back,
//! gets a fresh full bucket: what it would have had). Every write is a compare-and-swap on
//! that one slot's token. A key whose ways are all held by active keys shares one overflow
//! bucket with every other such key: it is limited more strictly, never less.
//!
//! The glue reads slots and writes them back; this module decides what a slot's value means
//! for a key ([`classify`]) and what to store.

use crate::keyed_hash::{siphash, Secret};
use crate::rate_limit::{Bucket, RateLimit};
use crate::stored;

/// How many slots one key may occupy; also the most slots a lookup reads.
pub const WAYS: u32 = 8;
/// Entries a table gets when the configuration does not say.
pub const DEFAULT_BUCKETS: u32 = 16_384;
/// The most entries a table may have (each is about 150 bytes of Envoy's memory).
pub const MAX_BUCKETS: u32 = 1 << 20;

/// A slot's value as one key sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The key's own entry, with its bucket.
    Mine(Bucket),
    /// Never written, or written empty: the key may claim it.
    Free,
    /// Another key's bucket, idle and full: the key may take it over.
    Idle,
    /// Another key's bucket, in use.
    Busy,
}

/// One table entry: whose bucket, and the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub fingerprint: u64,
    pub bucket: Bucket,
}

impl Entry {
    pub fn encode(&self) -> String {
        format!(
            "{:x} {} {}",
            self.fingerprint, self.bucket.milli_tokens, self.bucket.updated_ns
        )
    }

    /// `None` for a free slot (absent or empty).
    pub fn decode(value: Option<&[u8]>) -> Result<Option<Self>, String> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let text = stored::text(value, "entry")?;
        let bad = |problem| stored::malformed("entry", text, problem);
        let Some((fp, rest)) = text.split_once(' ') else {
            return Err(bad(format_args!(
                "expected `<fingerprint> <milli-tokens> <ns>`"
            )));
        };
        let Ok(fingerprint) = u64::from_str_radix(fp, 16) else {
            return Err(bad(format_args!("the fingerprint is not hexadecimal")));
        };
        let Some(bucket) = Bucket::decode(Some(rest.as_bytes()))? else {
            return Err(bad(format_args!("no bucket")));
        };
        Ok(Some(Self {
            fingerprint,
            bucket,
        }))
    }
}

/// The key's fingerprint: SipHash-2-4 keyed by the process's secret, the same in every VM
/// of the process (every worker must find the same slots) and unknown outside it, so no
/// client can choose keys that crowd a victim's slots and push it onto the overflow bucket.
/// Two keys with one fingerprint share a bucket (each gets fewer tokens), never more.
pub fn fingerprint(secret: Secret, key: &[u8]) -> u64 {
    siphash(secret, key)
}

/// The slots a key may live in, in lookup order.
pub fn slots(fingerprint: u64, buckets: u32) -> impl Iterator<Item = u32> {
    let n = u64::from(buckets.max(1));
    let home = fingerprint % n;
    (0..u64::from(WAYS.min(buckets.max(1))))
        .map(move |i| u32::try_from((home + i) % n).unwrap_or(0))
}

/// What the slot's stored value means for the key with `fingerprint`, at `now_ns`. An
/// unreadable value is another key's (it is left alone, never overwritten).
pub fn classify(limit: &RateLimit, value: Option<&[u8]>, fingerprint: u64, now_ns: u64) -> Slot {
    match Entry::decode(value) {
        Ok(entry) => classify_entry(limit, entry, fingerprint, now_ns),
        Err(_) => Slot::Busy,
    }
}

/// [`classify`] for an entry already decoded (`None`: a free slot); the dynamic module keeps
/// its table as entries in process memory.
pub fn classify_entry(
    limit: &RateLimit,
    entry: Option<Entry>,
    fingerprint: u64,
    now_ns: u64,
) -> Slot {
    match entry {
        None => Slot::Free,
        Some(e) if e.fingerprint == fingerprint => Slot::Mine(e.bucket),
        Some(e) if limit.droppable(&e.bucket, now_ns) => Slot::Idle,
        Some(_) => Slot::Busy,
    }
}

/// The shared-data key of slot `slot` of a plugin's table (the overflow bucket is `overflow`).
pub fn slot_key(prefix: &str, plugin: &str, slot: Option<u32>) -> String {
    match slot {
        Some(i) => format!("{prefix}rate-limit/{plugin}/{i}"),
        None => format!("{prefix}rate-limit/{plugin}/overflow"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret for the tests (the module's is random).
    const KEY: Secret = Secret([0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]);

    /// The fingerprint before it was keyed: FNV-1a with SplitMix64's mixer, the same for
    /// everyone, so anyone could compute where a key lands.
    pub fn unkeyed(key: &[u8]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in key {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= h >> 30;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 27;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }

    /// Keys crafted against the unkeyed fingerprint to fill every slot a victim may use
    /// (and one more for the overflow bucket) land all over the table under the keyed one.
    #[test]
    fn keys_crafted_for_a_victims_slots_miss_them_under_the_secret() {
        let buckets = 1024;
        let home = |fp| slots(fp, buckets).next().unwrap();
        let victim = home(unkeyed(b"victim"));
        let crafted: Vec<String> = (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| home(unkeyed(k.as_bytes())) == victim)
            .take(WAYS as usize + 1)
            .collect();
        assert_eq!(crafted.len(), 9);
        let ways: Vec<u32> = slots(fingerprint(KEY, b"victim"), buckets).collect();
        let landed = crafted
            .iter()
            .filter(|k| ways.contains(&home(fingerprint(KEY, k.as_bytes()))))
            .count();
        assert!(landed < 2, "{landed} crafted keys on the victim's ways");
    }
    use crate::config::PluginConfig;

    const S: u64 = 1_000_000_000;

    fn limit() -> RateLimit {
        match PluginConfig::parse(
            br#"{"role":"rate-limit","key":{"header":"k"},"burst":2,"refill_per_second":0.1,"idle_seconds":10,"buckets":64}"#,
        )
        .unwrap()
        {
            PluginConfig::RateLimit(r) => r,
            other => panic!("{}", other.role()),
        }
    }

    #[test]
    fn entries_round_trip_and_empty_is_free() {
        let e = Entry {
            fingerprint: 0xdead_beef,
            bucket: Bucket {
                milli_tokens: 1500,
                updated_ns: 9,
            },
        };
        assert_eq!(e.encode(), "deadbeef 1500 9");
        assert_eq!(Entry::decode(Some(b"deadbeef 1500 9")).unwrap(), Some(e));
        assert_eq!(Entry::decode(Some(b"")).unwrap(), None);
        assert_eq!(Entry::decode(None).unwrap(), None);
        for bad in [&b"zz 1 2"[..], b"1 2", b"ab", b"\xff 1 2"] {
            assert!(Entry::decode(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_key_has_at_most_ways_slots_inside_the_table() {
        let fp = fingerprint(KEY, b"alice");
        assert_eq!(fp, fingerprint(KEY, b"alice"));
        assert_ne!(fp, fingerprint(KEY, b"alicf"));
        let s: Vec<u32> = slots(fp, 64).collect();
        assert_eq!(s.len(), WAYS as usize);
        assert!(s.iter().all(|&i| i < 64));
        assert_eq!(s[1], (s[0] + 1) % 64);
        assert_eq!(slots(fp, 3).collect::<Vec<_>>().len(), 3);
        assert_eq!(slots(fp, 1).collect::<Vec<_>>(), [0]);
        // Another secret, another fingerprint.
        assert_ne!(fp, fingerprint(Secret([3, 4]), b"alice"));
    }

    #[test]
    fn fingerprints_spread_over_the_table() {
        let mut homes = [0u32; 64];
        for i in 0..64_000 {
            let home = slots(fingerprint(KEY, format!("client-{i}").as_bytes()), 64)
                .next()
                .unwrap();
            homes[home as usize] += 1;
        }
        // 1 000 each on average.
        assert!(homes.iter().all(|&n| (800..1200).contains(&n)), "{homes:?}");
    }

    #[test]
    fn a_slot_is_mine_free_idle_or_busy() {
        let l = limit();
        let mine = fingerprint(KEY, b"a");
        let other = Entry {
            fingerprint: fingerprint(KEY, b"b"),
            bucket: Bucket {
                milli_tokens: 2000,
                updated_ns: 0,
            },
        }
        .encode();
        let drained = Entry {
            fingerprint: fingerprint(KEY, b"b"),
            bucket: Bucket {
                milli_tokens: 0,
                updated_ns: 0,
            },
        }
        .encode();
        assert_eq!(classify(&l, None, mine, 0), Slot::Free);
        assert_eq!(classify(&l, Some(b""), mine, 0), Slot::Free);
        assert_eq!(
            classify(&l, Some(other.as_bytes()), mine, 9 * S),
            Slot::Busy
        );
        assert_eq!(
            classify(&l, Some(other.as_bytes()), mine, 10 * S),
            Slot::Idle
        );
        // Idle but still refilling (20 s to refill): taking it over would hand its key a
        // burst early.
        assert_eq!(
            classify(&l, Some(drained.as_bytes()), mine, 10 * S),
            Slot::Busy
        );
        assert_eq!(classify(&l, Some(b"junk"), mine, 100 * S), Slot::Busy);
        let own = format!("{mine:x} 1000 5");
        assert_eq!(
            classify(&l, Some(own.as_bytes()), mine, 0),
            Slot::Mine(Bucket {
                milli_tokens: 1000,
                updated_ns: 5
            })
        );
    }

    #[test]
    fn slot_keys_are_bounded_by_the_table() {
        assert_eq!(slot_key("p/", "rl", Some(7)), "p/rate-limit/rl/7");
        assert_eq!(slot_key("p/", "rl", None), "p/rate-limit/rl/overflow");
    }
}
