//! The node-path design of image volumes: a per-node DaemonSet pod mounts the modules' images
//! and `serve --copy-image-volumes` copies each into the node directory (cache and ECDS files,
//! a hostPath) that an Envoy in its own pod reads. A module change rolls the DaemonSet pod,
//! never Envoy: done here as the kubelet does it (containerd pulls and mounts each pod's image
//! volume, and releases it when the pod goes), with one Envoy process throughout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::containerd::{kubelet_mounts, Containerd};
use crate::image_volume::ecds_module;
use crate::oci_registry::Registry;
use crate::push::{filter_wasm, push_json};
use crate::real_envoy::Envoy;
use crate::serve_support::{dirs, ecds_bootstrap, header_role, wasm_plugin, write_plugin};
use crate::support::*;

/// The module files in the cache.
fn cached(cache: &Path) -> Vec<PathBuf> {
    files_under(cache)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect()
}

#[test]
fn a_module_change_rolls_the_fetcher_pod_and_the_same_envoy_serves_the_new_module() {
    let reg = Registry::start(false);
    let d = dirs();
    let v1 = std::fs::read(filter_wasm()).unwrap();
    // The same filter with one more custom section: another module, another image.
    let mut v2 = v1.clone();
    v2.extend_from_slice(&[0, 3, 2, b'v', b'2']);
    let v2_file = d.tmp.path().join("v2.wasm");
    std::fs::write(&v2_file, &v2).unwrap();
    let repo = format!("{}/filters/wasm-filter", reg.host);
    let mut images = Vec::new();
    for (file, tag) in [(filter_wasm(), "v1"), (v2_file, "v2")] {
        let url = format!("oci://{repo}:{tag}");
        let pushed = push_json(
            d.tmp.path(),
            &[file.to_str().unwrap(), &url, "--layout", "compat"],
        );
        let reference = format!("{repo}@{}", pushed["manifest_digest"].as_str().unwrap());
        images.push((url, reference));
    }
    let plugin = |version: usize| {
        let (url, _) = &images[version - 1];
        wasm_plugin(
            "node",
            url,
            &format!(
                "{}  imagePullPolicy: IfNotPresent\n",
                header_role(&format!("v{version}"))
            ),
        )
    };
    let node_copy = |module: &[u8]| {
        d.cache
            .join(format!("modules/sha256/{}.wasm", sha256_hex(module)))
    };
    let served = d.ecds.join("test.node.yaml");

    // One DaemonSet pod: the kubelet mounts its image volume, serve copies the module into the
    // node directory.
    let containerd = Containerd::start();
    let pod = |version: usize| {
        let (url, reference) = &images[version - 1];
        let root = d.tmp.path().join(format!("pod-{version}/images"));
        let source = wasm_fetcher::reference::Source::parse(url).unwrap();
        let mount = wasm_fetcher::image_volume::Mount::of(&source, &root).unwrap();
        kubelet_mounts(&containerd, reference, &mount.dir);
        assert_eq!(
            std::fs::read(mount.dir.join("plugin.wasm")).unwrap().len(),
            [&v1, &v2][version - 1].len()
        );
        let serve = d.serve_ready(
            &[],
            &[
                "--image-volume-root",
                root.to_str().unwrap(),
                "--copy-image-volumes",
            ],
        );
        (serve, root)
    };
    write_plugin(&d.plugins.join("node.yaml"), &plugin(1));
    let (serve, root) = pod(1);
    assert_eq!(ecds_module(&served), node_copy(&v1).display().to_string());
    assert_eq!(std::fs::read(node_copy(&v1)).unwrap(), v1);

    let boot = ecds_bootstrap(d.tmp.path(), &d.ecds, &[&plugin(1)], "127.0.0.1:1");
    let mut envoy = Envoy::start(&boot);
    let pid = envoy.pid();
    let says = |version: &str| {
        let want = format!("x-served-by: {version}");
        let r = envoy.eventually("main", |r| r.as_ref().is_ok_and(|(_, t)| t.contains(&want)));
        assert!(
            r.as_ref().is_ok_and(|(_, t)| t.contains(&want)),
            "{r:?}\n{}",
            envoy.log()
        );
    };
    says("v1");

    // The roll: the old pod goes, and with it its image volume; Envoy keeps serving the copy.
    assert!(serve.stop().success());
    let mount = wasm_fetcher::image_volume::Mount::of(
        &wasm_fetcher::reference::Source::parse(&images[0].0).unwrap(),
        &root,
    )
    .unwrap();
    containerd.unmount(&mount.dir);
    std::fs::remove_dir_all(root.parent().unwrap()).unwrap();
    says("v1");
    write_plugin(&d.plugins.join("node.yaml"), &plugin(2));
    let (serve, _root) = pod(2);
    assert_eq!(ecds_module(&served), node_copy(&v2).display().to_string());
    says("v2");
    assert!(envoy.running(), "Envoy exited:\n{}", envoy.log());
    assert_eq!(envoy.pid(), pid);

    // The old copy goes once no ECDS file names it; the one in use stays.
    let start = std::time::Instant::now();
    while cached(&d.cache) != [node_copy(&v2)] && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        cached(&d.cache),
        [node_copy(&v2)],
        "the v1 copy is not purged: {}\n{}",
        serve.log(),
        std::fs::read_to_string(d.cache.join("index.json")).unwrap_or_default(),
    );
    assert!(
        serve.log().contains("no ECDS file names"),
        "{}",
        serve.log()
    );
    assert!(serve.stop().success());
    assert_eq!(std::fs::read(node_copy(&v2)).unwrap(), v2);
}
