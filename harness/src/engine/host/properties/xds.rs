//! The `xds.*` properties of an HTTP stream: the route, virtual host and cluster the request
//! takes (chosen from its current headers, as Envoy chose them when the headers arrived), read
//! from the bootstrap as Envoy 1.40 serializes them (checked against it,
//! `harness/tests/all/metadata.rs`). `xds.node.*` is answered by the caller.
//!
//! Metadata is readable below `filter_metadata` (`xds.route_metadata.filter_metadata.NS.KEY`,
//! Struct values as for the node's metadata); the whole `Metadata` message, its
//! `typed_filter_metadata`, and the `xds` attributes the harness does not model answer
//! `NotFound` with a log line naming them.

use serde_json::Value;

use super::{below, json_value};
use crate::engine::abi::{LogLevel, Status};
use crate::engine::host::{logging, HostState, HttpStreamState};
use crate::envoy::bootstrap::{Bootstrap, Listener, Route, RouteAction};
use crate::envoy::http::headers;

/// `xds` attributes Envoy 1.40 has that the harness does not answer.
const NOT_EMULATED: &[&str] = &[
    "virtual_host_metadata",
    "listener_metadata",
    "listener_direction",
    "upstream_host_metadata",
    "filter_chain_name",
];

/// The listener a stream arrived on: the one bound to its destination.
fn listener<'b>(bootstrap: &'b Bootstrap, s: &HttpStreamState) -> Option<&'b Listener> {
    let (address, port) = s.connection.destination.as_ref();
    bootstrap
        .listeners
        .iter()
        .find(|l| l.port == *port && l.address == *address)
}

/// The stream's virtual host name and route, from its request headers.
fn route<'b>(bootstrap: &'b Bootstrap, s: &HttpStreamState) -> Option<(&'b str, &'b Route)> {
    let routes = &listener(bootstrap, s)?.http()?.routes;
    let req = s
        .request_headers
        .as_ref()
        .or(s.request_snapshot.as_deref())?;
    let text = |k: &str| {
        headers::get(req, k)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let (authority, path) = (text(":authority"), text(":path"));
    let vh = routes.virtual_host(&authority)?;
    let route = routes.route(&authority, &path)?;
    Some((vh.name.as_str(), route))
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
    let bootstrap = state.shared.bootstrap.get().ok_or(Status::NotFound)?;
    let cluster = || {
        let (_, r) = route(bootstrap, s)?;
        match &r.action {
            RouteAction::Cluster(name) => bootstrap.cluster(name),
            RouteAction::Direct { .. } => None,
        }
    };
    let found = |v: Option<Vec<u8>>| v.ok_or(Status::NotFound);
    match rest {
        ["route_name"] => found(route(bootstrap, s).map(|(_, r)| r.xds.name.clone().into_bytes())),
        ["route_metadata", more @ ..] => {
            let (_, r) = route(bootstrap, s).ok_or(Status::NotFound)?;
            metadata(state, "route_metadata", &r.xds.metadata, more)
        }
        ["virtual_host_name"] => found(route(bootstrap, s).map(|(vh, _)| vh.as_bytes().to_vec())),
        ["cluster_name"] => found(cluster().map(|c| c.name.clone().into_bytes())),
        ["cluster_metadata", more @ ..] => {
            let c = cluster().ok_or(Status::NotFound)?;
            metadata(state, "cluster_metadata", &c.metadata, more)
        }
        [first, ..] if NOT_EMULATED.contains(first) => {
            not_emulated(state, &format!("xds.{first}"));
            Err(Status::NotFound)
        }
        _ => Err(Status::NotFound),
    }
}
