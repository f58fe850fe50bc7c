//! `tcp-total-data-size-counter` in the harness: per-connection bytes, totals summed across
//! workers in shared data, and the metrics.

use wasm_harness::Proxy;
use wasm_harness::TcpEvent;

use crate::support::{lines, module};

fn counter(workers: usize) -> Proxy {
    Proxy::for_module(module())
        .configuration(r#"{"role": "tcp-total-data-size-counter"}"#)
        .vm_id("wasm-filter")
        .tcp()
        .workers(workers)
        .build()
        .unwrap()
}

fn bytes(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

#[test]
fn each_connection_is_logged_and_totals_are_summed_across_workers() {
    let mut proxy = counter(2);
    let events = [
        TcpEvent::Downstream(bytes("hello")),
        TcpEvent::Upstream(bytes("hi")),
        TcpEvent::Downstream(bytes("bye")),
        TcpEvent::CloseDownstream,
    ];
    let first = proxy.connect(None, Some(0), &events).unwrap();
    assert_eq!(first.upstream_received, b"hellobye");
    assert_eq!(first.downstream_received, b"hi");
    let second = proxy
        .connect(
            None,
            Some(1),
            &[
                TcpEvent::Downstream(bytes("0123456789")),
                TcpEvent::Upstream(bytes("x")),
                TcpEvent::CloseUpstream,
            ],
        )
        .unwrap();
    assert_eq!(second.worker, 1);
    assert_eq!(
        lines(&proxy, "tcp connection closed:"),
        [
            "wasm-filter: tcp connection closed: in=8 out=2",
            "wasm-filter: tcp connection closed: in=10 out=1"
        ]
    );
    let totals = proxy
        .shared_data("wasm-filter", "wasm-filter/tcp-totals")
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&totals),
        "in=18 out=3 connections=2"
    );
    assert_eq!(
        proxy.metric("wasm_filter.plugin.plugin.role.tcp-total-data-size-counter.bytes_in_total"),
        Some(18)
    );
    assert_eq!(
        proxy.metric("wasm_filter.plugin.plugin.role.tcp-total-data-size-counter.bytes_out_total"),
        Some(3)
    );
    assert_eq!(
        proxy
            .metric("wasm_filter.plugin.plugin.role.tcp-total-data-size-counter.connections_total"),
        Some(2)
    );
}
