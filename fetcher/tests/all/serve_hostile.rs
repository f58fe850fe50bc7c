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
        serve.log().contains("not yet closed")
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
    let serve = d.serve(&[], &[]);
    serve.wait_ready();
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
