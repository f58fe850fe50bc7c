//! Keyless verification against a real `docker-registry`, offline: a private Sigstore of the
//! test's own (testdata/sigstore/private_sigstore.py: a Fulcio CA, a CT log key and a Rekor
//! key, in Python with `cryptography`, independent of the fetcher) signs one module's digest
//! in every way and every broken way. Each signature is attached where cosign keeps it: a DSSE
//! bundle listed by the referrers API and by the fallback tag, a message-signature bundle by
//! the API, cosign 2's legacy annotations under the `.sig` tag and as a referrer.
//! `wasm-fetcher pull --trusted-root … --certificate-identity … --certificate-oidc-issuer …`
//! gives its verdict, sigstore-python (testdata/sigstore/reference_verify.py) given the same
//! trusted root gives its own, and both equal the expected one.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::Value;

use crate::attach::{Attach, Store, BUNDLE, LEGACY_TYPE, SIMPLE_SIGNING};
use crate::oci_registry::Registry;
use crate::referrers_front::Front;
use crate::support::*;

use crate::private_sigstore::{PrivateSigstore, IDENTITY, ISSUER};

/// The storage × format combinations cosign writes: cosign 3's DSSE bundle as a referrer
/// (listed by the API, or by the fallback tag), a message-signature bundle, cosign 2's legacy
/// signature under `.sig`, and the legacy signature as a referrer (cosign 3 with
/// `--new-bundle-format=false --registry-referrers-mode=oci-1-1`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Combo {
    DsseApi,
    DsseTag,
    MessageApi,
    LegacySig,
    LegacyApi,
}

impl Combo {
    const ALL: [Combo; 5] = [
        Combo::DsseApi,
        Combo::DsseTag,
        Combo::MessageApi,
        Combo::LegacySig,
        Combo::LegacyApi,
    ];

    /// `private_sigstore.py`'s format.
    fn signed(self) -> &'static str {
        match self {
            Combo::DsseApi | Combo::DsseTag => "dsse",
            Combo::MessageApi => "message",
            Combo::LegacySig | Combo::LegacyApi => "legacy",
        }
    }

    fn store(self) -> Store {
        match self {
            Combo::DsseApi | Combo::MessageApi | Combo::LegacyApi => Store::Api,
            Combo::DsseTag => Store::Tag,
            Combo::LegacySig => Store::SigTag,
        }
    }

    /// What `pull --json` calls the format.
    fn format(self) -> &'static str {
        match self {
            Combo::DsseApi | Combo::DsseTag => "dsse-bundle",
            Combo::MessageApi => "message-bundle",
            Combo::LegacySig | Combo::LegacyApi => "simple-signing",
        }
    }
}

/// How a certificate's identity or issuer is matched.
#[derive(Clone, Copy, Debug)]
enum Match {
    Exact(&'static str),
    Regexp(&'static str),
}

/// The policy a pull verifies with.
#[derive(Clone, Copy, Debug)]
struct Policy {
    identity: Match,
    issuer: Match,
}

const SIGNER: Policy = Policy {
    identity: Match::Exact(IDENTITY),
    issuer: Match::Exact(ISSUER),
};

impl Policy {
    fn args(&self, trusted_root: &Path) -> Vec<String> {
        let mut args = vec![
            "--trusted-root".to_string(),
            trusted_root.to_str().unwrap().to_string(),
        ];
        for (m, flag) in [
            (self.identity, "--certificate-identity"),
            (self.issuer, "--certificate-oidc-issuer"),
        ] {
            match m {
                Match::Exact(v) => args.extend([flag.to_string(), v.to_string()]),
                Match::Regexp(v) => args.extend([format!("{flag}-regexp"), v.to_string()]),
            }
        }
        args
    }

    /// The exact (identity, issuer) for the reference, which has no regular expressions.
    fn exact(&self) -> Option<(&'static str, &'static str)> {
        match (self.identity, self.issuer) {
            (Match::Exact(i), Match::Exact(s)) => Some((i, s)),
            _ => None,
        }
    }
}

/// Words the fetcher's refusal of each case must hold: kept here, in one place, to follow
/// the wording of the errors.
fn refusal_words(case: &str) -> &'static str {
    match case {
        "expired-outside" | "untrusted-ca" => "certificate",
        "tampered-payload" => "signature",
        "other-digest" => "another image",
        "no-sct" | "forged-sct" => "SCT",
        "no-tlog" | "forged-set" | "forged-proof" | "no-proof" | "no-set" => "transparency log",
        "other-identity" | "identity-regexp-substring" => "identity",
        "other-issuer" | "issuer-regexp-substring" => "issuer",
        "lying-type" => "signature",
        _ => panic!("no refusal words for {case}"),
    }
}

/// One pull to check: a signature (`signed`, a case of private_sigstore.py) in a repository,
/// pulled with `policy`.
struct Row {
    combo: Combo,
    /// The name in the table (the signed case, or a policy case on the good signature).
    name: &'static str,
    signed: &'static str,
    policy: Policy,
    /// Stored as a referrer whose manifest says it is a legacy signature while its layer is a
    /// bundle (the listing says bundle).
    lying: bool,
    verifies: bool,
}

/// Every case of private_sigstore.py and whether it verifies; legacy annotations hold a SET
/// and no inclusion proof, so the proof's cases are the bundles' only.
const SIGNED: [(&str, bool, bool); 13] = [
    ("good", true, true),
    ("expired-inside", true, true),
    ("expired-outside", false, true),
    ("tampered-payload", false, true),
    ("other-digest", false, true),
    ("no-sct", false, true),
    ("forged-sct", false, true),
    ("no-tlog", false, true),
    ("forged-set", false, true),
    ("forged-proof", false, false),
    ("no-proof", false, false),
    ("no-set", false, false),
    ("untrusted-ca", false, true),
];

/// The policy cases, all on the good signature.
const POLICIES: [(&str, Policy, bool); 6] = [
    (
        "other-identity",
        Policy {
            identity: Match::Exact("other@example.com"),
            issuer: Match::Exact(ISSUER),
        },
        false,
    ),
    (
        "other-issuer",
        Policy {
            identity: Match::Exact(IDENTITY),
            issuer: Match::Exact("https://other.example"),
        },
        false,
    ),
    (
        "identity-regexp",
        Policy {
            identity: Match::Regexp(r".*@example\.com"),
            issuer: Match::Exact(ISSUER),
        },
        true,
    ),
    (
        // A substring of the identity: an unanchored search would take it.
        "identity-regexp-substring",
        Policy {
            identity: Match::Regexp(r"signer@example"),
            issuer: Match::Exact(ISSUER),
        },
        false,
    ),
    (
        "issuer-regexp",
        Policy {
            identity: Match::Exact(IDENTITY),
            issuer: Match::Regexp(r"https://issuer\.[a-z]+"),
        },
        true,
    ),
    (
        "issuer-regexp-substring",
        Policy {
            identity: Match::Exact(IDENTITY),
            issuer: Match::Regexp(r"issuer\.example"),
        },
        false,
    ),
];

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for combo in Combo::ALL {
        for (case, verifies, in_legacy) in SIGNED {
            if combo.signed() == "legacy" && !in_legacy {
                continue;
            }
            rows.push(Row {
                combo,
                name: case,
                signed: case,
                policy: SIGNER,
                lying: false,
                verifies,
            });
        }
        for (name, policy, verifies) in POLICIES {
            rows.push(Row {
                combo,
                name,
                signed: "good",
                policy,
                lying: false,
                verifies,
            });
        }
        if matches!(combo, Combo::DsseApi | Combo::DsseTag) {
            rows.push(Row {
                combo,
                name: "lying-type",
                signed: "good",
                policy: SIGNER,
                lying: true,
                verifies: false,
            });
        }
    }
    rows
}

/// Attaches the signature in `file` (private_sigstore.py's output) to `subject` in `repo`.
fn attach(host: &str, repo: &str, subject: &str, combo: Combo, lying: bool, file: &Path) {
    let bytes = std::fs::read(file).unwrap();
    let legacy = combo.signed() == "legacy";
    let (blob, layer_type, annotations) = if legacy {
        let signed: Value = serde_json::from_slice(&bytes).unwrap();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(signed["payload"].as_str().unwrap())
            .unwrap();
        (payload, SIMPLE_SIGNING, signed["annotations"].clone())
    } else {
        (bytes, BUNDLE, Value::Null)
    };
    Attach {
        host,
        repo,
        subject,
        manifest_type: if lying || legacy { LEGACY_TYPE } else { BUNDLE },
        listed_type: if legacy { LEGACY_TYPE } else { BUNDLE },
        layer_type,
        annotations,
    }
    .push(combo.store(), &blob);
}

/// What the fetcher says about pulling `repo:1` from `host` with `policy`: the JSON on
/// success, the error line otherwise; and what is wrong with how it refused (not exit 1 with
/// one line naming the URL, or something cached).
fn ours(
    host: &str,
    repo: &str,
    root: &Path,
    policy: &Policy,
) -> (Result<Value, String>, Option<String>) {
    let url = format!("oci://{host}/{repo}:1");
    let cache = tempfile::tempdir().unwrap();
    let mut args = policy.args(root);
    args.extend([url.clone(), "--json".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = pull(cache.path(), &args);
    if o.status.success() {
        return (Ok(serde_json::from_slice(&o.stdout).unwrap()), None);
    }
    let err = stderr(&o);
    let cached = files_under(cache.path());
    let shape = if o.status.code() != Some(1) {
        Some(format!("exit {:?}", o.status.code()))
    } else if !err.starts_with(&format!("wasm-fetcher: {url}: "))
        || err.trim_end().lines().count() != 1
    {
        Some("not one line naming the URL".to_string())
    } else if !cached.is_empty() {
        Some(format!("cached {cached:?}"))
    } else {
        None
    };
    (Err(err), shape)
}

/// What is wrong with the fetcher's verdict on `row` (None: it is the expected one).
fn judge(row: &Row, digest: &str, verdict: &Result<Value, String>) -> Option<String> {
    match verdict {
        Ok(_) if !row.verifies => Some("verified, expected a refusal".into()),
        Err(e) if row.verifies => Some(format!("refused, expected to verify: {e}")),
        Ok(v) => {
            let signer = &v["signature"]["signers"][0];
            let key = signer["key"].as_str().unwrap_or_default();
            let fine = signer["format"] == row.combo.format()
                && signer["storage"] == row.combo.store().storage()
                && v["signature"]["digest"] == digest
                && key.starts_with("identity:");
            (!fine).then(|| format!("verified, but reported as {v}"))
        }
        Err(e) => {
            let words = refusal_words(row.name);
            (!e.contains(words)).then(|| format!("refused without the words {words:?}: {e}"))
        }
    }
}

/// private_sigstore.py's output for `row` in `signed`.
fn signed_file(signed: &Path, row: &Row) -> PathBuf {
    signed.join(format!("{}-{}.json", row.combo.signed(), row.signed))
}

/// sigstore-python's verdict on each row it can judge (an exact policy, no lying storage).
fn reference_verdicts(
    sigstore: &PrivateSigstore,
    digest: &str,
    signed: &Path,
    rows: &[Row],
) -> Vec<Option<Result<(), String>>> {
    let judged: Vec<(usize, (PathBuf, &str, &str))> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.lying)
        .filter_map(|(i, r)| {
            let (identity, issuer) = r.policy.exact()?;
            Some((i, (signed_file(signed, r), identity, issuer)))
        })
        .collect();
    let checks: Vec<_> = judged.iter().map(|(_, c)| c.clone()).collect();
    let mut verdicts = vec![None; rows.len()];
    for ((i, _), verdict) in judged.iter().zip(sigstore.reference(digest, &checks)) {
        verdicts[*i] = Some(verdict);
    }
    verdicts
}

/// The referee itself, with no registry and no fetcher: sigstore-python takes the good and
/// expired-inside signatures in every format, and refuses every other case and policy.
#[test]
fn sigstore_python_takes_the_good_signatures_and_refuses_every_bad_one() {
    let sigstore = PrivateSigstore::init();
    let digest = format!("sha256:{}", sha256_hex(b"keyless"));
    let signed = sigstore.sign_all(&digest, "registry.local/keyless");
    let rows = rows();
    let mut judged = 0;
    let mut wrong = Vec::new();
    for (row, verdict) in rows
        .iter()
        .zip(reference_verdicts(&sigstore, &digest, &signed, &rows))
    {
        let Some(verdict) = verdict else { continue };
        judged += 1;
        if verdict.is_ok() != row.verifies {
            wrong.push(format!("{:?} {}: {verdict:?}", row.combo, row.name));
        }
    }
    assert!(judged >= 60, "{judged} rows judged");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn keyless_signatures_in_every_storage_agree_with_sigstore_python() {
    let reg = Registry::start(false);
    let front = Front::start(&reg.host);
    let sigstore = PrivateSigstore::init();
    let anonymous = oci_client::secrets::RegistryAuth::Anonymous;
    // One module, the same digest in every repository: one signing run, one reference run.
    let module = module("keyless");
    let digest = reg.push_module("keyless/probe:1", &module, &anonymous);
    let signed = sigstore.sign_all(&digest, &format!("{}/keyless", reg.host));
    let file = |row: &Row| signed_file(&signed, row);

    let rows = rows();
    let reference = reference_verdicts(&sigstore, &digest, &signed, &rows);

    let mut wrong = Vec::new();
    for (row, reference) in rows.iter().zip(&reference) {
        let label = format!("{:?} {}", row.combo, row.name);
        if let Some(r) = reference {
            if r.is_ok() != row.verifies {
                wrong.push(format!("{label}: sigstore-python says {r:?}"));
            }
        }
        // One repository per signature; the policy cases pull the good one's.
        let repo = format!(
            "keyless/{}-{}",
            format!("{:?}", row.combo).to_lowercase(),
            if row.signed == "good" && !row.lying {
                "good"
            } else {
                row.name
            }
        );
        let host = if row.combo.store() == Store::Api {
            &front.host
        } else {
            &reg.host
        };
        let fresh = row.signed != "good" || row.lying || row.name == "good";
        if fresh {
            reg.push_module(&format!("{repo}:1"), &module, &anonymous);
            attach(host, &repo, &digest, row.combo, row.lying, &file(row));
        }
        let (verdict, shape) = ours(host, &repo, &sigstore.trusted_root(), &row.policy);
        if let Some(w) = judge(row, &digest, &verdict) {
            wrong.push(format!("{label}: {w}"));
        }
        if let Some(s) = shape {
            wrong.push(format!("{label}: a refusal, but {s}: {verdict:?}"));
        }
    }
    assert!(
        rows.len() >= 80,
        "{} rows: every case in every combination",
        rows.len()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} rows wrong:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}

/// A keyless-verified module is remembered with the identity that verified it: a warm pull
/// with the same policy (by flags or by environment) asks the registry nothing and names the
/// identity; another identity is not answered from that memory.
#[test]
fn a_warm_keyless_pull_asks_the_registry_nothing_and_names_the_identity() {
    let reg = Registry::start(false);
    let front = Front::start(&reg.host);
    let sigstore = PrivateSigstore::init();
    let anonymous = oci_client::secrets::RegistryAuth::Anonymous;
    let digest = reg.push_module("warm/keyless:1", &module("warm"), &anonymous);
    let signed = sigstore.sign_all(&digest, &format!("{}/warm/keyless", reg.host));
    attach(
        &front.host,
        "warm/keyless",
        &digest,
        Combo::DsseApi,
        false,
        &signed.join("dsse-good.json"),
    );
    let url = format!("oci://{}/warm/keyless:1", front.host);
    let root = sigstore.trusted_root();
    let mut args = SIGNER.args(&root);
    args.extend([url.clone(), "--json".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cache = tempfile::tempdir().unwrap();

    front.clear();
    let o = pull(cache.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cold: Value = serde_json::from_slice(&o.stdout).unwrap();
    let signer = &cold["signature"]["signers"][0];
    assert_eq!(signer["storage"], "referrers-api", "{cold}");
    assert_eq!(signer["format"], "dsse-bundle", "{cold}");
    let key = signer["key"].as_str().unwrap_or_default();
    let who = signer["identity"].as_str().unwrap_or_default();
    assert!(
        key.starts_with("identity:sha256:") && who.contains(IDENTITY) && who.contains(ISSUER),
        "{cold}"
    );
    // The listing is the one request a signature adds before its referrer and bundle.
    let seen = front.requests("GET /v2/warm/");
    let listings = seen
        .iter()
        .filter(|l| l.contains("/referrers/") || l.contains("sha256-"))
        .count();
    assert_eq!(listings, 1, "{seen:#?}");

    front.clear();
    let o = pull(cache.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let warm: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(warm["from_cache"], true, "{warm}");
    assert_eq!(warm["signature"], cold["signature"]);
    assert_eq!(front.requests(""), Vec::<String>::new());

    // The same policy from the environment.
    let env = [
        ("WASM_TRUSTED_ROOT", root.to_str().unwrap()),
        ("WASM_CERTIFICATE_IDENTITY", IDENTITY),
        ("WASM_CERTIFICATE_OIDC_ISSUER", ISSUER),
    ];
    let o = pull_env(cache.path(), &env, &[&url, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let by_env: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(by_env["signature"], cold["signature"], "{by_env}");
    assert_eq!(front.requests(""), Vec::<String>::new());
    // A --trusted-root flag replaces the environment's root for the environment's identity.
    let elsewhere = PrivateSigstore::init();
    let other_root = elsewhere.trusted_root();
    let moved = [
        ("WASM_TRUSTED_ROOT", other_root.to_str().unwrap()),
        env[1],
        env[2],
    ];
    let flag = ["--trusted-root", root.to_str().unwrap(), &url];
    assert_eq!(pull_env(cache.path(), &moved, &flag).status.code(), Some(0));
    let o = pull_env(cache.path(), &moved, &[&url]);
    assert!(stderr(&o).contains("signature untrusted"), "{}", stderr(&o));

    // Another identity: the registry is asked, and says no.
    let env = [
        ("WASM_TRUSTED_ROOT", root.to_str().unwrap()),
        ("WASM_CERTIFICATE_IDENTITY", "other@example.com"),
        ("WASM_CERTIFICATE_OIDC_ISSUER", ISSUER),
    ];
    let o = pull_env(cache.path(), &env, &[&url]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(refusal_words("other-identity")),
        "{}",
        stderr(&o)
    );
    assert!(!front.requests("GET /v2/warm/").is_empty());
}

/// Per WasmPlugin: `serve --trusted-root` checks each plugin's image against the identity and
/// issuer its annotations name (exact or by regular expression); a plugin whose annotations
/// name another identity gets no module, and the log says why.
#[test]
fn serve_checks_each_wasmplugin_against_its_annotated_identity() {
    let reg = Registry::start(false);
    let front = Front::start(&reg.host);
    let sigstore = PrivateSigstore::init();
    let anonymous = oci_client::secrets::RegistryAuth::Anonymous;
    let digest = reg.push_module("served/keyless:1", &module("served"), &anonymous);
    let signed = sigstore.sign_all(&digest, &format!("{}/served/keyless", reg.host));
    attach(
        &front.host,
        "served/keyless",
        &digest,
        Combo::DsseApi,
        false,
        &signed.join("dsse-good.json"),
    );
    let url = format!("oci://{}/served/keyless:1", front.host);
    let plugin = |name: &str, annotations: &[(&str, &str)]| {
        let lines: String = annotations
            .iter()
            .map(|(k, v)| format!("    wasm-fetcher.dev/{k}: '{v}'\n"))
            .collect();
        format!(
            "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata:\n  name: {name}\n  namespace: test\n  annotations:\n{lines}spec:\n  url: {url}\n"
        )
    };
    let d = crate::serve_support::dirs();
    for (name, annotations) in [
        (
            "exact",
            [
                ("certificate-identity", IDENTITY),
                ("certificate-oidc-issuer", ISSUER),
            ],
        ),
        (
            "regexp",
            [
                ("certificate-identity-regexp", r".*@example\.com"),
                ("certificate-oidc-issuer-regexp", r"https://issuer\..*"),
            ],
        ),
        (
            "other",
            [
                ("certificate-identity", "other@example.com"),
                ("certificate-oidc-issuer", ISSUER),
            ],
        ),
    ] {
        crate::serve_support::write_plugin(
            &d.plugins.join(format!("{name}.yaml")),
            &plugin(name, &annotations),
        );
    }
    let root = sigstore.trusted_root();
    let serve = d.serve(&[], &["--trusted-root", root.to_str().unwrap()]);
    crate::serve_support::wait_for(
        "every plugin converted",
        std::time::Duration::from_secs(30),
        || {
            ["success", "fetch_failure", "unmarshal_failure"]
                .iter()
                .map(|r| serve.metric(&format!("wasm_config_conversion_count{{result=\"{r}\"}}")))
                .sum::<u64>()
                == 3
        },
    );
    for (result, count) in [("success", 2), ("fetch_failure", 1)] {
        let sample = format!("wasm_config_conversion_count{{result=\"{result}\"}}");
        assert_eq!(serve.metric(&sample), count, "{sample}\n{}", serve.log());
    }
    let cached = d.cache.display().to_string();
    let ecds = |name: &str| std::fs::read_to_string(d.ecds.join(format!("test.{name}.yaml")));
    for name in ["exact", "regexp"] {
        let text = ecds(name).unwrap_or_default();
        assert!(text.contains(&cached), "{name}: {text}\n{}", serve.log());
    }
    assert!(
        !ecds("other").unwrap_or_default().contains(&cached),
        "{}",
        serve.log()
    );
    // The refusal is a warning or error about that plugin, in the refusal's words.
    let log = serve.log();
    let refused = log.lines().any(|l| {
        (l.contains("WARN") || l.contains("ERROR"))
            && l.contains("other")
            && l.contains(refusal_words("other-identity"))
    });
    assert!(refused, "{log}");
}
