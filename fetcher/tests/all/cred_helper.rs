//! Docker credential helpers, as Docker runs them: a `docker-credential-<name>` script on
//! `PATH` (written here) asked `get` with the registry's host on stdin, for a real
//! `docker-registry` that wants basic auth. `credHelpers` for the host and `credsStore` both
//! reach it; a helper that hangs is stopped after 10 s, one that prints too much after 64 KiB,
//! and each is a failed pull that names the helper.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use oci_client::secrets::RegistryAuth;

use crate::oci_registry::Registry;
use crate::support::*;

/// Writes the helper `name` into `bin` with `body` as its bash script.
fn helper(bin: &Path, name: &str, body: &str) {
    let path = bin.join(format!("docker-credential-{name}"));
    std::fs::write(&path, format!("#!/bin/bash\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `pull URL` with `config` as the Docker config and `bin` first on `PATH`.
fn pull_with(home: &Path, bin: &Path, config: &str, url: &str) -> (std::process::Output, Duration) {
    let docker = home.join(".docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(docker.join("config.json"), config).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_within(
        fetcher()
            .env("HOME", home)
            .env_remove("DOCKER_CONFIG")
            .env("PATH", path)
            .args(["pull", url, "--timeout", "60s", "--cache-dir"])
            .arg(home.join("cache")),
        Duration::from_secs(60),
    )
}

#[test]
fn helpers_answer_for_their_registry_within_their_bounds() {
    let reg = Registry::start(true);
    let auth = RegistryAuth::Basic("user".into(), "pass".into());
    let wasm = module("helped");
    reg.push(
        "private/f:1",
        vec![("application/wasm", wasm.clone())],
        "application/vnd.wasm.config.v0+json",
        &auth,
    );
    let url = format!("oci://{}/private/f:1", reg.host);
    let home = tempfile::tempdir().unwrap();
    let bin = home.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let asked = home.path().join("asked");
    let answer = r#"{"ServerURL":"x","Username":"user","Secret":"pass"}"#;
    helper(
        &bin,
        "good",
        &format!(
            "[ \"$1\" = get ] || exit 2\ncat >> '{}'\necho '{answer}'",
            asked.display()
        ),
    );
    // A helper that hangs after starting a child of its own: both are stopped.
    let child_pid = home.path().join("child.pid");
    helper(
        &bin,
        "hang",
        &format!(
            "sleep 1000 &\necho $! > '{}'\nexec sleep 60",
            child_pid.display()
        ),
    );
    helper(&bin, "talks", "echo 'token s3cr3t was refused'; exit 3");
    helper(&bin, "loud", "head -c 100000 /dev/zero | tr '\\0' a");
    helper(
        &bin,
        "empty",
        "echo 'credentials not found in native keychain'; exit 1",
    );

    for config in [
        format!(r#"{{"credHelpers":{{"{}":"good"}}}}"#, reg.host),
        r#"{"credsStore":"good"}"#.to_string(),
    ] {
        std::fs::remove_dir_all(home.path().join("cache")).ok();
        let (o, _) = pull_with(home.path(), &bin, &config, &url);
        assert_eq!(o.status.code(), Some(0), "{config}: {}", stderr(&o));
        assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), wasm);
    }
    // Asked twice, each time about this registry's host and nothing else.
    assert_eq!(
        std::fs::read_to_string(&asked).unwrap(),
        format!("{}{}", reg.host, reg.host)
    );

    // A helper for another host is not asked about this one.
    let other = r#"{"credHelpers":{"other.example":"hang"}}"#;
    let (o, _) = pull_with(
        home.path(),
        &bin,
        other,
        &format!("oci://{}/private/f:2", reg.host),
    );
    assert!(stderr(&o).contains("unauthorized"), "{}", stderr(&o));

    for (name, words, at_least) in [
        ("hang", "no answer within 10s", Duration::from_secs(10)),
        ("loud", "printed more than 65536 bytes", Duration::ZERO),
        (
            "missing",
            "docker-credential-missing is not on PATH",
            Duration::ZERO,
        ),
        ("talks", "failed (exit status: 3)", Duration::ZERO),
    ] {
        let config = format!(r#"{{"credHelpers":{{"{}":"{name}"}}}}"#, reg.host);
        let (o, took) = pull_with(
            home.path(),
            &bin,
            &config,
            &format!("oci://{}/private/f:2", reg.host),
        );
        assert_eq!(o.status.code(), Some(1), "{name}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("credential helper docker-credential-{name}"))
                && err.contains(words),
            "{name}: {err}"
        );
        assert!(
            took >= at_least && took < Duration::from_secs(20),
            "{name}: {took:?}"
        );
        assert!(!err.contains("s3cr3t"), "{name} quoted its output: {err}");
    }
    // The hung helper's own child was stopped with it.
    let pid = std::fs::read_to_string(&child_pid).unwrap();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .is_ok_and(|stat| !stat.contains(") Z "))
    };
    let start = std::time::Instant::now();
    while alive() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(), "the helper's child {} outlived it", pid.trim());

    // "credentials not found": no credentials, as Docker goes on; this registry then refuses.
    let config = format!(r#"{{"credHelpers":{{"{}":"empty"}}}}"#, reg.host);
    let (o, _) = pull_with(
        home.path(),
        &bin,
        &config,
        &format!("oci://{}/private/f:2", reg.host),
    );
    assert!(stderr(&o).contains("unauthorized"), "{}", stderr(&o));
}
