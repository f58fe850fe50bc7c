//! Which HTTP version Envoy speaks to a cluster's upstream, and whether its HTTP/1 codec passes
//! trailers, read from the cluster's protocol options: `typed_extension_protocol_options`
//! (`envoy.extensions.upstreams.http.v3.HttpProtocolOptions`) or the cluster's own deprecated
//! `http2_protocol_options` / `http_protocol_options`.

use serde_json::Value;

/// The `typed_extension_protocol_options` key Envoy reads upstream HTTP options from.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// How Envoy talks to a cluster's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (Envoy's default). Envoy's HTTP/1 codec neither sends request trailers nor
    /// delivers an upstream's response trailers unless `enable_trailers` is set.
    #[default]
    Http1,
    /// HTTP/1.1 with `http_protocol_options.enable_trailers: true`.
    Http1WithTrailers,
    /// HTTP/2 (`http2_protocol_options`): trailers pass both ways.
    Http2,
}

impl UpstreamProtocol {
    /// Whether trailers cross the connection to the upstream, either way.
    pub fn passes_trailers(self) -> bool {
        !matches!(self, Self::Http1)
    }

    /// The protocol `cluster` (a bootstrap cluster as JSON) configures. With
    /// `use_downstream_protocol_config` or `auto_config` the harness's client, which is
    /// HTTP/1.1 as the real-Envoy driver's is, makes it HTTP/1.1, with that config's
    /// HTTP/1 options.
    pub fn of_cluster(cluster: &Value) -> Self {
        if let Some(options) = cluster
            .get("typed_extension_protocol_options")
            .and_then(|o| o.get(HTTP_PROTOCOL_OPTIONS))
        {
            if let Some(explicit) = options.get("explicit_http_config") {
                if explicit.get("http2_protocol_options").is_some() {
                    return Self::Http2;
                }
                return Self::http1(explicit.get("http_protocol_options"));
            }
            for chosen in ["use_downstream_protocol_config", "auto_config"] {
                if let Some(config) = options.get(chosen) {
                    return Self::http1(config.get("http_protocol_options"));
                }
            }
        }
        if cluster.get("http2_protocol_options").is_some() {
            return Self::Http2;
        }
        Self::http1(cluster.get("http_protocol_options"))
    }

    fn http1(options: Option<&Value>) -> Self {
        if enables_trailers(options) {
            Self::Http1WithTrailers
        } else {
            Self::Http1
        }
    }
}

/// Whether HTTP/1 protocol options (`http_protocol_options`, of a cluster or a connection
/// manager) set `enable_trailers`: without it Envoy's HTTP/1 codec drops trailers it reads
/// and sends none.
pub fn enables_trailers(options: Option<&Value>) -> bool {
    options
        .and_then(|o| o.get("enable_trailers"))
        .is_some_and(|t| t.as_bool() == Some(true) || t.as_str() == Some("true"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_typed_options_and_the_deprecated_fields() {
        let typed = |config: Value| {
            UpstreamProtocol::of_cluster(&json!({"typed_extension_protocol_options": {
                HTTP_PROTOCOL_OPTIONS: config
            }}))
        };
        assert_eq!(
            UpstreamProtocol::of_cluster(&json!({})),
            UpstreamProtocol::Http1
        );
        assert_eq!(
            typed(json!({"explicit_http_config": {"http2_protocol_options": {}}})),
            UpstreamProtocol::Http2
        );
        assert_eq!(
            typed(
                json!({"explicit_http_config": {"http_protocol_options": {"enable_trailers": true}}})
            ),
            UpstreamProtocol::Http1WithTrailers
        );
        assert_eq!(
            typed(json!({"use_downstream_protocol_config": {"http2_protocol_options": {}}})),
            UpstreamProtocol::Http1
        );
        assert_eq!(
            UpstreamProtocol::of_cluster(&json!({"http2_protocol_options": {}})),
            UpstreamProtocol::Http2
        );
        assert_eq!(
            UpstreamProtocol::of_cluster(
                &json!({"http_protocol_options": {"enable_trailers": true}})
            ),
            UpstreamProtocol::Http1WithTrailers
        );
    }
}
