//! The `xds.*` properties of an HTTP stream: the route, virtual host and cluster the request
//! takes (chosen from its current headers, as Envoy chose them when the headers arrived), read
//! from the configuration's [`RouteTable`] as Envoy 1.40 serializes them (checked against it,
//! `harness/tests/all/metadata.rs`). `xds.node.*` is answered by the caller.
//!
//! Metadata is readable below `filter_metadata` (`xds.route_metadata.filter_metadata.NS.KEY`,
//! Struct values as for the node's metadata); the whole `Metadata` message, its
//! `typed_filter_metadata`, and the `xds` attributes the harness does not model answer
//! `NotFound` with a log line naming them.

use serde_json::Value;

use super::{below, json_value};
use crate::engine::abi::{LogLevel, Status};
use crate::engine::header_map as headers;
use crate::engine::host::{logging, HostState, HttpStreamState};

/// `xds` attributes Envoy 1.40 has that the harness does not answer.
const NOT_EMULATED: &[&str] = &[
    "virtual_host_metadata",
    "listener_metadata",
    "listener_direction",
    "upstream_host_metadata",
    "filter_chain_name",
];

/// What the configuration says of the route a request takes, which the `xds.*` properties
/// answer from. The emulated Envoy's bootstrap implements it with Envoy's route matching; the
/// engine does no routing of its own.
pub trait RouteTable: std::fmt::Debug + Send + Sync {
    /// The route a request for `authority` and `path` takes on the listener bound to
    /// `destination` (address, port), if one matches.
    fn xds_route(
        &self,
        destination: &(String, u16),
        authority: &str,
        path: &str,
    ) -> Option<XdsRoute<'_>>;
}

/// A request's route as the `xds.*` properties name it.
#[derive(Debug)]
pub struct XdsRoute<'a> {
    pub virtual_host: &'a str,
    pub name: &'a str,
    /// `envoy.config.core.v3.Metadata` as JSON (`Null` when absent).
    pub metadata: &'a Value,
    /// The cluster it sends to, with its metadata; `None` for a direct response or a cluster
    /// the configuration does not have.
    pub cluster: Option<(&'a str, &'a Value)>,
}

/// The stream's route, from its request headers (as Envoy chose it when they arrived).
fn route<'t>(table: &'t dyn RouteTable, s: &HttpStreamState) -> Option<XdsRoute<'t>> {
    let req = s
        .request_headers
        .as_ref()
        .or(s.request_snapshot.as_deref())?;
    let text = |k: &str| {
        headers::get(req, k)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    table.xds_route(
        &s.connection.destination,
        &text(":authority"),
        &text(":path"),
    )
}

/// `Metadata` below its message: `filter_metadata` and the keys under it.
fn metadata(
    state: &HostState,
    what: &str,
    metadata: &Value,
    rest: &[&str],
) -> Result<Vec<u8>, Status> {
    match rest {
        ["filter_metadata", keys @ ..] => {
            let all = metadata
                .get("filter_metadata")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}));
            json_value(below(&all, keys)?)
        }
        _ => {
            let part = if rest.is_empty() {
                "the whole Metadata message".to_string()
            } else {
                format!("{:?}", rest.join("."))
            };
            not_emulated(state, &format!("xds.{what} ({part})"));
            Err(Status::NotFound)
        }
    }
}

pub(super) fn not_emulated(state: &HostState, property: &str) {
    logging::record(
        state,
        LogLevel::Warn,
        format!("wasm-harness: property {property} exists in Envoy but is not emulated by the harness; answered NotFound"),
    );
}

/// `xds.<rest>` for the stream `s`.
pub(super) fn lookup(
    state: &HostState,
    s: &HttpStreamState,
    rest: &[&str],
) -> Result<Vec<u8>, Status> {
    let table = state.shared.routes.get().ok_or(Status::NotFound)?.as_ref();
    let found = |v: Option<Vec<u8>>| v.ok_or(Status::NotFound);
    match rest {
        ["route_name"] => found(route(table, s).map(|r| r.name.as_bytes().to_vec())),
        ["route_metadata", more @ ..] => {
            let r = route(table, s).ok_or(Status::NotFound)?;
            metadata(state, "route_metadata", r.metadata, more)
        }
        ["virtual_host_name"] => found(route(table, s).map(|r| r.virtual_host.as_bytes().to_vec())),
        ["cluster_name"] => found(
            route(table, s)
                .and_then(|r| r.cluster)
                .map(|(name, _)| name.as_bytes().to_vec()),
        ),
        ["cluster_metadata", more @ ..] => {
            let (_, m) = route(table, s)
                .and_then(|r| r.cluster)
                .ok_or(Status::NotFound)?;
            metadata(state, "cluster_metadata", m, more)
        }
        [first, ..] if NOT_EMULATED.contains(first) => {
            not_emulated(state, &format!("xds.{first}"));
            Err(Status::NotFound)
        }
        _ => Err(Status::NotFound),
    }
}
