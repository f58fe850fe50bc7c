//! The library API as another Rust program would call it: `wasm_fetcher::pull` directly.

use std::time::Duration;

use wasm_fetcher::{pull, Cache, PullRequest, Settings, Sha256};

use crate::support::*;

#[test]
fn concurrent_pulls_in_one_process_make_one_download() {
    let m = module("coalesced");
    // Slow enough that all pulls are in flight together.
    let server = Server::start(vec![(
        "/m.wasm",
        Behaviour::Slow(Duration::from_millis(300), m.clone()),
    )]);
    let url = server.url("/m.wasm");
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // A single-threaded runtime: a waiter that blocked its thread would stall the download it
    // waits for, so this also proves waiting does not block the runtime.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let settings = Settings::default();
        let req = PullRequest {
            url,
            sha256: Some(Sha256::parse(&sha256_hex(&m)).unwrap()),
            ..Default::default()
        };
        let results = rt.block_on(futures_util::future::join_all(
            (0..8).map(|_| pull(&req, &cache, &settings)),
        ));
        let _ = tx.send(results);
    });
    let results = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("concurrent pulls did not finish: a waiter blocked the runtime");
    let pulled: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(server.hits("/m.wasm"), 1, "one download for 8 pulls");
    assert!(pulled.iter().all(|p| p.path == pulled[0].path));
    assert_eq!(pulled.iter().filter(|p| !p.from_cache).count(), 1);
    assert_eq!(std::fs::read(&pulled[0].path).unwrap(), module("coalesced"));
}

#[test]
fn library_errors_are_typed() {
    let server = Server::start(vec![("/gone", Behaviour::Status(404))]);
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let req = PullRequest {
        url: server.url("/gone"),
        ..Default::default()
    };
    let e = rt
        .block_on(pull(&req, &cache, &Settings::default()))
        .unwrap_err();
    assert!(
        matches!(e, wasm_fetcher::FetchError::HttpStatus { status: 404, .. }),
        "{e:?}"
    );
    let never = PullRequest {
        url: server.url("/other"),
        policy: Some(wasm_fetcher::PullPolicy::Never),
        ..Default::default()
    };
    let e = rt
        .block_on(pull(&never, &cache, &Settings::default()))
        .unwrap_err();
    assert!(matches!(e, wasm_fetcher::FetchError::NotInCache), "{e:?}");
    assert_eq!(server.hits("/other"), 0, "Never touched the network");
}

#[test]
fn a_guard_refusal_is_a_typed_error_naming_the_rule() {
    let server = Server::start_on("127.0.0.2", vec![("/m.wasm", Behaviour::Ok(module("x")))]);
    let settings = Settings {
        blocked_cidrs: vec!["127.0.0.0/30".parse().unwrap()],
        ..Settings::default()
    };
    let req = PullRequest {
        url: server.url("/m.wasm"),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let e = pull_in(dir.path(), &req, &settings).unwrap_err();
    use wasm_fetcher::{Refusal, Rule};
    assert!(
        matches!(
            &e,
            wasm_fetcher::FetchError::Refused(Refusal::Blocked { rule: Rule::Listed(net), .. })
                if net.to_string() == "127.0.0.0/30"
        ),
        "{e:?}"
    );
    assert_eq!(server.connections(), 0);
}

/// One pull through the library into the cache at `dir`, on a runtime of its own.
fn pull_in(
    dir: &std::path::Path,
    req: &PullRequest,
    settings: &Settings,
) -> Result<wasm_fetcher::Pulled, wasm_fetcher::FetchError> {
    let cache = Cache::open(dir).unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(pull(req, &cache, settings))
}
