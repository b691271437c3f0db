//! Log set-up for the binary: [`aether_process::logging`] (`--log-format`, `--log-level`,
//! `RUST_LOG` as the fine-grained override, flat JSON lines), the same in every aether binary.
//! docs/install.md, "Logs", has the precedence and the defaults.

pub use aether_process::logging::{DEFAULT_FILTER, LogArgs, LogFormat, LogLevel, QUIET_WATCHER, directives, init};
