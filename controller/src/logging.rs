//! Log set-up for the binary: `tracing` events to standard error, filtered by `RUST_LOG`
//! (default `info`), as plain lines (ANSI colours only on a terminal) or one JSON object per
//! line.
//!
//! aether-agent has its own copy of this module: the two binaries share only `aether-crds`,
//! which does no I/O, and a crate for these few lines would cost more than the copy.

use clap::ValueEnum;

/// Log output format (`--log-format`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber; call once, first thing in `main`.
///
/// # Panics
/// When a global subscriber is already installed.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.init(),
    }
}
