//! `rate-limit` in the harness: one bucket shared by every worker, 429 with `retry-after`,
//! refill on the (virtual) clock, keys from a header or the client address, a table of a
//! fixed size whatever keys clients send, idle entries taken over by new keys.

use std::time::Duration;

use wasm_harness::{Exchange, Proxy, Request, UpstreamReply};

use crate::support::module;

fn limiter(config: serde_json::Value, workers: usize) -> Proxy {
    let mut config = config;
    config["role"] = "rate-limit".into();
    Proxy::for_module(module())
        .configuration(config.to_string())
        .name("limit")
        .vm_id("wasm-filter")
        .workers(workers)
        .build()
        .unwrap()
}

fn send(proxy: &mut Proxy, worker: usize, request: &Request) -> Exchange {
    proxy
        .send(None, Some(worker), request, &mut |_| {
            UpstreamReply::new(200)
        })
        .unwrap()
}

#[test]
fn two_workers_take_from_one_bucket() {
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 3, "refill_per_second": 1}),
        2,
    );
    let alice = Request::get("/").header("x-api-key", "alice");
    let statuses: Vec<_> = (0..4)
        .map(|i| send(&mut proxy, i % 2, &alice).response_status())
        .collect();
    assert_eq!(statuses, [Some(200), Some(200), Some(200), Some(429)]);
    let limited = send(&mut proxy, 1, &alice);
    assert_eq!(limited.response_status(), Some(429));
    assert_eq!(limited.response_header("retry-after"), Some("1"));
    assert!(limited.upstream.is_none());
    // Another key has its own bucket.
    let bob = Request::get("/").header("x-api-key", "bob");
    assert_eq!(send(&mut proxy, 0, &bob).response_status(), Some(200));
    // One second refills one token.
    proxy.advance(Duration::from_secs(1));
    assert_eq!(send(&mut proxy, 1, &alice).response_status(), Some(200));
    assert_eq!(send(&mut proxy, 0, &alice).response_status(), Some(429));
    assert_eq!(
        proxy.metric("wasm_filter.plugin.limit.role.rate-limit.limited_total"),
        Some(3)
    );
}

#[test]
fn the_client_address_is_the_key_without_its_port() {
    let mut proxy = limiter(
        serde_json::json!({"key": "client-address", "burst": 1, "refill_per_second": 0.5}),
        1,
    );
    assert_eq!(
        send(&mut proxy, 0, &Request::get("/")).response_status(),
        Some(200)
    );
    // A new connection (another port) from the same address shares the bucket.
    let second = send(&mut proxy, 0, &Request::get("/"));
    assert_eq!(second.response_status(), Some(429));
    assert_eq!(second.response_header("retry-after"), Some("2"));
    // The entry names the key by its fingerprint, never by the client's value.
    let entries = table(&proxy, 16_384);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].contains(" 0 "), "{entries:?}");
}

/// The non-empty entries of the `limit` plugin's table, which must hold `buckets` slots
/// and not one more.
fn table(proxy: &Proxy, buckets: u32) -> Vec<String> {
    let slot =
        |i: String| proxy.shared_data("wasm-filter", &format!("wasm-filter/rate-limit/limit/{i}"));
    assert!(
        slot((buckets - 1).to_string()).is_some(),
        "the table is created whole"
    );
    assert!(
        slot(buckets.to_string()).is_none(),
        "the table has {buckets} slots"
    );
    (0..buckets)
        .filter_map(|i| slot(i.to_string()))
        .chain(slot("overflow".into()))
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .collect()
}

#[test]
fn endless_distinct_keys_stay_in_the_table_and_share_the_overflow_bucket() {
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 1, "refill_per_second": 0.001, "buckets": 8}),
        2,
    );
    let mut ok = 0;
    for i in 0..200 {
        let key = format!("client-{i}");
        let ex = send(
            &mut proxy,
            i % 2,
            &Request::get("/").header("x-api-key", key.as_str()),
        );
        if ex.response_status() == Some(200) {
            ok += 1;
        }
        assert_eq!(
            proxy.shared_data(
                "wasm-filter",
                &format!("wasm-filter/rate-limit/limit/{key}")
            ),
            None
        );
    }
    // Eight keys hold the eight entries; the 192 others share the overflow bucket's one token.
    assert_eq!(ok, 8 + 1);
    assert_eq!(table(&proxy, 8).len(), 8 + 1);
    // A key that has an entry keeps it: its bucket is its own.
    let first = Request::get("/").header("x-api-key", "client-0");
    assert_eq!(send(&mut proxy, 0, &first).response_status(), Some(429));
}

#[test]
fn an_idle_full_entry_is_taken_over_by_a_new_key() {
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 2, "refill_per_second": 1, "idle_seconds": 5, "buckets": 1}),
        1,
    );
    let k = Request::get("/").header("x-api-key", "k");
    let other = Request::get("/").header("x-api-key", "other");
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(200));
    // The one entry is k's: other gets the overflow bucket.
    assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(200));
    assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(200));
    assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(429));
    proxy.advance(Duration::from_secs(5));
    // k's bucket is idle and full again: other takes the entry over with a full bucket.
    for _ in 0..2 {
        assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(200));
    }
    assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(429));
    let entries = table(&proxy, 1);
    assert!(entries[0].contains(" 0 "), "{entries:?}");
    // k comes back to a fresh bucket (its own was full when it was taken): the overflow one.
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(200));
}

#[test]
fn an_idle_entry_still_refilling_is_not_taken_over() {
    // 3 tokens at 0.1 per second: 30 s to refill, idle after 5 s.
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 3, "refill_per_second": 0.1, "idle_seconds": 5, "buckets": 1}),
        1,
    );
    let k = Request::get("/").header("x-api-key", "k");
    let other = Request::get("/").header("x-api-key", "other");
    for _ in 0..3 {
        assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(200));
    }
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(429));
    proxy.advance(Duration::from_secs(11));
    // Taking the entry would hand k a full burst at its next request: other overflows.
    for _ in 0..3 {
        assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(200));
    }
    assert_eq!(send(&mut proxy, 0, &other).response_status(), Some(429));
    // 11 s earned k one token, not the burst a fresh bucket would give.
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(200));
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(429));
}

/// The fingerprint before it was keyed (FNV-1a with SplitMix64's mixer): anyone could
/// compute where a key lands, and craft keys that land on a victim's slots.
fn unkeyed(key: &[u8]) -> u64 {
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

/// Eight keys crafted to fill the eight slots a victim's key may use under the unkeyed
/// fingerprint, and a ninth to drain the overflow bucket the victim would fall back on:
/// replayed against the module, whose fingerprint is keyed by a secret of the process, the
/// victim still gets its own bucket, on either worker.
#[test]
fn keys_crafted_against_a_known_fingerprint_do_not_touch_the_victim() {
    let buckets = 64u64;
    let victim_home = unkeyed(b"victim") % buckets;
    let crafted: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| unkeyed(k.as_bytes()) % buckets == victim_home)
        .take(9)
        .collect();
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 1,
            "refill_per_second": 0.001, "buckets": buckets}),
        2,
    );
    for (i, k) in crafted.iter().enumerate() {
        let ex = send(
            &mut proxy,
            i % 2,
            &Request::get("/").header("x-api-key", k.as_str()),
        );
        assert_eq!(ex.response_status(), Some(200), "{k}");
    }
    for worker in [0, 1] {
        let victim = Request::get("/").header("x-api-key", "victim");
        let ex = send(&mut proxy, worker, &victim);
        assert_eq!(
            ex.response_status(),
            if worker == 0 { Some(200) } else { Some(429) },
            "the victim's first request has its own token, its second finds it taken"
        );
    }
    assert_eq!(
        proxy.metric("wasm_filter.plugin.limit.role.rate-limit.overflow_total"),
        Some(0)
    );
}
