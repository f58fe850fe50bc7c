//! The parts of an Envoy bootstrap the harness emulates, as the parser
//! ([`super::parse`]) leaves them.

use std::path::PathBuf;

use serde_json::Value;

pub use crate::engine::plugin::{FailurePolicy, WasmPlugin};

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("cannot read bootstrap {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bootstrap {path} is not valid YAML/JSON: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("bootstrap: {at}: {message}")]
    Invalid { at: String, message: String },
    #[error("bootstrap: {at}: unsupported filter {name:?} ({type_url}): the harness runs only Wasm filters and the router")]
    UnsupportedFilter {
        at: String,
        name: String,
        type_url: String,
    },
}

/// A [`BootstrapError::Invalid`] at `at`.
pub(super) fn invalid(at: &str, message: impl Into<String>) -> BootstrapError {
    BootstrapError::Invalid {
        at: at.to_string(),
        message: message.into(),
    }
}

#[derive(Debug, Clone)]
pub struct Bootstrap {
    pub path: PathBuf,
    pub listeners: Vec<Listener>,
    pub clusters: Vec<Cluster>,
    /// `node`, kept as JSON for the `xds.node` / node metadata properties.
    pub node: Value,
    /// `bootstrap_extensions` of type `envoy.bootstrap.wasm`: Wasm services.
    pub services: Vec<WasmService>,
}

/// A Wasm service (`envoy.extensions.wasm.v3.WasmService`): a plugin with no stream, only a
/// root context; `singleton` runs one on the main thread, otherwise one on each worker.
#[derive(Debug, Clone)]
pub struct WasmService {
    pub plugin: WasmPlugin,
    pub singleton: bool,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub name: String,
    pub address: String,
    pub port: u16,
    /// What its one filter chain ends with, and the Wasm filters in front of that.
    pub chain: FilterChain,
}

/// A listener's filter chain, by its terminal filter.
#[derive(Debug, Clone)]
pub enum FilterChain {
    /// `envoy.filters.network.http_connection_manager`: HTTP Wasm filters, then the router.
    Http(HttpConnectionManager),
    /// `envoy.filters.network.wasm` filters, then `envoy.filters.network.tcp_proxy`.
    Tcp(TcpChain),
}

impl Listener {
    /// The listener's Wasm plugins in chain order: the network filters of a TCP listener,
    /// else the HTTP filters.
    pub fn plugins(&self) -> &[WasmPlugin] {
        match &self.chain {
            FilterChain::Http(hcm) => &hcm.filters,
            FilterChain::Tcp(tcp) => &tcp.filters,
        }
    }

    /// The HTTP connection manager, unless this is a TCP listener.
    pub fn http(&self) -> Option<&HttpConnectionManager> {
        match &self.chain {
            FilterChain::Http(hcm) => Some(hcm),
            FilterChain::Tcp(_) => None,
        }
    }

    /// The network filters and `tcp_proxy`, if this is a TCP listener.
    pub fn tcp(&self) -> Option<&TcpChain> {
        match &self.chain {
            FilterChain::Http(_) => None,
            FilterChain::Tcp(tcp) => Some(tcp),
        }
    }
}

/// A TCP listener's chain: network Wasm filters in order, then `tcp_proxy`.
#[derive(Debug, Clone)]
pub struct TcpChain {
    pub filters: Vec<WasmPlugin>,
    pub proxy: TcpProxy,
    /// A deny-all network RBAC filter (a fail-closed plugin's fallback) after this many of
    /// `filters`: it closes the connection when the client's first bytes reach it.
    pub deny_at: Option<usize>,
}

/// `envoy.filters.network.tcp_proxy`: every connection goes to one cluster.
#[derive(Debug, Clone)]
pub struct TcpProxy {
    pub stat_prefix: String,
    pub cluster: String,
}

#[derive(Debug, Clone)]
pub struct HttpConnectionManager {
    pub stat_prefix: String,
    /// Wasm filters in chain order; the router is always last.
    pub filters: Vec<WasmPlugin>,
    pub routes: RouteConfig,
    /// A deny-all RBAC filter (a fail-closed plugin's fallback) after this many of `filters`:
    /// requests get its 403 there, and the filters after it never see them.
    pub deny_at: Option<usize>,
    /// `http_protocol_options.enable_trailers`: whether Envoy's HTTP/1 codec hands the
    /// filters a chunked request's trailers, and sends a chunked response's to the client.
    pub http1_trailers: bool,
}

/// The RBAC filter that stands in for a Wasm filter whose module could not be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RbacFallback {
    /// No rules: every request passes (the plugin fails open).
    AllowAll,
    /// Empty rules: every request is denied (the plugin fails closed).
    DenyAll,
}

#[derive(Debug, Clone, Default)]
pub struct RouteConfig {
    pub virtual_hosts: Vec<VirtualHost>,
}

#[derive(Debug, Clone)]
pub struct VirtualHost {
    pub name: String,
    pub domains: Vec<String>,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub matcher: RouteMatch,
    pub action: RouteAction,
    /// Its `name` and `metadata`, for the `xds.route_name` / `xds.route_metadata` properties.
    pub xds: XdsInfo,
}

/// A resource's `name` and `metadata` (`envoy.config.core.v3.Metadata` as JSON, `Null` when
/// absent), which the `xds.*` properties read.
#[derive(Debug, Clone, Default)]
pub struct XdsInfo {
    pub name: String,
    pub metadata: Value,
}

#[derive(Debug, Clone)]
pub enum RouteMatch {
    Prefix(String),
    Path(String),
}

#[derive(Debug, Clone)]
pub enum RouteAction {
    Cluster(String),
    Direct { status: u16, body: Vec<u8> },
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    pub endpoints: Vec<(String, u16)>,
    /// `metadata`, for the `xds.cluster_metadata` property (`Null` when absent).
    pub metadata: Value,
    /// What Envoy speaks to the endpoints, from the cluster's protocol options.
    pub protocol: super::UpstreamProtocol,
}

impl Bootstrap {
    pub fn listener(&self, name: Option<&str>) -> Option<&Listener> {
        match name {
            None => self.listeners.first(),
            Some(n) => self.listeners.iter().find(|l| l.name == n),
        }
    }

    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.name == name)
    }
}
