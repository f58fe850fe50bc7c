//! The bootstrap parser: reads the document's parts the harness emulates into
//! [`super::model`], and refuses, naming the field, anything else that would change what
//! traffic sees.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::ecds::{self, EcdsFiles};
use super::model::*;
use super::typed_config::{type_name, types};
use super::{fields, shape};

impl Bootstrap {
    pub fn load(path: &Path) -> Result<Self, BootstrapError> {
        Self::load_swapped(path, &EcdsFiles::new())
    }

    /// [`Bootstrap::load`] with the discovery resources of the filters `swapped` names read
    /// from the file it gives instead (an ECDS file replaced while Envoy runs).
    pub fn load_swapped(path: &Path, swapped: &EcdsFiles) -> Result<Self, BootstrapError> {
        let text = crate::engine::input::read_text(path, crate::engine::input::MAX_CONFIG_BYTES)
            .map_err(|source| BootstrapError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let doc: Value = wasm_common::yaml::from_str(&text).map_err(|e| BootstrapError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_value_swapped(path, &doc, swapped)
    }

    /// Reads `doc` as Envoy would: every shape its loader accepts for the fields the harness
    /// reads, `TypedStruct`s seen through; fields the harness does not emulate are refused.
    pub fn from_value(path: &Path, doc: &Value) -> Result<Self, BootstrapError> {
        Self::from_value_swapped(path, doc, &EcdsFiles::new())
    }

    fn from_value_swapped(
        path: &Path,
        doc: &Value,
        swapped: &EcdsFiles,
    ) -> Result<Self, BootstrapError> {
        let mut doc = doc.clone();
        shape::normalize(&mut doc, shape::TypedStructs::Unwrap)?;
        // What discovery files configure is normalized like the rest.
        ecds::inline(&mut doc, swapped)?;
        shape::normalize(&mut doc, shape::TypedStructs::Unwrap)?;
        let parsed = Self::from_normalized(path, &doc)?;
        fields::refuse_unemulated(&doc)?;
        Ok(parsed)
    }

    fn from_normalized(path: &Path, doc: &Value) -> Result<Self, BootstrapError> {
        let resources = doc.get("static_resources");
        let mut listeners = Vec::new();
        for (i, l) in array(resources, "listeners").iter().enumerate() {
            listeners.push(parse_listener(
                &format!("static_resources.listeners[{i}]"),
                l,
            )?);
        }
        let mut clusters = Vec::new();
        for (i, c) in array(resources, "clusters").iter().enumerate() {
            clusters.push(parse_cluster(
                &format!("static_resources.clusters[{i}]"),
                c,
            )?);
        }
        let mut services = Vec::new();
        for (i, e) in array(Some(doc), "bootstrap_extensions").iter().enumerate() {
            let at = format!("bootstrap_extensions[{i}]");
            let typed = e.get("typed_config").unwrap_or(&Value::Null);
            if type_name(typed) != types::WASM_SERVICE {
                return Err(BootstrapError::UnsupportedFilter {
                    at,
                    name: str_field(e, "name").unwrap_or_default(),
                    type_url: type_name(typed),
                });
            }
            services.push(WasmService {
                plugin: parse_plugin(
                    &format!("{at}.typed_config"),
                    typed.get("config").unwrap_or(&Value::Null),
                )?,
                singleton: typed
                    .get("singleton")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            listeners,
            clusters,
            node: doc.get("node").cloned().unwrap_or(Value::Null),
            services,
        })
    }
}

fn array<'a>(v: Option<&'a Value>, key: &str) -> &'a [Value] {
    v.and_then(|v| v.get(key))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

fn parse_listener(at: &str, l: &Value) -> Result<Listener, BootstrapError> {
    let name = str_field(l, "name").unwrap_or_default();
    let sock = l
        .pointer("/address/socket_address")
        .ok_or_else(|| invalid(at, "address.socket_address is required"))?;
    let address = str_field(sock, "address").unwrap_or_else(|| "0.0.0.0".into());
    let port = port_of(&format!("{at}.address.socket_address"), sock)?;
    let chains = l
        .get("filter_chains")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid(at, "filter_chains is required"))?;
    if chains.len() != 1 {
        return Err(invalid(
            at,
            "exactly one filter chain is supported (filter_chain_match is not emulated)",
        ));
    }
    let filters = chains[0]
        .get("filters")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut http = None;
    let mut network = Vec::new();
    let mut tcp_proxy = None;
    let mut deny_at = None;
    for (i, f) in filters.iter().enumerate() {
        let fat = format!("{at}.filter_chains[0].filters[{i}]");
        let typed = f.get("typed_config").unwrap_or(&Value::Null);
        if http.is_some() || tcp_proxy.is_some() {
            return Err(invalid(
                &fat,
                "nothing may follow the terminal filter (http_connection_manager or tcp_proxy)",
            ));
        }
        match type_name(typed).as_str() {
            types::NETWORK_RBAC => {
                if super::rbac::fallback(&fat, typed, "stat_prefix")? == RbacFallback::DenyAll {
                    deny_at.get_or_insert(network.len());
                }
            }
            types::HCM if !network.is_empty() || deny_at.is_some() => {
                return Err(invalid(
                    &fat,
                    "network Wasm filters in front of http_connection_manager are not emulated (they would see the raw HTTP bytes): use HTTP Wasm filters, or tcp_proxy",
                ))
            }
            types::HCM => http = Some(parse_hcm(&fat, typed)?),
            types::NETWORK_WASM => network.push(parse_plugin(
                &format!("{fat}.typed_config"),
                typed.get("config").unwrap_or(&Value::Null),
            )?),
            types::TCP_PROXY => {
                let cluster = str_field(typed, "cluster").ok_or_else(|| {
                    invalid(
                        &fat,
                        "tcp_proxy needs a cluster (weighted_clusters are not emulated)",
                    )
                })?;
                tcp_proxy = Some(TcpProxy {
                    stat_prefix: str_field(typed, "stat_prefix").unwrap_or_default(),
                    cluster,
                });
            }
            other => {
                return Err(BootstrapError::UnsupportedFilter {
                    at: fat,
                    name: str_field(f, "name").unwrap_or_default(),
                    type_url: other.to_string(),
                })
            }
        }
    }
    let chain = match (http, tcp_proxy) {
        (Some(hcm), _) => FilterChain::Http(hcm),
        (None, Some(proxy)) => FilterChain::Tcp(TcpChain {
            filters: network,
            proxy,
            deny_at,
        }),
        (None, None) => {
            return Err(invalid(
                at,
                "the filter chain ends with neither envoy.filters.network.http_connection_manager nor envoy.filters.network.tcp_proxy",
            ))
        }
    };
    Ok(Listener {
        name,
        address,
        port,
        chain,
    })
}

fn port_of(at: &str, sock: &Value) -> Result<u16, BootstrapError> {
    sock.get("port_value")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| invalid(at, "port_value must be a port number"))
}

fn parse_hcm(at: &str, hcm: &Value) -> Result<HttpConnectionManager, BootstrapError> {
    let stat_prefix = str_field(hcm, "stat_prefix").unwrap_or_default();
    if hcm.get("rds").is_some() {
        return Err(invalid(
            at,
            "rds is not supported: use an inline route_config",
        ));
    }
    let routes = parse_route_config(
        &format!("{at}.typed_config.route_config"),
        hcm.get("route_config")
            .ok_or_else(|| invalid(at, "route_config is required"))?,
    )?;
    let mut filters = Vec::new();
    let mut deny_at = None;
    let mut saw_router = false;
    for (i, f) in array(Some(hcm), "http_filters").iter().enumerate() {
        let fat = format!("{at}.typed_config.http_filters[{i}]");
        let typed = f.get("typed_config").unwrap_or(&Value::Null);
        if saw_router {
            return Err(invalid(&fat, "the router must be the last HTTP filter"));
        }
        match type_name(typed).as_str() {
            types::HTTP_WASM => filters.push(parse_plugin(
                &format!("{fat}.typed_config"),
                typed.get("config").unwrap_or(&Value::Null),
            )?),
            types::ROUTER => saw_router = true,
            types::HTTP_RBAC => {
                if super::rbac::fallback(&fat, typed, "rules_stat_prefix")? == RbacFallback::DenyAll
                {
                    deny_at.get_or_insert(filters.len());
                }
            }
            other => {
                return Err(BootstrapError::UnsupportedFilter {
                    at: fat,
                    name: str_field(f, "name").unwrap_or_default(),
                    type_url: other.to_string(),
                })
            }
        }
    }
    if !saw_router {
        return Err(invalid(at, "http_filters has no envoy.filters.http.router"));
    }
    Ok(HttpConnectionManager {
        stat_prefix,
        filters,
        routes,
        deny_at,
        http1_trailers: super::protocol::enables_trailers(hcm.get("http_protocol_options")),
    })
}

fn parse_route_config(at: &str, rc: &Value) -> Result<RouteConfig, BootstrapError> {
    let mut virtual_hosts = Vec::new();
    for (i, vh) in array(Some(rc), "virtual_hosts").iter().enumerate() {
        let vat = format!("{at}.virtual_hosts[{i}]");
        let domains = array(Some(vh), "domains")
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>();
        if domains.is_empty() {
            return Err(invalid(&vat, "domains must not be empty"));
        }
        let mut routes = Vec::new();
        for (j, r) in array(Some(vh), "routes").iter().enumerate() {
            routes.push(parse_route(&format!("{vat}.routes[{j}]"), r)?);
        }
        virtual_hosts.push(VirtualHost {
            name: str_field(vh, "name").unwrap_or_default(),
            domains,
            routes,
        });
    }
    Ok(RouteConfig { virtual_hosts })
}

fn parse_route(at: &str, r: &Value) -> Result<Route, BootstrapError> {
    let m = r
        .get("match")
        .ok_or_else(|| invalid(at, "match is required"))?;
    for key in m.as_object().map(|o| o.keys()).into_iter().flatten() {
        if !matches!(key.as_str(), "prefix" | "path") {
            return Err(invalid(
                &format!("{at}.match"),
                format!("route match field {key:?} is not supported (only prefix and path)"),
            ));
        }
    }
    let matcher = if let Some(p) = str_field(m, "prefix") {
        RouteMatch::Prefix(p)
    } else if let Some(p) = str_field(m, "path") {
        RouteMatch::Path(p)
    } else {
        return Err(invalid(at, "match needs prefix or path"));
    };
    let action = if let Some(route) = r.get("route") {
        RouteAction::Cluster(str_field(route, "cluster").ok_or_else(|| {
            invalid(
                &format!("{at}.route"),
                "only route.cluster is supported (no weighted_clusters or cluster_header)",
            )
        })?)
    } else if let Some(d) = r.get("direct_response") {
        let status = d
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| invalid(&format!("{at}.direct_response"), "status is required"))?;
        let body = data_source(&format!("{at}.direct_response.body"), d.get("body"))?;
        RouteAction::Direct { status, body }
    } else {
        return Err(invalid(at, "a route needs route or direct_response"));
    };
    let xds = XdsInfo {
        name: str_field(r, "name").unwrap_or_default(),
        metadata: r.get("metadata").cloned().unwrap_or_default(),
    };
    Ok(Route {
        matcher,
        action,
        xds,
    })
}

/// An Envoy `DataSource` used inline (`inline_string` / `inline_bytes`).
fn data_source(at: &str, v: Option<&Value>) -> Result<Vec<u8>, BootstrapError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    if let Some(s) = str_field(v, "inline_string") {
        return Ok(s.into_bytes());
    }
    if let Some(b) = str_field(v, "inline_bytes") {
        return base64_decode(&b).ok_or_else(|| invalid(at, "inline_bytes is not valid base64"));
    }
    Err(invalid(
        at,
        "only inline_string and inline_bytes are supported",
    ))
}

fn parse_cluster(at: &str, c: &Value) -> Result<Cluster, BootstrapError> {
    let name = str_field(c, "name").ok_or_else(|| invalid(at, "name is required"))?;
    let mut endpoints = Vec::new();
    for (i, e) in array(c.get("load_assignment"), "endpoints")
        .iter()
        .enumerate()
    {
        for (j, lb) in array(Some(e), "lb_endpoints").iter().enumerate() {
            let eat = format!("{at}.load_assignment.endpoints[{i}].lb_endpoints[{j}]");
            let sock = lb
                .pointer("/endpoint/address/socket_address")
                .ok_or_else(|| invalid(&eat, "endpoint.address.socket_address is required"))?;
            endpoints.push((
                str_field(sock, "address").unwrap_or_default(),
                port_of(&eat, sock)?,
            ));
        }
    }
    let metadata = c.get("metadata").cloned().unwrap_or_default();
    Ok(Cluster {
        name,
        endpoints,
        metadata,
        protocol: super::UpstreamProtocol::of_cluster(c),
    })
}

fn parse_plugin(at: &str, config: &Value) -> Result<WasmPlugin, BootstrapError> {
    let vm = config
        .pointer("/vm_config")
        .ok_or_else(|| invalid(at, "config.vm_config is required"))?;
    let vat = format!("{at}.config.vm_config");
    let runtime = str_field(vm, "runtime").unwrap_or_default();
    let code = if let Some(f) = vm.pointer("/code/local/filename").and_then(Value::as_str) {
        // Envoy opens a relative filename against its working directory, not the bootstrap's.
        PathBuf::from(f)
    } else if vm.pointer("/code/remote").is_some() {
        return Err(invalid(
            &format!("{vat}.code.remote"),
            "remote code is not fetched by the harness: pull it with `wasm-fetcher pull` and point code.local.filename at the result",
        ));
    } else {
        return Err(invalid(
            &format!("{vat}.code"),
            "code.local.filename is required",
        ));
    };
    let fail_open = config
        .get("fail_open")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let failure_policy = match config.get("failure_policy").and_then(Value::as_str) {
        Some(_) if fail_open => {
            return Err(invalid(
                at,
                "only one of fail_open or failure_policy can be set",
            ))
        }
        None | Some("UNSPECIFIED") | Some("FAIL_CLOSED") if !fail_open => FailurePolicy::FailClosed,
        None => FailurePolicy::FailOpen,
        Some("FAIL_OPEN") => FailurePolicy::FailOpen,
        Some("FAIL_RELOAD") => FailurePolicy::FailReload,
        Some(other) => {
            return Err(invalid(
                &format!("{at}.config.failure_policy"),
                format!("unknown failure policy {other:?}"),
            ))
        }
    };
    let mut environment = Vec::new();
    // Envoy passes the variables of its own environment these name; one it lacks is left out.
    for key in array(vm.get("environment_variables"), "host_env_keys") {
        let key = key.as_str().unwrap_or_default();
        if let Ok(value) = std::env::var(key) {
            environment.push((key.to_string(), value));
        }
    }
    if let Some(kv) = vm
        .pointer("/environment_variables/key_values")
        .and_then(Value::as_object)
    {
        for (k, v) in kv {
            environment.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
        }
    }
    Ok(WasmPlugin {
        name: str_field(config, "name").unwrap_or_default(),
        root_id: str_field(config, "root_id").unwrap_or_default(),
        vm_id: str_field(vm, "vm_id").unwrap_or_default(),
        runtime,
        code,
        vm_configuration: any_to_bytes(&format!("{vat}.configuration"), vm.get("configuration"))?,
        configuration: any_to_bytes(
            &format!("{at}.config.configuration"),
            config.get("configuration"),
        )?,
        failure_policy,
        environment,
        allow_precompiled: vm
            .get("allow_precompiled")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// Envoy's `anyToBytes`: a `StringValue` or `BytesValue` is unwrapped, a `Struct` becomes JSON.
fn any_to_bytes(at: &str, v: Option<&Value>) -> Result<Vec<u8>, BootstrapError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    match type_name(v).as_str() {
        types::STRING_VALUE => Ok(str_field(v, "value").unwrap_or_default().into_bytes()),
        types::BYTES_VALUE => base64_decode(&str_field(v, "value").unwrap_or_default())
            .ok_or_else(|| invalid(at, "BytesValue.value is not valid base64")),
        types::STRUCT => {
            Ok(serde_json::to_vec(v.get("value").unwrap_or(&Value::Null)).unwrap_or_default())
        }
        other => Err(invalid(
            at,
            format!("configuration of type {other:?} is not supported (use google.protobuf.StringValue, BytesValue or Struct)"),
        )),
    }
}

/// Standard base64 (protobuf JSON's encoding for bytes), padded or not, whitespace ignored.
pub(crate) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurpose};
    use base64::Engine;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        general_purpose::PAD
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let compact: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    LENIENT.decode(compact).ok()
}
