//! `serve` delivering a `DynamicModule` resource to real Envoy 1.40 through ECDS, from a
//! loopback `docker-registry`, signed: a new version of the module is a new cache path, and
//! Envoy swaps to it under load with no restart and no failed request.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::dynamic_module::shared_object;
use crate::oci_registry::Registry;
use crate::real_envoy::{http_get, Envoy};
use crate::serve_support::*;
use crate::support::*;

/// A DynamicModule file's text: the module at `url`, the filter's header role adding
/// `x-served-by: VALUE`.
fn dynamic_module(url: &str, value: &str) -> String {
    format!(
        "apiVersion: extensions.wasm-fetcher.dev/v1alpha1\nkind: DynamicModule\nmetadata:\n  name: native\n  namespace: test\nspec:\n  url: {url}\n  pluginName: wasm-filter/native\n{}",
        header_role(value)
    )
}

/// A bootstrap with one HTTP listener, `main`, whose first filter is the ECDS entry of `text`
/// and the router to `upstream`.
fn bootstrap(dir: &Path, ecds: &Path, text: &str, upstream: &str) -> std::path::PathBuf {
    let plugins = match wasm_fetcher::serve::dynamic::parse(text).unwrap() {
        wasm_fetcher::serve::dynamic::Resources::Dynamic(p) => p,
        wasm_fetcher::serve::dynamic::Resources::Wasm(_) => panic!("not a DynamicModule"),
    };
    let entry = wasm_fetcher::serve::dynamic::filter_entry(&plugins[0], ecds);
    filters_bootstrap(dir, vec![entry], upstream)
}

/// One request's answer: its status and `x-served-by`, or why there was none.
type Answer = Result<(u16, Option<String>), String>;

/// The `.so` files Envoy's process has mapped.
fn mapped_modules(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut out: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("/dynamic-modules/"))
        .map(String::from)
        .collect();
    out.dedup();
    out
}

#[test]
fn serve_swaps_a_signed_dynamic_module_under_load_without_a_restart_or_a_failed_request() {
    let reg = Registry::start(false);
    let d = dirs();
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = crate::signature::key_pair(keys.path(), "signer");
    // Two versions: the module as built, and the same with bytes past its end (another
    // digest, another cache path; Envoy maps what the headers name).
    let v1 = std::fs::read(shared_object()).unwrap();
    let mut v2 = v1.clone();
    v2.extend([0u8; 64]);
    let mut urls = Vec::new();
    for (tag, bytes) in [("1", &v1), ("2", &v2)] {
        let file = keys.path().join(format!("v{tag}/libwasm_filter.so"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, bytes).unwrap();
        let url = format!("oci://{}/native/filter:{tag}", reg.host);
        let o = fetcher()
            .env("HOME", keys.path())
            .arg("push")
            .arg(&file)
            .args([
                &url,
                "--layout",
                "dynamic-module",
                "--envoy-versions",
                "1.40",
            ])
            .arg("--sign-key")
            .arg(&private)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        urls.push(url);
    }
    let public = public.to_str().unwrap().to_string();
    let plugin = d.plugins.join("native.yaml");
    let first = dynamic_module(&urls[0], "v1");
    write_plugin(&plugin, &first);
    let ecds_file = d.ecds.join("test.native.yaml");
    // Without a key or the opt-out, the module is refused: the failure policy's deny-all
    // filter stands in.
    let unsigned = d.serve_ready(&[], &["--envoy-version", "1.40"]);
    let text = std::fs::read_to_string(&ecds_file).unwrap();
    assert!(
        text.contains("rbac") && !text.contains("dynamic_module_config"),
        "{text}"
    );
    assert!(
        unsigned.log().contains("unsigned dynamic module refused"),
        "{}",
        unsigned.log()
    );
    drop(unsigned);
    let serve = d.serve(&[], &["--envoy-version", "1.40", "--verify-key", &public]);
    let start = Instant::now();
    while !std::fs::read_to_string(&ecds_file).is_ok_and(|t| t.contains("dynamic_module_config")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no ECDS file: {}",
            serve.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    serve.wait_ready();
    let written = std::fs::read_to_string(&ecds_file).unwrap();
    let v1_path = d.cache.join(format!(
        "dynamic-modules/{}/libwasm_filter.so",
        sha256_hex(&v1)
    ));
    assert!(
        written.contains(&v1_path.display().to_string()),
        "{written}"
    );

    let upstream = Server::start(vec![("/", Behaviour::Ok(b"ok".to_vec()))]);
    let run = tempfile::tempdir().unwrap();
    let mut envoy = Envoy::start(&bootstrap(run.path(), &d.ecds, &first, upstream.host()));
    let pid = envoy.pid();
    let served = envoy.eventually("main", |r| {
        r.as_ref()
            .is_ok_and(|(s, t)| *s == 200 && header(t, "x-served-by") == Some("v1"))
    });
    assert!(served.is_ok(), "{served:?}\n{}", envoy.log());
    assert_eq!(mapped_modules(pid), [v1_path.display().to_string()]);

    // The next serve asks Envoy itself which version it is.
    drop(serve);
    let serve = d.serve_ready(
        &[],
        &[
            "--envoy-admin",
            &envoy.admin_address(),
            "--verify-key",
            &public,
        ],
    );

    // Load: one client after another, each request on its own connection, until stopped.
    let port = envoy.port("main");
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = http_get(&format!("127.0.0.1:{port}"), "/")
                        .map(|(s, t)| (s, header(&t, "x-served-by").map(String::from)));
                    seen.lock().unwrap().push(r);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    write_plugin(&plugin, &dynamic_module(&urls[1], "v2"));
    let v2_path = d.cache.join(format!(
        "dynamic-modules/{}/libwasm_filter.so",
        sha256_hex(&v2)
    ));
    let start = Instant::now();
    loop {
        let last = seen.lock().unwrap().last().cloned();
        if matches!(last, Some(Ok((200, Some(ref v)))) if v == "v2") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Envoy never served v2: {last:?}\n{}\n{}",
            serve.log(),
            envoy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    let count = |v: &str| {
        seen.iter()
            .filter(|r| matches!(r, Ok((200, Some(s))) if s == v))
            .count()
    };
    let (old, new) = (count("v1"), count("v2"));
    let failed: Vec<_> = seen
        .iter()
        .filter(|r| !matches!(r, Ok((200, Some(s))) if s == "v1" || s == "v2"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {}: {failed:?}",
        failed.len(),
        seen.len()
    );
    assert!(old > 0 && new > 0, "v1 {old}, v2 {new}");
    eprintln!(
        "swap under load: {} requests, {old} from v1, {new} from v2, none failed",
        seen.len()
    );
    // The same process, now with the new module mapped; the old file is still there, unchanged.
    assert!(envoy.running());
    assert_eq!(envoy.pid(), pid);
    assert!(
        mapped_modules(pid).contains(&v2_path.display().to_string()),
        "{:?}",
        mapped_modules(pid)
    );
    assert_eq!(std::fs::read(&v1_path).unwrap(), v1);
    drop(serve);
}
