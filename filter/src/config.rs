//! The plugin configuration: `{"role": "<name>", ...role fields}`. Unknown roles and unknown
//! fields are errors, so a typo is caught by `on_configure` (and Envoy's canary rejects the
//! configuration) instead of silently doing nothing.

use serde::Deserialize;

use crate::header_ops::HeaderOperation;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PluginConfig {
    HttpHeaderOperation(HeaderOperation),
}

impl PluginConfig {
    pub fn role(&self) -> &'static str {
        match self {
            Self::HttpHeaderOperation(_) => "http-header-operation",
        }
    }

    /// Parses and validates; the error names the field and the problem in one line.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err("the plugin configuration is empty: expected JSON such as {\"role\": \"http-header-operation\", ...}".into());
        }
        let mut config: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        match &mut config {
            Self::HttpHeaderOperation(ops) => ops.validate()?,
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_role() {
        let c = PluginConfig::parse(
            br#"{"role":"http-header-operation","request":{"remove":["X-A"]}}"#,
        )
        .unwrap();
        assert_eq!(c.role(), "http-header-operation");
    }

    #[test]
    fn rejects_empty_unknown_role_and_unknown_field() {
        assert!(PluginConfig::parse(b"  ").unwrap_err().contains("empty"));
        assert!(PluginConfig::parse(br#"{"role":"nope"}"#)
            .unwrap_err()
            .contains("unknown variant `nope`"));
        let e =
            PluginConfig::parse(br#"{"role":"http-header-operation","reqest":{}}"#).unwrap_err();
        assert!(e.contains("unknown field `reqest`"), "{e}");
        let e = PluginConfig::parse(br#"{"role":"http-header-operation","request":{"sett":[]}}"#)
            .unwrap_err();
        assert!(e.contains("unknown field `sett`"), "{e}");
    }
}
