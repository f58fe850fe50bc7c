//! Pull policy: Istio's rules plus Kubernetes' `Never`, decided in one place.
//!
//! Differences from Istio, on purpose: an OCI reference with no tag counts as `latest` (Istio
//! treats only a literal `:latest` so), and `Always` records a resource version only after a
//! successful pull (Istio records it first, so a failed pull is never retried for that version).

use crate::error::SignatureError;
use crate::reference::Source;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum PullPolicy {
    #[cfg_attr(feature = "cli", value(name = "IfNotPresent"))]
    IfNotPresent,
    #[cfg_attr(feature = "cli", value(name = "Always"))]
    Always,
    #[cfg_attr(feature = "cli", value(name = "Never"))]
    Never,
}

/// The policy that applies: `Never` stays `Never`; a pin (a sha256 or a digest in the
/// reference) makes it `IfNotPresent`; without a policy a moving OCI tag means `Always`.
pub fn effective(requested: Option<PullPolicy>, source: &Source, pinned: bool) -> PullPolicy {
    match requested {
        Some(PullPolicy::Never) => PullPolicy::Never,
        _ if pinned => PullPolicy::IfNotPresent,
        Some(p) => p,
        None => match source {
            Source::Oci(r) if r.is_latest() => PullPolicy::Always,
            _ => PullPolicy::IfNotPresent,
        },
    }
}

/// Refuses, before anything is fetched, a pull whose signature could not be checked: a source
/// with no registry to hold one, or a policy that forbids reaching it.
pub fn check_signable(source: &Source, policy: PullPolicy) -> Result<(), SignatureError> {
    match source {
        Source::Oci(_) if policy == PullPolicy::Never => Err(SignatureError::Offline),
        Source::Oci(_) => Ok(()),
        other => Err(SignatureError::NoLocation {
            url: crate::reference::redact_userinfo(&crate::shown::shown(&other.key())),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::PullPolicy::*;
    use super::*;

    fn src(s: &str) -> Source {
        Source::parse(s).unwrap()
    }

    #[test]
    fn istio_rules_plus_never() {
        assert_eq!(effective(None, &src("oci://r/a:1.0"), false), IfNotPresent);
        assert_eq!(effective(None, &src("oci://r/a:latest"), false), Always);
        assert_eq!(
            effective(None, &src("oci://r/a"), false),
            Always,
            "no tag counts as latest"
        );
        assert_eq!(
            effective(None, &src("https://h/a:latest"), false),
            IfNotPresent
        );
        assert_eq!(
            effective(Some(Always), &src("oci://r/a:1.0"), false),
            Always
        );
        assert_eq!(
            effective(Some(Always), &src("oci://r/a:1.0"), true),
            IfNotPresent,
            "a pin wins over Always"
        );
        assert_eq!(
            effective(None, &src("oci://r/a:latest"), true),
            IfNotPresent,
            "a pin wins over latest"
        );
        assert_eq!(
            effective(Some(Never), &src("oci://r/a:latest"), true),
            Never
        );
        assert_eq!(
            effective(Some(IfNotPresent), &src("oci://r/a:latest"), false),
            IfNotPresent
        );
    }
}
