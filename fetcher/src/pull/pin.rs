//! Pins: what a pull promises about the module before it has it. A `--sha256` names the
//! module's bytes, or for `oci://` the image manifest or the image index (Istio settled on the
//! manifest digest, #37565; the module's own sha256 and an index digest are accepted too so a
//! pin copied from any of the three places works). A digest in the URL (`@sha256:`) names the
//! manifest or the index. Every rule about which pin matched what lives here.

use crate::digest::{Digest, Sha256};
use crate::error::FetchError;
use crate::oci::manifest::ImageDigests;
use crate::reference::Source;
use crate::store::index::Index;

/// Which pin a module was matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PinMatch {
    ModuleSha256,
    ManifestDigest,
    IndexDigest,
}

/// How `pin` relates to `image`, if it names it.
fn names(image: &ImageDigests, pin: Digest) -> Option<PinMatch> {
    if pin == image.manifest {
        Some(PinMatch::ManifestDigest)
    } else if Some(pin) == image.index {
        Some(PinMatch::IndexDigest)
    } else {
        None
    }
}

/// The pins of one pull.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pins {
    /// `--sha256` (`PullRequest::sha256`).
    requested: Option<Sha256>,
    /// `oci://…@sha256:…`.
    in_url: Option<Digest>,
}

/// The pins checked against what a source resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// The sha256 the module's bytes must have, when a pin names the bytes.
    pub module: Option<Sha256>,
    /// What the pull reports as matched.
    pub matched: Option<PinMatch>,
}

impl Pins {
    pub fn new(requested: Option<Sha256>, source: &Source) -> Self {
        Self {
            requested,
            in_url: source.pinned_digest().map(Digest),
        }
    }

    /// A pinned pull never needs to ask whether a tag moved: `IfNotPresent` applies.
    pub fn any(&self) -> bool {
        self.requested.is_some() || self.in_url.is_some()
    }

    /// The cached modules the pins may name, best first: the module's sha256 (its file may
    /// be there whatever the index says), then the modules the index recorded under a manifest
    /// or index digest. The caller takes the first whose file is intact.
    pub fn candidates(&self, idx: &Index) -> Vec<(Sha256, PinMatch)> {
        let by_digest = |digest: Digest| {
            idx.modules.iter().find_map(|(sha, m)| {
                if m.manifest_digest == Some(digest) {
                    Some((*sha, PinMatch::ManifestDigest))
                } else if m.index_digest == Some(digest) {
                    Some((*sha, PinMatch::IndexDigest))
                } else {
                    None
                }
            })
        };
        let mut found = Vec::new();
        if let Some(sha) = self.requested {
            found.push((sha, PinMatch::ModuleSha256));
            found.extend(by_digest(Digest(sha)));
        }
        if let Some(d) = self.in_url {
            found.extend(by_digest(d));
        }
        found
    }

    /// The pins against what the source resolved (`image` is `None` for file and HTTP). A URL
    /// digest that names neither the manifest nor the index is a mismatch; a `--sha256` that
    /// names neither stays a pin on the module's bytes, checked when they are committed.
    pub fn check(&self, image: Option<&ImageDigests>) -> Result<Checked, FetchError> {
        let by_digest = |pin: Sha256| image.and_then(|i| names(i, Digest(pin)));
        let requested_digest = self.requested.and_then(by_digest);
        let url_match = match (self.in_url, image) {
            (Some(d), Some(image)) => {
                Some(names(image, d).ok_or_else(|| FetchError::ChecksumMismatch {
                    expected: d.to_string(),
                    actual: image.manifest.to_string(),
                })?)
            }
            _ => None,
        };
        let module = if requested_digest.is_some() {
            None
        } else {
            self.requested
        };
        Ok(Checked {
            module,
            matched: requested_digest
                .or(module.map(|_| PinMatch::ModuleSha256))
                .or(url_match),
        })
    }
}

impl Checked {
    /// Whether a cached module with sha256 `sha` satisfies these pins.
    pub fn accepts(&self, sha: &Sha256) -> bool {
        self.module.is_none_or(|m| m == *sha)
    }

    /// A pin on the module's bytes against the sha256 the manifest gives them (`None` when
    /// the module is packed inside a layer and only its download can tell): a wrong pin fails
    /// here, after the manifest and before any layer, as Istio's agent stops at the manifest.
    pub fn check_declared(&self, declared: Option<Sha256>) -> Result<(), FetchError> {
        match (self.module, declared) {
            (Some(pin), Some(declared)) if pin != declared => Err(FetchError::ChecksumMismatch {
                expected: pin.hex(),
                actual: declared.hex(),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::index::ModuleEntry;

    fn sha(n: u8) -> Sha256 {
        Sha256([n; 32])
    }

    fn oci(url: &str) -> Source {
        Source::parse(url).unwrap()
    }

    fn image(manifest: u8, index: Option<u8>) -> ImageDigests {
        ImageDigests {
            manifest: Digest(sha(manifest)),
            index: index.map(|i| Digest(sha(i))),
        }
    }

    #[test]
    fn a_requested_pin_may_name_the_module_the_manifest_or_the_index() {
        let untagged = oci("oci://r/a:1");
        let img = image(2, Some(3));
        for (pin, module, matched) in [
            (1, Some(sha(1)), PinMatch::ModuleSha256),
            (2, None, PinMatch::ManifestDigest),
            (3, None, PinMatch::IndexDigest),
        ] {
            let checked = Pins::new(Some(sha(pin)), &untagged)
                .check(Some(&img))
                .unwrap();
            assert_eq!(
                checked,
                Checked {
                    module,
                    matched: Some(matched)
                },
                "pin {pin}"
            );
        }
        let http = Source::parse("https://h/m.wasm").unwrap();
        let checked = Pins::new(Some(sha(2)), &http).check(None).unwrap();
        assert_eq!(
            checked.module,
            Some(sha(2)),
            "without an image, a pin is the bytes'"
        );
        assert!(!checked.accepts(&sha(1)) && checked.accepts(&sha(2)));
    }

    #[test]
    fn a_module_pin_is_checked_against_what_the_manifest_declares() {
        let checked = Pins::new(Some(sha(1)), &oci("oci://r/a:1"))
            .check(Some(&image(2, None)))
            .unwrap();
        assert!(checked.check_declared(Some(sha(1))).is_ok());
        assert!(
            checked.check_declared(None).is_ok(),
            "only the bytes can tell"
        );
        let e = checked.check_declared(Some(sha(4))).unwrap_err();
        assert!(matches!(e, FetchError::ChecksumMismatch { .. }), "{e}");
        let by_manifest = Pins::new(Some(sha(2)), &oci("oci://r/a:1"))
            .check(Some(&image(2, None)))
            .unwrap();
        assert!(by_manifest.check_declared(Some(sha(4))).is_ok());
    }

    #[test]
    fn a_url_digest_must_name_the_manifest_or_the_index() {
        let hex = sha(3).hex();
        let pinned = oci(&format!("oci://r/a@sha256:{hex}"));
        let pins = Pins::new(None, &pinned);
        assert!(pins.any());
        let checked = pins.check(Some(&image(2, Some(3)))).unwrap();
        assert_eq!(checked.matched, Some(PinMatch::IndexDigest));
        assert_eq!(checked.module, None);
        let e = pins.check(Some(&image(2, None))).unwrap_err();
        assert!(matches!(e, FetchError::ChecksumMismatch { .. }), "{e}");
    }

    #[test]
    fn cached_modules_are_named_by_any_pin() {
        let mut idx = Index::default();
        let entry = |manifest: Option<u8>, index: Option<u8>| ModuleEntry {
            source: String::new(),
            manifest_digest: manifest.map(|m| Digest(sha(m))),
            index_digest: index.map(|i| Digest(sha(i))),
            size: 0,
            modified_ns: None,
            pulled_at: 0,
            last_used: 0,
            image_volume_copy: false,
            dynamic_module: None,
            signatures: vec![],
        };
        idx.modules.insert(sha(1), entry(Some(2), Some(3)));
        let plain = oci("oci://r/a:1");
        let found = |pin: u8| Pins::new(Some(sha(pin)), &plain).candidates(&idx);
        assert_eq!(found(1), [(sha(1), PinMatch::ModuleSha256)]);
        assert_eq!(
            found(2),
            [
                (sha(2), PinMatch::ModuleSha256),
                (sha(1), PinMatch::ManifestDigest)
            ]
        );
        assert_eq!(found(3)[1], (sha(1), PinMatch::IndexDigest));
        assert_eq!(found(4), [(sha(4), PinMatch::ModuleSha256)]);
        let in_url = oci(&format!("oci://r/a@sha256:{}", sha(2).hex()));
        assert_eq!(
            Pins::new(None, &in_url).candidates(&idx),
            [(sha(1), PinMatch::ManifestDigest)]
        );
        assert!(Pins::new(None, &plain).candidates(&idx).is_empty());
    }
}
