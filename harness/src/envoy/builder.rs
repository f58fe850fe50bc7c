//! A host for one module and its plugin configuration, without writing a bootstrap: what a
//! filter author's `tests/` wants. The builder writes the Envoy bootstrap it stands for (one
//! listener with the plugin, then the router or `tcp_proxy`, to a `backend` cluster), so
//! [`ProxyBuilder::bootstrap_yaml`] can also be given to real Envoy and every rule of the
//! bootstrap path (VM sharing, canary, failure policy) applies unchanged.
//!
//! ```no_run
//! use wasm_harness::{Proxy, Request, UpstreamReply};
//! let mut proxy = Proxy::for_module("target/wasm32-wasip1/release/my_filter.wasm")
//!     .configuration(r#"{"deny": ["/admin"]}"#)
//!     .build()?;
//! let exchange = proxy.round_trip(&Request::get("/admin"), UpstreamReply::new(200))?;
//! assert_eq!(exchange.response_status(), Some(403));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use wasm_common::envoy_types::url;

use crate::envoy::bootstrap::{Bootstrap, FailurePolicy};
use crate::envoy::proxy::{Proxy, ProxyOptions, StartError};

/// The listener address the built bootstrap names (real Envoy runs rewrite it).
const LISTENER_PORT: u16 = 10000;
const BACKEND: (&str, u16) = ("127.0.0.1", 8080);

/// Builds a [`Proxy`] for one module; see the module docs.
#[derive(Debug, Clone)]
pub struct ProxyBuilder {
    module: PathBuf,
    name: String,
    root_id: String,
    vm_id: String,
    configuration: Option<String>,
    vm_configuration: Option<String>,
    runtime: String,
    failure_policy: FailurePolicy,
    allow_precompiled: bool,
    environment: Vec<(String, String)>,
    tcp: bool,
    clusters: Vec<(String, String, u16)>,
    workers: usize,
    log_level: crate::engine::abi::LogLevel,
}

impl Proxy {
    /// A host running the module at `path` as the only Wasm filter of an HTTP listener (or a
    /// TCP one, see [`ProxyBuilder::tcp`]); set its configuration, then [`ProxyBuilder::build`].
    pub fn for_module(path: impl AsRef<Path>) -> ProxyBuilder {
        ProxyBuilder {
            module: path.as_ref().to_path_buf(),
            name: "plugin".into(),
            root_id: String::new(),
            vm_id: String::new(),
            configuration: None,
            vm_configuration: None,
            runtime: "envoy.wasm.runtime.v8".into(),
            failure_policy: FailurePolicy::FailClosed,
            allow_precompiled: false,
            environment: Vec::new(),
            tcp: false,
            clusters: Vec::new(),
            workers: ProxyOptions::default().workers,
            log_level: ProxyOptions::default().log_level,
        }
    }
}

impl ProxyBuilder {
    /// The plugin configuration (`config.configuration`, a `StringValue`): what
    /// `proxy_on_configure` reads.
    pub fn configuration(mut self, configuration: impl Into<String>) -> Self {
        self.configuration = Some(configuration.into());
        self
    }

    /// The VM configuration (`vm_config.configuration`): what `proxy_on_vm_start` reads.
    pub fn vm_configuration(mut self, configuration: impl Into<String>) -> Self {
        self.vm_configuration = Some(configuration.into());
        self
    }

    /// The plugin's `name` (default `plugin`; the `plugin_name` property).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The plugin's `root_id` (default empty): SDKs pick the root context by it.
    pub fn root_id(mut self, root_id: impl Into<String>) -> Self {
        self.root_id = root_id.into();
        self
    }

    /// `vm_config.vm_id` (default empty): shared data and queues are per vm_id.
    pub fn vm_id(mut self, vm_id: impl Into<String>) -> Self {
        self.vm_id = vm_id.into();
        self
    }

    /// `vm_config.runtime` (default `envoy.wasm.runtime.v8`, what Envoy's release builds have).
    pub fn runtime(mut self, runtime: impl Into<String>) -> Self {
        self.runtime = runtime.into();
        self
    }

    /// What happens to traffic once the VM has failed (default fail-closed, Envoy's).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// `vm_config.allow_precompiled` (see [`crate::engine::precompiled_section`]).
    pub fn allow_precompiled(mut self, allow: bool) -> Self {
        self.allow_precompiled = allow;
        self
    }

    /// A `vm_config.environment_variables.key_values` entry the guest sees through WASI.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.environment.push((key.into(), value.into()));
        self
    }

    /// Run the module as a network filter (`envoy.filters.network.wasm`) in front of
    /// `tcp_proxy`, for [`Proxy::connect`], instead of as an HTTP filter.
    pub fn tcp(mut self) -> Self {
        self.tcp = true;
        self
    }

    /// Another cluster, for the guest's `proxy_http_call`s: answered from
    /// [`Proxy::callouts`]' canned replies, else by a real HTTP server at `address:port` if
    /// that is a loopback address.
    pub fn cluster(
        mut self,
        name: impl Into<String>,
        address: impl Into<String>,
        port: u16,
    ) -> Self {
        self.clusters.push((name.into(), address.into(), port));
        self
    }

    /// Worker threads (Envoy's `--concurrency`, default 2); each has its own VM.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Envoy's log level (`-l`, default `info`): the guest's lines below it are not kept,
    /// and `proxy_get_log_level` answers it.
    pub fn log_level(mut self, level: crate::engine::abi::LogLevel) -> Self {
        self.log_level = level;
        self
    }

    /// The Envoy bootstrap this builder stands for, as a document.
    pub fn bootstrap(&self) -> Value {
        let mut vm_config = json!({
            "vm_id": self.vm_id,
            "runtime": self.runtime,
            "code": {"local": {"filename": self.module.display().to_string()}},
        });
        if let Some(c) = &self.vm_configuration {
            vm_config["configuration"] = string_value(c);
        }
        if self.allow_precompiled {
            vm_config["allow_precompiled"] = json!(true);
        }
        if !self.environment.is_empty() {
            let kv: serde_json::Map<String, Value> = self
                .environment
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            vm_config["environment_variables"] = json!({ "key_values": kv });
        }
        let mut plugin = json!({
            "name": self.name,
            "root_id": self.root_id,
            "vm_config": vm_config,
            "failure_policy": match self.failure_policy {
                FailurePolicy::FailClosed => "FAIL_CLOSED",
                FailurePolicy::FailOpen => "FAIL_OPEN",
                FailurePolicy::FailReload => "FAIL_RELOAD",
            },
        });
        if let Some(c) = &self.configuration {
            plugin["configuration"] = string_value(c);
        }
        let filters = if self.tcp {
            json!([
                {"name": "envoy.filters.network.wasm", "typed_config": {
                    "@type": url::NETWORK_WASM,
                    "config": plugin}},
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": url::TCP_PROXY,
                    "stat_prefix": "tcp", "cluster": "backend"}},
            ])
        } else {
            json!([{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": url::HCM,
            "stat_prefix": "ingress_http",
            "route_config": {"name": "local_route", "virtual_hosts": [{
                "name": "all", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]}]},
            "http_filters": [
                {"name": "envoy.filters.http.wasm", "typed_config": {
                    "@type": url::HTTP_WASM,
                    "config": plugin}},
                {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": url::ROUTER}},
            ]}}])
        };
        let clusters: Vec<Value> = std::iter::once(("backend", BACKEND.0, BACKEND.1))
            .chain(
                self.clusters
                    .iter()
                    .map(|(n, a, p)| (n.as_str(), a.as_str(), *p)),
            )
            .map(|(name, address, port)| {
                json!({
                    "name": name, "connect_timeout": "1s", "type": "STATIC",
                    "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
                        "endpoint": {"address": {"socket_address": {"address": address, "port_value": port}}}}]}]},
                })
            })
            .collect();
        json!({"static_resources": {
            "listeners": [{
                "name": "main",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": LISTENER_PORT}},
                "filter_chains": [{"filters": filters}],
            }],
            "clusters": clusters,
        }})
    }

    /// [`ProxyBuilder::bootstrap`] as YAML, e.g. to write it out and run real Envoy on it.
    pub fn bootstrap_yaml(&self) -> String {
        serde_norway::to_string(&self.bootstrap()).unwrap_or_default()
    }

    /// Starts the host: the canary VM (a `false` from `proxy_on_configure` is
    /// [`StartError::Rejected`]), then each worker's.
    pub fn build(&self) -> Result<Proxy, StartError> {
        let bootstrap =
            Bootstrap::from_value(Path::new("<built by Proxy::for_module>"), &self.bootstrap())?;
        Proxy::new(
            bootstrap,
            &ProxyOptions {
                workers: self.workers,
                log_level: self.log_level,
                ..ProxyOptions::default()
            },
        )
    }
}

fn string_value(s: &str) -> Value {
    json!({"@type": url::STRING_VALUE, "value": s})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_is_one_the_parser_reads_back() {
        let b = Proxy::for_module("m.wasm")
            .configuration("{}")
            .root_id("r")
            .vm_id("v")
            .cluster("auth", "127.0.0.1", 9000)
            .env("K", "V")
            .failure_policy(FailurePolicy::FailOpen);
        let parsed = Bootstrap::from_value(Path::new("x"), &b.bootstrap()).unwrap();
        let p = &parsed.listeners[0].plugins()[0];
        assert_eq!((p.root_id.as_str(), p.vm_id.as_str()), ("r", "v"));
        assert_eq!(p.configuration, b"{}");
        assert_eq!(p.failure_policy, FailurePolicy::FailOpen);
        assert_eq!(p.environment, vec![("K".to_string(), "V".to_string())]);
        assert_eq!(
            parsed.cluster("auth").unwrap().endpoints,
            vec![("127.0.0.1".to_string(), 9000)]
        );
        let tcp = Bootstrap::from_value(Path::new("x"), &b.tcp().bootstrap()).unwrap();
        assert_eq!(tcp.listeners[0].tcp().map(|t| t.filters.len()), Some(1));
    }
}
