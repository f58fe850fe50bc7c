//! Route, virtual host and cluster properties (`xds.*`) and dynamic metadata (`metadata`):
//! `testdata/guests/property-probe.wat` reads them in the harness and in real Envoy 1.40, and
//! both must answer the same statuses and bytes.

use std::time::{Duration, Instant};

use wasm_harness::real_envoy::RealEnvoy;
use wasm_harness::{Exchange, Proxy, ProxyOptions, Request, UpstreamReply};

use crate::support::*;

/// The probe's lines ("PATH status=S hex=HEX"), in order; a map's entries (the pairs format,
/// nested ones too) sorted, since Envoy lists a protobuf map's entries in no fixed order.
fn probes(lines: impl Iterator<Item = String>) -> Vec<String> {
    lines
        .filter_map(|l| l.rsplit_once("probe probe: ").map(|(_, m)| m.to_string()))
        .map(|l| match l.rsplit_once(" hex=") {
            Some((head, hex)) if head.contains("filter_metadata") => {
                let bytes: Option<Vec<u8>> = (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                    .collect();
                match bytes {
                    Some(b) if hex.len() % 2 == 0 => format!("{head} value={}", normalized(&b)),
                    _ => l,
                }
            }
            _ => l,
        })
        .collect()
}

/// `request` through the harness: the exchange and the probe's lines.
fn harness_probes(proxy: &mut Proxy, request: &Request) -> (Exchange, Vec<String>) {
    let before = proxy.log_len();
    let ex = proxy
        .send(None, None, request, &mut |_| UpstreamReply::new(200))
        .unwrap();
    let lines = probes(proxy.logs()[before..].iter().map(|r| r.to_string()));
    (ex, lines)
}

/// `request` through real Envoy: the exchange and the probe's lines, once `want` of them are
/// in Envoy's log (or 10 s have passed).
fn envoy_probes(real: &mut RealEnvoy, request: &Request, want: usize) -> (Exchange, Vec<String>) {
    let seen = real.wasm_logs().len();
    let ex = real.send(None, request, &UpstreamReply::new(200)).unwrap();
    let start = Instant::now();
    let mut lines = probes(real.wasm_logs().into_iter().skip(seen));
    while lines.len() < want && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        lines = probes(real.wasm_logs().into_iter().skip(seen));
    }
    (ex, lines)
}

/// `bytes` as text, with any map (the pairs format) in it listed in key order.
fn normalized(bytes: &[u8]) -> String {
    match pairs(bytes) {
        Some(mut p) if !p.is_empty() => {
            p.sort();
            let entries: Vec<String> = p
                .iter()
                .map(|(k, v)| format!("{}: {}", String::from_utf8_lossy(k), normalized(v)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        _ => format!("{:?}", String::from_utf8_lossy(bytes)),
    }
}

/// The pairs format's entries, if `bytes` is exactly one.
fn pairs(bytes: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let word = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let n = word(0)?;
    let mut at = 4usize.checked_add(n.checked_mul(8)?)?;
    let mut out = Vec::new();
    for i in 0..n {
        let (k, v) = (word(4 + 8 * i)?, word(8 + 8 * i)?);
        let key = bytes.get(at..at.checked_add(k)?)?.to_vec();
        at += k + 1;
        let value = bytes.get(at..at.checked_add(v)?)?.to_vec();
        at += v + 1;
        out.push((key, value));
    }
    (at == bytes.len()).then_some(out)
}

#[test]
fn route_and_cluster_metadata_and_dynamic_metadata_read_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "property-probe.wat");
    let text = std::fs::read_to_string(root().join("testdata/scenarios/metadata.bootstrap.yaml"))
        .unwrap()
        .replace("testdata/guests/property-probe.wat", wasm.to_str().unwrap());
    let b = dir.path().join("metadata.bootstrap.yaml");
    std::fs::write(&b, text).unwrap();
    wasm_harness::real_envoy::validate(&envoy(), &b).unwrap();

    let mut real = RealEnvoy::start(&envoy(), &b, 1).unwrap();
    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
    // A routed request, then one the router answers itself (no cluster).
    for path in ["/items/1", "/"] {
        let request = Request::get(path);
        let (_, harness_lines) = harness_probes(&mut proxy, &request);
        let (_, envoy_lines) = envoy_probes(&mut real, &request, harness_lines.len());
        assert_eq!(harness_lines, envoy_lines, "{path}");
        if path == "/items/1" {
            assert!(
                harness_lines.contains(
                    &r#"xds/route_metadata/filter_metadata/demo/tier status=0 value="gold""#
                        .to_string()
                ),
                "{harness_lines:?}"
            );
            assert!(
                harness_lines.contains(
                    &r#"xds/cluster_metadata/filter_metadata/demo/tier status=0 value="silver""#
                        .to_string()
                ),
                "{harness_lines:?}"
            );
        }
    }
}

/// What the harness does not answer it names in the log, as for foreign functions.
#[test]
fn metadata_the_harness_does_not_emulate_is_named_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let b = bootstrap_variant(
        dir.path(),
        &guest("property-probe.wat"),
        Some("xds/route_metadata\nxds/upstream_host_metadata\nxds/cluster_metadata/typed_filter_metadata"),
        |_| {},
    );
    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
    let before = proxy.log_len();
    proxy
        .send(None, None, &Request::get("/"), &mut |_| {
            UpstreamReply::new(200)
        })
        .unwrap();
    let log: Vec<String> = proxy.logs()[before..]
        .iter()
        .map(|r| r.to_string())
        .collect();
    for named in [
        "property xds.route_metadata (the whole Metadata message) exists in Envoy but is not emulated",
        "property xds.upstream_host_metadata exists in Envoy but is not emulated",
        "property xds.cluster_metadata (\"typed_filter_metadata\") exists in Envoy but is not emulated",
    ] {
        assert!(log.iter().any(|l| l.contains(named)), "{named}: {log:#?}");
    }
}

/// The scenario's comparison with real Envoy, which must pass.
fn passed_in_both(scenario: &std::path::Path) -> wasm_harness::ComparisonReport {
    let report = differential(scenario);
    assert_eq!(report.verdict, wasm_harness::Verdict::Passed, "{report}");
    report
}

/// `testdata/scenarios/dynamic-metadata.bootstrap.yaml` in `dir`, its module assembled for
/// real Envoy.
fn dynamic_metadata_bootstrap(dir: &std::path::Path) {
    let wasm = assembled(dir, "property-probe.wat");
    let b =
        std::fs::read_to_string(root().join("testdata/scenarios/dynamic-metadata.bootstrap.yaml"))
            .unwrap()
            .replace("testdata/guests/property-probe.wat", wasm.to_str().unwrap());
    std::fs::write(dir.join("dynamic-metadata.bootstrap.yaml"), b).unwrap();
}

/// `testdata/scenarios/dynamic-metadata.yaml` seeds each request's dynamic metadata (a string,
/// a double, a bool, a list, a map, another namespace, none); real Envoy seeds the same with
/// `header_to_metadata`, and the probe's lines (every byte of every `metadata` property read)
/// must be the same in both.
#[test]
fn seeded_dynamic_metadata_reads_as_in_envoy() {
    let o = harness(&["run", "testdata/scenarios/dynamic-metadata.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let dir = tempfile::tempdir().unwrap();
    dynamic_metadata_bootstrap(dir.path());
    let s = dir.path().join("dynamic-metadata.yaml");
    std::fs::copy(root().join("testdata/scenarios/dynamic-metadata.yaml"), &s).unwrap();
    let report = passed_in_both(&s);
    assert_eq!(report.cases.len(), 7, "{report}");
}

/// The Rust API seeds the same metadata in both (`Request::metadata`, and
/// `RealEnvoy::start_seeding` with the keys): maps of several keys and namespaces, every
/// Struct value kind including null, read at every level, the same entries in both (a map's
/// entries compared in key order, as Envoy lists them in no fixed order).
#[test]
fn dynamic_metadata_from_the_rust_api_reads_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "property-probe.wat");
    let probe = [
        "metadata/filter_metadata",
        "metadata/filter_metadata/demo",
        "metadata/filter_metadata/demo/none",
        "metadata/filter_metadata/demo/nested",
        "metadata/filter_metadata/demo/nested/k",
        "metadata/filter_metadata/other",
        "metadata/filter_metadata/other/n",
    ];
    let b = bootstrap_variant(dir.path(), &wasm, Some(&probe.join("\n")), |doc| {
        let plugin = doc
            .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config/config")
            .unwrap();
        plugin["name"] = "probe".into();
        plugin["root_id"] = "probe".into();
        plugin["vm_config"]["vm_id"] = "probe".into();
    });
    let request = Request::get("/")
        .metadata("demo", "tier", serde_json::json!("gold"))
        .metadata("demo", "weight", serde_json::json!(-1.25))
        .metadata("demo", "on", serde_json::json!(false))
        .metadata("demo", "none", serde_json::Value::Null)
        .metadata("demo", "tags", serde_json::json!(["a", "b", "c"]))
        .metadata(
            "demo",
            "nested",
            serde_json::json!({"k": "v", "n": 3, "l": [1]}),
        )
        .metadata("other", "n", serde_json::json!(7));
    let keys = wasm_harness::real_envoy::metadata::seeded_keys([&request.dynamic_metadata]);
    let mut real = RealEnvoy::start_seeding(
        &envoy(),
        &b,
        1,
        wasm_harness::engine::abi::LogLevel::Info,
        keys,
    )
    .unwrap();
    let mut proxy = Proxy::from_bootstrap(&b, &ProxyOptions::with_workers(1)).unwrap();
    let (ex, harness_lines) = harness_probes(&mut proxy, &request);
    let (envoy_ex, envoy_lines) = envoy_probes(&mut real, &request, probe.len());
    assert_eq!(harness_lines, envoy_lines);
    assert_eq!(harness_lines.len(), probe.len(), "{harness_lines:#?}");
    assert!(
        harness_lines
            .contains(&r#"metadata/filter_metadata/demo/nested/k status=0 value="v""#.to_string()),
        "{harness_lines:#?}"
    );
    // The seeding headers reach neither the filters nor the upstream.
    for seen in [&ex.upstream, &envoy_ex.upstream] {
        let seen = seen.as_ref().expect("routed upstream");
        assert!(
            !seen
                .headers
                .iter()
                .any(|(k, _)| k.starts_with("x-wasm-harness")),
            "{:?}",
            seen.headers
        );
    }
}

/// `metadata` on a TCP connection is empty in Envoy (nothing the bootstrap runs sets any) and
/// in the harness.
#[test]
fn metadata_on_a_tcp_connection_as_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = assembled(dir.path(), "property-probe.wat");
    let bootstrap = format!(
        r#"
static_resources:
  listeners:
  - name: tcp
    address:
      socket_address: {{address: 127.0.0.1, port_value: 10031}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.wasm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm
          config:
            name: probe
            root_id: probe
            configuration:
              "@type": type.googleapis.com/google.protobuf.StringValue
              value: "metadata\nmetadata/filter_metadata\nmetadata/typed_filter_metadata\nmetadata/filter_metadata/demo"
            vm_config:
              vm_id: probe
              runtime: envoy.wasm.runtime.v8
              code: {{local: {{filename: {}}}}}
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: tcp
          cluster: backend
  clusters:
  - name: backend
    connect_timeout: 1s
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{address: 127.0.0.1, port_value: 8080}}
"#,
        wasm.display()
    );
    let b = dir.path().join("tcp.bootstrap.yaml");
    std::fs::write(&b, bootstrap).unwrap();
    let s = scenario(
        dir.path(),
        &b,
        "  - name: a connection\n    connection:\n      - downstream: \"hello\"\n      - upstream: \"hi\"\n      - close: downstream\n    expect:\n      logs: [\"metadata status=0 hex=-\", \"metadata/filter_metadata status=0 hex=00000000\", \"metadata/typed_filter_metadata status=0 hex=00000000\", \"metadata/filter_metadata/demo status=1 hex=-\"]\n",
    );
    // The expected lines are checked on Envoy's log too, and both logs are compared.
    let report = passed_in_both(&s);
    assert_eq!(report.cases.len(), 1, "{report}");
}

/// A map of several entries read whole: Envoy lists the entries in its own order, so the
/// comparison says it cannot compare the step's lines and why, instead of failing on it.
#[test]
fn a_map_of_several_entries_is_not_compared_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    dynamic_metadata_bootstrap(dir.path());
    let s = scenario(
        dir.path(),
        &dir.path().join("dynamic-metadata.bootstrap.yaml"),
        "  - name: eight keys\n    request:\n      dynamic_metadata:\n        demo: {k1: a, k2: b, k3: c, k4: d, k5: e, k6: f, k7: g, k8: h}\n",
    );
    let report = passed_in_both(&s);
    match &report.cases[0].logs {
        wasm_harness::compare::LogComparison::CannotCompare { why, .. } => {
            assert!(why.contains("no fixed order"), "{why}")
        }
        other => assert!(!other.differs(), "{report}"),
    }
}
