//! `serve` against plugin files written to hurt it: it keeps answering its probes and says
//! which file it refused and why.

use std::time::Duration;

use crate::serve_support::{dirs, get, wait_for, write_plugin};

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
