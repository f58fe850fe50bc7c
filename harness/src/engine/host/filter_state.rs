//! Envoy's filter state as `set_envoy_filter_state` fills it and the `filter_state` property
//! reads it: only keys with an object factory registered in Envoy 1.40 can be set, each
//! factory accepts the values it can parse, and reading one back gives what Envoy's object
//! serializes to (some objects are write-only).
//!
//! The table below was taken from real Envoy 1.40 (its startup list of
//! `filter_state.object` factories, and what each answered to a probe of values), not from
//! the factories' source.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use crate::engine::abi::Status;

/// How a factory parses a value, and what reading the object back gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Any bytes; read back as they are.
    Text,
    /// Any bytes; the object has no string form (`NotFound` when read).
    WriteOnly,
    /// A decimal unsigned integer; read back in decimal.
    Unsigned,
    /// `true` or `false`.
    Bool,
    /// Any bytes; read back `true` for `true`, else `false`.
    Flag,
    /// An IP address without a port; read back as an empty map (Envoy reflects it as one).
    IpReflected,
    /// An IP address without a port; read back as `IP:0`.
    Ip,
    /// `IP:port`; read back as an empty map.
    SocketReflected,
    /// A value whose syntax the harness does not know: refused (`BadArgument`) and said so.
    Unknown,
}

const FACTORIES: &[(&str, Kind)] = &[
    ("envoy.ai.llm_protocol.request", Kind::Unknown),
    ("envoy.ai.model.request", Kind::Text),
    ("envoy.bool", Kind::Bool),
    (
        "envoy.filters.listener.original_dst.local_ip",
        Kind::IpReflected,
    ),
    (
        "envoy.filters.listener.original_dst.remote_ip",
        Kind::IpReflected,
    ),
    ("envoy.hashable_string", Kind::Text),
    ("envoy.network.application_protocols", Kind::WriteOnly),
    ("envoy.network.ip", Kind::Ip),
    ("envoy.network.network_namespace", Kind::Text),
    (
        "envoy.network.transport_socket.http_11_proxy.info",
        Kind::Unknown,
    ),
    (
        "envoy.network.transport_socket.original_dst_address",
        Kind::SocketReflected,
    ),
    ("envoy.network.upstream_server_name", Kind::Text),
    ("envoy.network.upstream_subject_alt_names", Kind::Text),
    ("envoy.ratelimit.hits_addend", Kind::Unsigned),
    ("envoy.router.debug_config", Kind::WriteOnly),
    ("envoy.string", Kind::Text),
    (TCP_PROXY_CLUSTER, Kind::Text),
    ("envoy.tcp_proxy.disable_tunneling", Kind::Flag),
    (
        "envoy.tcp_proxy.per_connection_idle_timeout_ms",
        Kind::Unsigned,
    ),
    ("envoy.upstream.dynamic_host", Kind::Text),
    ("envoy.upstream.dynamic_port", Kind::Unsigned),
];

/// The key whose value steers `tcp_proxy` to a cluster.
pub const TCP_PROXY_CLUSTER: &str = "envoy.tcp_proxy.cluster";

/// The most bytes of keys and values one connection's or stream's filter state holds.
pub const MAX_FILTER_STATE_BYTES: usize = 16 << 20;

/// Why a value was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No factory for the key (Envoy: `NotFound`).
    UnknownKey,
    /// The factory did not parse the value (Envoy: `BadArgument`).
    BadValue,
    /// The harness does not know what this factory accepts (answered `BadArgument`).
    NotEmulated,
    /// The filter state would pass [`MAX_FILTER_STATE_BYTES`] (answered `BadArgument`).
    TooLarge,
}

impl Refusal {
    pub fn status(&self) -> Status {
        match self {
            Refusal::UnknownKey => Status::NotFound,
            _ => Status::BadArgument,
        }
    }
}

/// One connection's (or stream's) filter state objects, by key.
#[derive(Debug, Default)]
pub struct FilterState {
    objects: BTreeMap<String, (Kind, Vec<u8>)>,
    bytes: usize,
}

fn parse_unsigned(value: &[u8]) -> Option<Vec<u8>> {
    let n: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    Some(n.to_string().into_bytes())
}

fn parse_ip(value: &[u8]) -> Option<IpAddr> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

impl FilterState {
    /// Envoy's `setEnvoyFilterState` for `key` (after the stream check): the factory's
    /// parse, then a mutable object under `key`, replacing any before it.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), Refusal> {
        let kind = FACTORIES
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, kind)| *kind)
            .ok_or(Refusal::UnknownKey)?;
        let stored = match kind {
            Kind::Text if key == "envoy.ai.model.request" && value.is_empty() => None,
            Kind::Text | Kind::WriteOnly | Kind::Flag => Some(value.to_vec()),
            Kind::Unsigned => parse_unsigned(value),
            Kind::Bool => matches!(value, b"true" | b"false").then(|| value.to_vec()),
            Kind::IpReflected => parse_ip(value).map(|_| value.to_vec()),
            Kind::Ip => parse_ip(value).map(|ip| SocketAddr::new(ip, 0).to_string().into_bytes()),
            Kind::SocketReflected => std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.parse::<SocketAddr>().ok())
                .map(|_| value.to_vec()),
            Kind::Unknown => return Err(Refusal::NotEmulated),
        }
        .ok_or(Refusal::BadValue)?;
        let old = self
            .objects
            .get(key)
            .map_or(0, |(_, v)| key.len() + v.len());
        let bytes = self.bytes - old + key.len() + stored.len();
        if bytes > MAX_FILTER_STATE_BYTES {
            return Err(Refusal::TooLarge);
        }
        self.bytes = bytes;
        self.objects.insert(key.to_string(), (kind, stored));
        Ok(())
    }

    /// The property `filter_state.<key>` as Envoy serializes it; `None` (NotFound) for a key
    /// never set or an object without a string form.
    pub fn read(&self, key: &str) -> Option<Vec<u8>> {
        let (kind, value) = self.objects.get(key)?;
        match kind {
            Kind::WriteOnly | Kind::Unknown => None,
            Kind::Flag => Some(if value == b"true" {
                b"true".to_vec()
            } else {
                b"false".to_vec()
            }),
            // An empty map in the pairs format: a zero count.
            Kind::IpReflected | Kind::SocketReflected => Some(vec![0; 4]),
            Kind::Text | Kind::Unsigned | Kind::Bool | Kind::Ip => Some(value.clone()),
        }
    }

    /// The raw value set under `key`, for the host's own use (the `tcp_proxy` cluster).
    pub fn value(&self, key: &str) -> Option<&[u8]> {
        self.objects.get(key).map(|(_, v)| v.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_taken_or_refused_as_envoy_1_40_does() {
        let mut fs = FilterState::default();
        assert_eq!(fs.set("no.such.key", b"1"), Err(Refusal::UnknownKey));
        assert_eq!(fs.set(TCP_PROXY_CLUSTER, b"alpha"), Ok(()));
        assert_eq!(fs.read(TCP_PROXY_CLUSTER), Some(b"alpha".to_vec()));
        assert_eq!(
            fs.set("envoy.ratelimit.hits_addend", b"-1"),
            Err(Refusal::BadValue)
        );
        assert_eq!(fs.set("envoy.ratelimit.hits_addend", b"10"), Ok(()));
        assert_eq!(
            fs.set("envoy.network.ip", b"127.0.0.1:80"),
            Err(Refusal::BadValue)
        );
        assert_eq!(fs.set("envoy.network.ip", b"127.0.0.1"), Ok(()));
        assert_eq!(fs.read("envoy.network.ip"), Some(b"127.0.0.1:0".to_vec()));
        assert_eq!(fs.set("envoy.network.application_protocols", b"h2"), Ok(()));
        assert_eq!(fs.read("envoy.network.application_protocols"), None);
        assert_eq!(fs.set("envoy.tcp_proxy.disable_tunneling", b"yes"), Ok(()));
        assert_eq!(
            fs.read("envoy.tcp_proxy.disable_tunneling"),
            Some(b"false".to_vec())
        );
        assert_eq!(
            fs.set(
                "envoy.network.transport_socket.original_dst_address",
                b"bad"
            ),
            Err(Refusal::BadValue)
        );
        assert_eq!(
            fs.set(
                "envoy.network.transport_socket.original_dst_address",
                b"[::1]:80"
            ),
            Ok(())
        );
        assert_eq!(
            fs.read("envoy.network.transport_socket.original_dst_address"),
            Some(vec![0, 0, 0, 0])
        );
        assert_eq!(
            fs.set("envoy.ai.llm_protocol.request", b"x"),
            Err(Refusal::NotEmulated)
        );
    }
}
