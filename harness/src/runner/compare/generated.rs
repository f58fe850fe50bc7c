//! Values Envoy makes up, which no harness can repeat: compared as "generated", not as a
//! difference.
//!
//! Envoy's connection manager gives a request without an `x-request-id` a random UUID
//! (version 4); the harness gives it a numbered one of the same shape. A guest that logs its
//! request headers (or the `request.id` property) writes it, so in a step whose request
//! carries no `x-request-id` every version-4 UUID in a line, on both sides, reads as
//! [`GENERATED_REQUEST_ID`] before the lines are compared. An id the client sends Envoy 1.40
//! keeps (the harness refuses the fields that would make it replace one:
//! `use_remote_address`, `preserve_external_request_id`, `generate_request_id`), so it is
//! compared as it is.
//!
//! Envoy's router measures how long the upstream took (`x-envoy-upstream-service-time`, in
//! milliseconds); the harness's upstream takes no time. A line that writes the header's value
//! (after its name, as a guest logging its response headers does) compares it as
//! [`MEASURED`].

use crate::engine::host::LogRecord;
use crate::envoy::http::{headers, Request};
use crate::runner::real_envoy::log::EnvoyRecord;

/// What a generated request id reads as in a compared line.
pub const GENERATED_REQUEST_ID: &str = "<generated x-request-id>";

const UUID_LEN: usize = 36;

/// Whether Envoy makes up an `x-request-id` for `request`.
pub fn envoy_generates_request_id(request: &Request) -> bool {
    headers::get(&request.headers, "x-request-id").is_none()
}

/// What a measured service time reads as in a compared line.
pub const MEASURED: &str = "<measured>";

const SERVICE_TIME: &str = "x-envoy-upstream-service-time";

/// The step's lines with every measured service time masked, and with `request_ids` every
/// generated request id too, both sides alike.
pub fn mask_lines(
    harness: &[LogRecord],
    envoy: &[EnvoyRecord],
    request_ids: bool,
) -> (Vec<LogRecord>, Vec<EnvoyRecord>) {
    let masked = |text: &str| {
        let text = mask_service_time(text);
        if request_ids {
            mask(&text)
        } else {
            text
        }
    };
    let harness = harness
        .iter()
        .map(|r| LogRecord {
            message: masked(&r.message),
            ..r.clone()
        })
        .collect();
    let envoy = envoy
        .iter()
        .map(|r| EnvoyRecord {
            text: masked(&r.text),
            ..r.clone()
        })
        .collect();
    (harness, envoy)
}

/// `text` with the digits that follow each `x-envoy-upstream-service-time` (past what
/// separates a name from its value: `: `, `=`, quotes) replaced by [`MEASURED`].
fn mask_service_time(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(SERVICE_TIME) {
        let after = at + SERVICE_TIME.len();
        out.push_str(&rest[..after]);
        rest = &rest[after..];
        let gap = rest
            .find(|c: char| !matches!(c, ':' | '=' | ' ' | '"' | '\'' | '\0' | '\t'))
            .unwrap_or(rest.len());
        let digits = rest[gap..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - gap);
        out.push_str(&rest[..gap]);
        if digits > 0 {
            out.push_str(MEASURED);
        }
        rest = &rest[gap + digits..];
    }
    out.push_str(rest);
    out
}

/// `text` with each version-4 UUID (`xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx`, lower-case
/// hex, as Envoy's request id extension and the harness write it) replaced.
fn mask(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i + UUID_LEN <= bytes.len() {
        if is_uuid_v4(&bytes[i..i + UUID_LEN]) {
            out.push_str(&text[copied..i]);
            out.push_str(GENERATED_REQUEST_ID);
            i += UUID_LEN;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

fn is_uuid_v4(b: &[u8]) -> bool {
    let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    b.iter().enumerate().all(|(i, &c)| match i {
        8 | 13 | 18 | 23 => c == b'-',
        14 => c == b'4',
        19 => matches!(c, b'8' | b'9' | b'a' | b'b'),
        _ => hex(c),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_and_the_harnesss_ids_read_alike() {
        let envoy = mask("request header x-request-id: 3f1c2a9e-51b7-4c0d-9e2f-6a7b8c9d0e1f");
        let harness = mask("request header x-request-id: 00005eed-0000-4000-8000-000000000001");
        assert_eq!(envoy, harness);
        assert_eq!(
            envoy,
            format!("request header x-request-id: {GENERATED_REQUEST_ID}")
        );
    }

    #[test]
    fn measured_service_times_read_alike() {
        let harness = "#2 <- x-envoy-upstream-service-time: 0 and x-envoy-upstream-service-time=0";
        let envoy = "#2 <- x-envoy-upstream-service-time: 13 and x-envoy-upstream-service-time=2";
        assert_eq!(mask_service_time(harness), mask_service_time(envoy));
        assert_eq!(
            mask_service_time(envoy),
            format!("#2 <- x-envoy-upstream-service-time: {MEASURED} and x-envoy-upstream-service-time={MEASURED}")
        );
        // No value after the name: nothing to mask.
        for text in [
            "x-envoy-upstream-service-time",
            "x-envoy-upstream-service-time: none",
        ] {
            assert_eq!(mask_service_time(text), text);
        }
    }

    #[test]
    fn other_values_stay() {
        for text in [
            "client-chosen-id",
            "3f1c2a9e-51b7-1c0d-9e2f-6a7b8c9d0e1f",
            "3F1C2A9E-51B7-4C0D-9E2F-6A7B8C9D0E1F",
            "3f1c2a9e-51b7-4c0d-9e2f-6a7b8c9d0e1",
            "é-multibyte text around 😀 stays whole",
        ] {
            assert_eq!(mask(text), text);
        }
    }
}
