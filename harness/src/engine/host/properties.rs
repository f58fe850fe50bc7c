//! `proxy_get_property` / `proxy_set_property`: the subset of Envoy's attributes the harness
//! can know (plugin identity, node identity and metadata, request, response and connection
//! attributes), serialized as Envoy does (strings raw, integers and doubles 8 bytes
//! little-endian, booleans 1 byte, maps in the pairs format). Anything unknown is `NotFound`,
//! as in Envoy. Addresses: the client is 127.0.0.1 with a port per connection, the
//! destination is the listener's address and port; `filter_state.<key>` reads what
//! `set_envoy_filter_state` stored (see [`super::filter_state`]); `xds.*` the route, virtual
//! host and cluster a request takes ([`xds`]); `metadata` the stream's dynamic metadata, as the
//! request seeded it (a TCP connection's is empty); `upstream.address` / `.port` once the
//! proxy connected upstream (`tcp_proxy`, or the router for an HTTP request). Attributes Envoy has and the harness does not model are
//! answered NotFound with a note saying so ([`not_modelled`]).

use wasmtime::{Caller, Linker};

mod xds;

pub use xds::{RouteTable, XdsRoute};

use super::{hostcall, memory, HeaderMap, HostState};
use crate::engine::abi::Status;
use crate::engine::header_map as headers;
use crate::engine::metadata::DynamicMetadata;

fn int(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// A property's bytes, or Envoy's status for it: NotFound, or SerializationFailure for a
/// value Envoy cannot serialize (a Struct's `null`, and any map or list holding one).
fn lookup(state: &HostState, path: &[&str]) -> Result<Vec<u8>, Status> {
    // The node is local info: every context can read it, a stream or not. Only under `xds`:
    // Envoy 1.40 answers NotFound for the legacy top-level `node` (checked against it).
    if let ["xds", "node", rest @ ..] = path {
        if rest.is_empty() {
            return Err(Status::NotFound); // Envoy gives the whole Node proto here; not modelled
        }
        let mut v = state.shared.node.get().ok_or(Status::NotFound)?;
        for key in rest {
            v = v.get(key).ok_or(Status::NotFound)?;
        }
        return json_value(v);
    }
    if let Some(s) = state.http_stream_ref() {
        match path {
            ["xds", rest @ ..] => return xds::lookup(state, s, rest),
            ["metadata", rest @ ..] => return dynamic_metadata(&s.dynamic_metadata, rest),
            _ => {}
        }
    } else if let (["metadata", rest @ ..], Some(_)) = (path, state.connection()) {
        // A TCP connection's: nothing the harness runs sets any.
        return dynamic_metadata(&DynamicMetadata::new(), rest);
    }
    plain(state, path).ok_or_else(|| {
        if not_modelled(path) {
            xds::not_emulated(state, &path.join("."));
        }
        Status::NotFound
    })
}

/// Attributes Envoy 1.40 has that the harness does not model: a guest reading one is told
/// (`wasm-harness: property ... is not emulated`), never left with a silent NotFound. The
/// upstream's address and port are modelled once the proxy connected to it.
fn not_modelled(path: &[&str]) -> bool {
    match path {
        ["upstream", "address" | "port"] => false,
        ["upstream" | "upstream_filter_state", ..] => true,
        ["request", name] => ["duration", "size", "total_size"].contains(name),
        ["response", name] => [
            "code_details",
            "flags",
            "grpc_status",
            "trailers",
            "size",
            "total_size",
            "backend_latency",
        ]
        .contains(name),
        ["connection", name] => [
            "requested_server_name",
            "tls_version",
            "subject_local_certificate",
            "subject_peer_certificate",
            "dns_san_local_certificate",
            "dns_san_peer_certificate",
            "uri_san_local_certificate",
            "uri_san_peer_certificate",
            "sha256_peer_certificate_digest",
            "termination_details",
            "transport_failure_reason",
        ]
        .contains(name),
        ["listener_direction" | "listener_metadata"] => true,
        _ => false,
    }
}

/// The properties that are bytes or absent.
fn plain(state: &HostState, path: &[&str]) -> Option<Vec<u8>> {
    let id = state.context_id();
    let plugin = state.plugin_of(id);
    match path {
        ["plugin_name"] => return plugin.map(|p| p.name.clone().into_bytes()),
        ["plugin_root_id"] => return plugin.map(|p| p.root_id.clone().into_bytes()),
        ["plugin_vm_id"] => return plugin.map(|p| p.vm_id.clone().into_bytes()),
        _ => {}
    }
    if let Some(c) = state.connection() {
        let (address, port) = c.destination.as_ref();
        match path {
            ["filter_state", key] => return c.with_filter_state(|fs| fs.read(key)),
            ["source", "address"] => {
                return Some(format!("127.0.0.1:{}", c.source_port).into_bytes())
            }
            ["source", "port"] => return Some(int(c.source_port.into())),
            ["destination", "address"] => return Some(format!("{address}:{port}").into_bytes()),
            ["destination", "port"] => return Some(int((*port).into())),
            ["connection", "id"] => return Some(int(c.id as i64)),
            ["upstream", "address"] => {
                return c
                    .upstream
                    .get()
                    .map(|(h, p)| format!("{h}:{p}").into_bytes())
            }
            ["upstream", "port"] => return c.upstream.get().map(|(_, p)| int((*p).into())),
            // Plain-text downstream connections only.
            ["connection", "mtls"] => return Some(vec![0]),
            _ => {}
        }
    }
    let s = state.http_stream_ref()?;
    let key = path.join("\0");
    if let Some(v) = s.properties.get(&key) {
        return Some(v.clone());
    }
    let no_headers = HeaderMap::new();
    let req = s
        .request_headers
        .as_ref()
        .or(s.request_snapshot.as_deref())
        .unwrap_or(&no_headers);
    let header = |k: &str| headers::get(req, k).map(<[u8]>::to_vec);
    let full_path = header(":path").unwrap_or_default();
    let mut split = full_path.splitn(2, |b| *b == b'?');
    let url_path = split.next().unwrap_or_default().to_vec();
    let query = split.next().unwrap_or_default().to_vec();
    match path {
        ["request", "path"] => Some(full_path),
        ["request", "url_path"] => Some(url_path),
        ["request", "query"] => Some(query),
        ["request", "host"] => header(":authority"),
        ["request", "scheme"] => header(":scheme"),
        ["request", "method"] => header(":method"),
        ["request", "id"] => header("x-request-id"),
        ["request", "useragent"] => header("user-agent"),
        ["request", "referer"] => header("referer"),
        ["request", "protocol"] => Some(
            s.connection
                .http_protocol
                .unwrap_or("HTTP/1.1")
                .as_bytes()
                .to_vec(),
        ),
        // Requests take no virtual time, so the first byte arrived now.
        ["request", "time"] => Some(int(super::time::wall_nanos(state) as i64)),
        ["request", "headers"] => Some(crate::engine::abi::encode_pairs(req)),
        ["response", "headers"] => s
            .response_headers
            .as_ref()
            .map(|h| crate::engine::abi::encode_pairs(h)),
        ["response", "headers", name] => {
            let values: Vec<&[u8]> = s
                .response_headers
                .as_ref()?
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_slice())
                .collect();
            (!values.is_empty()).then(|| values.join(&b","[..]))
        }
        ["request", "headers", name] => {
            let values: Vec<&[u8]> = req
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_slice())
                .collect();
            (!values.is_empty()).then(|| values.join(&b","[..]))
        }
        ["response", "code"] => s.response_code.map(|c| int(c.into())),
        _ => None,
    }
}

/// `metadata.<rest>`: the stream's dynamic metadata, as the request seeded it (only Wasm
/// filters and the router run here, and neither sets any). The whole message is its protobuf
/// serialization, `filter_metadata` and below Struct values; nothing fills
/// `typed_filter_metadata`, an empty map as in Envoy.
fn dynamic_metadata(metadata: &DynamicMetadata, rest: &[&str]) -> Result<Vec<u8>, Status> {
    use crate::engine::metadata::protobuf_metadata;
    match rest {
        [] => Ok(protobuf_metadata(metadata)),
        ["filter_metadata", keys @ ..] => {
            let all = serde_json::Value::Object(
                metadata
                    .iter()
                    .map(|(ns, fields)| (ns.clone(), fields.clone().into()))
                    .collect(),
            );
            json_value(below(&all, keys)?)
        }
        ["typed_filter_metadata"] => json_value(&serde_json::json!({})),
        _ => Err(Status::NotFound),
    }
}

/// The value at `keys` below `v` (map keys only: Envoy does not index lists by path).
pub(super) fn below<'v>(
    v: &'v serde_json::Value,
    keys: &[&str],
) -> Result<&'v serde_json::Value, Status> {
    keys.iter()
        .try_fold(v, |v, key| v.as_object()?.get(*key))
        .ok_or(Status::NotFound)
}

/// A JSON value (protobuf Struct semantics) as Envoy serializes the CEL value it becomes:
/// a list is pairs of its items' bytes and empty values, and a `null` anywhere does not
/// serialize.
pub(super) fn json_value(v: &serde_json::Value) -> Result<Vec<u8>, Status> {
    use serde_json::Value;
    Ok(match v {
        // The pairs format of no pairs: a zero count (Envoy writes it; `encode_pairs` does not).
        Value::Object(m) if m.is_empty() => vec![0; 4],
        Value::Array(a) if a.is_empty() => vec![0; 4],
        Value::String(s) => s.clone().into_bytes(),
        Value::Number(n) => n
            .as_f64()
            .ok_or(Status::SerializationFailure)?
            .to_le_bytes()
            .to_vec(),
        Value::Bool(b) => vec![*b as u8],
        Value::Object(m) => crate::engine::abi::encode_pairs(
            &m.iter()
                .map(|(k, v)| Ok((k.clone(), json_value(v)?)))
                .collect::<Result<Vec<_>, Status>>()?,
        ),
        Value::Array(a) => crate::engine::abi::encode_pairs(
            &a.iter()
                .map(|v| Ok((json_value(v)?, Vec::new())))
                .collect::<Result<Vec<_>, Status>>()?,
        ),
        Value::Null => return Err(Status::SerializationFailure),
    })
}

fn proxy_get_property(
    mut caller: Caller<'_, HostState>,
    path_ptr: i32,
    path_size: i32,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let raw = memory::read_string(&caller, path_ptr, path_size)?;
        if raw.is_empty() {
            return Err(Status::SerializationFailure.into());
        }
        let path: Vec<&str> = raw.split('\0').collect();
        if path == ["filter_state"] && caller.data().connection().is_some() {
            // Envoy's filter state map cannot list its keys, so it does not serialize.
            return Err(Status::SerializationFailure.into());
        }
        let value = lookup(caller.data(), &path)?;
        memory::copy_out(&mut caller, &value, ret_ptr, ret_size)
    })
}

/// Envoy keeps set properties in the stream's filter state; without a stream it is NotFound.
fn proxy_set_property(
    mut caller: Caller<'_, HostState>,
    path_ptr: i32,
    path_size: i32,
    value_ptr: i32,
    value_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let adding = memory::check(&caller, path_ptr, path_size)?
            + memory::check(&caller, value_ptr, value_size)?;
        let s = caller.data_mut().http_stream().ok_or(Status::NotFound)?;
        let held: usize = s.properties.iter().map(|(k, v)| k.len() + v.len()).sum();
        if held.saturating_add(adding) > MAX_STREAM_PROPERTY_BYTES {
            super::logging::record(
                caller.data(),
                crate::engine::abi::LogLevel::Critical,
                format!(
                    "proxy_set_property: the stream's properties would pass the harness's limit of {MAX_STREAM_PROPERTY_BYTES} bytes ({held} held, adding {adding}): refused (BadArgument)"
                ),
            );
            return Err(Status::BadArgument.into());
        }
        let path = memory::read_string(&caller, path_ptr, path_size)?;
        let value = memory::read(&caller, value_ptr, value_size)?;
        let s = caller.data_mut().http_stream().ok_or(Status::NotFound)?;
        s.properties.insert(path, value);
        Ok(())
    })
}

/// The most bytes of paths and values a stream's properties (Envoy's filter state) may hold.
pub const MAX_STREAM_PROPERTY_BYTES: usize = 16 << 20;

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_property", proxy_get_property)?;
    linker.func_wrap("env", "proxy_set_property", proxy_set_property)?;
    Ok(())
}
