//! `hosts.toml` as containerd reads it, side by side: one hosts directory given to
//! `ctr images pull --hosts-dir` (a real containerd) and to `wasm-fetcher pull
//! --registry-config-dir`, a `--layout compat` image in loopback `docker-registry`s (the
//! registry and its mirrors), and the requests each tool made counted in each registry's access
//! log. Each case asserts which registries served each tool; where they agree the assertion is
//! one, and docs/fetcher.md's table says why where they differ.

use std::path::{Path, PathBuf};

use crate::containerd::Containerd;
use crate::oci_registry::{Options, Registry};
use crate::push::{filter_wasm, push};
use crate::support::{pull, stderr};

/// The repository every registry holds.
const REPO: &str = "mods/m";

/// A registry, the mirrors in front of it, all holding the same image, and a containerd.
struct Referee {
    containerd: Containerd,
    tmp: tempfile::TempDir,
    upstream: Registry,
    mirrors: Vec<Registry>,
    pulls: std::cell::Cell<u32>,
}

/// What one tool's pull did: whether it succeeded, and the requests for the repository each
/// registry answered (the upstream first, then the mirrors in order).
#[derive(Debug, PartialEq)]
struct Seen {
    ok: bool,
    requests: Vec<usize>,
}

impl Seen {
    /// Which registries were asked for the image at all.
    fn asked(&self) -> Vec<bool> {
        self.requests.iter().map(|&n| n > 0).collect()
    }
}

fn requests(reg: &Registry) -> usize {
    let path = format!("/v2/{REPO}/");
    reg.requests_with("GET", "", &path) + reg.requests_with("HEAD", "", &path)
}

impl Referee {
    /// The upstream and one mirror per element of `mirrors` (its options), each holding the
    /// image (pushed by `wasm-fetcher push --layout compat`, so all hold the same digest).
    fn start(mirrors: &[Options]) -> Self {
        Self::start_with(|_| mirrors.to_vec())
    }

    /// [`Referee::start`] with the mirrors' options made knowing the upstream (a pull-through
    /// mirror names it).
    fn start_with(mirrors: impl FnOnce(&Registry) -> Vec<Options>) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let upstream = Registry::start(false);
        let options = mirrors(&upstream);
        let mirrors: Vec<Registry> = options
            .iter()
            .map(|o| Registry::start_with(o.clone()))
            .collect();
        // A mirror serving the upstream's storage holds what is pushed there.
        let pushed = mirrors
            .iter()
            .zip(&options)
            .filter(|(_, o)| o.storage.is_none())
            .map(|(m, _)| m);
        for reg in std::iter::once(&upstream).chain(pushed) {
            let o = push(
                tmp.path(),
                &[
                    filter_wasm().to_str().unwrap(),
                    &format!("oci://{}/{REPO}:v1", reg.host),
                    "--layout",
                    "compat",
                    "--insecure-registry",
                    &reg.host,
                ],
            );
            assert!(o.status.success(), "push to {}: {}", reg.host, stderr(&o));
        }
        Self {
            containerd: Containerd::start(),
            tmp,
            upstream,
            mirrors,
            pulls: Default::default(),
        }
    }

    /// A hosts directory holding `files` (`(directory name, hosts.toml text)`).
    fn hosts(&self, files: &[(&str, String)]) -> PathBuf {
        let n = self.next();
        let dir = self.tmp.path().join(format!("certs-{n}.d"));
        for (name, text) in files {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(dir.join(name).join("hosts.toml"), text).unwrap();
        }
        dir
    }

    fn next(&self) -> u32 {
        let n = self.pulls.get() + 1;
        self.pulls.set(n);
        n
    }

    fn all(&self) -> Vec<&Registry> {
        std::iter::once(&self.upstream)
            .chain(&self.mirrors)
            .collect()
    }

    fn counts(&self) -> Vec<usize> {
        self.all().into_iter().map(requests).collect()
    }

    fn since(&self, before: &[usize]) -> Vec<usize> {
        self.counts()
            .iter()
            .zip(before)
            .map(|(now, then)| now - then)
            .collect()
    }

    /// The image reference, by tag, at the upstream.
    fn reference(&self) -> String {
        format!("{}/{REPO}:v1", self.upstream.host)
    }

    /// containerd's pull of the image through `hosts` (a new namespace: every blob fetched).
    fn ctr(&self, hosts: &Path) -> (Seen, String) {
        let before = self.counts();
        let ns = format!("case-{}", self.next());
        let o =
            self.containerd
                .pull_in(&ns, &self.reference(), hosts, &["--snapshotter", "native"]);
        let seen = Seen {
            ok: o.status.success(),
            requests: self.since(&before),
        };
        (seen, stderr(&o))
    }

    /// `wasm-fetcher pull --registry-config-dir hosts` of the image, into an empty cache.
    fn ours(&self, hosts: &Path) -> (Seen, String) {
        let before = self.counts();
        let cache = self.tmp.path().join(format!("cache-{}", self.next()));
        let url = format!("oci://{}", self.reference());
        let o = pull(
            &cache,
            &["--registry-config-dir", hosts.to_str().unwrap(), &url],
        );
        let seen = Seen {
            ok: o.status.success(),
            requests: self.since(&before),
        };
        (seen, stderr(&o))
    }

    /// Both tools on `hosts`; both must agree on success and on which registries they asked.
    fn agree(&self, hosts: &Path) -> Vec<bool> {
        let (theirs, their_log) = self.ctr(hosts);
        let (ours, our_log) = self.ours(hosts);
        assert_eq!(
            (theirs.ok, theirs.asked()),
            (ours.ok, ours.asked()),
            "containerd {theirs:?} vs wasm-fetcher {ours:?}\nctr: {their_log}\nours: {our_log}"
        );
        ours.asked()
    }
}

fn http(reg: &Registry) -> String {
    format!("http://{}", reg.host)
}

fn host_entry(url: &str, extra: &str) -> String {
    format!("[host.\"{url}\"]\n  capabilities = [\"pull\", \"resolve\"]\n{extra}\n")
}

/// `server`; hosts tried in file order, the first that has the image serving it; a host that
/// answers 404 and a host that is down falling through to the next, and all of them to the
/// server; the directory named for the registry with its port, and only that one.
#[test]
fn server_hosts_in_order_and_fallback_agree_with_containerd() {
    let r = Referee::start(&[Options::default(), Options::default()]);
    let (up, m1, m2) = (&r.upstream, &r.mirrors[0], &r.mirrors[1]);
    let server = format!("server = \"{}\"\n\n", http(up));

    // The server alone.
    let hosts = r.hosts(&[(&up.host, server.clone())]);
    assert_eq!(r.agree(&hosts), [true, false, false]);

    // Two mirrors: the first serves.
    let both = format!(
        "{server}{}{}",
        host_entry(&http(m1), ""),
        host_entry(&http(m2), "")
    );
    let hosts = r.hosts(&[(&up.host, both)]);
    assert_eq!(r.agree(&hosts), [false, true, false]);

    // A host that is down (nothing listens), then one without the image (404), then one with it.
    let gone = "http://127.0.0.1:1".to_string();
    let empty = Registry::start(false);
    let text = format!(
        "{server}{}{}{}",
        host_entry(&gone, ""),
        host_entry(&http(&empty), ""),
        host_entry(&http(m2), "")
    );
    let hosts = r.hosts(&[(&up.host, text)]);
    let before = requests(&empty);
    assert_eq!(r.agree(&hosts), [false, false, true]);
    assert!(
        requests(&empty) >= before + 2,
        "both asked the empty mirror"
    );

    // Every mirror failing: the server.
    let text = format!(
        "{server}{}{}",
        host_entry(&gone, ""),
        host_entry(&http(&empty), "")
    );
    let hosts = r.hosts(&[(&up.host, text)]);
    assert_eq!(r.agree(&hosts), [true, false, false]);

    // A directory named for the host without its port is another host's: not read.
    let ip_only = up.host.split(':').next().unwrap();
    let hosts = r.hosts(&[(
        ip_only,
        format!("server = \"{}\"\n{}", http(up), host_entry(&http(m1), "")),
    )]);
    // Both then reach the loopback registry directly (plain HTTP, as for any loopback host).
    assert_eq!(r.agree(&hosts), [true, false, false]);
}

/// `_default/hosts.toml` applies to a registry with no directory of its own; the registry's
/// own directory wins over it. Every request to a mirror names the upstream as `ns`.
#[test]
fn default_directory_and_ns_agree_with_containerd() {
    let r = Referee::start(&[Options::default(), Options::default()]);
    let (up, m1, m2) = (&r.upstream, &r.mirrors[0], &r.mirrors[1]);
    let hosts = r.hosts(&[(
        "_default",
        format!("server = \"{}\"\n{}", http(up), host_entry(&http(m1), "")),
    )]);
    let ns = format!("ns={}", up.host.replace(':', "%3A"));
    let image = format!("/v2/{REPO}/");
    let with_ns = || {
        let image_ns = |method| m1.requests_with(method, &image, &ns);
        image_ns("GET") + image_ns("HEAD")
    };
    let (all_before, ns_before) = (requests(m1), with_ns());
    assert_eq!(r.agree(&hosts), [false, true, false]);
    let (all, with) = (requests(m1) - all_before, with_ns() - ns_before);
    assert!(all > 0);
    assert_eq!(all, with, "a request to the mirror without ?{ns}");

    let hosts = r.hosts(&[
        (
            "_default",
            format!("server = \"{}\"\n{}", http(up), host_entry(&http(m1), "")),
        ),
        (
            &up.host,
            format!("server = \"{}\"\n{}", http(up), host_entry(&http(m2), "")),
        ),
    ]);
    assert_eq!(r.agree(&hosts), [false, false, true]);
}

/// `override_path`: the host's URL path is the API root itself (no `/v2` added). The mirror
/// is a pull-through cache of the upstream under `/api/`: both tools ask it at that root.
#[test]
fn override_path_agrees_with_containerd() {
    let r = Referee::start(&[]);
    let up = &r.upstream;
    let m = Registry::start_with(Options {
        proxy_remote: Some(http(up)),
        prefix: Some("/api/"),
        ..Default::default()
    });
    let hosts = r.hosts(&[(
        &up.host,
        format!(
            "server = \"{}\"\n{}",
            http(up),
            host_entry(
                &format!("http://{}/api/v2", m.host),
                "  override_path = true"
            )
        ),
    )]);
    let at_root = format!("/api/v2/{REPO}/");
    let asked = || m.requests_with("GET", "", &at_root) + m.requests_with("HEAD", "", &at_root);
    let before = asked();
    let (theirs, log) = r.ctr(&hosts);
    assert!(theirs.ok, "{log}");
    let after_theirs = asked();
    assert!(
        after_theirs > before,
        "containerd did not ask the mirror at /api/v2: {log}"
    );
    let (ours, log) = r.ours(&hosts);
    assert!(ours.ok, "{log}");
    assert!(
        asked() > after_theirs,
        "we did not ask the mirror at /api/v2: {log}"
    );
}

/// A TLS mirror: trusted through `ca` (a path beside hosts.toml), or not verified with
/// `skip_verify`; with neither, its certificate is refused and the server serves.
#[test]
fn tls_mirror_ca_and_skip_verify_agree_with_containerd() {
    let r = Referee::start(&[Options {
        tls: true,
        ..Default::default()
    }]);
    let (up, m) = (&r.upstream, &r.mirrors[0]);
    let https = format!("https://{}", m.host);
    let with = |extra: &str| {
        let hosts = r.hosts(&[(
            &up.host,
            format!("server = \"{}\"\n{}", http(up), host_entry(&https, extra)),
        )]);
        std::fs::copy(m.ca_file(), hosts.join(&up.host).join("mirror-ca.pem")).unwrap();
        hosts
    };
    assert_eq!(r.agree(&with("  ca = \"mirror-ca.pem\"")), [false, true]);
    assert_eq!(r.agree(&with("  skip_verify = true")), [false, true]);
    assert_eq!(r.agree(&with("")), [true, false]);
}

/// `client`: a mirror that takes only a client certificate its CA signed. With the
/// certificate and key named (a `[certificate, key]` pair, relative to the file), both pull
/// through it; without, its TLS handshake fails and both go on to the server.
#[test]
fn a_client_certificate_agrees_with_containerd() {
    let r = Referee::start_with(|up| {
        vec![Options {
            tls: true,
            client_certificates: true,
            storage: Some(up.storage()),
            ..Default::default()
        }]
    });
    let (up, m) = (&r.upstream, &r.mirrors[0]);
    let https = format!("https://{}", m.host);
    let with = |extra: &str| {
        let hosts = r.hosts(&[(
            &up.host,
            format!("server = \"{}\"\n{}", http(up), host_entry(&https, extra)),
        )]);
        let dir = hosts.join(&up.host);
        let (cert, key) = m.client_files();
        std::fs::copy(m.ca_file(), dir.join("mirror-ca.pem")).unwrap();
        std::fs::copy(cert, dir.join("node.pem")).unwrap();
        std::fs::copy(key, dir.join("node.key")).unwrap();
        hosts
    };
    let ca = "  ca = \"mirror-ca.pem\"\n";
    assert_eq!(
        r.agree(&with(&format!(
            "{ca}  client = [[\"node.pem\", \"node.key\"]]"
        ))),
        [false, true]
    );
    assert_eq!(r.agree(&with(ca)), [true, false]);
}

/// `capabilities`: a host that may only `pull` is never asked for the tag (the server
/// resolves it) but serves the content by digest, for both. A host that may only `resolve`
/// or only `push`: containerd 1.6 fetches content from it as from a pull-only host; we ask
/// it nothing, as its capabilities say.
#[test]
fn capabilities_side_by_side_with_containerd() {
    let r = Referee::start(&[Options::default()]);
    let (up, m) = (&r.upstream, &r.mirrors[0]);
    let only = |caps: &str| {
        r.hosts(&[(
            &up.host,
            format!(
                "server = \"{}\"\n[host.\"{}\"]\n  capabilities = [{caps}]\n",
                http(up),
                http(m)
            ),
        )])
    };
    let at_mirror = |what: &str| {
        let path = format!("/v2/{REPO}/{what}");
        m.requests_with("GET", &path, "") + m.requests_with("HEAD", &path, "")
    };
    // (capabilities, then for containerd and for us: the tag asked of the mirror, content
    // fetched from it). A resolve-only host: containerd 1.6 fetches content from it as if it
    // were pull-only; we ask it nothing (docs/fetcher.md).
    for (caps, theirs_want, ours_want) in [
        ("\"pull\"", (false, true), (false, true)),
        ("\"resolve\"", (false, true), (false, false)),
    ] {
        let hosts = only(caps);
        let (tags, blobs) = (at_mirror("manifests/v1"), at_mirror("blobs/"));
        let (theirs, their_log) = r.ctr(&hosts);
        let (tags_ctr, blobs_ctr) = (
            at_mirror("manifests/v1") - tags,
            at_mirror("blobs/") - blobs,
        );
        let (ours, our_log) = r.ours(&hosts);
        let (tags_ours, blobs_ours) = (
            at_mirror("manifests/v1") - tags - tags_ctr,
            at_mirror("blobs/") - blobs - blobs_ctr,
        );
        assert!(
            theirs.ok && ours.ok,
            "{caps}\nctr: {their_log}\nours: {our_log}"
        );
        assert_eq!(
            (tags_ctr > 0, blobs_ctr > 0),
            theirs_want,
            "containerd, {caps}"
        );
        assert_eq!(
            (tags_ours > 0, blobs_ours > 0),
            ours_want,
            "wasm-fetcher, {caps}"
        );
        // The server resolved the tag for both.
        assert!(theirs.asked()[0] && ours.asked()[0], "{caps}");
    }
    // A push-only host: containerd 1.6 fetches content from it too; we never pull from it.
    let hosts = only("\"push\"");
    let (theirs, log) = r.ctr(&hosts);
    assert!(theirs.ok, "{log}");
    assert_eq!(theirs.asked(), [true, true], "{log}");
    let (ours, log) = r.ours(&hosts);
    assert!(ours.ok, "{log}");
    assert_eq!(ours.asked(), [true, false], "{log}");
}

/// A registry host that is no host name (`..`) names no directory: containerd refuses the
/// reference, and so do we, before reading anything.
#[test]
fn a_dot_dot_registry_is_refused_by_both() {
    let r = Referee::start(&[]);
    let hosts = r.hosts(&[("_default", format!("server = \"{}\"\n", http(&r.upstream)))]);
    // Where `DIR/../hosts.toml` would lead: a trap that a read would report.
    std::fs::write(hosts.parent().unwrap().join("hosts.toml"), "not = [toml").unwrap();
    let o = r.containerd.pull_in("dotdot", "../mods/m:v1", &hosts, &[]);
    assert!(!o.status.success());
    let o = pull(
        &r.tmp.path().join("c"),
        &[
            "--registry-config-dir",
            hosts.to_str().unwrap(),
            "oci://../mods/m:v1",
        ],
    );
    assert!(!o.status.success());
    assert!(!stderr(&o).contains("not valid TOML"), "{}", stderr(&o));
    assert!(stderr(&o).contains("invalid registry"), "{}", stderr(&o));
}
