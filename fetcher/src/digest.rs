//! What makes bytes a module we will hand to Envoy: the pinned sha256, and the Wasm header of
//! a core module (a component is refused by name, since Envoy cannot run one).

use crate::error::FetchError;

/// A sha256 digest, parsed from 64 hex characters (case-insensitive, optional `sha256:`).
/// Shown and stored as 64 lower-case hex characters: a module's name in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    pub fn parse(s: &str) -> Result<Self, String> {
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        if hex_part.len() != 64 {
            return Err(format!(
                "{s:?} is not a sha256: expected 64 hex characters, got {}",
                hex_part.len()
            ));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out)
            .map_err(|_| format!("{s:?} is not a sha256: it has non-hex characters"))?;
        Ok(Self(out))
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The sha256 of bytes already in memory (a manifest, a document).
    pub fn of(bytes: &[u8]) -> Self {
        use sha2::Digest;
        Sha256(sha2::Sha256::digest(bytes).into())
    }
}

/// A digest named by a manifest or an index: exactly `sha256:` and 64 lower-case hex
/// characters, checked before it goes into a URL.
pub fn parse_digest(s: &str) -> Result<Digest, FetchError> {
    let bad = || FetchError::Registry {
        message: format!(
            "invalid digest {:?} in a manifest: expected sha256: and 64 lower-case hex characters",
            s.chars().take(100).collect::<String>()
        ),
    };
    let hex_part = s.strip_prefix("sha256:").ok_or_else(bad)?;
    if !hex_part
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(bad());
    }
    Sha256::parse(hex_part).map(Digest).map_err(|_| bad())
}

impl std::fmt::Display for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

impl std::str::FromStr for Sha256 {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

/// An OCI content digest (an image manifest's or index's), shown and stored as
/// `sha256:<hex>`, the form registries and Istio's `sha256` field use for it; the typed form
/// keeps it from being compared with a module's sha256 by accident of spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub Sha256);

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

impl std::str::FromStr for Digest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("sha256:") {
            Some(hex) => Sha256::parse(hex).map(Digest),
            None => Err(format!("{s:?} is not a digest: expected sha256:<64 hex>")),
        }
    }
}

/// Stored as their text, read back through `FromStr`.
macro_rules! serde_as_text {
    ($($t:ty),*) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = std::borrow::Cow::<str>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

serde_as_text!(Sha256, Digest);

const MAGIC: &[u8; 4] = b"\0asm";
const CORE_VERSION: [u8; 4] = [1, 0, 0, 0];
/// Component model binaries: version 0x0d, layer 1.
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0, 1, 0];

/// Checks the first 8 bytes of a module.
pub fn check_wasm_header(head: &[u8]) -> Result<(), FetchError> {
    if head.len() < 8 || &head[..4] != MAGIC {
        // The bytes themselves are not quoted: a file that is not Wasm may be a key or a token.
        return Err(FetchError::NotWasm {
            reason: "it does not start with \\0asm".into(),
        });
    }
    match &head[4..8] {
        v if v == CORE_VERSION => Ok(()),
        v if v == COMPONENT_VERSION => Err(FetchError::NotWasm {
            reason: "it is a Wasm component, not a core module; Envoy runs core modules only"
                .into(),
        }),
        v => Err(FetchError::NotWasm {
            reason: format!("unknown Wasm version {v:02x?}"),
        }),
    }
}

pub fn check_pin(expected: Option<&Sha256>, actual: &Sha256) -> Result<(), FetchError> {
    match expected {
        Some(e) if e != actual => Err(FetchError::ChecksumMismatch {
            expected: e.hex(),
            actual: actual.hex(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sha256_in_any_case_and_with_prefix() {
        let lower = "ab".repeat(32);
        assert_eq!(Sha256::parse(&lower).unwrap().hex(), lower);
        assert_eq!(Sha256::parse(&lower.to_uppercase()).unwrap().hex(), lower);
        assert_eq!(
            Sha256::parse(&format!("sha256:{lower}")).unwrap().hex(),
            lower
        );
        assert!(Sha256::parse("abc").unwrap_err().contains("64 hex"));
        assert!(Sha256::parse(&"zz".repeat(32))
            .unwrap_err()
            .contains("non-hex"));
    }

    #[test]
    fn manifest_digests_are_strict() {
        let hex = "ab".repeat(32);
        assert_eq!(
            parse_digest(&format!("sha256:{hex}")).unwrap().to_string(),
            format!("sha256:{hex}")
        );
        for bad in [
            hex.clone(),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha512:{hex}"),
            format!("sha256:{hex}/../x"),
            "sha256:../../etc".into(),
            format!("sha256:{}", &hex[2..]),
        ] {
            let e = parse_digest(&bad).unwrap_err().to_string();
            assert!(e.contains("invalid digest"), "{bad}: {e}");
        }
    }

    #[test]
    fn wasm_header_checks() {
        assert!(check_wasm_header(b"\0asm\x01\0\0\0").is_ok());
        let e = check_wasm_header(b"<html>hello").unwrap_err().to_string();
        assert!(e.starts_with("not a Wasm module"), "{e}");
        let e = check_wasm_header(b"\0asm\x0d\0\x01\0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("Wasm component"), "{e}");
        assert!(check_wasm_header(b"\0as").is_err());
    }
}
