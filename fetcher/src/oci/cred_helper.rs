//! Docker credential helpers (`credHelpers`, `credsStore` in a Docker config): the program
//! `docker-credential-<name>` on `PATH`, run as Docker runs it (`get`, the registry's host on
//! stdin, `{"Username": …, "Secret": …}` on stdout), for the short-lived tokens of cloud
//! registries (ECR, GCR, ACR). A helper is someone else's program: it gets [`DEADLINE`] to
//! answer and [`OUTPUT_LIMIT`] bytes to answer in, then it is killed with every process it
//! started (it runs in a process group of its own); its answer is used for the one registry it
//! was asked about and no other, and nothing it printed is quoted in an error (a helper's
//! output is a secret, or an error about one).

use std::process::Stdio;
use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::FetchError;

/// How long a helper may take: the kubelet gives its credential providers 10 s too.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// The most a helper may print: an answer is a few hundred bytes, a cloud token a few KiB.
pub const OUTPUT_LIMIT: u64 = 64 << 10;

/// What Docker's helpers print for `get`.
#[derive(Deserialize)]
struct Answer {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// The words the helpers of docker-credential-helpers print when they hold nothing for the
/// registry: Docker then goes on without credentials, and so does this.
const NOT_FOUND: &str = "credentials not found";

/// The program a helper name stands for; a name that is not a plain file name is refused
/// (`docker-credential-../x` would run a path).
pub fn program(helper: &str) -> Result<String, FetchError> {
    let plain = !helper.is_empty()
        && helper.len() <= 64
        && helper
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !helper.starts_with('.');
    if !plain {
        return Err(failed(
            &crate::shown::shown(helper),
            "not a helper name: expected letters, digits, '-', '_' or '.'".into(),
        ));
    }
    Ok(format!("docker-credential-{helper}"))
}

fn failed(program: &str, reason: String) -> FetchError {
    FetchError::CredentialHelper {
        program: program.to_string(),
        reason,
    }
}

/// Credentials for `registry` from the helper `helper`.
pub async fn get(helper: &str, registry: &str) -> Result<RegistryAuth, FetchError> {
    get_within(helper, registry, DEADLINE, OUTPUT_LIMIT).await
}

/// [`get`] with its bounds given.
pub async fn get_within(
    helper: &str,
    registry: &str,
    deadline: Duration,
    limit: u64,
) -> Result<RegistryAuth, FetchError> {
    let program = program(helper)?;
    let mut child = tokio::process::Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            failed(
                &program,
                match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        format!("{program} is not on PATH; install it or remove the helper from the Docker config")
                    }
                    _ => format!("cannot run it: {e}"),
                },
            )
        })?;
    let group = child.id();
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        kill_group(group);
        return Err(failed(&program, "no pipes to it".into()));
    };
    let exchange = async {
        // A helper that exits without reading its input is its own answer.
        let _ = stdin.write_all(registry.as_bytes()).await;
        drop(stdin);
        let mut out = Vec::new();
        stdout.take(limit + 1).read_to_end(&mut out).await?;
        if out.len() as u64 > limit {
            return Ok((None, out));
        }
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((Some(status), out))
    };
    let (status, out) = match tokio::time::timeout(deadline, exchange).await {
        Err(_) => {
            kill_group(group);
            return Err(failed(
                &program,
                format!("no answer within {deadline:?}; it was stopped"),
            ));
        }
        Ok(Err(e)) => {
            kill_group(group);
            return Err(failed(&program, e.to_string()));
        }
        Ok(Ok(answer)) => answer,
    };
    let Some(status) = status else {
        kill_group(group);
        return Err(failed(
            &program,
            format!("it printed more than {limit} bytes; it was stopped"),
        ));
    };
    let text = String::from_utf8_lossy(&out);
    if !status.success() {
        if text.contains(NOT_FOUND) {
            return Ok(RegistryAuth::Anonymous);
        }
        return Err(failed(
            &program,
            format!(
                "get for {registry} failed ({status}); what it printed is not repeated here (it may hold a secret)"
            ),
        ));
    }
    // serde_json's words can quote a value: only where the answer went wrong is said.
    let answer: Answer = serde_json::from_slice(&out).map_err(|e| {
        failed(
            &program,
            format!(
                "its answer is not {{\"Username\": …, \"Secret\": …}} JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    match (answer.username.as_str(), answer.secret) {
        (_, secret) if secret.is_empty() => Ok(RegistryAuth::Anonymous),
        ("<token>", _) => Err(failed(
            &program,
            "it answered with an identity token (Username \"<token>\"), which needs an OAuth2 exchange this fetcher does not do".into(),
        )),
        (user, secret) => Ok(RegistryAuth::Basic(user.to_string(), secret)),
    }
}

/// Kills the process group `group` leads (the helper and whatever it started), if any.
fn kill_group(group: Option<u32>) {
    let Some(pgid) = group.and_then(|g| libc::pid_t::try_from(g).ok()) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill(2) takes no pointers; a negative pid names the process group the helper
    // was started in (`process_group(0)`), which holds only the helper and its children.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_name_is_a_file_name_on_path_never_a_path() {
        assert_eq!(program("ecr-login").unwrap(), "docker-credential-ecr-login");
        assert_eq!(program("gcloud").unwrap(), "docker-credential-gcloud");
        for bad in [
            "",
            "../bin/sh",
            "a/b",
            ".hidden",
            "a b",
            "x\n",
            &"a".repeat(65),
        ] {
            assert!(
                matches!(program(bad), Err(FetchError::CredentialHelper { .. })),
                "{bad:?}"
            );
        }
    }
}
