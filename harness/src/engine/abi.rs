//! The proxy-wasm ABI's numbers and wire formats, in one place.
//!
//! Values are those of proxy-wasm-cpp-host (what Envoy returns), which in a few places differ
//! from the spec text: the statuses are `WasmResult` in proxy-wasm-cpp-sdk's
//! `proxy_wasm_common.h`, the enums and wire formats those of the spec
//! (<https://github.com/proxy-wasm/spec>, `abi-versions/v0.2.1/README.md`) and of
//! proxy-wasm-cpp-host's `src/exports.cc` and `src/pairs_util.cc`.

/// `proxy_status_t` / cpp-host `WasmResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    BrokenConnection = 11,
    Unimplemented = 12,
}

impl Status {
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Which ABI the module was compiled against, from its `proxy_abi_version_*` export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AbiVersion {
    V0_1_0,
    V0_2_0,
    V0_2_1,
}

impl AbiVersion {
    /// Envoy scans the exports for the first function named like a known ABI marker.
    pub fn detect<'a>(mut export_names: impl Iterator<Item = &'a str>) -> Option<Self> {
        export_names.find_map(|name| match name {
            "proxy_abi_version_0_1_0" => Some(Self::V0_1_0),
            "proxy_abi_version_0_2_0" => Some(Self::V0_2_0),
            "proxy_abi_version_0_2_1" => Some(Self::V0_2_1),
            _ => None,
        })
    }

    /// Whether Envoy links this `env` import for a module of this ABI: the imports that
    /// exist only in some versions are registered only for them (cpp-host
    /// `registerCallbacks`), so e.g. a 0.2.0 module importing `proxy_get_log_level` fails to
    /// load in Envoy, and must in the harness too.
    pub fn links_import(self, name: &str) -> bool {
        match name {
            "proxy_get_configuration"
            | "proxy_continue_request"
            | "proxy_continue_response"
            | "proxy_clear_route_cache" => self == Self::V0_1_0,
            "proxy_continue_stream" | "proxy_close_stream" => self >= Self::V0_2_0,
            "proxy_get_log_level" => self == Self::V0_2_1,
            _ => true,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_1_0 => "0.1.0",
            Self::V0_2_0 => "0.2.0",
            Self::V0_2_1 => "0.2.1",
        }
    }
}

/// `proxy_map_type_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    RequestHeaders,
    RequestTrailers,
    ResponseHeaders,
    ResponseTrailers,
    GrpcInitialMetadata,
    GrpcTrailingMetadata,
    HttpCallResponseHeaders,
    HttpCallResponseTrailers,
}

impl MapType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => Self::RequestHeaders,
            1 => Self::RequestTrailers,
            2 => Self::ResponseHeaders,
            3 => Self::ResponseTrailers,
            4 => Self::GrpcInitialMetadata,
            5 => Self::GrpcTrailingMetadata,
            6 => Self::HttpCallResponseHeaders,
            7 => Self::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// `proxy_buffer_type_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    HttpRequestBody,
    HttpResponseBody,
    DownstreamData,
    UpstreamData,
    HttpCallResponseBody,
    GrpcReceiveBuffer,
    VmConfiguration,
    PluginConfiguration,
    CallData,
}

impl BufferType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => Self::HttpRequestBody,
            1 => Self::HttpResponseBody,
            2 => Self::DownstreamData,
            3 => Self::UpstreamData,
            4 => Self::HttpCallResponseBody,
            5 => Self::GrpcReceiveBuffer,
            6 => Self::VmConfiguration,
            7 => Self::PluginConfiguration,
            8 => Self::CallData,
            _ => return None,
        })
    }
}

/// `proxy_stream_type_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamType {
    HttpRequest,
    HttpResponse,
    Downstream,
    Upstream,
}

impl StreamType {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => Self::HttpRequest,
            1 => Self::HttpResponse,
            2 => Self::Downstream,
            3 => Self::Upstream,
            _ => return None,
        })
    }
}

/// `proxy_log_level_t`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    /// Envoy's default log level.
    #[default]
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => Self::Trace,
            1 => Self::Debug,
            2 => Self::Info,
            3 => Self::Warn,
            4 => Self::Error,
            5 => Self::Critical,
            _ => return None,
        })
    }

    /// A level as Envoy's `-l` takes it (`warn` or `warning`); `off` is not one, since the
    /// harness's log expectations need the log.
    pub fn parse(name: &str) -> Result<Self, String> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "trace" => Self::Trace,
            "debug" => Self::Debug,
            "info" => Self::Info,
            "warn" | "warning" => Self::Warn,
            "error" => Self::Error,
            "critical" => Self::Critical,
            "off" => return Err("log level \"off\" is not supported: the harness needs the log to check expectations (use critical)".into()),
            other => return Err(format!("log level {other:?}: expected one of trace, debug, info, warning (or warn), error, critical, as Envoy's -l takes")),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
        }
    }
}

impl std::str::FromStr for LogLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for LogLevel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// cpp-host's limits on a serialized pairs map (`limits.h`): larger input decodes as empty.
const MAX_PAIRS_BYTES: usize = 1 << 20;
const MAX_PAIRS: usize = 1024;

/// Serializes header pairs in the proxy-wasm wire format:
/// `u32 N, N x (u32 key_len, u32 value_len), N x (key \0 value \0)`.
/// An empty map is emitted as zero bytes, as cpp-host does (`copyToPointerSize("")`).
pub fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    if pairs.is_empty() {
        return Vec::new();
    }
    let payload: usize = pairs
        .iter()
        .map(|(k, v)| k.as_ref().len() + v.as_ref().len() + 2)
        .sum();
    let mut out = Vec::with_capacity(4 + 8 * pairs.len() + payload);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// Decodes the pairs wire format the way cpp-host's `toPairs` does: anything malformed (bad
/// lengths, missing NULs, trailing bytes, over the limits) yields an empty list, not an error.
pub fn decode_pairs(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    decode_pairs_strict(bytes).unwrap_or_default()
}

fn decode_pairs_strict(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    if bytes.len() > MAX_PAIRS_BYTES || bytes.len() < 4 {
        return None;
    }
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = word(0)?;
    if n > MAX_PAIRS {
        return None;
    }
    let mut sizes = Vec::with_capacity(n);
    for i in 0..n {
        sizes.push((word(4 + 8 * i)?, word(8 + 8 * i)?));
    }
    let mut at = 4 + 8 * n;
    let mut out = Vec::with_capacity(n);
    for (klen, vlen) in sizes {
        let key = bytes.get(at..at + klen)?;
        at += klen;
        if *bytes.get(at)? != 0 {
            return None;
        }
        at += 1;
        let value = bytes.get(at..at + vlen)?;
        at += vlen;
        if *bytes.get(at)? != 0 {
            return None;
        }
        at += 1;
        out.push((String::from_utf8_lossy(key).into_owned(), value.to_vec()));
    }
    (at == bytes.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_specific_imports_link_only_for_their_versions() {
        use AbiVersion::*;
        assert!(V0_1_0.links_import("proxy_continue_request"));
        assert!(!V0_2_0.links_import("proxy_continue_request"));
        assert!(!V0_2_1.links_import("proxy_clear_route_cache"));
        assert!(!V0_1_0.links_import("proxy_continue_stream"));
        assert!(V0_2_0.links_import("proxy_close_stream"));
        assert!(!V0_2_0.links_import("proxy_get_log_level"));
        assert!(V0_2_1.links_import("proxy_get_log_level"));
        assert!(V0_1_0.links_import("proxy_log"));
    }

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![
            (":path".to_string(), b"/".to_vec()),
            ("x-a".to_string(), b"".to_vec()),
        ];
        let bytes = encode_pairs(&pairs);
        assert_eq!(&bytes[..4], &2u32.to_le_bytes());
        assert_eq!(decode_pairs(&bytes), pairs);
    }

    #[test]
    fn empty_map_is_zero_bytes_and_four_zero_bytes_decode_empty() {
        assert!(encode_pairs::<String, Vec<u8>>(&[]).is_empty());
        assert!(decode_pairs(&[0, 0, 0, 0]).is_empty());
    }

    #[test]
    fn malformed_pairs_decode_as_empty() {
        let mut bytes = encode_pairs(&[("k".to_string(), b"v".to_vec())]);
        bytes.push(7); // trailing garbage
        assert!(decode_pairs(&bytes).is_empty());
        let mut bytes = encode_pairs(&[("k".to_string(), b"v".to_vec())]);
        let last = bytes.len() - 1;
        bytes[last] = b'x'; // missing NUL
        assert!(decode_pairs(&bytes).is_empty());
        assert!(decode_pairs(&[1, 0, 0]).is_empty());
    }

    #[test]
    fn abi_detection_takes_first_marker() {
        let names = ["memory", "proxy_abi_version_0_2_1", "malloc"];
        assert_eq!(
            AbiVersion::detect(names.into_iter()),
            Some(AbiVersion::V0_2_1)
        );
        assert_eq!(AbiVersion::detect(["_start"].into_iter()), None);
    }
}
