//! The JSON type of every bootstrap field the harness reads, checked before the bootstrap is
//! parsed: a field of the wrong type (`listeners: 5`, `fail_open: "yes"`) is an error naming
//! the field and the type it needs, instead of a field quietly read as absent.

use serde_json::Value;

use super::BootstrapError;

#[derive(Clone, Copy)]
enum Kind {
    List,
    Map,
    Text,
    Number,
    Bool,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::List => "a list",
            Kind::Map => "a map",
            Kind::Text => "a string",
            Kind::Number => "a number",
            Kind::Bool => "true or false",
        }
    }

    fn admits(self, v: &Value) -> bool {
        matches!(
            (self, v),
            (Kind::List, Value::Array(_))
                | (Kind::Map, Value::Object(_))
                | (Kind::Text, Value::String(_))
                | (Kind::Number, Value::Number(_))
                | (Kind::Bool, Value::Bool(_))
        )
    }
}

use Kind::*;

/// Fields by path: `.` between keys, `[]` after a list whose every item the rest applies to.
/// A parent comes before its children.
const FIELDS: &[(&str, Kind)] = &[
    ("node", Map),
    ("static_resources", Map),
    ("static_resources.listeners", List),
    ("static_resources.listeners[]", Map),
    ("static_resources.listeners[].name", Text),
    ("static_resources.listeners[].address", Map),
    ("static_resources.listeners[].address.socket_address", Map),
    (
        "static_resources.listeners[].address.socket_address.address",
        Text,
    ),
    ("static_resources.listeners[].filter_chains", List),
    ("static_resources.listeners[].filter_chains[]", Map),
    ("static_resources.listeners[].filter_chains[].filters", List),
    (
        "static_resources.listeners[].filter_chains[].filters[]",
        Map,
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].name",
        Text,
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config",
        Map,
    ),
    ("static_resources.clusters", List),
    ("static_resources.clusters[]", Map),
    ("static_resources.clusters[].name", Text),
    ("static_resources.clusters[].load_assignment", Map),
    (
        "static_resources.clusters[].load_assignment.endpoints",
        List,
    ),
    (
        "static_resources.clusters[].load_assignment.endpoints[]",
        Map,
    ),
    (
        "static_resources.clusters[].load_assignment.endpoints[].lb_endpoints",
        List,
    ),
    (
        "static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[]",
        Map,
    ),
    ("bootstrap_extensions", List),
    ("bootstrap_extensions[]", Map),
    ("bootstrap_extensions[].name", Text),
    ("bootstrap_extensions[].typed_config", Map),
    ("bootstrap_extensions[].typed_config.singleton", Bool),
];

/// A network filter's `typed_config` (the connection manager, `tcp_proxy`, network Wasm).
const NETWORK_FILTER: &[(&str, Kind)] = &[
    ("stat_prefix", Text),
    ("cluster", Text),
    ("route_config", Map),
    ("route_config.virtual_hosts", List),
    ("route_config.virtual_hosts[]", Map),
    ("route_config.virtual_hosts[].name", Text),
    ("route_config.virtual_hosts[].domains", List),
    ("route_config.virtual_hosts[].domains[]", Text),
    ("route_config.virtual_hosts[].routes", List),
    ("route_config.virtual_hosts[].routes[]", Map),
    ("route_config.virtual_hosts[].routes[].match", Map),
    ("route_config.virtual_hosts[].routes[].match.prefix", Text),
    ("route_config.virtual_hosts[].routes[].match.path", Text),
    ("route_config.virtual_hosts[].routes[].route", Map),
    ("route_config.virtual_hosts[].routes[].route.cluster", Text),
    ("route_config.virtual_hosts[].routes[].direct_response", Map),
    (
        "route_config.virtual_hosts[].routes[].direct_response.status",
        Number,
    ),
    (
        "route_config.virtual_hosts[].routes[].direct_response.body",
        Map,
    ),
    ("http_filters", List),
    ("http_filters[]", Map),
    ("http_filters[].name", Text),
    ("http_filters[].typed_config", Map),
];

/// A Wasm plugin's `config` (`PluginConfig`).
const PLUGIN: &[(&str, Kind)] = &[
    ("name", Text),
    ("root_id", Text),
    ("fail_open", Bool),
    ("failure_policy", Text),
    ("configuration", Map),
    ("vm_config", Map),
    ("vm_config.vm_id", Text),
    ("vm_config.runtime", Text),
    ("vm_config.allow_precompiled", Bool),
    ("vm_config.configuration", Map),
    ("vm_config.code", Map),
    ("vm_config.code.local", Map),
    ("vm_config.code.local.filename", Text),
    ("vm_config.environment_variables", Map),
    ("vm_config.environment_variables.key_values", Map),
];

/// Where the tables above apply, beyond the root.
const NETWORK_FILTERS: &str = "static_resources.listeners[].filter_chains[].filters[].typed_config";
const PLUGINS: [&str; 3] = [
    "static_resources.listeners[].filter_chains[].filters[].typed_config.config",
    "static_resources.listeners[].filter_chains[].filters[].typed_config.http_filters[].typed_config.config",
    "bootstrap_extensions[].typed_config.config",
];

/// Checks every field the harness reads for its type.
pub(super) fn check(doc: &Value) -> Result<(), BootstrapError> {
    for (path, kind) in FIELDS {
        visit("", doc, path, *kind)?;
    }
    for (path, kind) in NETWORK_FILTER {
        visit("", doc, &format!("{NETWORK_FILTERS}.{path}"), *kind)?;
    }
    for base in PLUGINS {
        visit("", doc, base, Map)?;
        for (path, kind) in PLUGIN {
            visit("", doc, &format!("{base}.{path}"), *kind)?;
        }
    }
    Ok(())
}

/// Follows `path` from `v` (found at `at`), checking what it reaches; absent fields and
/// `null` are left to the parser, which knows which are required.
fn visit(at: &str, v: &Value, path: &str, kind: Kind) -> Result<(), BootstrapError> {
    let (segment, rest) = match path.split_once('.') {
        Some((s, r)) => (s, Some(r)),
        None => (path, None),
    };
    let (key, each) = match segment.strip_suffix("[]") {
        Some(k) => (k, true),
        None => (segment, false),
    };
    let here = if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    };
    let Some(found) = v.get(key).filter(|f| !f.is_null()) else {
        return Ok(());
    };
    if !each {
        return match rest {
            None if !kind.admits(found) => Err(wrong(&here, kind, found)),
            None => Ok(()),
            Some(rest) => visit(&here, found, rest, kind),
        };
    }
    let Some(items) = found.as_array() else {
        // The list itself has its own entry, which names the problem.
        return Ok(());
    };
    for (i, item) in items.iter().enumerate() {
        let at_item = format!("{here}[{i}]");
        match rest {
            None if !kind.admits(item) => return Err(wrong(&at_item, kind, item)),
            None => {}
            Some(rest) => visit_item(&at_item, item, rest, kind)?,
        }
    }
    Ok(())
}

/// `visit` for the path below a list item (which is the value itself, not a key of it).
fn visit_item(at: &str, item: &Value, path: &str, kind: Kind) -> Result<(), BootstrapError> {
    if item.is_object() {
        visit(at, item, path, kind)
    } else {
        Ok(())
    }
}

fn wrong(at: &str, kind: Kind, found: &Value) -> BootstrapError {
    let what = match found {
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "a map".to_string(),
        Value::String(s) if s.len() > 40 => "a string".to_string(),
        Value::String(s) => format!("a string ({s:?})"),
        Value::Number(n) => format!("a number ({n})"),
        Value::Bool(b) => format!("{b}"),
        Value::Null => "nothing".to_string(),
    };
    super::model::invalid(at, format!("expected {}, found {what}", kind.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(yaml: &str) -> String {
        let doc: Value = serde_norway::from_str(yaml).unwrap();
        check(&doc).unwrap_err().to_string()
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named_with_the_type_it_needs() {
        assert_eq!(
            error("static_resources: {listeners: 5}"),
            "bootstrap: static_resources.listeners: expected a list, found a number (5)"
        );
        assert_eq!(
            error("static_resources: {listeners: [{name: 7}]}"),
            "bootstrap: static_resources.listeners[0].name: expected a string, found a number (7)"
        );
        let e = error(
            "static_resources: {listeners: [{filter_chains: [{filters: [{typed_config: {http_filters: [{typed_config: {config: {fail_open: 'yes'}}}]}}]}]}]}",
        );
        assert_eq!(
            e,
            "bootstrap: static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.fail_open: expected true or false, found a string (\"yes\")"
        );
        assert!(error("static_resources: 3").contains("static_resources: expected a map"));
        let doc: Value = serde_norway::from_str("static_resources: {listeners: []}").unwrap();
        assert!(check(&doc).is_ok());
    }
}
