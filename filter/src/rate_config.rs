//! The two `rate-limit` fields serde's derive cannot read as they are written: the key's
//! source (`"client-address"` or `{"header": "<name>"}`) and the refill rate, read exactly
//! from its decimal text.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Unexpected, Visitor};
use serde_json::value::RawValue;

use crate::quote::Quoted;

/// Where the bucket's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `{"header": "x-api-key"}`: that request header's value; requests without it share
    /// one bucket.
    Header(String),
    /// `"client-address"`: the client's IP address (`source.address`, port left out).
    ClientAddress,
}

const KEY_VARIANTS: &[&str] = &["header", "client-address"];

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = KeySource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`\"client-address\"` or `{\"header\": ...}`")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<KeySource, E> {
        match s {
            "client-address" => Ok(KeySource::ClientAddress),
            "header" => Err(E::custom(format_args!(
                "{} needs a header name: {{\"header\": \"<name>\"}}",
                Quoted(s)
            ))),
            _ => Err(E::unknown_variant(s, KEY_VARIANTS)),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeySource, A::Error> {
        let Some(name) = map.next_key::<String>()? else {
            return Err(de::Error::invalid_type(Unexpected::Map, &self));
        };
        let key = match name.as_str() {
            "header" => KeySource::Header(map.next_value()?),
            "client-address" => {
                return Err(de::Error::custom(
                    "`client-address` takes no value: write \"client-address\"",
                ))
            }
            _ => return Err(de::Error::unknown_variant(&name, KEY_VARIANTS)),
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_type(Unexpected::Map, &self));
        }
        Ok(key)
    }
}

impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

/// `refill_per_second` as the configuration wrote it (type-checked; its bounds are the
/// reader's). A type error names the field itself: raised after serde_json has read the
/// value whole, it would otherwise carry the position of the end of the enclosing object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumberText(pub String);

impl<'de> Deserialize<'de> for NumberText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        let text = raw.get();
        if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return Ok(Self(text.to_string()));
        }
        let value: serde_json::Value = serde_json::from_str(text).map_err(de::Error::custom)?;
        let found = match &value {
            serde_json::Value::Null => Unexpected::Other("null"),
            serde_json::Value::Bool(b) => Unexpected::Bool(*b),
            serde_json::Value::String(s) => Unexpected::Str(s),
            serde_json::Value::Array(_) => Unexpected::Seq,
            serde_json::Value::Object(_) => Unexpected::Map,
            serde_json::Value::Number(_) => Unexpected::Other("number"),
        };
        Err(de::Error::invalid_type(
            found,
            &"a number at refill_per_second",
        ))
    }
}

/// Tokens added back per second, in thousandths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rate {
    pub milli: u64,
}

/// The bounds of `refill_per_second`, in thousandths: 0.001 to 1 000 000 per second.
const RATE_MILLI: (u64, u64) = (1, 1_000_000_000);

impl Rate {
    /// From the configuration's number, exactly: more than three decimals round to the
    /// nearest thousandth, a value out of bounds is refused as written.
    pub fn from_text(text: &NumberText) -> Result<Self, String> {
        let n = Scaled::new(&text.0, 3);
        let (min, max) = RATE_MILLI;
        if n.negative || n.units < min || n.units > max || (n.units == max && n.rest) {
            return Err(format!(
                "refill_per_second {}: must be between 0.001 and 1000000",
                text.0
            ));
        }
        Ok(Self { milli: n.rounded() })
    }
}

/// As a decimal: `2`, `0.5`, `0.001`.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.milli / 1000, self.milli % 1000);
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:03}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

/// A number in whole units of `10^-places`, from its decimal text (no floating point).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scaled {
    negative: bool,
    /// Whole units of the magnitude (saturating).
    units: u64,
    /// Something is left below one unit.
    rest: bool,
    /// What is left is at least half a unit.
    half: bool,
}

impl Scaled {
    /// `text` has the grammar of a JSON number (serde_json checked it).
    fn new(text: &str, places: u32) -> Self {
        let (negative, magnitude) = match text.strip_prefix('-') {
            Some(m) => (true, m),
            None => (false, text),
        };
        let (mantissa, exp) = magnitude.split_once(['e', 'E']).unwrap_or((magnitude, "0"));
        let exp = exp
            .trim_start_matches('+')
            .parse::<i64>()
            .unwrap_or(if exp.starts_with('-') {
                -1_000_000
            } else {
                1_000_000
            });
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        // Digits before this index are whole units.
        let point = (int.len() as i64)
            .saturating_add(exp)
            .saturating_add(i64::from(places));
        let mut s = Self {
            negative,
            units: 0,
            rest: false,
            half: false,
        };
        let mut count = 0;
        for (k, d) in int.bytes().chain(frac.bytes()).enumerate() {
            let d = d.wrapping_sub(b'0');
            let k = k as i64;
            if k < point {
                s.units = s.units.saturating_mul(10).saturating_add(u64::from(d));
            } else {
                s.half |= k == point && d >= 5;
                s.rest |= d != 0;
            }
            count = k + 1;
        }
        if point > count {
            let zeros = u32::try_from((point - count).min(40)).unwrap_or(40);
            s.units = s.units.saturating_mul(10u64.saturating_pow(zeros));
        }
        s
    }

    /// Rounded to the nearest unit (halves up).
    fn rounded(&self) -> u64 {
        self.units.saturating_add(u64::from(self.half))
    }
}
