//! Envoy's admin API as the agent reads it (`--envoy-admin`): the address type, shared with the
//! proxy launcher ([`aether_process::envoy_admin`]: a Unix socket, the chart's
//! `/run/aether/envoy/admin.sock`, or `IP:PORT`), and an async HTTP client for it.

use std::time::Duration;

pub use aether_process::envoy_admin::{EnvoyAdmin, SUN_PATH_MAX_BYTES};

/// A plain-HTTP client for `admin` that gives up after `timeout`: over the Unix socket, or over
/// TCP with no proxy. No root certificates (the agent's image has none, and loading the
/// platform's would fail the builder). Requests go to [`EnvoyAdmin::url`].
///
/// # Errors
/// When reqwest cannot build the client.
pub fn client(admin: &EnvoyAdmin, timeout: Duration) -> reqwest::Result<reqwest::Client> {
    let builder = reqwest::Client::builder().no_proxy().tls_certs_only(Vec::new()).timeout(timeout);
    match admin.unix_path() {
        Some(p) => builder.unix_socket(p),
        None => builder,
    }
    .build()
}
