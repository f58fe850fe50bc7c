//! The configuration examples users copy: every JSON block in `docs/filter.md` and in the
//! README's filter section is a configuration the filter itself accepts, so no example rots.

use wasm_filter::config::{PluginConfig, VmConfig};

use crate::support::root;

/// The ```json blocks of a Markdown file, in order.
fn json_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```json") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Each block is a plugin configuration (it names a `role`) or the VM configuration; both are
/// parsed by the filter's own parsers.
fn check_examples(file: &str) -> usize {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let blocks = json_blocks(&text);
    for block in &blocks {
        let value: serde_json::Value = serde_json::from_str(block)
            .unwrap_or_else(|e| panic!("{file}: a json block is not JSON ({e}):\n{block}"));
        if value.get("role").is_some() {
            PluginConfig::parse(block.as_bytes())
                .unwrap_or_else(|e| panic!("{file}: the filter refuses an example: {e}\n{block}"));
        } else {
            VmConfig::parse(block.as_bytes()).unwrap_or_else(|e| {
                panic!("{file}: the filter refuses a VM example: {e}\n{block}")
            });
        }
    }
    blocks.len()
}

#[test]
fn every_configuration_example_in_the_filter_docs_is_accepted_by_the_filter() {
    assert!(
        check_examples("docs/filter.md") >= 6,
        "docs/filter.md shows every role"
    );
}

#[test]
fn make_publishs_default_plugin_configuration_is_accepted_by_the_filter() {
    let text = std::fs::read(root().join("envoy-config/wasmplugins/plugin-config.json")).unwrap();
    PluginConfig::parse(&text)
        .unwrap_or_else(|e| panic!("envoy-config/wasmplugins/plugin-config.json: {e}"));
}

#[test]
fn the_readme_filter_example_is_accepted_by_the_filter() {
    assert!(
        check_examples("README.md") >= 1,
        "the README shows a configuration"
    );
}
