//! The `tcp-total-data-size-counter` role: bytes each way per connection, logged when it
//! closes, and process-wide totals kept in shared data (every worker VM adds its closed
//! connections with a compare-and-swap) and in metrics.
//!
//! The totals are stored as text, `in=<bytes> out=<bytes> connections=<n>`, so an operator
//! (or a scenario's `shared_data` check) can read them as they are.

use crate::quote::Quoted;
use serde::Deserialize;

use crate::stored;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpCounter {
    /// Log each connection's bytes when it closes (the totals are kept either way).
    #[serde(default = "yes")]
    pub log_connections: bool,
}

fn yes() -> bool {
    true
}

/// The shared-data key under the VM's prefix.
pub const TOTALS_KEY: &str = "tcp-totals";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Bytes from the client (downstream) to the upstream.
    pub bytes_in: u64,
    /// Bytes from the upstream back to the client.
    pub bytes_out: u64,
    pub connections: u64,
}

impl Totals {
    pub fn encode(&self) -> String {
        format!(
            "in={} out={} connections={}",
            self.bytes_in, self.bytes_out, self.connections
        )
    }

    /// Absent or empty is zero; anything unreadable is an error (never silently reset).
    pub fn decode(value: Option<&[u8]>) -> Result<Self, String> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(Self::default());
        };
        let text = stored::text(value, "totals")?;
        let bad = |problem| stored::malformed("totals", text, problem);
        let mut t = Self::default();
        let mut seen = 0;
        for part in text.split(' ') {
            let Some((k, v)) = part.split_once('=') else {
                return Err(bad(format_args!(
                    "{} is not key=value",
                    Quoted(stored::cut(part))
                )));
            };
            let Some(n) = stored::number(v) else {
                return Err(bad(format_args!(
                    "{} is not a number",
                    Quoted(stored::cut(k))
                )));
            };
            match k {
                "in" => t.bytes_in = n,
                "out" => t.bytes_out = n,
                "connections" => t.connections = n,
                _ => {
                    return Err(bad(format_args!(
                        "unknown field {}",
                        Quoted(stored::cut(k))
                    )))
                }
            }
            seen += 1;
        }
        if seen != 3 {
            return Err(bad(format_args!("expected in, out and connections")));
        }
        Ok(t)
    }

    /// Adds one closed connection; saturates rather than wrapping.
    pub fn add_connection(&self, bytes_in: u64, bytes_out: u64) -> Self {
        Self {
            bytes_in: self.bytes_in.saturating_add(bytes_in),
            bytes_out: self.bytes_out.saturating_add(bytes_out),
            connections: self.connections.saturating_add(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another module sharing the key space can store megabytes under the totals key; the
    /// error is logged on every closed connection, so it must stay a bounded line whatever
    /// part of the value is wrong (as `stored::malformed` bounds the value it quotes).
    #[test]
    fn a_huge_malformed_tcp_totals_value_makes_a_log_line_of_bounded_size() {
        let long = "x".repeat(1 << 20);
        let mut too_long = Vec::new();
        for (what, value) in [
            ("no `=`", long.clone()),
            (
                "a long unknown field",
                format!("{long}=1 out=0 connections=0"),
            ),
            ("a long number", format!("in={long} out=0 connections=0")),
            ("a long field not a number", format!("{long}=y")),
        ] {
            let e = Totals::decode(Some(value.as_bytes())).unwrap_err();
            if e.len() > 1024 {
                too_long.push(format!("{what}: a {}-byte log line", e.len()));
            }
        }
        assert!(too_long.is_empty(), "{too_long:#?}");
    }

    #[test]
    fn encodes_and_adds() {
        let t = Totals::decode(None).unwrap().add_connection(4, 5);
        assert_eq!(t.encode(), "in=4 out=5 connections=1");
        let t = Totals::decode(Some(t.encode().as_bytes()))
            .unwrap()
            .add_connection(10, 0);
        assert_eq!(t.encode(), "in=14 out=5 connections=2");
        assert_eq!(Totals::decode(Some(b"")).unwrap(), Totals::default());
        let max = Totals {
            bytes_in: u64::MAX,
            ..Totals::default()
        };
        assert_eq!(max.add_connection(1, 1).bytes_in, u64::MAX);
    }

    #[test]
    fn unreadable_totals_are_errors() {
        for bad in [
            &b"in=1 out=2"[..],
            b"in=x out=2 connections=1",
            b"garbage",
            b"in=1 out=2 connections=1 extra=4",
            b"\xff",
        ] {
            assert!(Totals::decode(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn config_logs_connections_by_default() {
        use crate::config::PluginConfig;
        let parse = |json: &str| PluginConfig::parse(json.as_bytes());
        let c = parse(r#"{"role":"tcp-total-data-size-counter"}"#).unwrap();
        assert_eq!(
            c,
            PluginConfig::TcpTotalDataSizeCounter(TcpCounter {
                log_connections: true
            })
        );
        let c = parse(r#"{"role":"tcp-total-data-size-counter","log_connections":false}"#);
        assert_eq!(
            c.unwrap(),
            PluginConfig::TcpTotalDataSizeCounter(TcpCounter {
                log_connections: false
            })
        );
        let e = parse(r#"{"role":"tcp-total-data-size-counter","log":true}"#).unwrap_err();
        assert_eq!(e, "unknown field `log`, expected `log_connections`");
        let e = parse(r#"{"role":"tcp-total-data-size-counter","log_connections":1}"#);
        assert_eq!(
            e.unwrap_err(),
            "invalid type: integer `1`, expected a boolean at log_connections"
        );
    }
}
