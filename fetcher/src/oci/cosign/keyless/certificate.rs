//! A Fulcio signing certificate, checked offline at the time the log vouches for: its chain to
//! a certificate authority of the trusted root (built and checked by rustls-webpki, every
//! certificate valid at that time, code signing), its embedded SCT against a CT log of the
//! root (RFC 6962's precertificate form), and the identity it certifies (the subject
//! alternative name and Fulcio's OIDC-issuer extension).

use std::time::Duration;

use rustls::pki_types::{CertificateDer, UnixTime};
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::sct::{HashAlgorithm, SignedCertificateTimestampList, Version};
use x509_cert::ext::pkix::{KeyUsage, KeyUsages, SubjectAltName};
use x509_cert::Certificate;

use crate::keyless::{Hash, TrustedRoot};
use crate::shown::shown;

/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), the OID's content octets as webpki takes them.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
const SCT_LIST: &str = "1.3.6.1.4.1.11129.2.4.2";
/// Fulcio's OIDC issuer: v1 (raw bytes, deprecated and still written) and v2 (DER UTF8String).
const ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
const ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
/// Fulcio's OtherName SAN (a username identity).
const OTHER_NAME_SAN: &str = "1.3.6.1.4.1.57264.1.7";
/// A leaf carries one or a few SCTs.
const SCT_LIMIT: usize = 8;

const ALGORITHMS: &[&dyn rustls::pki_types::SignatureVerificationAlgorithm] = &[
    webpki::ring::ECDSA_P256_SHA256,
    webpki::ring::ECDSA_P256_SHA384,
    webpki::ring::ECDSA_P384_SHA256,
    webpki::ring::ECDSA_P384_SHA384,
    webpki::ring::ED25519,
    webpki::ring::RSA_PKCS1_2048_8192_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA384,
    webpki::ring::RSA_PKCS1_2048_8192_SHA512,
];

/// A leaf certificate, parsed.
pub(in crate::oci::cosign) struct Leaf<'a> {
    der: &'a [u8],
    cert: Certificate,
}

/// Who a certificate certifies.
pub(in crate::oci::cosign) struct Certified {
    pub subjects: Vec<String>,
    pub issuer: Option<String>,
}

fn unix(t: &x509_cert::time::Time) -> i64 {
    i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

impl<'a> Leaf<'a> {
    pub fn parse(der: &'a [u8]) -> Result<Self, String> {
        let cert = Certificate::from_der(der)
            .map_err(|e| format!("the signing certificate is not a DER X.509 certificate ({e})"))?;
        Ok(Self { der, cert })
    }

    /// The key the signature must verify with: what Fulcio certifies for cosign is an
    /// ephemeral ECDSA P-256 key.
    pub fn key(&self) -> Result<p256::ecdsa::VerifyingKey, String> {
        use p256::pkcs8::DecodePublicKey;
        let spki = self
            .cert
            .tbs_certificate
            .subject_public_key_info
            .to_der()
            .map_err(|e| e.to_string())?;
        p256::ecdsa::VerifyingKey::from_public_key_der(&spki).map_err(|_| {
            "the signing certificate's key is not ECDSA P-256 (the key cosign signs keyless with); other leaf keys are not verified".to_string()
        })
    }

    fn extension(&self, oid: &str) -> Option<&x509_cert::ext::Extension> {
        self.cert
            .tbs_certificate
            .extensions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|e| e.extn_id.to_string() == oid)
    }

    /// The chain to an authority of `root` valid at `time`, and the SCT; returns nothing but
    /// a reason when either fails.
    pub fn check_trust(&self, root: &TrustedRoot, time: i64) -> Result<(), String> {
        let validity = &self.cert.tbs_certificate.validity;
        let (from, to) = (unix(&validity.not_before), unix(&validity.not_after));
        if !(from <= time && time <= to) {
            return Err(format!(
                "the signing certificate was not valid when the log recorded the signature (logged at {time}, valid {from} to {to}, Unix seconds)"
            ));
        }
        self.check_key_usage()?;
        let issuer = self.check_chain(root, time)?;
        self.check_sct(root, &issuer)
    }

    fn check_key_usage(&self) -> Result<(), String> {
        let ku = self
            .extension("2.5.29.15")
            .and_then(|e| KeyUsage::from_der(e.extn_value.as_bytes()).ok());
        if ku.is_some_and(|k| k.0.contains(KeyUsages::DigitalSignature)) {
            Ok(())
        } else {
            Err("the signing certificate's key usage lacks digitalSignature".into())
        }
    }

    /// Returns the issuing certificate's DER SubjectPublicKeyInfo (the SCT names its hash).
    fn check_chain(&self, root: &TrustedRoot, time: i64) -> Result<Vec<u8>, String> {
        let leaf = CertificateDer::from(self.der);
        let ee = webpki::EndEntityCert::try_from(&leaf).map_err(|e| {
            format!("the signing certificate is not one a chain can be built from ({e})")
        })?;
        let at = UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(time).unwrap_or(0)));
        let mut reasons = Vec::new();
        for ca in root.authorities.iter() {
            if !ca.window.contains(time) {
                reasons.push(format!("{} was not trusted at that time", ca.uri));
                continue;
            }
            let Some((anchor, intermediates)) = ca.chain.split_last() else {
                continue;
            };
            let anchor_der = CertificateDer::from(anchor.as_slice());
            let Ok(anchor) = webpki::anchor_from_trusted_cert(&anchor_der) else {
                reasons.push(format!("{}'s root is not a usable trust anchor", ca.uri));
                continue;
            };
            let intermediates: Vec<CertificateDer<'_>> = intermediates
                .iter()
                .map(|c| CertificateDer::from(c.as_slice()))
                .collect();
            match ee.verify_for_usage(
                ALGORITHMS,
                &[anchor],
                &intermediates,
                at,
                webpki::KeyUsage::required(CODE_SIGNING),
                None,
                None,
            ) {
                Ok(_) => return self.issuer_key(&ca.chain),
                Err(e) => reasons.push(format!(
                    "{}: {e:?}",
                    if ca.uri.is_empty() { "a CA" } else { &ca.uri }
                )),
            }
        }
        Err(format!(
            "the signing certificate does not chain to a certificate authority of the trusted root at the time of signing ({})",
            shown(&reasons.join("; "))
        ))
    }

    /// The SPKI of the chain's certificate named as the leaf's issuer.
    fn issuer_key(&self, chain: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let issuer = &self.cert.tbs_certificate.issuer;
        chain
            .iter()
            .filter_map(|c| Certificate::from_der(c).ok())
            .find(|c| &c.tbs_certificate.subject == issuer)
            .and_then(|c| c.tbs_certificate.subject_public_key_info.to_der().ok())
            .ok_or_else(|| {
                "the signing certificate's issuer is not in the chain that verified it".into()
            })
    }

    /// One embedded SCT must verify with a CT log of the root that was valid when it was
    /// issued, over the precertificate (the leaf's TBS without the SCT list).
    fn check_sct(&self, root: &TrustedRoot, issuer_spki: &[u8]) -> Result<(), String> {
        let ext = self.extension(SCT_LIST).ok_or(
            "the signing certificate carries no SCT: it was not logged to certificate transparency",
        )?;
        let list = SignedCertificateTimestampList::from_der(ext.extn_value.as_bytes())
            .map_err(|e| format!("the certificate's SCT list is not DER ({e})"))?;
        let scts = list
            .parse_timestamps()
            .map_err(|e| format!("the certificate's SCT list does not parse ({e:?})"))?;
        if scts.is_empty() || scts.len() > SCT_LIMIT {
            return Err(format!(
                "the certificate carries {} SCTs, where 1 to {SCT_LIMIT} are read",
                scts.len()
            ));
        }
        let mut tbs = self.cert.tbs_certificate.clone();
        if let Some(exts) = tbs.extensions.as_mut() {
            exts.retain(|e| e.extn_id.to_string() != SCT_LIST);
        }
        let tbs = tbs.to_der().map_err(|e| e.to_string())?;
        let issuer_hash = crate::digest::Sha256::of(issuer_spki).0;
        for sct in &scts {
            let Ok(sct) = sct.parse_timestamp() else {
                continue;
            };
            let Some(log) = root.ctlogs.iter().find(|l| l.id == sct.log_id.key_id) else {
                continue;
            };
            let secs = i64::try_from(sct.timestamp / 1000).unwrap_or(i64::MAX);
            if sct.version != Version::V1 || !log.window.contains(secs) {
                continue;
            }
            let hash = match sct.signature.algorithm.hash {
                HashAlgorithm::Sha256 => Hash::Sha256,
                HashAlgorithm::Sha384 => Hash::Sha384,
                _ => continue,
            };
            let Ok(tbs_len) = u32::try_from(tbs.len()) else {
                continue;
            };
            let ext = sct.extensions.as_slice();
            let mut signed = Vec::with_capacity(tbs.len() + ext.len() + 64);
            signed.extend_from_slice(&[0, 0]); // v1, certificate_timestamp
            signed.extend_from_slice(&sct.timestamp.to_be_bytes());
            signed.extend_from_slice(&[0, 1]); // precert_entry
            signed.extend_from_slice(&issuer_hash);
            signed.extend_from_slice(&tbs_len.to_be_bytes()[1..]);
            signed.extend_from_slice(&tbs);
            signed.extend_from_slice(&u16::try_from(ext.len()).unwrap_or(u16::MAX).to_be_bytes());
            signed.extend_from_slice(ext);
            if log
                .key
                .verifies(hash, &signed, sct.signature.signature.as_slice())
            {
                return Ok(());
            }
        }
        Err(
            "no SCT in the signing certificate verifies with a CT log key of the trusted root"
                .into(),
        )
    }

    /// The subject alternative names and the OIDC issuer. Both issuer extensions, when
    /// present, must agree: which one a verifier reads differs between clients.
    pub fn certified(&self) -> Result<Certified, String> {
        let mut subjects = Vec::new();
        if let Some(ext) = self.extension("2.5.29.17") {
            let san = SubjectAltName::from_der(ext.extn_value.as_bytes()).map_err(|e| {
                format!("the certificate's subject alternative name is not DER ({e})")
            })?;
            for name in san.0 {
                match name {
                    GeneralName::Rfc822Name(n) => subjects.push(n.as_str().to_string()),
                    GeneralName::UniformResourceIdentifier(u) => {
                        subjects.push(u.as_str().to_string())
                    }
                    GeneralName::OtherName(o) if o.type_id.to_string() == OTHER_NAME_SAN => {
                        if let Ok(s) = o
                            .value
                            .decode_as::<x509_cert::der::asn1::Utf8StringRef<'_>>()
                        {
                            subjects.push(s.as_str().to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        let v1 = self
            .extension(ISSUER_V1)
            .map(|e| String::from_utf8_lossy(e.extn_value.as_bytes()).into_owned());
        let v2 = match self.extension(ISSUER_V2) {
            Some(e) => Some(
                x509_cert::der::asn1::Utf8StringRef::from_der(e.extn_value.as_bytes())
                    .map(|s| s.as_str().to_string())
                    .map_err(|_| {
                        "the certificate's OIDC issuer (1.3.6.1.4.1.57264.1.8) is not a UTF8String"
                            .to_string()
                    })?,
            ),
            None => None,
        };
        let issuer = match (v1, v2) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "the certificate names two OIDC issuers ({:?} and {:?})",
                    shown(&a),
                    shown(&b)
                ))
            }
            (a, b) => b.or(a),
        };
        Ok(Certified { subjects, issuer })
    }
}
