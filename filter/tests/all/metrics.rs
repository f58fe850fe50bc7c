//! The roles' metrics as an operator reads them: real Envoy 1.40 running the shipped
//! bootstrap (whose `stats_tags` take the plugin and the role out of the names), scraped on
//! `/stats/prometheus`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::support::{bootstrap_copy, EnvoyProcess};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 GET on a fresh connection; the whole response as text.
fn get(port: u16, path: &str, headers: &str) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nhost: t\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn prometheus_shows_each_roles_metrics_tagged_with_plugin_and_role() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, admin) = (free_port(), free_port());
    let path = bootstrap_copy(dir.path(), "envoy-config/bootstrap.yaml");
    let mut text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            r#""burst": 20, "refill_per_second": 10"#,
            r#""burst": 2, "refill_per_second": 0.001"#,
        )
        .replace("port_value: 10000", &format!("port_value: {listener}"))
        .replace("port_value: 9901", &format!("port_value: {admin}"));
    for other in ["10001", "10002"] {
        text = text.replace(&format!("port_value: {other}"), "port_value: 0");
    }
    std::fs::write(&path, text).unwrap();
    let envoy = EnvoyProcess::start(dir.path(), &path);
    assert!(
        envoy.wait_for("configured role rate-limit"),
        "{}",
        envoy.log()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", listener)).is_err() {
        assert!(Instant::now() < deadline, "{}", envoy.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // /healthz is answered by the route: the filters run, no upstream is needed.
    let statuses: Vec<String> = (0..3)
        .map(|_| {
            get(listener, "/healthz", "")
                .get(9..12)
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(statuses, ["200", "200", "429"]);
    let scrape = get(admin, "/stats/prometheus", "");
    let series = |name: &str, plugin: &str, role: &str| -> Option<u64> {
        let head = format!("{name}{{plugin=\"{plugin}\",role=\"{role}\"}} ");
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(&head)?.trim().parse().ok())
    };
    assert_eq!(
        series("wasm_filter_allowed_total", "rate-limit", "rate-limit"),
        Some(2),
        "{scrape}"
    );
    assert_eq!(
        series("wasm_filter_limited_total", "rate-limit", "rate-limit"),
        Some(1)
    );
    assert_eq!(
        series(
            "wasm_filter_edited_total",
            "header-ops",
            "http-header-operation"
        ),
        Some(2)
    );
    // `when` (GET under /legacy/) did not match these.
    assert_eq!(
        series(
            "wasm_filter_skipped_total",
            "legacy-path",
            "http-header-operation"
        ),
        Some(2)
    );
    assert!(
        scrape.contains("# TYPE wasm_filter_allowed_total counter"),
        "{scrape}"
    );
}
