//! `make bench` for the fetcher: cold pulls of a 5 MiB and a 50 MiB module from a real
//! `docker-registry` on loopback, timed against `skopeo copy` of the same image in the same
//! run, and the warm lookup of a cached module. Every figure is a whole `wasm-fetcher` process,
//! as a script or an init container would run it. Runs are interleaved (fetcher, skopeo,
//! fetcher, ...) so machine noise hits both sides alike; medians and ratios are reported. A
//! pinned lookup re-hashes the cached module (a pin is checked against the bytes, not against
//! a stamp whoever changed the file could restore), so it is measured on its own.
//! Exits 1 when a target is missed. `BENCH_HOLD=1` keeps the registry up afterwards, for profiling.

// A test or benchmark states its assumptions with unwrap, expect and panic: a broken one is a
// failed run, which is what it should be. The workspace denies them in library code only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/all/oci_registry.rs"]
#[allow(dead_code)]
mod oci_registry;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use oci_client::secrets::RegistryAuth;

const FETCHER: &str = env!("CARGO_BIN_EXE_wasm-fetcher");
const RUNS: usize = 9;
const WARM_RUNS: usize = 51;

/// A valid module of about `size` bytes: the header and one custom section of incompressible
/// bytes, so neither side gains from compression.
fn module(size: usize) -> Vec<u8> {
    let payload = size - 16;
    let mut m = b"\0asm\x01\0\0\0\0".to_vec();
    let mut len = (payload + 2) as u64;
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            m.push(byte);
            break;
        }
        m.push(byte | 0x80);
    }
    m.extend_from_slice(&[1, b'b']);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    m.extend((0..payload).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    m
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let out = cmd.output().expect("cannot run");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn fetcher_pull(url: &str, cache: &Path) -> Command {
    let mut c = Command::new(FETCHER);
    c.args(["pull", url, "--cache-dir"]).arg(cache);
    c
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

struct Verdict {
    failed: bool,
}

impl Verdict {
    fn check(&mut self, what: &str, ok: bool) {
        println!("  {what}: {}", if ok { "ok" } else { "MISSED" });
        self.failed |= !ok;
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported (the runs are few).
    let registry = oci_registry::Registry::start(false);
    let scratch = tempfile::tempdir().unwrap();
    let mut verdict = Verdict { failed: false };
    println!(
        "wasm-fetcher vs skopeo {} ({} cold runs each, interleaved; median)",
        String::from_utf8_lossy(
            &Command::new("skopeo")
                .arg("--version")
                .output()
                .expect("skopeo (Debian package skopeo) is needed")
                .stdout
        )
        .trim()
        .trim_start_matches("skopeo version "),
        RUNS
    );
    for (label, size, target) in [("5 MiB", 5 << 20, 0.5), ("50 MiB", 50 << 20, 0.35)] {
        let repo = format!("bench/m{}:v1", size >> 20);
        registry.push(
            &repo,
            vec![(
                "application/vnd.module.wasm.content.layer.v1+wasm",
                module(size),
            )],
            "application/vnd.oci.image.config.v1+json",
            &RegistryAuth::Anonymous,
        );
        let url = format!("oci://{}/{repo}", registry.host);
        let docker = format!("docker://{}/{repo}", registry.host);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for run in 0..RUNS {
            let cache = scratch.path().join(format!("cache-{size}-{run}"));
            ours.push(timed(&mut fetcher_pull(&url, &cache)));
            let dest = scratch.path().join(format!("skopeo-{size}-{run}"));
            theirs.push(timed(
                Command::new("skopeo")
                    .args(["copy", "--quiet", "--src-tls-verify=false", &docker])
                    .arg(format!("dir:{}", dest.display())),
            ));
            let _ = std::fs::remove_dir_all(&cache);
            let _ = std::fs::remove_dir_all(&dest);
        }
        let (o, t) = (median(ours), median(theirs));
        let ratio = o.as_secs_f64() / t.as_secs_f64();
        println!(
            "cold pull {label}: wasm-fetcher {}, skopeo copy {}, ratio {ratio:.2} (target <= {target})",
            ms(o),
            ms(t)
        );
        verdict.check(&format!("{label} cold pull ratio"), ratio <= target);
    }

    // Warm: the module is cached; a tagged reference with IfNotPresent is answered from the
    // cache alone, as is a file:// URL, pinned or not.
    let cache = scratch.path().join("warm");
    let url = format!("oci://{}/bench/m5:v1", registry.host);
    timed(&mut fetcher_pull(&url, &cache));
    let file = scratch.path().join("warm.wasm");
    let bytes = module(5 << 20);
    std::fs::write(&file, &bytes).unwrap();
    let file_url = format!("file://{}", file.display());
    timed(&mut fetcher_pull(&file_url, &cache));
    let pin = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    let pinned = || {
        let mut c = fetcher_pull(&file_url, &cache);
        c.args(["--sha256", &pin]);
        c
    };
    let (mut oci, mut local, mut local_pinned) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..WARM_RUNS {
        oci.push(timed(&mut fetcher_pull(&url, &cache)));
        local.push(timed(&mut fetcher_pull(&file_url, &cache)));
        local_pinned.push(timed(&mut pinned()));
    }
    let (o, l, p) = (median(oci), median(local), median(local_pinned));
    println!(
        "warm lookup (whole process, {WARM_RUNS} runs, median): oci:// tag {}, file:// {} (target < 5 ms); \
         file:// pinned, 5 MiB re-hashed, {} (target < 15 ms)",
        ms(o),
        ms(l),
        ms(p)
    );
    verdict.check(
        "warm lookup",
        o < Duration::from_millis(5) && l < Duration::from_millis(5),
    );
    verdict.check("warm pinned lookup", p < Duration::from_millis(15));
    if std::env::var_os("BENCH_HOLD").is_some() {
        println!("holding registry {}", registry.host);
        std::thread::sleep(Duration::from_secs(600));
    }
    drop(registry);
    if verdict.failed {
        std::process::exit(1);
    }
}
