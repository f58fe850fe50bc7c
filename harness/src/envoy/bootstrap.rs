//! Reads a real Envoy bootstrap (YAML or JSON) into the parts the harness emulates.
//!
//! Only what the harness can honour is accepted. Anything else that would change what a request
//! sees (another HTTP filter, RDS, regex routes) is an error naming the field, never a silent
//! skip: a harness that quietly ignores config would pass tests Envoy fails.

mod ecds;
mod fields;
mod model;
mod parse;
mod protocol;
mod rbac;
mod routes;
mod shape;
mod typed_config;

pub use ecds::EcdsFiles;
pub use model::*;
pub(crate) use parse::base64_decode;
pub use protocol::UpstreamProtocol;
pub(crate) use shape::{normalize, TypedStructs};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::path::{Path, PathBuf};

    const YAML: &str = r#"
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: 10000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {path: "/local"}
                direct_response: {status: 200, body: {inline_string: "hi"}}
              - match: {prefix: "/"}
                route: {cluster: backend}
            - name: api
              domains: ["api.example.com", "*.example.com"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: api}
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: demo
                root_id: demo_root
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{"role":"x"}'
                vm_config:
                  vm_id: vm1
                  runtime: envoy.wasm.runtime.v8
                  code: {local: {filename: target/filter.wasm}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8080}}}
"#;

    fn parse(yaml: &str) -> Result<Bootstrap, BootstrapError> {
        let doc: Value = serde_norway::from_str(yaml).unwrap();
        Bootstrap::from_value(Path::new("test.yaml"), &doc)
    }

    #[test]
    fn reads_listener_plugin_routes_and_clusters() {
        let b = parse(YAML).unwrap();
        let l = b.listener(None).unwrap();
        assert_eq!((l.name.as_str(), l.port), ("main", 10000));
        let p = &l.plugins()[0];
        assert_eq!(
            (p.name.as_str(), p.root_id.as_str(), p.vm_id.as_str()),
            ("demo", "demo_root", "vm1")
        );
        assert_eq!(p.configuration, br#"{"role":"x"}"#);
        assert_eq!(p.code, PathBuf::from("target/filter.wasm"));
        assert_eq!(p.failure_policy, FailurePolicy::FailClosed);
        assert_eq!(b.cluster("backend").unwrap().endpoints[0].1, 8080);
    }

    #[test]
    fn unsupported_filter_is_an_error_naming_it() {
        let yaml = YAML.replace(
            "envoy.extensions.filters.http.router.v3.Router",
            "envoy.extensions.filters.http.lua.v3.Lua",
        );
        let err = parse(&yaml).unwrap_err().to_string();
        assert!(err.contains("unsupported filter"), "{err}");
        assert!(err.contains("http_filters[1]"), "{err}");
    }

    #[test]
    fn fail_open_and_failure_policy_are_exclusive() {
        let yaml = YAML.replace(
            "name: demo\n",
            "name: demo\n                fail_open: true\n                failure_policy: FAIL_RELOAD\n",
        );
        let err = parse(&yaml).unwrap_err().to_string();
        assert!(err.contains("only one of fail_open"), "{err}");
    }

    #[test]
    fn base64_decodes_standard_alphabet() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert!(base64_decode("!!").is_none());
    }
}
