//! `serve` against plugin files written to hurt it: it keeps answering its probes and says
//! which file it refused and why.

use std::time::Duration;

use crate::serve_support::{dirs, get, wait_for, wasm_plugin, write_plugin};
use crate::support::{module, Behaviour, Server};

/// 50,000 nested flow mappings in 200 KB: libyaml alone spends over a minute on them, which
/// on the thread that answers probes fails every `/healthz` for that minute.
#[test]
fn deeply_nested_yaml_is_refused_while_probes_keep_answering() {
    let d = dirs();
    let deep = format!("{}{}", "{a: ".repeat(50_000), "}".repeat(50_000));
    write_plugin(&d.plugins.join("deep.yaml"), &deep);
    let serve = d.serve(&[], &[]);
    wait_for("the refusal in the log", Duration::from_secs(10), || {
        serve.log().contains("nests more than 512 flow collections")
    });
    for _ in 0..5 {
        assert_eq!(get(&serve.addr, "/healthz").map(|(s, _)| s), Ok(200));
    }
    let (status, body) = get(&serve.addr, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("deep.yaml"), "{body}");
}

/// One 100 KB string anchored once and used 3,000 times: 300 MB once expanded.
#[test]
fn an_alias_bomb_of_long_strings_is_refused_by_its_expanded_bytes() {
    let d = dirs();
    let bomb = format!(
        "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {{name: p, namespace: n}}\nspec:\n  url: file:///x.wasm\n  pluginConfig:\n    s: &s {}\n    l: [{}]\n",
        "x".repeat(100_000),
        vec!["*s"; 3_000].join(",")
    );
    write_plugin(&d.plugins.join("bomb.yaml"), &bomb);
    let serve = d.serve(&[], &[]);
    wait_for("the refusal in the log", Duration::from_secs(10), || {
        serve.log().contains("aliases expand to more than")
    });
    assert_eq!(get(&serve.addr, "/healthz").map(|(s, _)| s), Ok(200));
}

/// Idle connections, more than the endpoint's bound and opened again all along, and clients
/// sending their request a byte a second: the kubelet's probes are answered all the while,
/// and `HEAD` gets the headers alone.
#[test]
fn probes_answer_through_idle_and_slow_clients_and_head_has_no_body() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let d = dirs();
    let serve = d.serve_ready(&[], &[]);
    let idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&serve.addr).unwrap())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pressure: Vec<_> = (0..3)
        .map(|i| {
            let (addr, stop) = (serve.addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(mut s) = TcpStream::connect(&addr) {
                        // One keeps opening idle connections, the others drip a request.
                        if i > 0 {
                            let _ = s.write_all(b"G");
                        }
                        held.push(s);
                    }
                    for s in held.iter_mut().filter(|_| i > 0) {
                        let _ = s.write_all(b"E");
                    }
                    std::thread::sleep(Duration::from_millis(if i == 0 { 50 } else { 1000 }));
                }
            })
        })
        .collect();
    for _ in 0..15 {
        assert_eq!(get(&serve.addr, "/healthz").map(|(s, _)| s), Ok(200));
        assert_eq!(get(&serve.addr, "/readyz").map(|(s, _)| s), Ok(200));
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in pressure {
        t.join().unwrap();
    }
    drop(idle);
    let mut s = TcpStream::connect(&serve.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("content-length: 3\r\n"), "{out}");
    assert!(
        out.ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {out:?}"
    );
}

/// Two files naming one namespace/name: the first by file name owns it, whichever pull ends
/// first. Here the second, fail-open, fails at once; its allow-all must never take the name of
/// the first, fail-closed, whose module comes slowly. Removing the owner serves the other.
/// A name too long for the file system is not served either; `/readyz` names both.
#[test]
fn duplicate_names_go_to_the_first_file_and_readyz_names_what_is_not_served() {
    let d = dirs();
    let good = module("good");
    let server = Server::start(vec![(
        "/slow.wasm",
        Behaviour::Slow(Duration::from_secs(2), good),
    )]);
    write_plugin(
        &d.plugins.join("a.yaml"),
        &wasm_plugin(
            "p",
            &server.url("/slow.wasm"),
            "  failStrategy: FAIL_CLOSE\n",
        ),
    );
    write_plugin(
        &d.plugins.join("b.yaml"),
        &wasm_plugin(
            "p",
            &server.url("/gone.wasm"),
            "  failStrategy: FAIL_OPEN\n",
        ),
    );
    let long = [
        "x".repeat(63),
        "y".repeat(63),
        "z".repeat(63),
        "w".repeat(61),
    ]
    .join(".");
    write_plugin(
        &d.plugins.join("c.yaml"),
        &wasm_plugin(&long, &server.url("/slow.wasm"), ""),
    );
    let serve = d.serve(&[], &[]);
    let ecds = d.ecds.join("test.p.yaml");
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        let text = std::fs::read_to_string(&ecds).unwrap_or_default();
        assert!(
            !text.contains("wasm-default-allow"),
            "b.yaml's allow-all took a.yaml's name: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for("a.yaml's module is served", Duration::from_secs(10), || {
        std::fs::read_to_string(&ecds).is_ok_and(|t| t.contains("modules/sha256"))
    });
    let (status, body) = get(&serve.addr, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("test/p") && body.contains("a.yaml"), "{body}");
    assert!(body.contains(&format!("test/{long}")), "{body}");
    std::fs::remove_file(d.plugins.join("c.yaml")).unwrap();
    std::fs::remove_file(d.plugins.join("a.yaml")).unwrap();
    wait_for(
        "b.yaml is served once a.yaml is gone",
        Duration::from_secs(10),
        || std::fs::read_to_string(&ecds).is_ok_and(|t| t.contains("wasm-default-allow")),
    );
    wait_for("ready", Duration::from_secs(10), || serve.ready());
}

/// The module each ECDS file in `ecds` names, where it names one.
fn named_modules(ecds: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(ecds)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".yaml"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| {
                    Some(
                        l.split_once("filename:")?
                            .1
                            .trim()
                            .trim_matches('\'')
                            .into(),
                    )
                })
                .collect::<Vec<std::path::PathBuf>>()
        })
        .collect()
}

/// Another process purges the cache all along, with every module expired at once: no module
/// an ECDS file names is ever gone, since `serve` leases a module before naming it.
#[test]
fn a_purge_running_all_along_never_removes_a_module_an_ecds_file_names() {
    let d = dirs();
    let modules = d.tmp.path().join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    for i in 0..30 {
        let m = modules.join(format!("m{i}.wasm"));
        std::fs::write(&m, module(&format!("m{i}"))).unwrap();
        write_plugin(
            &d.plugins.join(format!("p{i}.yaml")),
            &wasm_plugin(&format!("p{i}"), &format!("file://{}", m.display()), ""),
        );
    }
    let serve = d.serve(&[], &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let purger = {
        let (cache, stop) = (d.cache.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = crate::support::fetcher()
                    .env("WASM_MODULE_EXPIRY", "1ns")
                    .arg("purge")
                    .arg("--cache-dir")
                    .arg(&cache)
                    .output();
            }
        })
    };
    let check = || {
        for m in named_modules(&d.ecds) {
            assert!(
                m.is_file(),
                "{} is named but was purged\n{}",
                m.display(),
                serve.log()
            );
        }
    };
    wait_for("every plugin served", Duration::from_secs(60), || {
        check();
        serve.ready()
    });
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        check();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    purger.join().unwrap();
}

/// A second `serve` with its own cache, on an ECDS directory a running `serve` writes,
/// would undo the first one's files: it refuses to start and says why.
#[test]
fn a_second_serve_on_the_same_ecds_directory_refuses_to_start() {
    let d = dirs();
    let first = d.serve_ready(&[], &[]);
    let (status, log) = d.serve_to_exit(&d.tmp.path().join("other-cache"));
    assert!(status.is_some_and(|s| !s.success()), "still running: {log}");
    assert!(log.contains("another wasm-fetcher serve"), "{log}");
    assert!(log.contains(&d.ecds.display().to_string()), "{log}");
    assert!(first.ready());
}

/// What `kill -9` leaves: a temp file in the ECDS directory and a download cut short in the
/// cache. The next start removes them, but not the files a live writer holds locked.
#[test]
fn a_start_removes_the_temp_files_of_killed_writers_and_keeps_live_ones() {
    let d = dirs();
    let tmp = d.cache.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let dead = [
        d.ecds.join(".wasm-fetcher-Ab12Cd"),
        tmp.join("download-Xy34.part"),
    ];
    let live = [
        d.ecds.join(".wasm-fetcher-Ef56Gh"),
        tmp.join("download-Zw78.part"),
    ];
    let mut held = Vec::new();
    for f in dead.iter().chain(&live) {
        std::fs::write(f, b"partial").unwrap();
    }
    for f in &live {
        let file = std::fs::File::options().write(true).open(f).unwrap();
        file.try_lock().unwrap();
        held.push(file);
    }
    let _serve = d.serve_ready(&[], &[]);
    wait_for(
        "the dead writers' files removed",
        Duration::from_secs(10),
        || dead.iter().all(|f| !f.exists()),
    );
    for f in &live {
        assert!(f.exists(), "{} is held by a live writer", f.display());
    }
    drop(held);
}

/// Six slow sources with `--max-concurrent-pulls 2`: two connections at a time, not six.
#[test]
fn pulls_wait_their_turn_under_the_concurrency_bound() {
    let d = dirs();
    let routes: Vec<(String, Behaviour)> = (0..6)
        .map(|i| {
            let m = module(&format!("s{i}"));
            (
                format!("/s{i}.wasm"),
                Behaviour::Slow(Duration::from_secs(2), m),
            )
        })
        .collect();
    let server = Server::start(
        routes
            .iter()
            .map(|(p, b)| (p.as_str(), b.clone()))
            .collect(),
    );
    for i in 0..6 {
        write_plugin(
            &d.plugins.join(format!("s{i}.yaml")),
            &wasm_plugin(&format!("s{i}"), &server.url(&format!("/s{i}.wasm")), ""),
        );
    }
    let serve = d.serve(&[("WASM_MAX_CONCURRENT_PULLS", "2")], &[]);
    wait_for("the first pulls", Duration::from_secs(10), || {
        server.connections() >= 2
    });
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(server.connections(), 2, "{}", serve.log());
    serve.wait_ready();
    assert_eq!(server.connections(), 6);
}

/// Plugin files together past `--max-plugin-bytes`: those first by name are read, the rest
/// are not (nor held in memory), and `/readyz` names them.
#[test]
fn plugin_files_past_the_total_bound_are_not_read() {
    let d = dirs();
    let m = d.tmp.path().join("m.wasm");
    std::fs::write(&m, module("m")).unwrap();
    let pad = format!("# {}\n", "x".repeat(1500));
    for name in ["a", "b"] {
        write_plugin(
            &d.plugins.join(format!("{name}.yaml")),
            &format!(
                "{pad}{}",
                wasm_plugin(name, &format!("file://{}", m.display()), "")
            ),
        );
    }
    let serve = d.serve(&[], &["--max-plugin-bytes", "3000"]);
    wait_for("a.yaml served", Duration::from_secs(10), || {
        d.ecds.join("test.a.yaml").is_file()
    });
    let (status, body) = get(&serve.addr, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("b.yaml") && body.contains("--max-plugin-bytes"),
        "{body}"
    );
    assert!(!d.ecds.join("test.b.yaml").exists());
    std::fs::remove_file(d.plugins.join("a.yaml")).unwrap();
    wait_for(
        "b.yaml read once a.yaml is gone",
        Duration::from_secs(10),
        || d.ecds.join("test.b.yaml").is_file(),
    );
}

/// A source URL with a password and a token in its query, serving a file that is not Wasm
/// (here, a secret): neither the log nor `/readyz` quotes the password, the token or the
/// file's bytes.
#[test]
fn logs_and_readyz_quote_no_secret_from_urls_or_bytes() {
    let d = dirs();
    let server = Server::start(vec![(
        "/key.wasm",
        Behaviour::Ok(b"SECRETKEY=hunter3".to_vec()),
    )]);
    let url = server
        .url("/key.wasm?token=s3cr3t")
        .replace("http://", "http://user:hunter2@");
    write_plugin(&d.plugins.join("k.yaml"), &wasm_plugin("k", &url, ""));
    write_plugin(
        &d.plugins.join("x.yaml"),
        "kind: WasmPlugin\nspec: [s3cr3t\n",
    );
    let serve = d.serve(&[], &[]);
    wait_for("the fallback written", Duration::from_secs(10), || {
        d.ecds.join("test.k.yaml").is_file()
    });
    let (_, readyz) = get(&serve.addr, "/readyz").unwrap();
    let ecds = std::fs::read_to_string(d.ecds.join("test.k.yaml")).unwrap();
    for (what, text) in [("log", serve.log()), ("readyz", readyz), ("ecds", ecds)] {
        for secret in ["hunter2", "token=s3cr3t", "53 45 43 52"] {
            assert!(!text.contains(secret), "{what} quotes {secret}: {text}");
        }
    }
}

/// `--ecds-mode 0600`: the ECDS files, which hold pluginConfig values, are this user's alone.
#[test]
fn ecds_files_get_the_mode_asked() {
    use std::os::unix::fs::PermissionsExt;
    let d = dirs();
    let m = d.tmp.path().join("m.wasm");
    std::fs::write(&m, module("m")).unwrap();
    let url = format!("file://{}", m.display());
    write_plugin(&d.plugins.join("p.yaml"), &wasm_plugin("p", &url, ""));
    let _serve = d.serve_ready(&[], &["--ecds-mode", "0600"]);
    let mode = std::fs::metadata(d.ecds.join("test.p.yaml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A URL that does not parse, with a token in its query: `/readyz` and the log say why it was
/// refused without quoting the token.
#[test]
fn readyz_quotes_no_query_of_a_url_that_does_not_parse() {
    let d = dirs();
    for (name, url) in [
        ("q", "oci://h/a?token=s3cr3t"),
        ("t", "oci://h/a:v1?token=s3cr3t"),
        ("u", "http://user:hunter2@h:99999/m.wasm?token=s3cr3t"),
    ] {
        write_plugin(
            &d.plugins.join(format!("{name}.yaml")),
            &wasm_plugin(name, url, ""),
        );
    }
    let serve = d.serve(&[], &[]);
    wait_for("every file refused", Duration::from_secs(10), || {
        get(&serve.addr, "/readyz").is_ok_and(|(_, b)| b.matches("invalid URL").count() == 3)
    });
    let (status, readyz) = get(&serve.addr, "/readyz").unwrap();
    assert_eq!(status, 503, "{readyz}");
    for (what, text) in [("log", serve.log()), ("readyz", readyz)] {
        for secret in ["s3cr3t", "hunter2"] {
            assert!(!text.contains(secret), "{what} quotes {secret}: {text}");
        }
    }
}

/// With no `--ecds-mode`, an ECDS file carrying `env` and `pluginConfig` values is readable by
/// its owner and group alone, never by every user of the node.
#[test]
fn ecds_files_with_inline_secrets_are_not_world_readable_by_default() {
    use std::os::unix::fs::PermissionsExt;
    let d = dirs();
    let m = d.tmp.path().join("m.wasm");
    std::fs::write(&m, module("m")).unwrap();
    let url = format!("file://{}", m.display());
    let spec = "  pluginConfig: {password: hunter2}\n  vmConfig:\n    env:\n    - {name: TOKEN, value: s3cr3t}\n";
    write_plugin(&d.plugins.join("p.yaml"), &wasm_plugin("p", &url, spec));
    let _serve = d.serve_ready(&[], &[]);
    let path = d.ecds.join("test.p.yaml");
    assert!(std::fs::read_to_string(&path).unwrap().contains("s3cr3t"));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640, "{mode:o}");
}

/// A plugin file that is a link to YAML outside the plugins directory (a secret elsewhere on
/// the node) is not read: `/readyz` and the log name the link and quote none of its keys or
/// values. A ConfigMap's links inside the directory still work.
#[test]
fn a_plugin_file_linked_out_of_the_directory_is_not_read() {
    use std::os::unix::fs::symlink;
    let d = dirs();
    let secret = d.tmp.path().join("secret.yaml");
    std::fs::write(&secret, "s3cr3tkey: s3cr3tvalue\nkind: [s3cr3tlist\n").unwrap();
    symlink(&secret, d.plugins.join("x.yaml")).unwrap();
    let m = d.tmp.path().join("m.wasm");
    std::fs::write(&m, module("m")).unwrap();
    let ts = d.plugins.join("..2026_1");
    std::fs::create_dir(&ts).unwrap();
    let url = format!("file://{}", m.display());
    std::fs::write(ts.join("p.yaml"), wasm_plugin("p", &url, "")).unwrap();
    symlink("..2026_1", d.plugins.join("..data")).unwrap();
    symlink("..data/p.yaml", d.plugins.join("p.yaml")).unwrap();
    let serve = d.serve(&[], &[]);
    wait_for("the linked plugin served", Duration::from_secs(10), || {
        d.ecds.join("test.p.yaml").is_file()
    });
    let (status, readyz) = get(&serve.addr, "/readyz").unwrap();
    assert_eq!(status, 503, "{readyz}");
    assert!(readyz.contains("outside the plugins directory"), "{readyz}");
    for (what, text) in [("log", serve.log()), ("readyz", readyz)] {
        assert!(!text.contains("s3cr3t"), "{what} quotes the file: {text}");
    }
}
