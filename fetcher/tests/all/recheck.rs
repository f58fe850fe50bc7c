//! KEP-2535 on a node-wide cache: `serve --recheck-credentials` hands a cached private module
//! to a plugin only once the registry (htpasswd, loopback) accepted that plugin's own
//! credentials. Without the flag, the module one namespace pulled is served to a namespace
//! with no credentials, which is the hole the flag closes.

use std::time::Duration;

use oci_client::secrets::RegistryAuth;

use crate::image_volume::ecds_module;
use crate::oci_registry::Registry;
use crate::serve_support::{dirs, header_role, wait_for, write_plugin};
use crate::support::module;

fn plugin(name: &str, namespace: &str, url: &str, secret: Option<&str>) -> String {
    format!(
        "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  url: {url}\n  imagePullPolicy: IfNotPresent\n{}{}",
        secret.map(|s| format!("  imagePullSecret: {s}\n")).unwrap_or_default(),
        header_role(name)
    )
}

/// What the registry answered for the image's manifests so far.
fn manifest_gets(reg: &Registry) -> usize {
    reg.requests("GET", "/v2/mods/private/manifests/")
}

/// Team a (with a pull secret) is served first; then team b's plugin (no secret) names the
/// same image, then team c's (a secret of its own, valid), then c's again with another
/// `pluginConfig`. Returns b's ECDS file and the serve log, and checks c is served the cached
/// module, the registry asked about c once.
fn team_b_after_team_a(reg: &Registry, url: &str, recheck: bool) -> (String, String) {
    let d = dirs();
    let secrets = d.tmp.path().join("secrets");
    for team in ["team-a", "team-c"] {
        let secret = secrets.join(team).join("regcred");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(
            secret.join(".dockerconfigjson"),
            format!(
                r#"{{"auths":{{"{}":{{"auth":"dXNlcjpwYXNz"}}}}}}"#,
                reg.host
            ),
        )
        .unwrap();
    }
    write_plugin(
        &d.plugins.join("a.yaml"),
        &plugin("a", "team-a", url, Some("regcred")),
    );
    let empty = d.tmp.path().join("no-docker-config");
    let mut args = vec![
        "--pull-secrets",
        secrets.to_str().unwrap(),
        "--pull-timeout",
        "2s",
    ];
    if recheck {
        args.push("--recheck-credentials");
    }
    let serve = d.serve_ready(&[("DOCKER_CONFIG", empty.to_str().unwrap())], &args);
    let a_module = ecds_module(&d.ecds.join("team-a.a.yaml"));
    assert_eq!(std::fs::read(&a_module).unwrap(), module("private"));

    write_plugin(&d.plugins.join("b.yaml"), &plugin("b", "team-b", url, None));
    let b_file = d.ecds.join("team-b.b.yaml");
    wait_for("team b's ECDS file", Duration::from_secs(30), || {
        b_file.is_file() && serve.ready()
    });
    let b = std::fs::read_to_string(&b_file).unwrap();

    let before_c = manifest_gets(reg);
    let c_file = d.ecds.join("team-c.c.yaml");
    let c_text = |role: &str| {
        plugin("c", "team-c", url, Some("regcred"))
            .replace("value: c}", &format!("value: {role}}}"))
    };
    write_plugin(&d.plugins.join("c.yaml"), &c_text("cee-one"));
    wait_for("team c served", Duration::from_secs(30), || {
        std::fs::read_to_string(&c_file).is_ok_and(|t| t.contains("cee-one")) && serve.ready()
    });
    assert_eq!(
        ecds_module(&c_file),
        a_module,
        "team c is served the cached module"
    );
    let after_c = manifest_gets(reg);
    assert_eq!(
        after_c > before_c,
        recheck,
        "the registry asked about team c's credentials only with the recheck"
    );
    write_plugin(&d.plugins.join("c.yaml"), &c_text("cee-two"));
    wait_for(
        "team c's new config served",
        Duration::from_secs(30),
        || std::fs::read_to_string(&c_file).is_ok_and(|t| t.contains("cee-two")),
    );
    assert_eq!(
        manifest_gets(reg),
        after_c,
        "a confirmed credential is remembered"
    );
    let log = serve.log();
    assert!(serve.stop().success());
    (b, log)
}

#[test]
fn a_namespace_without_credentials_gets_no_private_module_another_namespace_cached() {
    let reg = Registry::start(true);
    reg.push_module(
        "mods/private:v1",
        &module("private"),
        &RegistryAuth::Basic("user".into(), "pass".into()),
    );
    let url = format!("oci://{}/mods/private:v1", reg.host);
    let cached_module = |ecds: &str| ecds.contains("/modules/sha256/");

    // Without the recheck, the cache answers team b with team a's module.
    let (b, _) = team_b_after_team_a(&reg, &url, false);
    assert!(cached_module(&b), "{b}");

    // With it, the registry is asked with team b's (no) credentials and says no: b gets its
    // fallback, and the log says why.
    let before = manifest_gets(&reg);
    let (b, log) = team_b_after_team_a(&reg, &url, true);
    assert!(!cached_module(&b), "team b got the private module: {b}");
    assert!(b.contains("rbac.v3.RBAC"), "{b}");
    assert!(log.contains("unauthorized"), "{log}");
    assert!(manifest_gets(&reg) > before, "the registry was not asked");
}
