//! Which inbound listeners Envoy could not bind: read from Envoy's own structured state, never
//! from the text of a NACK (docs/design-notes.md, "Agent").
//!
//! A listener bound in a pod's netns fails when something there already holds the port (the app
//! also listens on TCP). Envoy then rejects that one listener, applies the others of the same
//! LDS response, and NACKs the response (measured with Envoy 1.40). The NACK's message is free
//! text and its `resource_names` is the subscription, not the culprit; Envoy's admin
//! `/config_dump?resource=dynamic_listeners` instead lists each rejected listener by name with an
//! `error_state` (`details`: e.g. `cannot bind '0.0.0.0:8080': Address already in use`). After
//! every new LDS NACK the agent reads that dump ([`fetch`]), keeps the failed `inbound_*` names
//! ([`failed_inbound`], pure) and the driver stops offering those listeners, so the next LDS
//! response is ACKed and every other pod keeps its listeners.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::acks::AckTracker;
use super::envoy_admin::EnvoyAdmin;
use super::resource_set::LISTENER_TYPE_URL;
use crate::names::ClusterName;

/// One inbound listener Envoy rejected: its name (`inbound_<ns>_<pod>_<port>`, parsed) and
/// Envoy's `error_state.details`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindFailure {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The declared port whose listener failed.
    pub port: u16,
    /// Envoy's reason, as it wrote it (at most 512 bytes kept).
    pub details: String,
}

/// The most of Envoy's `details` kept per failure (bytes).
pub const DETAILS_MAX_BYTES: usize = 512;

/// The failed inbound listeners in a `/config_dump?resource=dynamic_listeners` answer: every
/// `DynamicListener` with an `error_state` whose name (the entry's `name`, else the failed
/// configuration's) parses as an inbound listener name. Other names (the health gateway, another
/// control plane's) are ignored. Sorted, without duplicates (Envoy may list one twice).
pub fn failed_inbound(dump: &Value) -> Vec<BindFailure> {
    let mut out: Vec<BindFailure> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let error = l.get("error_state")?;
            let name = l["name"].as_str().or_else(|| error["failed_configuration"]["name"].as_str())?;
            let ClusterName::Inbound { namespace, pod, port } = ClusterName::parse(name)? else { return None };
            let mut details = error["details"].as_str().unwrap_or_default().to_owned();
            if details.len() > DETAILS_MAX_BYTES {
                let cut = (0..=DETAILS_MAX_BYTES).rev().find(|i| details.is_char_boundary(*i)).unwrap_or(0);
                details.truncate(cut);
            }
            Some(BindFailure { namespace, pod, port, details })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.pod, a.port).cmp(&(&b.namespace, &b.pod, b.port)));
    out.dedup_by(|a, b| (&a.namespace, &a.pod, a.port) == (&b.namespace, &b.pod, b.port));
    out
}

/// Why the dump could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No answer, or not HTTP 200.
    #[error("GET /config_dump from Envoy's admin at {addr} failed: {reason}")]
    Request {
        /// The admin address (`--envoy-admin`).
        addr: EnvoyAdmin,
        /// The HTTP or connection error.
        reason: String,
    },
}

/// The most of a config dump read (bytes): a node with many pods has many listeners.
pub const DUMP_MAX_BYTES: usize = 64 << 20;

/// Reads `/config_dump?resource=dynamic_listeners` from Envoy's admin at `addr` (plain HTTP over
/// its Unix socket, or TCP), within `timeout`.
///
/// # Errors
/// [`AdminError::Request`] for no answer in time, a status other than 200, a body over
/// [`DUMP_MAX_BYTES`] or one that is not JSON.
pub async fn fetch(addr: &EnvoyAdmin, timeout: Duration) -> Result<Value, AdminError> {
    let err = |reason: String| AdminError::Request { addr: addr.clone(), reason };
    let client = super::envoy_admin::client(addr, timeout).map_err(|e| err(e.to_string()))?;
    let resp =
        client.get(addr.url("/config_dump?resource=dynamic_listeners")).send().await.map_err(|e| err(e.to_string()))?;
    if resp.status() != reqwest::StatusCode::OK {
        return Err(err(format!("HTTP {}", resp.status())));
    }
    if resp.content_length().is_some_and(|n| n > DUMP_MAX_BYTES as u64) {
        return Err(err(format!("the dump is over {DUMP_MAX_BYTES} bytes")));
    }
    let body = resp.bytes().await.map_err(|e| err(e.to_string()))?;
    if body.len() > DUMP_MAX_BYTES {
        return Err(err(format!("the dump is over {DUMP_MAX_BYTES} bytes")));
    }
    serde_json::from_slice(&body).map_err(|e| err(format!("not JSON: {e}")))
}

/// Reads of the dump after one NACK before giving up until the next one (2 s apart).
pub const FETCH_ATTEMPTS: u32 = 5;

/// Watches `tracker`; after each new LDS NACK (from any node's stream) reads the dump from
/// `admin` and sends the failed inbound listeners to `tx` (only when there are some). Ends when
/// `tx` closes. A dump that cannot be read is logged and read again up to [`FETCH_ATTEMPTS`]
/// times.
pub fn spawn_watch(tracker: AckTracker, admin: EnvoyAdmin, tx: mpsc::Sender<Vec<BindFailure>>) {
    tokio::spawn(async move {
        let mut seen = 0u64;
        loop {
            let total = |t: &AckTracker| t.nodes().iter().map(|n| t.nack_count(n, LISTENER_TYPE_URL)).sum::<u64>();
            if !tracker.wait_for(Duration::from_secs(3600), |t| total(t) > seen).await {
                if tx.is_closed() {
                    return;
                }
                continue;
            }
            seen = total(&tracker);
            // Envoy NACKs once per response: a dump that cannot be read is retried a few times,
            // since no new NACK may come to trigger another read.
            for attempt in 1..=FETCH_ATTEMPTS {
                match fetch(&admin, Duration::from_secs(5)).await {
                    Ok(dump) => {
                        let failed = failed_inbound(&dump);
                        if !failed.is_empty() && tx.send(failed).await.is_err() {
                            return;
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, attempt, of = FETCH_ATTEMPTS, "LDS NACKed; cannot read which inbound listener failed");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's admin is a Unix socket: the dump is read over it (one plain HTTP/1.1 answer
    /// from a listener standing in for Envoy's admin), and a socket nobody listens on is an
    /// error naming the address.
    #[tokio::test]
    async fn the_dump_is_read_over_the_admins_unix_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // As `startup` does before anything builds a client.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                req.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"configs":[{"name":"inbound_shop_cart-2_8080","error_state":{"details":"in use"}}]}"#;
            let resp = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            conn.write_all(resp.as_bytes()).await.unwrap();
            String::from_utf8(req).unwrap()
        });
        let admin = EnvoyAdmin::Unix(path.clone());
        let dump = fetch(&admin, Duration::from_secs(5)).await.unwrap();
        let req = server.await.unwrap();
        assert!(req.starts_with("GET /config_dump?resource=dynamic_listeners HTTP/1.1\r\n"), "{req}");
        assert_eq!(failed_inbound(&dump)[0].pod, "cart-2");
        std::fs::remove_file(&path).unwrap();
        let e = fetch(&admin, Duration::from_secs(1)).await.unwrap_err().to_string();
        assert!(e.contains(&format!("unix:{}", path.display())), "{e}");
    }

    #[test]
    fn only_inbound_listeners_with_an_error_state_count_once_each() {
        let dump = serde_json::json!({"configs": [
            {"name": "aether_health", "active_state": {}},
            {"name": "inbound_shop_cart-1_8080", "active_state": {}},
            {"name": "inbound_shop_cart-2_8080", "error_state": {"details": "cannot bind '0.0.0.0:8080': Address already in use"}},
            {"error_state": {"details": "cannot bind '0.0.0.0:8080': Address already in use",
                             "failed_configuration": {"name": "inbound_shop_cart-2_8080"}}},
            {"name": "aether_health", "error_state": {"details": "x"}},
            {"name": "inbound_bad", "error_state": {"details": "x"}},
            {"name": "inbound_shop_cart-3_9090", "error_state": {"details": "é".repeat(400)}}
        ]});
        let failed = failed_inbound(&dump);
        assert_eq!(failed.len(), 2);
        assert_eq!((failed[0].pod.as_str(), failed[0].port), ("cart-2", 8080));
        assert_eq!(failed[0].details, "cannot bind '0.0.0.0:8080': Address already in use");
        assert_eq!((failed[1].pod.as_str(), failed[1].port), ("cart-3", 9090));
        assert!(failed[1].details.len() <= DETAILS_MAX_BYTES);
        assert!(failed_inbound(&serde_json::json!({})).is_empty());
    }
}
