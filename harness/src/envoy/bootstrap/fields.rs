//! Which bootstrap fields the harness reads (with the type each needs, for
//! [`super::shape::normalize`]), and which it knows to be harmless to ignore. In the messages
//! the harness emulates, every other field is refused by name: Envoy would act on it
//! (`filter_chain_match`, `transport_socket`, `typed_per_filter_config`, a route `timeout`,
//! `capability_restriction_config`, ...) and a harness that quietly skipped it would pass
//! tests Envoy fails.

use serde_json::Value;

use super::model::{invalid, BootstrapError};
use super::shape::{join, snake_case, Kind, Kind::*};
use super::typed_config::{type_name, types};

/// `PluginConfig.FailurePolicy` as Envoy 1.40 numbers it (read back from its config dump).
const FAILURE_POLICY: Kind = Enum(&[
    ("UNSPECIFIED", 0),
    ("FAIL_RELOAD", 1),
    ("FAIL_CLOSED", 2),
    ("FAIL_OPEN", 3),
]);

/// Fields by path from the root: `.` between keys, `[]` after a list whose every item the
/// rest applies to. A parent comes before its children (an `Any` is unwrapped before its
/// fields are read).
const FIELDS: &[(&str, Kind)] = &[
    ("node", Map),
    ("static_resources", Map),
    ("static_resources.listeners", List),
    ("static_resources.listeners[]", Map),
    ("static_resources.listeners[].name", Text),
    ("static_resources.listeners[].address", Map),
    ("static_resources.listeners[].address.socket_address", Map),
    ("static_resources.listeners[].address.socket_address.address", Text),
    ("static_resources.listeners[].address.socket_address.port_value", Number),
    ("static_resources.listeners[].filter_chains", List),
    ("static_resources.listeners[].filter_chains[]", Map),
    ("static_resources.listeners[].filter_chains[].filters", List),
    ("static_resources.listeners[].filter_chains[].filters[]", Map),
    ("static_resources.listeners[].filter_chains[].filters[].name", Text),
    ("static_resources.listeners[].filter_chains[].filters[].typed_config", Any),
    ("static_resources.clusters", List),
    ("static_resources.clusters[]", Map),
    ("static_resources.clusters[].name", Text),
    ("static_resources.clusters[].load_assignment", Map),
    ("static_resources.clusters[].load_assignment.endpoints", List),
    ("static_resources.clusters[].load_assignment.endpoints[]", Map),
    ("static_resources.clusters[].load_assignment.endpoints[].lb_endpoints", List),
    ("static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[]", Map),
    ("static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[].endpoint", Map),
    (
        "static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[].endpoint.address",
        Map,
    ),
    (
        "static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[].endpoint.address.socket_address",
        Map,
    ),
    (
        "static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[].endpoint.address.socket_address.address",
        Text,
    ),
    (
        "static_resources.clusters[].load_assignment.endpoints[].lb_endpoints[].endpoint.address.socket_address.port_value",
        Number,
    ),
    ("bootstrap_extensions", List),
    ("bootstrap_extensions[]", Map),
    ("bootstrap_extensions[].name", Text),
    ("bootstrap_extensions[].typed_config", Any),
    ("bootstrap_extensions[].typed_config.singleton", Bool),
];

/// A network filter's `typed_config` (the connection manager, `tcp_proxy`, network Wasm).
const NETWORK_FILTER: &[(&str, Kind)] = &[
    ("stat_prefix", Text),
    ("cluster", Text),
    ("rds", Map),
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
    (
        "route_config.virtual_hosts[].routes[].direct_response.body.inline_string",
        Text,
    ),
    (
        "route_config.virtual_hosts[].routes[].direct_response.body.inline_bytes",
        Text,
    ),
    ("http_filters", List),
    ("http_filters[]", Map),
    ("http_filters[].name", Text),
    ("http_filters[].config_discovery", Map),
    ("http_filters[].typed_config", Any),
];

/// A Wasm plugin's `config` (`PluginConfig`).
const PLUGIN: &[(&str, Kind)] = &[
    ("name", Text),
    ("root_id", Text),
    ("fail_open", Bool),
    ("failure_policy", FAILURE_POLICY),
    ("configuration", Any),
    ("vm_config", Map),
    ("vm_config.vm_id", Text),
    ("vm_config.runtime", Text),
    ("vm_config.allow_precompiled", Bool),
    ("vm_config.configuration", Any),
    ("vm_config.code", Map),
    ("vm_config.code.local", Map),
    ("vm_config.code.local.filename", Text),
    ("vm_config.code.remote", Map),
    ("vm_config.environment_variables", Map),
    ("vm_config.environment_variables.key_values", Map),
    ("vm_config.environment_variables.host_env_keys", List),
];

/// Where the tables above apply, beyond the root.
const NETWORK_FILTERS: &str = "static_resources.listeners[].filter_chains[].filters[].typed_config";
const PLUGINS: [&str; 3] = [
    "static_resources.listeners[].filter_chains[].filters[].typed_config.config",
    "static_resources.listeners[].filter_chains[].filters[].typed_config.http_filters[].typed_config.config",
    "bootstrap_extensions[].typed_config.config",
];

/// Every field path the harness reads, parents first, with its kind.
pub(super) fn all() -> Vec<(String, Kind)> {
    let mut out: Vec<(String, Kind)> = FIELDS.iter().map(|(p, k)| (p.to_string(), *k)).collect();
    out.extend(
        NETWORK_FILTER
            .iter()
            .map(|(p, k)| (format!("{NETWORK_FILTERS}.{p}"), *k)),
    );
    for base in PLUGINS {
        out.push((base.to_string(), Map));
        out.extend(PLUGIN.iter().map(|(p, k)| (format!("{base}.{p}"), *k)));
    }
    out
}

/// The messages whose every field is either read (in the tables above) or listed here as
/// harmless to ignore; any other field of theirs is refused. `types` limits an `Any` path to
/// the messages it may hold. Messages not listed (clusters, `node`, `admin`, ...) are not
/// checked: what they configure does not reach the traffic the harness emulates.
const CLOSED: &[(&str, &[&str], &[&str])] = &[
    (
        "",
        &[],
        &[
            "admin",
            "layered_runtime",
            "stats_config",
            "stats_sinks",
            "stats_flush_interval",
            "stats_flush_on_admin",
            "watchdog",
            "watchdogs",
            "overload_manager",
            "enable_dispatcher_stats",
            "stats_server_version_override",
            "fatal_actions",
            "application_log_config",
            "default_socket_interface",
            "typed_dns_resolver_config",
            "dns_resolution_config",
            "use_tcp_for_dns_lookups",
            "cluster_manager",
            "node_context_params",
            "memory_allocator_manager",
            "default_regex_engine",
            "perf_tracing_file_path",
            "inline_headers",
            "certificate_provider_instances",
        ],
    ),
    ("static_resources", &[], &["secrets"]),
    (
        "static_resources.listeners[]",
        &[],
        &[
            "stat_prefix",
            "traffic_direction",
            "per_connection_buffer_limit_bytes",
            "access_log",
            "metadata",
            "drain_type",
            "enable_reuse_port",
            "connection_balance_config",
            "ignore_global_conn_limit",
            "max_connections_to_accept_per_socket_event",
            "tcp_backlog_size",
            "listener_filters_timeout",
            "continue_on_listener_filters_timeout",
            "socket_options",
            "freebind",
            "tcp_fast_open_queue_length",
            "enable_mptcp",
        ],
    ),
    ("static_resources.listeners[].address", &[], &[]),
    (
        "static_resources.listeners[].address.socket_address",
        &[],
        &["ipv4_compat"],
    ),
    (
        "static_resources.listeners[].filter_chains[]",
        &[],
        &["name", "metadata", "transport_socket_connect_timeout"],
    ),
    ("static_resources.listeners[].filter_chains[].filters[]", &[], &[]),
    (
        NETWORK_FILTERS,
        &[types::HCM, types::TCP_PROXY, types::NETWORK_WASM],
        &[
            "codec_type",
            "access_log",
            "access_log_options",
            "tracing",
            "common_http_protocol_options",
            "http_protocol_options",
            "http2_protocol_options",
            "stream_idle_timeout",
            "request_timeout",
            "request_headers_timeout",
            "drain_timeout",
            "delayed_close_timeout",
            "max_request_headers_kb",
            "upgrade_configs",
            "internal_address_config",
            "stream_error_on_invalid_http_message",
            "idle_timeout",
            "max_connect_attempts",
        ],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.route_config",
        &[],
        &["name", "validate_clusters"],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.route_config.virtual_hosts[]",
        &[],
        &["metadata"],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.route_config.virtual_hosts[].routes[]",
        &[],
        &["name", "metadata", "decorator"],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.route_config.virtual_hosts[].routes[].route",
        &[],
        &[],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.route_config.virtual_hosts[].routes[].direct_response",
        &[],
        &[],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.http_filters[]",
        &[],
        &["is_optional"],
    ),
    (
        "static_resources.listeners[].filter_chains[].filters[].typed_config.http_filters[].typed_config",
        &[types::HTTP_WASM, types::ROUTER],
        &["dynamic_stats", "start_child_span", "upstream_log", "upstream_log_options"],
    ),
    ("bootstrap_extensions[].typed_config", &[types::WASM_SERVICE], &[]),
];

/// The closed messages of a plugin `config`, below each of [`PLUGINS`].
const PLUGIN_CLOSED: &[(&str, &[&str])] = &[
    ("", &[]),
    ("vm_config", &["nack_on_code_cache_miss"]),
    ("vm_config.code", &[]),
    ("vm_config.code.local", &["watched_directory"]),
    ("vm_config.environment_variables", &[]),
];

/// Why a field Envoy acts on is refused, for the ones users meet most.
fn reason(key: &str) -> &'static str {
    match key {
        "filter_chain_match" => "filter chain matching is not emulated: every connection takes the listener's one chain",
        "transport_socket" => "TLS is not emulated: the harness speaks plain HTTP and TCP",
        "listener_filters" => "listener filters are not emulated",
        "typed_per_filter_config" => "per-route filter configuration is not emulated",
        "capability_restriction_config" => "capability restrictions are not emulated: every hostcall is allowed",
        "dynamic_resources" => "xDS is not emulated: give the listeners and clusters in static_resources",
        _ => "not emulated by the harness, and Envoy would act on it: remove it to run this bootstrap in the harness",
    }
}

/// Refuses, naming it, every field of a [`CLOSED`] message that is neither read nor known
/// to be harmless. Runs on a normalized bootstrap the parser accepted (so every `Any` holds a
/// type the harness knows).
pub(super) fn refuse_unemulated(doc: &Value) -> Result<(), BootstrapError> {
    let read: Vec<String> = all().into_iter().map(|(p, _)| p).collect();
    let mut closed: Vec<(String, &[&str], &[&str])> = CLOSED
        .iter()
        .map(|(p, t, h)| (p.to_string(), *t, *h))
        .collect();
    for base in PLUGINS {
        for (p, harmless) in PLUGIN_CLOSED {
            let path = if p.is_empty() {
                base.to_string()
            } else {
                join(base, p)
            };
            closed.push((path, &[], harmless));
        }
    }
    for (path, types, harmless) in &closed {
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("{path}.")
        };
        let children: Vec<&str> = read
            .iter()
            .filter_map(|p| p.strip_prefix(&prefix))
            .map(|rest| {
                rest.split('.')
                    .next()
                    .unwrap_or(rest)
                    .trim_end_matches("[]")
            })
            .collect();
        let mut found = Vec::new();
        values_at("", doc, path, &mut found);
        for (at, message) in found {
            let Some(fields) = message.as_object() else {
                continue;
            };
            if !types.is_empty() && !types.contains(&type_name(message).as_str()) {
                continue;
            }
            for key in fields.keys() {
                let snake = snake_case(key);
                if key == "@type"
                    || fields[key].is_null()
                    || children.contains(&snake.as_str())
                    || harmless.contains(&snake.as_str())
                {
                    continue;
                }
                return Err(invalid(&join(&at, key), reason(&snake)));
            }
        }
    }
    Ok(())
}

/// Every value at `path` (as in the tables) below `v`, with its field path.
fn values_at<'a>(at: &str, v: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    if path.is_empty() {
        out.push((at.to_string(), v));
        return;
    }
    let (segment, rest) = path.split_once('.').unwrap_or((path, ""));
    let (key, each) = match segment.strip_suffix("[]") {
        Some(k) => (k, true),
        None => (segment, false),
    };
    let here = join(at, key);
    let Some(found) = v.get(key) else { return };
    if !each {
        return values_at(&here, found, rest, out);
    }
    for (i, item) in found.as_array().into_iter().flatten().enumerate() {
        values_at(&format!("{here}[{i}]"), item, rest, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(yaml: &str) -> Option<String> {
        let mut doc: Value = serde_norway::from_str(yaml).unwrap();
        super::super::shape::normalize(&mut doc, super::super::shape::TypedStructs::Unwrap)
            .unwrap();
        refuse_unemulated(&doc).err().map(|e| e.to_string())
    }

    #[test]
    fn a_field_envoy_acts_on_is_refused_by_its_path() {
        let e = refusal(
            "static_resources: {listeners: [{name: a, filter_chains: [{filter_chain_match: {destination_port: 1}, filters: []}]}]}",
        )
        .unwrap();
        assert_eq!(
            e,
            "bootstrap: static_resources.listeners[0].filter_chains[0].filter_chain_match: filter chain matching is not emulated: every connection takes the listener's one chain"
        );
        // Named as written, whatever the spelling.
        let e = refusal("static_resources: {listeners: [{listenerFilters: []}]}").unwrap();
        assert!(
            e.contains("static_resources.listeners[0].listenerFilters: listener filters"),
            "{e}"
        );
        let e = refusal(
            "bootstrap_extensions: [{typed_config: {'@type': type.googleapis.com/envoy.extensions.wasm.v3.WasmService, config: {capability_restriction_config: {}}}}]",
        )
        .unwrap();
        assert!(
            e.contains("bootstrap_extensions[0].typed_config.config.capability_restriction_config"),
            "{e}"
        );
    }

    #[test]
    fn harmless_and_read_fields_pass() {
        assert_eq!(
            refusal(
                "admin: {}\nstatic_resources: {listeners: [{name: a, statPrefix: x, filter_chains: [{filters: [{typed_config: {'@type': x/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, cluster: c, idle_timeout: 1s}}]}]}], clusters: [{name: c, connect_timeout: 1s}]}"
            ),
            None
        );
        // An unemulated field set to null is the field left out.
        assert_eq!(
            refusal(
                "static_resources: {listeners: [{filter_chains: [{filter_chain_match: null}]}]}"
            ),
            None
        );
    }
}
