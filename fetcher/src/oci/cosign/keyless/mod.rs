//! Keyless signatures (an OIDC identity certified by Fulcio, logged in Rekor), checked
//! offline against a pinned trusted root, in the order that keeps unauthenticated data from
//! deciding anything: the signature with the certificate's key (by the caller, which knows
//! the format), then the log entry (which alone authenticates the time of signing), then the
//! certificate at that time (chain, SCT), and last the identity policy.
//!
//! The `sigstore` crate (0.15) was read for this and not used: it verifies neither the SET
//! nor the inclusion proof nor the checkpoint, so its time of signing is unauthenticated; it
//! skips the SCT on the cosign path, drops rotated log keys by today's date, and never checks
//! a CA's validity window. The parts that are standard come from rustls-webpki (the chain),
//! x509-cert (parsing, the SCT list) and ring (log and CT signatures).

mod certificate;
mod tlog;

pub(super) use tlog::{Recorded, TlogEntry};

use crate::keyless::Identity;

pub(super) use certificate::Leaf;

/// Why a keyless signature is refused, before it is worded for its referrer.
pub(super) enum Refused {
    /// The log entry, the chain or the SCT does not check against the trusted root.
    Untrusted(String),
    /// Everything checks, but the certificate names someone else.
    OtherIdentity(String),
}

/// Checks what remains once the signature verified with `leaf`'s key: the log entry records
/// it, the certificate was valid and trusted when it was logged, and names the policy's
/// identity. Returns who signed, in words.
pub(super) fn check(
    policy: &Identity,
    leaf: &Leaf<'_>,
    leaf_der: &[u8],
    entry: &TlogEntry,
    recorded: &Recorded<'_>,
) -> Result<String, Refused> {
    let root = &policy.root;
    let time = entry
        .check(root, recorded, leaf_der)
        .map_err(Refused::Untrusted)?;
    leaf.check_trust(root, time).map_err(Refused::Untrusted)?;
    let certified = leaf.certified().map_err(Refused::Untrusted)?;
    let who = format!(
        "{} issued by {}",
        match certified.subjects.as_slice() {
            [] => "no subject".to_string(),
            names => names
                .iter()
                .map(|n| format!("{:?}", crate::shown::shown(n)))
                .collect::<Vec<_>>()
                .join(", "),
        },
        certified.issuer.as_deref().map_or_else(
            || "no OIDC issuer".to_string(),
            |i| format!("{:?}", crate::shown::shown(i))
        )
    );
    let issuer_ok = certified
        .issuer
        .as_deref()
        .is_some_and(|i| policy.issuer.matches(i));
    let subject_ok = certified.subjects.iter().any(|s| policy.subject.matches(s));
    if issuer_ok && subject_ok {
        Ok(who)
    } else {
        Err(Refused::OtherIdentity(who))
    }
}
