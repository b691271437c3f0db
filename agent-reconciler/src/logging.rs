//! Log set-up for the binary: `tracing` events to standard error, filtered by `RUST_LOG`
//! (default [`DEFAULT_FILTER`]), as plain lines (ANSI colours only on a terminal) or one JSON object per
//! line.
//!
//! aether-controller has its own copy of this module: the crates the two binaries share are
//! `aether-crds` (no I/O) and `aether-serve-policy` (listeners), and a crate for these few lines
//! would cost more than the copy.

use clap::ValueEnum;

/// Log output format (`--log-format`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// The filter without `RUST_LOG`: `info`, but kube-runtime's watcher only at `error`: it logs a
/// `WARN` for every refused watch retry, and our watch health logs one line per outage instead
/// (docs/install.md, "Troubleshooting: a watch that fails").
pub const DEFAULT_FILTER: &str = "info,kube_runtime::watcher=error";

/// Installs the global subscriber; call once, first thing in `main`.
///
/// # Panics
/// When a global subscriber is already installed.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.init(),
    }
}
