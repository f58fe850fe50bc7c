//! Redaction fails closed: every body a reader could take for JSON holding a redacted key,
//! that the role cannot fully inspect (serde_json cannot read it, a content-encoding the
//! reader ignores, trailers, a body over `max_buffer_bytes`), goes through the harness and
//! real Envoy 1.40 (the Wasm module and the dynamic module), on the request and on the
//! response; Python's `json` then reads what reached the upstream and the client, and no
//! redacted key in it holds anything but the mask.

use std::io::Write;
use std::process::{Command, Stdio};

use wasm_harness::real_envoy::RealEnvoy;
use wasm_harness::{Exchange, Request, UpstreamReply};

use crate::support::{bootstrap_copy, envoy, role};

const MASK: &str = "[redacted]";
const SECRET: &str = "s3cret";

/// One attacker's body: its bytes, its `content-encoding` headers, and trailers or not.
struct Case {
    name: &'static str,
    body: Vec<u8>,
    encodings: Vec<&'static str>,
    trailers: bool,
}

fn case(name: &'static str, body: impl Into<Vec<u8>>) -> Case {
    Case {
        name,
        body: body.into(),
        encodings: Vec::new(),
        trailers: false,
    }
}

fn utf16(text: &str, big: bool) -> Vec<u8> {
    text.encode_utf16()
        .flat_map(|u| {
            if big {
                u.to_be_bytes()
            } else {
                u.to_le_bytes()
            }
        })
        .collect()
}

fn utf32(text: &str, big: bool) -> Vec<u8> {
    text.chars()
        .flat_map(|c| {
            let c = u32::from(c);
            if big {
                c.to_be_bytes()
            } else {
                c.to_le_bytes()
            }
        })
        .collect()
}

/// The issue's cases, and one plain body (redacted as asked: the test is not vacuous).
fn cases() -> Vec<Case> {
    let plain = format!(r#"{{"user": "al", "password": "{SECRET}"}}"#);
    let deep = format!(
        r#"{{"password": "{SECRET}", "deep": {}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let encoded = |name, encodings: &[&'static str]| Case {
        encodings: encodings.to_vec(),
        ..case(name, plain.clone())
    };
    vec![
        case("plain", plain.clone()),
        case(
            "lone surrogate escape",
            format!(r#"{{"password": "{SECRET}", "x": "\ud800"}}"#),
        ),
        case(
            "lone low surrogate escape first",
            format!(r#"{{"x": "\udc00", "password": "{SECRET}"}}"#),
        ),
        case(
            "raw surrogate",
            [
                &br#"{"x": ""#[..],
                b"\xed\xa0\x80",
                format!(r#"", "password": "{SECRET}"}}"#).as_bytes(),
            ]
            .concat(),
        ),
        case(
            "utf-8 bom",
            [&b"\xef\xbb\xbf"[..], plain.as_bytes()].concat(),
        ),
        case("utf-16le", utf16(&plain, false)),
        case("utf-16be", utf16(&plain, true)),
        case("utf-16 with bom", utf16(&format!("\u{feff}{plain}"), false)),
        case("utf-32le", utf32(&plain, false)),
        case("utf-32be", utf32(&plain, true)),
        case("nan", format!(r#"{{"password": "{SECRET}", "n": NaN}}"#)),
        case(
            "infinity",
            format!(r#"{{"n": Infinity, "password": "{SECRET}"}}"#),
        ),
        case(
            "-infinity",
            format!(r#"{{"password": "{SECRET}", "n": -Infinity}}"#),
        ),
        case("nesting past 128", deep),
        case(
            "invalid utf-8",
            [
                format!(r#"{{"password": "{SECRET}", "x": ""#).as_bytes(),
                b"\xff",
                b"\"}",
            ]
            .concat(),
        ),
        case(
            "overlong utf-8",
            [
                format!(r#"{{"password": "{SECRET}", "x": ""#).as_bytes(),
                b"\xc0\xaf",
                b"\"}",
            ]
            .concat(),
        ),
        encoded("empty content-encoding", &[""]),
        encoded("identity;q=1", &["identity;q=1"]),
        encoded("x-none", &["x-none"]),
        encoded("identity, identity", &["identity, identity"]),
        encoded("two content-encoding headers", &["identity", "identity"]),
        encoded("identity then x-none", &["identity", "x-none"]),
        Case {
            trailers: true,
            ..case("trailers", plain.clone())
        },
        case(
            "over max_buffer_bytes",
            format!(
                r#"{{"password": "{SECRET}", "pad": "{}"}}"#,
                "x".repeat(5000)
            ),
        ),
    ]
}

/// For each body, whether Python's `json` reads it as holding a redacted key whose value is
/// not the mask (`None`: Python cannot read it).
fn python_reads_a_secret(bodies: &[Vec<u8>]) -> Vec<Option<bool>> {
    const SCRIPT: &str = r#"
import json, sys
KEYS = {"password", "token"}
def holds(v):
    if isinstance(v, dict):
        return any((k in KEYS and x != MASK) or holds(x) for k, x in v.items())
    if isinstance(v, list):
        return any(holds(x) for x in v)
    return False
MASK = sys.argv[1]
out = []
for h in json.load(sys.stdin):
    try:
        doc = json.loads(bytes.fromhex(h))
    except Exception:
        out.append(None)
        continue
    out.append(holds(doc))
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT, MASK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let hex: Vec<String> = bodies.iter().map(hex::encode).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&hex).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The request and the reply that carry `case` on `request_side` (else on the response).
fn exchange(case: &Case, request_side: bool) -> (Request, UpstreamReply) {
    if request_side {
        let mut r =
            Request::post("/upload", case.body.clone()).header("content-type", "application/json");
        for e in &case.encodings {
            r = r.header("content-encoding", *e);
        }
        if case.trailers {
            r.trailers.push(("x-checksum".into(), b"1".to_vec()));
        }
        (r, UpstreamReply::new(200))
    } else {
        let mut reply = UpstreamReply::new(200)
            .header("content-type", "application/json")
            .body(case.body.clone());
        for e in &case.encodings {
            reply = reply.header("content-encoding", *e);
        }
        if case.trailers {
            reply.trailers.push(("x-checksum".into(), b"1".to_vec()));
        }
        (Request::get("/me"), reply)
    }
}

/// What reached the other side: the upstream's body for a request case, the client's for a
/// response case (nothing when it was refused or reset).
fn delivered(ex: &Exchange, request_side: bool) -> Vec<u8> {
    if request_side {
        ex.upstream
            .as_ref()
            .map(|u| u.full_body())
            .unwrap_or_default()
    } else {
        ex.response().map(|r| r.full_body()).unwrap_or_default()
    }
}

/// Sends every case both ways through `send`, and checks what Python reads on the far side.
fn no_secret_leaves(runtime: &str, mut send: impl FnMut(&Request, &UpstreamReply) -> Vec<u8>) {
    let cases = cases();
    // The cases are what the issue says: Python reads each as holding the secret, except
    // the two that are not UTF-8 (which JavaScript's decoders read, replacing the bytes).
    let readable = python_reads_a_secret(&cases.iter().map(|c| c.body.clone()).collect::<Vec<_>>());
    for (c, r) in cases.iter().zip(&readable) {
        let not_utf8 = c.name.contains("utf-8") && c.name != "utf-8 bom";
        assert_eq!(*r, if not_utf8 { None } else { Some(true) }, "{}", c.name);
    }
    let mut got = Vec::new();
    let mut names = Vec::new();
    for c in &cases {
        for request_side in [true, false] {
            let (request, reply) = exchange(c, request_side);
            let body = send(&request, &reply);
            names.push(format!(
                "{runtime}: {} on the {}",
                c.name,
                if request_side { "request" } else { "response" }
            ));
            got.push(body);
        }
    }
    let verdicts = python_reads_a_secret(&got);
    for ((name, body), verdict) in names.iter().zip(&got).zip(&verdicts) {
        assert_ne!(
            *verdict,
            Some(true),
            "{name}: {:?}",
            String::from_utf8_lossy(body)
        );
        assert!(
            !body.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "{name}: {:?}",
            String::from_utf8_lossy(body)
        );
    }
    // The plain body did go through, redacted, both ways.
    for got in &got[..2] {
        assert_eq!(
            String::from_utf8_lossy(got),
            format!(r#"{{"user": "al", "password": "{MASK}"}}"#),
            "{runtime}"
        );
    }
}

fn both_sides_redact() -> serde_json::Value {
    let redact = serde_json::json!({"redact_json": {"keys": ["password", "token"], "mask": MASK}});
    serde_json::json!({"request": redact, "response": redact, "max_buffer_bytes": 4096})
}

#[test]
fn no_uninspectable_body_leaves_the_harness_with_a_secret() {
    let mut proxy = role("http-body-operation", both_sides_redact(), 1).unwrap();
    no_secret_leaves("harness", |request, reply| {
        let ex = proxy.round_trip(request, reply.clone()).unwrap();
        let request_side = request.method == "POST";
        delivered(&ex, request_side)
    });
    assert!(proxy.take_errors().is_empty());
}

/// The shipped bootstrap's body listener, redacting both ways with a 4 KiB buffer.
fn redacting_both_ways(text: String) -> String {
    let edits = [
        (
            r#""request": {"max_bytes": 65536},"#,
            r#""request": {"redact_json": {"keys": ["password", "token"], "mask": "[redacted]"}},"#,
        ),
        (
            r#""max_buffer_bytes": 262144,"#,
            r#""max_buffer_bytes": 4096,"#,
        ),
    ];
    let mut text = text;
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    text
}

fn through_envoy(runtime: &str, relative: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = bootstrap_copy(dir.path(), relative);
    let text = redacting_both_ways(std::fs::read_to_string(&path).unwrap());
    std::fs::write(&path, text).unwrap();
    let mut real = RealEnvoy::start(&envoy(), &path, 1).unwrap_or_else(|e| panic!("{e}"));
    no_secret_leaves(runtime, |request, reply| {
        let request_side = request.method == "POST";
        match real.send(Some("bodies"), request, reply) {
            Ok(ex) => delivered(&ex, request_side),
            // Envoy refused the message itself (a codec error): nothing was delivered.
            Err(_) => Vec::new(),
        }
    });
}

#[test]
fn no_uninspectable_body_leaves_envoy_with_a_secret_through_the_wasm_module() {
    through_envoy("envoy + wasm", "envoy-config/bootstrap.yaml");
}

#[test]
fn no_uninspectable_body_leaves_envoy_with_a_secret_through_the_dynamic_module() {
    crate::dynamic_module::module_environment();
    through_envoy("envoy + .so", "envoy-config/dynamic-module.yaml");
}
