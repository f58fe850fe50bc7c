//! The command line's edge: flags validated into options, one line per failure, exit codes,
//! a progress bar on a terminal. The library below never sees a raw flag.

pub mod cache;
pub mod pull;
pub mod push;
pub mod rewrite;
pub mod serve;
pub mod sidecar;
pub mod trust;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

/// Library logs, quiet unless asked: a failure is the one line this program prints.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WASM_FETCHER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// A failed subcommand: what it was about (a URL, `purge`, ...) and why.
pub struct Failure {
    subject: String,
    error: anyhow::Error,
}

impl Failure {
    pub fn new(subject: impl Into<String>, error: impl Into<anyhow::Error>) -> Self {
        Self {
            subject: subject.into(),
            error: error.into(),
        }
    }

    /// The one line a failure prints: the subject, then the error and its causes, each said
    /// once (an I/O error is often both a message and that message's source), with no URL's
    /// userinfo in it.
    pub fn report(self) -> ExitCode {
        let line = format!(
            "{}: {}",
            self.subject,
            wasm_fetcher::error::chain(self.error.as_ref())
        );
        eprintln!(
            "wasm-fetcher: {}",
            wasm_fetcher::reference::redact_userinfo(&line)
        );
        ExitCode::from(self.exit_code())
    }

    /// 2 for a URL that cannot name a module (a usage error, like a bad flag), 1 otherwise.
    fn exit_code(&self) -> u8 {
        let e = &self.error;
        match e.downcast_ref::<wasm_fetcher::FetchError>() {
            Some(wasm_fetcher::FetchError::BadUrl { .. }) => 2,
            _ if e
                .downcast_ref::<wasm_fetcher::push::PushError>()
                .is_some_and(|p| p.is_usage()) =>
            {
                2
            }
            _ => 1,
        }
    }
}

/// Runs a subcommand about `subject` (its URL) that reports progress under `message`.
pub fn with_progress(
    subject: String,
    message: &str,
    work: impl FnOnce(wasm_fetcher::Progress) -> anyhow::Result<()>,
) -> Result<(), Failure> {
    let bar = Bar::new(message);
    let outcome = work(bar.reporter());
    // Cleared before the failure line is printed.
    drop(bar);
    outcome.map_err(|e| Failure::new(subject, e))
}

/// Runs `work` on a runtime of its own, bounded by `timeout` (the `--timeout` flag).
pub fn within<T>(
    timeout: Duration,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async { tokio::time::timeout(timeout, work).await });
    // A task still blocked in the kernel (opening a FIFO no one writes) is not waited for:
    // the deadline is the deadline. Whatever it was writing is a temp file in the cache's
    // `tmp/`, never a module or the index, and `purge` removes it.
    runtime.shutdown_background();
    outcome.map_err(|_| anyhow::anyhow!("timed out after {timeout:?} (--timeout)"))?
}

/// A progress bar on a terminal, nothing when stderr is piped. It stays hidden for the
/// first moments so a quick pull prints only its path; a URL's userinfo is never shown.
pub struct Bar(Option<indicatif::ProgressBar>);

impl Bar {
    pub fn new(message: &str) -> Self {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
        let style = indicatif::ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(wasm_fetcher::reference::redact_userinfo(message));
        Self(Some(bar))
    }

    /// Where the library reports progress: this bar, or nowhere.
    pub fn reporter(&self) -> wasm_fetcher::Progress {
        const QUIET_FOR: Duration = Duration::from_millis(300);
        let Some(bar) = self.0.clone() else {
            return wasm_fetcher::Progress::default();
        };
        let since = std::time::Instant::now();
        wasm_fetcher::Progress::new(move |event| {
            use wasm_fetcher::ProgressEvent as Event;
            match event {
                Event::Started { total } => {
                    if let Some(total) = total {
                        bar.set_length(total);
                    }
                    bar.set_position(0);
                }
                Event::Advanced(n) => bar.inc(n),
            }
            if bar.is_hidden() && since.elapsed() >= QUIET_FOR {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
        })
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// An Envoy configuration file (`what` names it in the read error): a regular file within the
/// bootstrap limit, UTF-8, YAML or JSON. The text comes back too, for callers that answer in
/// the input's format. Each failure names the file once.
pub fn read_document(
    path: &std::path::Path,
    what: &'static str,
) -> anyhow::Result<(String, serde_json::Value)> {
    use wasm_fetcher::regular_file;
    let bytes = regular_file::read_input(path, what, regular_file::BOOTSTRAP_LIMIT)?;
    let named = || path.display().to_string();
    let text = String::from_utf8(bytes)
        .context("not UTF-8 text")
        .with_context(named)?;
    let doc = wasm_common::yaml::from_str(&text)
        .context("not valid YAML or JSON")
        .with_context(named)?;
    Ok((text, doc))
}
