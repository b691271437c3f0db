//! `aether-agent run` from its flags: the rustls crypto provider, the tokio runtime,
//! [`crate::agent::run`], and the exit code.

use std::process::ExitCode;

use crate::cli::flags::RunArgs;

/// The target of the log lines below: the binary's crate, as when they were written in `main`,
/// so `RUST_LOG=aether_agent=...` still selects them.
const LOG_TARGET: &str = "aether_agent";

/// Runs the agent until SIGTERM/SIGINT. Exit code 0 after a clean shutdown; 1 (the error
/// logged) when it cannot start or fails.
pub fn run(args: RunArgs) -> ExitCode {
    if rustls::crypto::ring::default_provider().install_default().is_err() {
        tracing::debug!(target: LOG_TARGET, "a rustls crypto provider was already installed");
    }
    let rt = tokio::runtime::Runtime::new().expect("starting the tokio runtime");
    match rt.block_on(crate::agent::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(target: LOG_TARGET, "{e:#}");
            ExitCode::FAILURE
        }
    }
}
