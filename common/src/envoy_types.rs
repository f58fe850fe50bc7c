//! The Envoy type URLs the fetcher and the harness read and write, each named once: as a type
//! name (what follows the last `/`, by which Envoy resolves an `Any`) in [`name`], and as the
//! full URL Envoy's own configuration writes (`type.googleapis.com/…`) in [`url`]. The names
//! are those of Envoy's API protos (`api/envoy/…` in envoyproxy/envoy) and of the `xds` and
//! `udpa` repositories for the `TypedStruct` wrapper.

macro_rules! types {
    ($($(#[$doc:meta])* $id:ident = $name:literal;)*) => {
        /// Type names: a type URL's part after its last `/`.
        pub mod name {
            $($(#[$doc])* pub const $id: &str = $name;)*
        }
        /// Full type URLs, as `@type` and `type_urls` write them.
        pub mod url {
            $($(#[$doc])* pub const $id: &str = concat!("type.googleapis.com/", $name);)*
        }
    };
}

types! {
    /// The HTTP Wasm filter (`envoy.filters.http.wasm`).
    HTTP_WASM = "envoy.extensions.filters.http.wasm.v3.Wasm";
    /// The network Wasm filter (`envoy.filters.network.wasm`).
    NETWORK_WASM = "envoy.extensions.filters.network.wasm.v3.Wasm";
    /// A Wasm service (`bootstrap_extensions`): a VM with no filter.
    WASM_SERVICE = "envoy.extensions.wasm.v3.WasmService";
    /// What Istio puts in place of an HTTP Wasm filter that cannot be fetched.
    HTTP_RBAC = "envoy.extensions.filters.http.rbac.v3.RBAC";
    /// What Istio puts in place of a network Wasm filter that cannot be fetched.
    NETWORK_RBAC = "envoy.extensions.filters.network.rbac.v3.RBAC";
    /// The HTTP dynamic-module filter (`envoy.filters.http.dynamic_modules`).
    HTTP_DYNAMIC_MODULE = "envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
    /// The network dynamic-module filter (`envoy.filters.network.dynamic_modules`).
    NETWORK_DYNAMIC_MODULE = "envoy.extensions.filters.network.dynamic_modules.v3.DynamicModuleNetworkFilter";
    HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
    TCP_PROXY = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
    ROUTER = "envoy.extensions.filters.http.router.v3.Router";
    /// An ECDS resource: a name and its `typed_config`.
    TYPED_EXTENSION_CONFIG = "envoy.config.core.v3.TypedExtensionConfig";
    STRING_VALUE = "google.protobuf.StringValue";
    BYTES_VALUE = "google.protobuf.BytesValue";
    STRUCT = "google.protobuf.Struct";
    /// The wrapper holding a message as a `Struct` (`value`) beside its type URL (`type_url`),
    /// as the proxy-wasm SDK examples write filters; Envoy unwraps both names alike.
    UDPA_TYPED_STRUCT = "udpa.type.v1.TypedStruct";
    XDS_TYPED_STRUCT = "xds.type.v3.TypedStruct";
}

/// Both names of the `TypedStruct` wrapper.
pub const TYPED_STRUCTS: [&str; 2] = [name::UDPA_TYPED_STRUCT, name::XDS_TYPED_STRUCT];

/// A type URL's type name: Envoy resolves `type.googleapis.com/x.y.Z`, `example.com/p/x.y.Z`
/// and (in a `TypedStruct`'s `type_url`) a bare `x.y.Z` alike, by what follows the last `/`.
pub fn name_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or_default()
}

/// Whether `url` names a `TypedStruct`, whatever its prefix.
pub fn is_typed_struct(url: &str) -> bool {
    TYPED_STRUCTS.contains(&name_of(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_its_name_under_envoys_prefix_and_resolves_by_its_name() {
        assert_eq!(
            url::HTTP_WASM,
            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
        );
        assert_eq!(name_of(url::HTTP_WASM), name::HTTP_WASM);
        assert_eq!(
            name_of("example.com/p/xds.type.v3.TypedStruct"),
            name::XDS_TYPED_STRUCT
        );
        assert_eq!(name_of("udpa.type.v1.TypedStruct"), name::UDPA_TYPED_STRUCT);
        assert!(is_typed_struct("x.io/udpa.type.v1.TypedStruct"));
        assert!(!is_typed_struct(url::STRUCT));
    }
}
