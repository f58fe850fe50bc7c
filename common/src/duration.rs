//! Durations in Go's syntax (`time.ParseDuration`): `90s`, `1.5h`, `1h30m`, `500ms`. Istio's
//! agent reads `WASM_MODULE_EXPIRY`, `WASM_PURGE_INTERVAL` and `WASM_HTTP_REQUEST_TIMEOUT` in
//! it, so the fetcher takes the same values; the harness's scenarios (`advance: 1h30m`) use it
//! too, so there is one grammar to learn.

use std::time::Duration;

/// The longest duration Go can represent (`math.MaxInt64` nanoseconds, about 292 years).
const MAX_NANOS: u128 = i64::MAX as u128;

/// Go's `time.ParseDuration`: a sequence of decimal numbers, each with an optional fraction
/// and a unit (ns, us or µs, ms, s, m, h), such as `1h30m` or `1.5s`; `0` alone needs no
/// unit. Negative durations are refused (none of these settings means anything by one), as is
/// one Go could not hold. Exact integer arithmetic: `0.1s` is 100ms, not a float's nearest.
/// Messages do not repeat the input (the caller shows it once).
pub fn parse(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let text = text.strip_prefix('+').unwrap_or(text);
    if text.starts_with('-') {
        return Err("negative durations are not allowed".into());
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_digits, after) = rest.split_at(int_len);
        let (frac_digits, after) = match after.strip_prefix('.') {
            Some(f) => f.split_at(f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len())),
            None => ("", after),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(
                "expected a number before each unit (such as 90s, 1.5h or 1h30m); a unit alone is not a number"
                    .into(),
            );
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(
                    "missing unit: a duration needs a unit (ns, us, ms, s, m or h), such as 90s or 1h30m"
                        .into(),
                )
            }
            u => {
                let shown: String = u.chars().take(8).collect();
                return Err(format!(
                    "unknown unit {shown:?} (use ns, us, ms, s, m or h)"
                ));
            }
        };
        let out_of_range = || "out of range (at most about 2562047h)".to_string();
        let mut whole: u128 = 0;
        for d in int_digits.bytes() {
            whole = whole * 10 + u128::from(d - b'0');
            if whole * per_unit > MAX_NANOS {
                return Err(out_of_range());
            }
        }
        // Digits past the 20th are far below a nanosecond for any unit: dropped, as Go does.
        let (mut frac, mut scale) = (0u128, 1u128);
        for d in frac_digits.bytes().take(20) {
            frac = frac * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        total += whole * per_unit + frac * per_unit / scale;
        if total > MAX_NANOS {
            return Err(out_of_range());
        }
        rest = next;
    }
    // At most i64::MAX: fits a u64.
    Ok(Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert!(parse("10").unwrap_err().contains("missing unit"));
        assert!(parse("5d").unwrap_err().contains("unknown unit"));
        assert_eq!(parse("0.1s").unwrap(), Duration::from_millis(100));
        assert_eq!(parse(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("5.s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse("+1µs").unwrap(), Duration::from_micros(1));
        assert_eq!(parse("0s").unwrap(), Duration::ZERO);
        assert!(parse(".s").unwrap_err().contains("expected a number"));
        assert!(parse("-1s").unwrap_err().contains("negative"));
        assert_eq!(
            parse("2562047h47m16.854775807s").unwrap(),
            Duration::from_nanos(i64::MAX as u64)
        );
        assert!(parse("2562048h").unwrap_err().contains("out of range"));
        assert!(parse(&format!("{}s", "9".repeat(40)))
            .unwrap_err()
            .contains("out of range"));
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Text that looks like durations, out-of-range numbers included.
            #[test]
            fn duration_like_text_stays_in_range(
                s in "[+-]?([0-9]{0,25}(\\.[0-9]{0,25})?(ns|us|µs|ms|s|m|h|d|)){1,6}"
            ) {
                if let Ok(d) = parse(&s) {
                    prop_assert!(d.as_nanos() <= i64::MAX as u128);
                }
            }

            /// Whole units add up exactly, as in Go.
            #[test]
            fn whole_units_add_up(h in 0u64..100_000, m in 0u64..60, sec in 0u64..60, ms in 0u64..1000, ns in 0u64..1_000_000) {
                let text = format!("{h}h{m}m{sec}s{ms}ms{ns}ns");
                let expected = Duration::from_secs((h * 60 + m) * 60 + sec)
                    + Duration::from_millis(ms)
                    + Duration::from_nanos(ns);
                prop_assert_eq!(parse(&text), Ok(expected));
            }

            /// A fraction is exact to the nanosecond: `1.5s` is 1s and 500ms.
            #[test]
            fn fractions_are_exact(whole in 0u64..10_000, frac in 0u64..1_000_000_000) {
                let text = format!("{whole}.{frac:09}s");
                prop_assert_eq!(
                    parse(&text),
                    Ok(Duration::from_secs(whole) + Duration::from_nanos(frac))
                );
            }
        }
    }
}
