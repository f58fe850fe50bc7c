//! A real `docker-registry` (CNCF distribution, Debian package) on a free loopback port, with
//! optional basic auth and TLS, its access log kept so tests can count what was requested, and
//! a push helper that goes through the registry's HTTP API with `oci-client`.
//! Shared by the integration tests and `benches/pull.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// The layer and config media types of a module pushed in the CNCF Wasm artifact layout.
pub const WASM: &str = "application/wasm";
pub const CNCF_CONFIG: &str = "application/vnd.wasm.config.v0+json";

#[derive(Default, Clone)]
pub struct Options {
    /// Basic auth for `user:pass` (htpasswd from apache2-utils).
    pub htpasswd: bool,
    /// Serve TLS with a certificate signed by a throwaway CA (`Registry::ca_file`).
    pub tls: bool,
    /// Token authentication: every request is challenged with `Bearer realm="<this>"`.
    pub token_realm: Option<&'static str>,
    /// A pull-through cache of the registry at this URL (`proxy: remoteurl`).
    pub proxy_remote: Option<String>,
    /// Served under this path (`http: prefix`): the API at `PREFIX/v2/`.
    pub prefix: Option<&'static str>,
    /// With `tls`: TLS only for a client certificate the registry's CA signed
    /// (`Registry::client_files`).
    pub client_certificates: bool,
    /// Serve another registry's storage (`Registry::storage`) instead of its own: the same
    /// images without pushing them again.
    pub storage: Option<PathBuf>,
}

pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    tls: bool,
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("cannot run a test tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it, with `openssl`.
pub fn make_certs(dir: &Path) {
    let p = |n: &str| dir.join(n);
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test CA",
            "-keyout",
        ])
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.pem")));
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
        ])
        .arg(p("server.key"))
        .arg("-out")
        .arg(p("server.csr")));
    std::fs::write(
        p("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "1", "-CAcreateserial", "-in"])
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(p("ext.cnf"))
        .arg("-out")
        .arg(p("server.pem")));
}

/// A client certificate signed by `make_certs`'s CA: `client.pem` and `client.key`.
fn make_client_certificate(dir: &Path) {
    let p = |n: &str| dir.join(n);
    run(Command::new("openssl")
        .args([
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=node", "-keyout",
        ])
        .arg(p("client.key"))
        .arg("-out")
        .arg(p("client.csr")));
    std::fs::write(p("client.cnf"), "extendedKeyUsage=clientAuth\n").unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "1", "-CAcreateserial", "-in"])
        .arg(p("client.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(p("client.cnf"))
        .arg("-out")
        .arg(p("client.pem")));
}

impl Registry {
    pub fn start(htpasswd: bool) -> Self {
        Self::start_with(Options {
            htpasswd,
            ..Default::default()
        })
    }

    /// Starts the registry on a free port. The port is only free when we looked, so readiness
    /// is the registry's own "listening on" log line (written once it has bound the port), not
    /// a successful connect, which a stranger on that port would also give; if the registry
    /// exits because the port was taken meanwhile, it starts again on another.
    pub fn start_with(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        if options.tls || options.token_realm.is_some() {
            make_certs(dir.path());
        }
        if options.client_certificates {
            make_client_certificate(dir.path());
        }
        if options.htpasswd {
            let out = Command::new("htpasswd")
                .args(["-Bbn", "user", "pass"])
                .output()
                .expect("htpasswd (apache2-utils) is needed");
            std::fs::write(dir.path().join("htpasswd"), out.stdout).unwrap();
        }
        for _ in 0..5 {
            let port = free_port();
            let mut config = format!(
                "version: 0.1\nlog: {{level: info, accesslog: {{disabled: false}}}}\nstorage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\n",
                options
                    .storage
                    .clone()
                    .unwrap_or_else(|| dir.path().join("data"))
                    .display()
            );
            if options.tls {
                let clientcas = match options.client_certificates {
                    true => format!(", clientcas: [{}]", dir.path().join("ca.pem").display()),
                    false => String::new(),
                };
                config.push_str(&format!(
                    "http: {{addr: 127.0.0.1:{port}, tls: {{certificate: {}, key: {}{clientcas}}}}}\n",
                    dir.path().join("server.pem").display(),
                    dir.path().join("server.key").display()
                ));
            } else if let Some(prefix) = options.prefix {
                config.push_str(&format!(
                    "http: {{addr: 127.0.0.1:{port}, prefix: \"{prefix}\"}}\n"
                ));
            } else {
                config.push_str(&format!("http: {{addr: 127.0.0.1:{port}}}\n"));
            }
            if options.htpasswd {
                config.push_str(&format!(
                    "auth: {{htpasswd: {{realm: test, path: {}}}}}\n",
                    dir.path().join("htpasswd").display()
                ));
            }
            if let Some(realm) = options.token_realm {
                config.push_str(&format!(
                    "auth: {{token: {{realm: \"{realm}\", service: test-registry, issuer: test-issuer, rootcertbundle: {}}}}}\n",
                    dir.path().join("ca.pem").display()
                ));
            }
            if let Some(remote) = &options.proxy_remote {
                config.push_str(&format!("proxy: {{remoteurl: \"{remote}\"}}\n"));
            }
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config).unwrap();
            let log_path = dir.path().join("access.log");
            let log = std::fs::File::create(&log_path).unwrap();
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config_path)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .expect("docker-registry (Debian package docker-registry) is needed");
            let host = format!("127.0.0.1:{port}");
            let ready = format!("listening on {host}");
            let start = Instant::now();
            loop {
                if std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains(&ready)) {
                    return Self {
                        host,
                        tls: options.tls,
                        child,
                        dir,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken: try another
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "docker-registry did not start: {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("docker-registry could not bind a free port in 5 attempts");
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The CA that signed a TLS registry's certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Where it keeps its images (`Options::storage` for another registry).
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The client certificate and key a registry started with `client_certificates` takes.
    pub fn client_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.pem"),
            self.dir.path().join("client.key"),
        )
    }

    /// How many requests so far were `METHOD` on a path starting with `prefix` (the access log
    /// is written as requests complete, so give it a moment).
    pub fn requests(&self, method: &str, prefix: &str) -> usize {
        std::thread::sleep(Duration::from_millis(100));
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        let needle = format!("\"{method} {prefix}");
        log.lines().filter(|l| l.contains(&needle)).count()
    }

    /// [`Self::requests`] whose request line also holds `text` (a query parameter).
    pub fn requests_with(&self, method: &str, prefix: &str, text: &str) -> usize {
        std::thread::sleep(Duration::from_millis(100));
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        let needle = format!("\"{method} {prefix}");
        log.lines()
            .filter_map(|l| l.split_once(&needle).map(|(_, rest)| rest))
            .filter(|rest| {
                rest.split(' ')
                    .next()
                    .is_some_and(|target| target.contains(text))
            })
            .count()
    }

    /// Pushes `module` as a one-layer CNCF Wasm artifact; returns the manifest digest.
    pub fn push_module(&self, repo_tag: &str, module: &[u8], auth: &RegistryAuth) -> String {
        self.push(repo_tag, vec![(WASM, module.to_vec())], CNCF_CONFIG, auth)
    }

    /// Pushes an image with these layers and config; returns the manifest digest.
    pub fn push(
        &self,
        repo_tag: &str,
        layers: Vec<(&str, Vec<u8>)>,
        config_type: &str,
        auth: &RegistryAuth,
    ) -> String {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::new(ClientConfig {
            protocol: if self.tls {
                ClientProtocol::Https
            } else {
                ClientProtocol::Http
            },
            accept_invalid_certificates: self.tls,
            ..Default::default()
        });
        let reference: Reference = format!("{}/{repo_tag}", self.host).parse().unwrap();
        let layers: Vec<ImageLayer> = layers
            .into_iter()
            .map(|(t, data)| ImageLayer::new(data, t.to_string(), None))
            .collect();
        let config = Config::new(b"{}".to_vec(), config_type.to_string(), None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let resp = rt
            .block_on(client.push(&reference, &layers, config, auth, None))
            .unwrap();
        let digest = resp.manifest_url.rsplit('/').next().unwrap().to_string();
        if digest.starts_with("sha256:") {
            return digest;
        }
        rt.block_on(client.fetch_manifest_digest(&reference, auth))
            .unwrap()
    }
}
