//! `serve` learns of plugin changes from file events: with both timers set to an hour, a
//! Kubernetes ConfigMap update (a new timestamped directory, the `..data` link renamed over it)
//! and a file edited in place reach the ECDS file within seconds, and each version is read
//! whole.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use crate::serve_support::*;
use crate::support::sha256_hex;

/// The ECDS file of plugin `test.cm` names the header value `value`.
fn served(ecds: &Path, value: &str) -> bool {
    std::fs::read_to_string(ecds.join("test.cm.yaml")).is_ok_and(|t| {
        t.contains(&format!("value: {value}")) || t.contains(&format!("\"value\":\"{value}\""))
    })
}

#[test]
fn a_configmap_swap_and_an_edit_in_place_reach_the_ecds_file_by_file_events_alone() {
    let d = dirs();
    let module = d.tmp.path().join("m.wasm");
    std::fs::write(&module, std::fs::read(crate::push::filter_wasm()).unwrap()).unwrap();
    let url = format!("file://{}", module.display());
    let sha = sha256_hex(&std::fs::read(&module).unwrap());
    let text = |v: &str| wasm_plugin("cm", &url, &format!("{}  sha256: {sha}\n", header_role(v)));
    // The ConfigMap volume's layout: cm.yaml -> ..data/cm.yaml, ..data -> ..2026_1.
    let p = &d.plugins;
    std::fs::create_dir(p.join("..2026_1")).unwrap();
    std::fs::write(p.join("..2026_1/cm.yaml"), text("one")).unwrap();
    symlink("..2026_1", p.join("..data")).unwrap();
    symlink("..data/cm.yaml", p.join("cm.yaml")).unwrap();
    let serve = d.serve_ready(&[], &["--poll-interval", "1h", "--rescan-interval", "1h"]);
    let ecds_text = || std::fs::read_to_string(d.ecds.join("test.cm.yaml")).unwrap_or_default();
    assert!(served(&d.ecds, "one"), "{}", ecds_text());

    // The kubelet's update: write the new directory, swap the link, drop the old directory.
    std::fs::create_dir(p.join("..2026_2")).unwrap();
    std::fs::write(p.join("..2026_2/cm.yaml"), text("two")).unwrap();
    symlink("..2026_2", p.join("..data_tmp")).unwrap();
    std::fs::rename(p.join("..data_tmp"), p.join("..data")).unwrap();
    std::fs::remove_dir_all(p.join("..2026_1")).unwrap();
    wait_for(
        "the swapped ConfigMap served",
        Duration::from_secs(10),
        || served(&d.ecds, "two"),
    );

    // An edit in place (truncate, then write in two parts): the settled file is what is read.
    std::fs::remove_file(p.join("cm.yaml")).unwrap();
    std::fs::write(p.join("cm.yaml"), text("three")).unwrap();
    wait_for("the new file served", Duration::from_secs(10), || {
        served(&d.ecds, "three")
    });
    let full = text("four");
    let (head, tail) = full.split_at(full.len() / 2);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(p.join("cm.yaml")).unwrap();
        f.write_all(head.as_bytes()).unwrap();
        f.flush().unwrap();
        f.write_all(tail.as_bytes()).unwrap();
    }
    wait_for("the edited file served", Duration::from_secs(10), || {
        served(&d.ecds, "four")
    });
    assert!(
        !serve.log().contains("WasmPlugin refused"),
        "a half-written file was read: {}",
        serve.log()
    );
    assert!(serve.stop().success());
}
