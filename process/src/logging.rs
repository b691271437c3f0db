//! Log set-up for a binary: `tracing` events to standard error, as plain lines (ANSI colours only
//! on a terminal) or one flat JSON object per line, filtered by `--log-level` or, when set,
//! `RUST_LOG`.
//!
//! - `--log-level L` (`error`, `warn`, `info`, `debug`, `trace`; default `info`) gives the filter
//!   [`directives`]: `L,kube_runtime::watcher=error` for `error`, `warn` and `info`, plain `L` for
//!   `debug` and `trace`. kube-runtime's watcher logs a `WARN` for every refused watch retry; our
//!   watch health logs one line per outage instead (docs/install.md, "Troubleshooting: a watch
//!   that fails"), so those retries show only when you ask for debug output.
//! - `RUST_LOG`, when set and not empty, replaces that filter entirely (the fine-grained
//!   override, e.g. `RUST_LOG=info,aether_controller::cluster=debug`). A `RUST_LOG` that does not
//!   parse is reported in a warning and `--log-level` applies.
//! - JSON lines carry `timestamp`, `level`, `target`, `message` and the event's fields at the top
//!   level (`{"level":"WARN","pod":"shop/cart-1",...}`), not nested under `fields`.
//!
//! Every binary of the project takes the two flags as [`LogArgs`] (flattened into its `Cli`) and
//! calls [`LogArgs::init`] first thing in `main`.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// `--log-format` and `--log-level`, the same in every binary: flatten into a clap `Parser`
/// (`#[command(flatten)]`). Both are global, so they may also follow a subcommand, and each can
/// be set from its environment variable.
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogArgs {
    /// Log format: plain text or one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Plain, env = "AETHER_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,
    /// The least severe events logged: error, warn, info, debug or trace (from debug on, also
    /// kube-runtime's per-retry watch warnings). RUST_LOG, when set, replaces this filter
    /// entirely (e.g. RUST_LOG=info,kube_client=debug).
    #[arg(long, value_enum, default_value_t = LogLevel::Info, env = "AETHER_LOG_LEVEL", global = true)]
    pub log_level: LogLevel,
}

impl LogArgs {
    /// [`init`] with these flags; call once, first thing in `main`.
    ///
    /// # Panics
    /// When a global subscriber is already installed.
    pub fn init(self) {
        init(self.log_format, self.log_level);
    }
}

/// Log output format (`--log-format`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line, the event's fields at the top level.
    Json,
}

/// The least severe events logged (`--log-level`), unless `RUST_LOG` is set.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// Errors, warnings and what the process does (start-up, watch outages, decisions, ...).
    #[default]
    Info,
    /// Also every decision and retry, kube-runtime's watcher retries included.
    Debug,
    /// Everything, the libraries' internals included.
    Trace,
}

impl LogLevel {
    /// The level as a filter directive: `error`, `warn`, `info`, `debug` or `trace`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// The directive that keeps kube-runtime's per-retry watcher `WARN`s out of the log at
/// `--log-level` `error`, `warn` and `info`.
pub const QUIET_WATCHER: &str = "kube_runtime::watcher=error";

/// The filter without `RUST_LOG` and without `--log-level`: `info,kube_runtime::watcher=error`.
pub const DEFAULT_FILTER: &str = "info,kube_runtime::watcher=error";

/// The filter directives for `level` and the value of `RUST_LOG` (`None` when unset): `RUST_LOG`
/// when it has any non-blank text (it replaces the filter entirely), else `level` with
/// [`QUIET_WATCHER`] for `error`/`warn`/`info`, or `level` alone for `debug`/`trace`. Pure.
pub fn directives(level: LogLevel, rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(env) => env.to_owned(),
        None => match level {
            LogLevel::Debug | LogLevel::Trace => level.as_str().to_owned(),
            LogLevel::Error | LogLevel::Warn | LogLevel::Info => format!("{},{QUIET_WATCHER}", level.as_str()),
        },
    }
}

/// The subscriber [`init`] installs, writing to `writer` through `filter`: plain lines (ANSI
/// colours when `ansi`) or flat JSON objects.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(writer);
    match format {
        LogFormat::Json => Box::new(builder.json().flatten_event(true).finish()),
        LogFormat::Plain => Box::new(builder.finish()),
    }
}

/// Installs the global subscriber writing to standard error, filtered as [`directives`] says
/// for `level` and the environment's `RUST_LOG`; call once, first thing in `main`.
///
/// # Panics
/// When a global subscriber is already installed.
pub fn init(format: LogFormat, level: LogLevel) {
    use tracing_subscriber::util::SubscriberInitExt;
    let rust_log = std::env::var("RUST_LOG").ok();
    let (filter, refused) = match EnvFilter::try_new(directives(level, rust_log.as_deref())) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new(directives(level, None)), Some(e)),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    subscriber(format, filter, ansi, std::io::stderr).init();
    if let Some(e) = refused {
        tracing::warn!(rust_log = rust_log.as_deref().unwrap_or_default(), error = %e,
            log_level = level.as_str(), "RUST_LOG is not a valid filter; using --log-level");
    }
}

/// An error and its sources as one line, `: `-separated, each source once: a link whose text the
/// line already holds is skipped (kube's, tonic's and hyper-util's messages often repeat their
/// source's text, and some hide the cause that matters unless the sources are walked).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    with_sources(error.to_string(), error.source())
}

/// `head` followed by `source` and its own sources, as [`error_chain`] joins them (no leading
/// `: ` when `head` is empty). For errors whose useful text is not their `Display`, e.g. a gRPC
/// status's message.
pub fn with_sources(head: String, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut out = head;
    let mut source = source;
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the subscriber for `format` and `directives` writes for a few events.
    fn logged(format: LogFormat, directives: &str) -> String {
        let out = Lines::default();
        let writer = out.clone();
        let sub = subscriber(format, EnvFilter::new(directives), false, move || writer.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(pod = "shop/cart-1", attempts = 3, "cannot publish a pod Event");
            tracing::debug!("a debug line");
            tracing::warn!(target: "kube_runtime::watcher", "watcher retry");
        });
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn rust_log_replaces_the_filter_and_the_level_keeps_the_watcher_quiet_up_to_info() {
        assert_eq!(directives(LogLevel::default(), None), DEFAULT_FILTER);
        assert_eq!(directives(LogLevel::Warn, None), "warn,kube_runtime::watcher=error");
        assert_eq!(directives(LogLevel::Debug, None), "debug");
        assert_eq!(directives(LogLevel::Trace, Some("  ")), "trace");
        assert_eq!(directives(LogLevel::Error, Some("aether_controller=trace")), "aether_controller=trace");
    }

    #[test]
    fn json_lines_carry_the_fields_at_the_top_level() {
        let text = logged(LogFormat::Json, DEFAULT_FILTER);
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line = lines[0].as_object().unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "cannot publish a pod Event");
        assert_eq!(line["pod"], "shop/cart-1");
        assert_eq!(line["attempts"], 3);
        assert!(line.contains_key("timestamp") && line.contains_key("target"), "{text}");
        assert!(!line.contains_key("fields"), "{text}");
    }

    #[test]
    fn the_watchers_retries_show_from_debug_on() {
        let info = logged(LogFormat::Plain, &directives(LogLevel::Info, None));
        assert!(info.contains("cannot publish") && info.contains("pod=\"shop/cart-1\""), "{info}");
        assert!(!info.contains("watcher retry") && !info.contains("a debug line"), "{info}");
        let debug = logged(LogFormat::Plain, &directives(LogLevel::Debug, None));
        assert!(debug.contains("watcher retry") && debug.contains("a debug line"), "{debug}");
        let error = logged(LogFormat::Plain, &directives(LogLevel::Error, None));
        assert_eq!(error, "");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Link {
        text: &'static str,
        #[source]
        source: Option<Box<Link>>,
    }

    #[test]
    fn an_error_chain_prints_each_source_once_in_order() {
        let leaf = Link { text: "connection refused (os error 111)", source: None };
        let mid = Link { text: "tcp connect error: connection refused (os error 111)", source: Some(Box::new(leaf)) };
        let top = Link { text: "client error (Connect)", source: Some(Box::new(mid)) };
        assert_eq!(error_chain(&top), "client error (Connect): tcp connect error: connection refused (os error 111)");
        assert_eq!(error_chain(&Link { text: "alone", source: None }), "alone");
        // A gRPC status with an empty message: its sources alone, no leading separator.
        let leaf = Link { text: "connection refused", source: None };
        assert_eq!(with_sources(String::new(), Some(&leaf)), "connection refused");
    }
}
