//! `rate-limit` in the harness: one bucket shared by every worker, 429 with `retry-after`,
//! refill on the (virtual) clock, keys from a header or the client address, idle buckets
//! dropped on a tick.

use std::time::Duration;

use wasm_harness::{Exchange, Proxy, Request, UpstreamReply};

use crate::support::{lines, module};

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
    assert_eq!(proxy.metric("rate_limit_limited"), Some(3));
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
    let bucket = proxy
        .shared_data("wasm-filter", "wasm-filter/rate-limit/limit/127.0.0.1")
        .unwrap();
    assert!(String::from_utf8_lossy(&bucket).starts_with("0 "));
}

#[test]
fn idle_buckets_are_dropped_on_a_tick() {
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 2, "refill_per_second": 1, "idle_seconds": 5}),
        1,
    );
    send(&mut proxy, 0, &Request::get("/").header("x-api-key", "k"));
    proxy.advance(Duration::from_secs(5));
    assert_eq!(lines(&proxy, "dropped 1 idle buckets").len(), 1);
    let key = "wasm-filter/rate-limit/limit/k";
    assert_eq!(
        proxy.shared_data("wasm-filter", key).as_deref(),
        Some(&b""[..])
    );
    // A dropped bucket starts full again.
    let ex = send(&mut proxy, 0, &Request::get("/").header("x-api-key", "k"));
    assert_eq!(ex.response_status(), Some(200));
}

#[test]
fn an_idle_bucket_still_refilling_is_not_emptied() {
    // 3 tokens at 0.1 per second: 30 s to refill, idle after 5 s.
    let mut proxy = limiter(
        serde_json::json!({"key": {"header": "x-api-key"}, "burst": 3, "refill_per_second": 0.1, "idle_seconds": 5}),
        1,
    );
    let k = Request::get("/").header("x-api-key", "k");
    for _ in 0..3 {
        assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(200));
    }
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(429));
    proxy.advance(Duration::from_secs(11));
    assert!(lines(&proxy, "idle buckets").is_empty());
    // 11 s earned one token, not the burst an emptied (fresh) bucket would give.
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(200));
    assert_eq!(send(&mut proxy, 0, &k).response_status(), Some(429));
    // Once refilled and idle, it is emptied on a tick.
    proxy.advance(Duration::from_secs(40));
    assert_eq!(lines(&proxy, "dropped 1 idle buckets").len(), 1);
}
