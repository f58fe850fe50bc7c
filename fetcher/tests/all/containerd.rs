//! A real containerd (Debian's `containerd`, what a node's kubelet asks through CRI) on a
//! private socket, its root and state in a temporary directory, stopped at the end: the tests'
//! referee for what the node's runtime pulls, mounts and asks of mirrors. `ctr` drives it as
//! the kubelet would: `images pull --hosts-dir` (the node's `config_path`) and `images mount`
//! (an image volume's read-only mount). containerd mounts snapshots, so it needs root: a run
//! that is not root fails here and says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::stderr;

/// The namespace the kubelet's images live in.
const NAMESPACE: &str = "k8s.io";

pub struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
    /// The snapshotter pulls unpack into: overlayfs, a node's default, where this kernel and
    /// filesystem take it; native (plain copies) where they do not (overlay on overlay).
    snapshotter: &'static str,
    /// Mount targets to release before containerd stops.
    mounts: std::cell::RefCell<Vec<PathBuf>>,
}

impl Containerd {
    /// Starts containerd with a generated config: no CRI plugin (`ctr` speaks its own API), no
    /// `opt` plugin (it would write `/opt/containerd`), content isolated by namespace (a pull in
    /// a new namespace fetches every blob again, so each is counted at the registries),
    /// everything under a temporary directory.
    pub fn start() -> Self {
        // SAFETY: geteuid reads the process's effective user id; it cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "containerd mounts image snapshots, which needs root: run the tests as root (the suite starts its own containerd on a private socket; it never touches the node's)"
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.internal.v1.opt\"]\n[plugins.\"io.containerd.metadata.v1.bolt\"]\n  content_sharing_policy = \"isolated\"\n[grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("c.sock").display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let log_path = d.join("containerd.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let mut child = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("containerd (Debian package containerd) is needed: make test installs it");
        let start = Instant::now();
        while !std::fs::read_to_string(&log_path)
            .is_ok_and(|l| l.contains("containerd successfully booted"))
        {
            let exited = child.try_wait().unwrap();
            if exited.is_some() || start.elapsed() >= Duration::from_secs(20) {
                // Stopped before failing: no daemon outlives its deleted root.
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "containerd did not start ({exited:?}): {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut c = Self {
            child,
            dir,
            snapshotter: "native",
            mounts: Default::default(),
        };
        let plugins = c.ctr(&["plugins", "ls"]);
        assert!(plugins.status.success(), "{}", stderr(&plugins));
        let overlay_ok = String::from_utf8_lossy(&plugins.stdout).lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"io.containerd.snapshotter.v1")
                && f.get(1) == Some(&"overlayfs")
                && f.last() == Some(&"ok")
        });
        if overlay_ok {
            c.snapshotter = "overlayfs";
        }
        c
    }

    /// `ctr` on this containerd's socket, in the kubelet's namespace.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_in(NAMESPACE, args)
    }

    /// `ctr` on this containerd's socket, in `namespace`.
    pub fn ctr_in(&self, namespace: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.dir.path().join("c.sock"))
            .args(["--namespace", namespace, "--timeout", "60s"])
            .args(args)
            .stdin(Stdio::null());
        crate::support::run_within(&mut cmd, Duration::from_secs(90)).0
    }

    /// `ctr images pull --hosts-dir HOSTS REFERENCE`, unpacked into the snapshotter: what the
    /// kubelet's pull of an image volume does, mirrors and credentials read from `hosts`.
    pub fn pull(&self, reference: &str, hosts: &Path, extra: &[&str]) -> Output {
        self.pull_in(NAMESPACE, reference, hosts, extra)
    }

    /// [`Self::pull`] in `namespace`: a fresh one fetches every blob again.
    pub fn pull_in(
        &self,
        namespace: &str,
        reference: &str,
        hosts: &Path,
        extra: &[&str],
    ) -> Output {
        let hosts = hosts.to_str().unwrap();
        let mut args = vec![
            "images",
            "pull",
            "--snapshotter",
            self.snapshotter,
            "--hosts-dir",
            hosts,
        ];
        args.extend_from_slice(extra);
        args.push(reference);
        self.ctr_in(namespace, &args)
    }

    /// Mounts the pulled image `reference` read-only at `target` (created), as the kubelet
    /// mounts an image volume; released when this containerd stops.
    pub fn mount(&self, reference: &str, target: &Path) {
        std::fs::create_dir_all(target).unwrap();
        let o = self.ctr(&[
            "images",
            "mount",
            "--snapshotter",
            self.snapshotter,
            "--rw=false",
            reference,
            target.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "ctr images mount: {}", stderr(&o));
        self.mounts.borrow_mut().push(target.to_path_buf());
    }

    /// Releases the mount at `target` and its snapshot, as the kubelet does when the pod goes.
    pub fn unmount(&self, target: &Path) {
        let o = self.ctr(&["images", "unmount", "--rm", target.to_str().unwrap()]);
        assert!(o.status.success(), "ctr images unmount: {}", stderr(&o));
        self.mounts.borrow_mut().retain(|m| m != target);
    }

    /// The node's hosts directory (containerd's `config_path`) with the plain-HTTP registry
    /// `host` (`127.0.0.1:PORT`) in it, as a node lists an insecure registry.
    pub fn plain_http(&self, host: &str) -> PathBuf {
        let hosts = self.dir.path().join("certs.d");
        std::fs::create_dir_all(hosts.join(host)).unwrap();
        std::fs::write(
            hosts.join(host).join("hosts.toml"),
            format!("server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
        )
        .unwrap();
        hosts
    }

    /// What containerd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // No panic here (it may run while a failed test unwinds): ctr's own timeout bounds it.
        for target in self.mounts.take() {
            let _ = Command::new("ctr")
                .arg("--address")
                .arg(self.dir.path().join("c.sock"))
                .args(["--namespace", NAMESPACE, "--timeout", "20s"])
                .args(["images", "unmount", "--rm"])
                .arg(&target)
                .output();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kubelet's part for an image volume: containerd pulls `reference` (plain HTTP to its
/// registry, listed in the node's hosts directory) and mounts it read-only at `mount_path`.
pub fn kubelet_mounts(containerd: &Containerd, reference: &str, mount_path: &Path) {
    let registry = reference.split('/').next().unwrap();
    let o = containerd.pull(reference, &containerd.plain_http(registry), &[]);
    assert!(
        o.status.success(),
        "ctr images pull {reference}: {}\n{}",
        stderr(&o),
        containerd.log()
    );
    containerd.mount(reference, mount_path);
}
