//! The `http-header-operation` role: remove, set (replace) and add headers on the request
//! before it is routed and on the response before the client sees it.
//!
//! Order is fixed (remove, then set, then add) so a config can say "drop every `x-foo`, then
//! add ours" without depending on how JSON orders keys.

use crate::conditions::Condition;
use crate::quote::Quoted;
use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderOperation {
    /// Both lists apply only to requests that match (the response list: to responses to
    /// requests that matched).
    pub when: Option<Condition>,
    #[serde(default)]
    pub request: Ops,
    #[serde(default)]
    pub response: Ops,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ops {
    #[serde(default)]
    pub remove: Vec<String>,
    #[serde(default)]
    pub set: Vec<Header>,
    #[serde(default)]
    pub add: Vec<Header>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// One edit, as the glue applies it with a hostcall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit<'a> {
    Remove(&'a str),
    Set(&'a str, &'a str),
    Add(&'a str, &'a str),
}

/// For the log: `Set("x-a", "1")`, the shape `{:?}` gives, through [`Quoted`].
impl std::fmt::Display for Edit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Edit::Remove(n) => write!(f, "Remove({})", Quoted(n)),
            Edit::Set(n, v) => write!(f, "Set({}, {})", Quoted(n), Quoted(v)),
            Edit::Add(n, v) => write!(f, "Add({}, {})", Quoted(n), Quoted(v)),
        }
    }
}

/// RFC 9110 `tchar`.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl HeaderOperation {
    pub fn validate(&mut self) -> Result<(), String> {
        if let Some(when) = &mut self.when {
            when.validate("when")?;
        }
        self.request.validate("request")?;
        self.response.validate("response")
    }

    pub fn count(&self) -> (usize, usize) {
        (self.request.len(), self.response.len())
    }
}

impl Ops {
    pub fn len(&self) -> usize {
        self.remove.len() + self.set.len() + self.add.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks names and values and lower-cases names (Envoy's maps are lower-case).
    pub fn validate(&mut self, side: &str) -> Result<(), String> {
        for (i, name) in self.remove.iter_mut().enumerate() {
            check_name(&format!("{side}.remove[{i}]"), name, false)?;
            *name = name.to_ascii_lowercase();
        }
        for (op, list, pseudo_ok) in [("set", &mut self.set, true), ("add", &mut self.add, false)] {
            for (i, h) in list.iter_mut().enumerate() {
                let at = format!("{side}.{op}[{i}]");
                check_name(&format!("{at}.name"), &h.name, pseudo_ok)?;
                if h.value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
                    return Err(format!(
                        "{at}.value {}: a header value must not contain CR, LF or NUL",
                        Quoted(&h.value)
                    ));
                }
                h.name = h.name.to_ascii_lowercase();
            }
        }
        Ok(())
    }

    /// The edits in the order they are applied: remove, set, add.
    pub fn edits(&self) -> impl Iterator<Item = Edit<'_>> {
        self.remove
            .iter()
            .map(|n| Edit::Remove(n))
            .chain(self.set.iter().map(|h| Edit::Set(&h.name, &h.value)))
            .chain(self.add.iter().map(|h| Edit::Add(&h.name, &h.value)))
    }

    /// What the edits do to a header list, with Envoy's map semantics (case-insensitive
    /// names, `set` replaces every value, `add` appends). The glue does the same through
    /// hostcalls; this is its specification and its test.
    pub fn apply(&self, headers: &mut Vec<(String, String)>) {
        for edit in self.edits() {
            match edit {
                Edit::Remove(n) => headers.retain(|(k, _)| !k.eq_ignore_ascii_case(n)),
                Edit::Set(n, v) => {
                    headers.retain(|(k, _)| !k.eq_ignore_ascii_case(n));
                    headers.push((n.to_string(), v.to_string()));
                }
                Edit::Add(n, v) => headers.push((n.to_string(), v.to_string())),
            }
        }
    }
}

fn check_name(at: &str, name: &str, pseudo_ok: bool) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{at}: a header name must not be empty"));
    }
    if let Some(rest) = name.strip_prefix(':') {
        if !pseudo_ok {
            return Err(format!(
                "{at} {}: pseudo-headers can only be set, not added or removed",
                Quoted(name)
            ));
        }
        if is_token(rest) {
            return Ok(());
        }
    } else if is_token(name) {
        return Ok(());
    }
    Err(format!(
        "{at} {}: not a valid HTTP header name",
        Quoted(name)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;

    fn ops(json: &str) -> Result<HeaderOperation, String> {
        match PluginConfig::parse(json.as_bytes())? {
            PluginConfig::HttpHeaderOperation(o) => Ok(o),
            other => Err(format!("parsed as {}", other.role())),
        }
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn remove_then_set_then_add() {
        let o = ops(r#"{"role":"http-header-operation","request":{
            "add":[{"name":"X-Tag","value":"ours"}],
            "set":[{"name":"x-env","value":"demo"}],
            "remove":["X-TAG"]}}"#)
        .unwrap();
        let mut headers = h(&[
            ("x-tag", "theirs"),
            ("x-env", "a"),
            ("X-Env", "b"),
            ("keep", "1"),
        ]);
        o.request.apply(&mut headers);
        assert_eq!(
            headers,
            h(&[("keep", "1"), ("x-env", "demo"), ("x-tag", "ours")])
        );
    }

    #[test]
    fn add_keeps_duplicates() {
        let o = ops(r#"{"role":"http-header-operation","response":{"add":[{"name":"v","value":"1"},{"name":"v","value":"2"}]}}"#).unwrap();
        let mut headers = h(&[("v", "0")]);
        o.response.apply(&mut headers);
        assert_eq!(headers, h(&[("v", "0"), ("v", "1"), ("v", "2")]));
        assert_eq!(o.count(), (0, 2));
    }

    #[test]
    fn errors_name_the_field() {
        let e = ops(r#"{"role":"http-header-operation","request":{"add":[{"name":"bad name","value":"x"}]}}"#).unwrap_err();
        assert!(
            e.contains("request.add[0].name \"bad name\": not a valid HTTP header name"),
            "{e}"
        );
        let e = ops(
            r#"{"role":"http-header-operation","response":{"set":[{"name":"x","value":"a\nb"}]}}"#,
        )
        .unwrap_err();
        assert!(e.contains("response.set[0].value"), "{e}");
        let e =
            ops(r#"{"role":"http-header-operation","request":{"remove":[":path"]}}"#).unwrap_err();
        assert!(
            e.contains("request.remove[0]") && e.contains("pseudo-headers"),
            "{e}"
        );
        let e = ops(r#"{"role":"http-header-operation","request":{"remove":[""]}}"#).unwrap_err();
        assert!(e.contains("must not be empty"), "{e}");
        let e = ops(r#"{"role":"http-header-operation","request":{"add":[{"name":"x"}]}}"#)
            .unwrap_err();
        assert!(e.contains("missing field `value`"), "{e}");
    }

    #[test]
    fn pseudo_header_may_be_set() {
        let o = ops(r#"{"role":"http-header-operation","request":{"set":[{"name":":path","value":"/v2"}]}}"#).unwrap();
        assert_eq!(o.request.edits().next(), Some(Edit::Set(":path", "/v2")));
        // The log names a failed edit as `{:?}` would.
        let set = Edit::Set(":path", "/v2");
        assert_eq!(set.to_string(), format!("{set:?}"));
        assert_eq!(Edit::Remove("x").to_string(), r#"Remove("x")"#);
    }
}
