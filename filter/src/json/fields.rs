//! Reading configuration objects with the messages serde's derive gave, which users, docs
//! and tests know: "unknown field `x`, expected one of `a`, `b`", "missing field `x`",
//! "duplicate field `x`", "invalid type: string \"x\", expected u32", "unknown variant `x`,
//! expected `a` or `b`". Below the top level a message ends with the field's path, where
//! serde_json put a line and column (`... expected a string at request.set[0].name`): the
//! start of every message stays what it was.

use super::Value;

/// A value and where it is in the document (`request.set[0]`; empty for the root).
pub struct Field<'v> {
    pub at: String,
    pub value: &'v Value,
}

/// An object whose keys were checked by [`Obj::fields`] before anything is read from it.
pub struct Obj<'v> {
    at: String,
    entries: &'v [(String, Value)],
    /// A key the caller has read already (an internally tagged enum's tag).
    tag: Option<&'static str>,
}

/// `msg` at `at`.
pub fn error(at: &str, msg: String) -> String {
    if at.is_empty() {
        msg
    } else {
        format!("{msg} at {at}")
    }
}

/// serde's list of what was expected: "`a`", "`a` or `b`", "one of `a`, `b`, `c`".
fn one_of(names: &[&str]) -> String {
    match names {
        [] => "nothing".into(),
        [a] => format!("`{a}`"),
        [a, b] => format!("`{a}` or `{b}`"),
        _ => {
            let mut list = String::from("one of ");
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    list.push_str(", ");
                }
                list.push('`');
                list.push_str(n);
                list.push('`');
            }
            list
        }
    }
}

fn is_integer(number: &str) -> bool {
    !number.contains(['.', 'e', 'E'])
}

impl<'v> Field<'v> {
    pub fn root(value: &'v Value) -> Self {
        Self {
            at: String::new(),
            value,
        }
    }

    /// `msg` about this field.
    pub fn error(&self, msg: String) -> String {
        error(&self.at, msg)
    }

    /// serde's words for what was found instead.
    pub fn invalid_type(&self, expected: &str) -> String {
        let found = match self.value {
            Value::Null => "null".into(),
            Value::Bool(b) => format!("boolean `{b}`"),
            Value::Number(n) if is_integer(n) => format!("integer `{n}`"),
            Value::Number(n) => format!("floating point `{n}`"),
            Value::String(s) => format!("string {}", super::write::Quoted(s)),
            Value::Array(_) => "sequence".into(),
            Value::Object(_) => "map".into(),
        };
        error(
            &self.at,
            format!("invalid type: {found}, expected {expected}"),
        )
    }

    /// `expected` names the type for the message (`struct Ops`).
    pub fn object(self, expected: &str) -> Result<Obj<'v>, String> {
        match self.value {
            Value::Object(entries) => Ok(Obj {
                at: self.at,
                entries,
                tag: None,
            }),
            _ => Err(self.invalid_type(expected)),
        }
    }

    pub fn str(&self) -> Result<&'v str, String> {
        match self.value {
            Value::String(s) => Ok(s),
            _ => Err(self.invalid_type("a string")),
        }
    }

    pub fn string(self) -> Result<String, String> {
        self.str().map(str::to_string)
    }

    pub fn bool(self) -> Result<bool, String> {
        match self.value {
            Value::Bool(b) => Ok(*b),
            _ => Err(self.invalid_type("a boolean")),
        }
    }

    pub fn u64(self) -> Result<u64, String> {
        self.integer("u64", u64::MAX)
    }

    pub fn u32(self) -> Result<u32, String> {
        let n = self.integer("u32", u32::MAX.into())?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// A whole number from 0 to `max`; `ty` names the type for the message.
    fn integer(&self, ty: &str, max: u64) -> Result<u64, String> {
        match self.value {
            Value::Number(n) if is_integer(n) => match n.parse::<u64>() {
                Ok(v) if v <= max => Ok(v),
                _ => Err(error(
                    &self.at,
                    format!("invalid value: integer `{n}`, expected {ty}"),
                )),
            },
            _ => Err(self.invalid_type(ty)),
        }
    }

    /// The elements of a list, each read by `read` with its path (`at[i]`). A plain loop
    /// rather than `collect` into a `Result`, whose iterator adapters are far more code.
    pub fn list<T>(
        self,
        mut read: impl FnMut(Field<'v>) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let Value::Array(items) = self.value else {
            return Err(self.invalid_type("a sequence"));
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, value) in items.iter().enumerate() {
            out.push(read(Field {
                at: format!("{}[{i}]", self.at),
                value,
            })?);
        }
        Ok(out)
    }

    pub fn strings(self) -> Result<Vec<String>, String> {
        self.list(Field::string)
    }

    /// A unit variant named by a string: its index in `names`.
    pub fn variant(&self, names: &[&str]) -> Result<usize, String> {
        let name = self.str()?;
        names.iter().position(|n| *n == name).ok_or_else(|| {
            error(
                &self.at,
                format!("unknown variant `{name}`, expected {}", one_of(names)),
            )
        })
    }

    /// A number read exactly in units of `10^-places` (no floating point); `expected` names
    /// the type for the message.
    pub fn scaled(self, places: u32, expected: &str) -> Result<Scaled<'v>, String> {
        let Value::Number(text) = self.value else {
            return Err(self.invalid_type(expected));
        };
        Ok(Scaled::new(text, places))
    }
}

/// A number in whole units of `10^-places`, from its decimal text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scaled<'v> {
    /// As written, for messages.
    pub text: &'v str,
    pub negative: bool,
    /// Whole units of the magnitude (saturating).
    pub units: u64,
    /// Something is left below one unit.
    pub rest: bool,
    /// What is left is at least half a unit.
    pub half: bool,
}

impl<'v> Scaled<'v> {
    /// `text` has the grammar of a JSON number.
    fn new(text: &'v str, places: u32) -> Self {
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
            text,
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
    pub fn rounded(&self) -> u64 {
        self.units.saturating_add(u64::from(self.half))
    }
}

impl<'v> Obj<'v> {
    /// `tag` is not one of the object's own fields: [`Obj::fields`] lets it through.
    pub fn tagged(mut self, tag: &'static str) -> Self {
        self.tag = Some(tag);
        self
    }

    /// Refuses the first key (in document order) not in `known`, or given twice.
    pub fn fields(&self, known: &[&str]) -> Result<(), String> {
        for (i, (key, _)) in self.entries.iter().enumerate() {
            let msg = if self
                .entries
                .get(..i)
                .unwrap_or_default()
                .iter()
                .any(|(k, _)| k == key)
            {
                format!("duplicate field `{key}`")
            } else if known.contains(&key.as_str()) || self.tag == Some(key.as_str()) {
                continue;
            } else {
                format!("unknown field `{key}`, expected {}", one_of(known))
            };
            return Err(error(&self.at, msg));
        }
        Ok(())
    }

    /// The field, if given.
    pub fn get(&self, name: &str) -> Option<Field<'v>> {
        let (_, value) = self.entries.iter().find(|(k, _)| k == name)?;
        let at = if self.at.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.at)
        };
        Some(Field { at, value })
    }

    /// The field, if given and not `null` (for what is optional in the configuration).
    pub fn opt(&self, name: &str) -> Option<Field<'v>> {
        self.get(name).filter(|f| !matches!(f.value, Value::Null))
    }

    /// The field read by `read`, or `default()` when it is not given: serde's
    /// `#[serde(default)]` (a `null` is read, and refused as the wrong type).
    pub fn or<T>(
        &self,
        name: &str,
        read: impl FnOnce(Field<'v>) -> Result<T, String>,
        default: impl FnOnce() -> T,
    ) -> Result<T, String> {
        match self.get(name) {
            Some(f) => read(f),
            None => Ok(default()),
        }
    }

    pub fn need(&self, name: &str) -> Result<Field<'v>, String> {
        self.get(name)
            .ok_or_else(|| error(&self.at, format!("missing field `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Value {
        super::super::parse(text.as_bytes(), 1 << 20).unwrap()
    }

    #[test]
    fn objects_refuse_unknown_and_duplicate_keys_in_serdes_words() {
        let v = doc(r#"{"a":1,"role":"x","zz":2}"#);
        let o = Field::root(&v).object("struct T").unwrap();
        assert_eq!(
            o.fields(&["a", "b", "c"]).unwrap_err(),
            "unknown field `role`, expected one of `a`, `b`, `c`"
        );
        let o = o.tagged("role");
        assert_eq!(
            o.fields(&["a", "b"]).unwrap_err(),
            "unknown field `zz`, expected `a` or `b`"
        );
        assert_eq!(
            o.fields(&["a"]).unwrap_err(),
            "unknown field `zz`, expected `a`"
        );
        assert!(o.fields(&["a", "zz"]).is_ok());
        assert_eq!(o.need("q").err().unwrap(), "missing field `q`");
        let v = doc(r#"{"x":{"a":1,"a":2}}"#);
        let o = Field::root(&v).object("struct T").unwrap();
        let inner = o.need("x").unwrap().object("struct U").unwrap();
        assert_eq!(
            inner.fields(&["a"]).unwrap_err(),
            "duplicate field `a` at x"
        );
    }

    #[test]
    fn types_are_checked_with_the_path() {
        let v =
            doc(r#"{"s":{"l":[1,"two",1.5,-3,4294967296,null,true,{},[]]},"n":null,"e":"loud"}"#);
        let o = Field::root(&v).object("struct T").unwrap();
        let s = o.need("s").unwrap().object("struct S").unwrap();
        let got = s
            .need("l")
            .unwrap()
            .list(|f| {
                Ok(match f.u32() {
                    Ok(n) => n.to_string(),
                    Err(e) => e,
                })
            })
            .unwrap();
        assert_eq!(
            got,
            [
                "1",
                "invalid type: string \"two\", expected u32 at s.l[1]",
                "invalid type: floating point `1.5`, expected u32 at s.l[2]",
                "invalid value: integer `-3`, expected u32 at s.l[3]",
                "invalid value: integer `4294967296`, expected u32 at s.l[4]",
                "invalid type: null, expected u32 at s.l[5]",
                "invalid type: boolean `true`, expected u32 at s.l[6]",
                "invalid type: map, expected u32 at s.l[7]",
                "invalid type: sequence, expected u32 at s.l[8]",
            ]
        );
        assert!(o.opt("n").is_none());
        assert!(o.get("n").is_some());
        assert_eq!(
            o.need("e").unwrap().variant(&["a", "b", "c"]).unwrap_err(),
            "unknown variant `loud`, expected one of `a`, `b`, `c` at e"
        );
        assert_eq!(
            o.need("s").unwrap().strings().unwrap_err(),
            "invalid type: map, expected a sequence at s"
        );
    }

    #[test]
    fn numbers_scale_exactly() {
        fn milli(t: &str) -> Scaled<'_> {
            Scaled::new(t, 3)
        }
        let s = milli("0.5");
        assert_eq!(
            (s.units, s.rest, s.half, s.negative),
            (500, false, false, false)
        );
        assert_eq!(milli("2").units, 2000);
        assert_eq!(milli("25e-2").units, 250);
        assert_eq!(milli("1E+3").units, 1_000_000);
        let s = milli("0.0015");
        assert_eq!((s.units, s.rest, s.half, s.rounded()), (1, true, true, 2));
        let s = milli("0.00049");
        assert_eq!((s.units, s.rest, s.half), (0, true, false));
        let s = milli("-0.25");
        assert_eq!((s.units, s.negative), (250, true));
        assert_eq!(milli("1e400").units, u64::MAX);
        assert_eq!(milli("0e400").units, 0);
        let s = milli("1e-400");
        assert_eq!((s.units, s.rest), (0, true));
        assert_eq!(milli("99999999999999999999999").units, u64::MAX);
    }
}
