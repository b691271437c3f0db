//! What every aether binary does the same as a process: which build it is
//! ([`build_info`]: the `--version` line and `aether_build_info`), its logs ([`logging`]:
//! `--log-level`, `--log-format`, `RUST_LOG`, flat JSON), and its own Prometheus metrics:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `aether_build_info` | info (value 1) | `version`, `git_sha` | which build runs ([`build_info`]) |
//! | `process_cpu_seconds_total` | counter (seconds) | | user + system CPU time |
//! | `process_resident_memory_bytes` | gauge (bytes) | | resident set size |
//! | `process_virtual_memory_bytes` | gauge (bytes) | | virtual memory size |
//! | `process_open_fds` | gauge | | open file descriptors |
//! | `process_max_fds` | gauge | | the soft `RLIMIT_NOFILE` (absent when unlimited) |
//! | `process_start_time_seconds` | gauge (seconds since the Unix epoch) | | when the process started |
//!
//! The `process_*` names and meanings are the Prometheus client libraries' standard ones, so the
//! usual dashboards and alerts apply. They are read from `/proc` at scrape time ([`process`]):
//! Linux only; elsewhere (and if `/proc` cannot be read) those series are left out, never an
//! error of the scrape. prometheus-client 0.26 has no process collector of its own.
//!
//! And one value two binaries take as a flag: where Envoy's admin answers ([`envoy_admin`]: the
//! agent's `--envoy-admin`, the proxy launcher's `--admin`).
//!
//! [`register`] adds all of them to a binary's registry. [`build_info::VERSION_LINE`] is what
//! `--version` prints after the binary's name.

#![forbid(unsafe_code)]

pub mod build_info;
pub mod envoy_admin;
pub mod logging;
pub mod process;

use prometheus_client::registry::Registry;

/// Registers `aether_build_info` and the `process_*` collector into `registry` (once per
/// registry).
pub fn register(registry: &mut Registry) {
    build_info::register(registry);
    registry.register_collector(Box::new(process::ProcessCollector));
}
