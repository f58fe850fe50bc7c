//! `when`: which requests an operation applies to. Every part given must hold (a method in
//! the set, a path prefix, each header present or equal); an absent `when` matches all.

use crate::quote::Quoted;
use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Any of these methods (case-sensitive, as HTTP methods are).
    #[serde(default)]
    pub methods: Vec<String>,
    /// The path (its query left out) starts with this.
    pub path_prefix: Option<String>,
    #[serde(default)]
    pub headers: Vec<HeaderCondition>,
}

/// `{"name": "x-a"}`: present; `{"name": "x-a", "value": "1"}`: present with this value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderCondition {
    pub name: String,
    pub value: Option<String>,
}

impl Condition {
    pub fn validate(&mut self, at: &str) -> Result<(), String> {
        for (i, m) in self.methods.iter().enumerate() {
            if !crate::header_ops::is_token(m) {
                return Err(format!(
                    "{at}.methods[{i}] {}: not an HTTP method",
                    Quoted(m)
                ));
            }
        }
        if let Some(p) = &self.path_prefix {
            if !p.starts_with('/') {
                return Err(format!("{at}.path_prefix {}: must start with /", Quoted(p)));
            }
        }
        for (i, h) in self.headers.iter_mut().enumerate() {
            let name = h.name.strip_prefix(':').unwrap_or(&h.name);
            if !crate::header_ops::is_token(name) {
                return Err(format!(
                    "{at}.headers[{i}].name {}: not a valid HTTP header name",
                    Quoted(&h.name)
                ));
            }
            h.name = h.name.to_ascii_lowercase();
        }
        Ok(())
    }

    /// Whether the request matches; `header` looks a request header up (lower-case name).
    /// Methods and path come from `:method` and `:path` through the same lookup, so the
    /// glue reads only what the condition names.
    pub fn matches(&self, header: &mut dyn FnMut(&str) -> Option<String>) -> bool {
        if !self.methods.is_empty() {
            let Some(method) = header(":method") else {
                return false;
            };
            if !self.methods.contains(&method) {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            let Some(path) = header(":path") else {
                return false;
            };
            let path = path.split(['?', '#']).next().unwrap_or_default();
            if !path.starts_with(prefix.as_str()) {
                return false;
            }
        }
        self.headers
            .iter()
            .all(|h| match (header(&h.name), &h.value) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(got), Some(want)) => got == *want,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(json: &str) -> Result<Condition, String> {
        let mut c: Condition = crate::de::from_slice(json.as_bytes())?;
        c.validate("when")?;
        Ok(c)
    }

    fn request<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn every_part_must_hold() {
        let c = cond(r#"{"methods":["GET","HEAD"],"path_prefix":"/api","headers":[{"name":"X-Tenant"},{"name":"x-env","value":"prod"}]}"#).unwrap();
        let ok = [
            (":method", "GET"),
            (":path", "/api/items?x=1"),
            ("x-tenant", "a"),
            ("x-env", "prod"),
        ];
        assert!(c.matches(&mut request(&ok)));
        for (i, bad) in [
            (":method", "POST"),
            (":path", "/other"),
            ("x-tenant", ""),
            ("x-env", "dev"),
        ]
        .iter()
        .enumerate()
        {
            let mut r = ok;
            r[i] = *bad;
            let mut r = r.to_vec();
            if bad.0 == "x-tenant" {
                r.remove(i);
            }
            assert!(!c.matches(&mut request(&r)), "{bad:?}");
        }
    }

    #[test]
    fn the_query_is_not_part_of_the_path() {
        let c = cond(r#"{"path_prefix":"/a?b"}"#).unwrap();
        assert!(!c.matches(&mut request(&[(":path", "/a?b")])));
        let c = cond(r#"{"path_prefix":"/a"}"#).unwrap();
        assert!(c.matches(&mut request(&[(":path", "/a?b")])));
        assert!(cond("{}").unwrap().matches(&mut request(&[])));
    }

    #[test]
    fn errors_name_the_field() {
        assert!(cond(r#"{"methods":["GE T"]}"#)
            .unwrap_err()
            .contains("when.methods[0]"));
        assert!(cond(r#"{"path_prefix":"api"}"#)
            .unwrap_err()
            .contains("when.path_prefix"));
        assert!(cond(r#"{"headers":[{"name":"a b"}]}"#)
            .unwrap_err()
            .contains("when.headers[0].name"));
        assert!(cond(r#"{"header":[]}"#)
            .unwrap_err()
            .contains("unknown field `header`"));
    }
}
