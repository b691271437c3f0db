//! What a state-of-the-world stream ([`super::sotw`]) and an incremental one ([`super::delta`])
//! share: nonces ([`next_nonce`]), the stream's [`Session`] (its node, counted as connected once a
//! request names it; the one place a send, an ACK or a NACK is recorded into the [`AckTracker`],
//! the stream's [`StreamState`] and the metrics), and the loop that serves a stream ([`run`]).
//!
//! What differs between the two is behind [`Protocol`]: the request type, and the per-type state
//! each keeps (state of the world: the version and nonce last sent; delta: the subscription, the
//! versions the client holds, the responses in flight).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::config::core::v3::Node;
use futures::StreamExt;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tonic::{Status, Streaming};

use super::acks::{AckTracker, Nack, StreamState};
use super::metrics::XdsMetrics;
use super::resource_set::ResourceSet;

static NONCE: AtomicU64 = AtomicU64::new(1);

/// A nonce no other response of this process carried (state of the world and delta alike).
pub(super) fn next_nonce() -> String {
    NONCE.fetch_add(1, Ordering::Relaxed).to_string()
}

/// One stream counted in the tracker and the gauge, from its first request that carried a node
/// until it is dropped: with its [`Session`], however the stream's task ends.
pub(super) struct Connection {
    pub(super) id: u64,
    tracker: AckTracker,
    gauge: Option<Gauge>,
}

impl Connection {
    /// Counts a stream of `node` as open in `tracker` (and the `connected` gauge of `metrics`).
    pub(super) fn open(tracker: &AckTracker, node: &str, metrics: Option<&XdsMetrics>) -> Connection {
        let gauge = metrics.map(|m| m.connected.clone());
        if let Some(g) = &gauge {
            g.inc();
        }
        Connection { id: tracker.stream_opened(node), tracker: tracker.clone(), gauge }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.tracker.stream_closed(self.id);
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}

/// One ADS stream, whichever variant: who is on the other end, and where what happens on it is
/// recorded.
pub(super) struct Session {
    /// Envoy's node id (empty until a request carries one).
    pub(super) node: String,
    /// Set by the first request that carries a node; counts the stream as connected until the
    /// session is dropped.
    connection: Option<Connection>,
    peer: String,
    tracker: AckTracker,
    metrics: Option<XdsMetrics>,
    /// The metrics' `mode` label ([`super::metrics::MODE_SOTW`] or
    /// [`super::metrics::MODE_DELTA`]).
    mode: &'static str,
    /// The stream's name in log lines (`xDS`, `delta xDS`).
    label: &'static str,
}

impl Session {
    /// A session of a stream from `peer`, recording into `tracker` and `metrics` under `mode`,
    /// logged as `label`.
    pub(super) fn new(
        peer: String,
        tracker: AckTracker,
        metrics: Option<XdsMetrics>,
        mode: &'static str,
        label: &'static str,
    ) -> Session {
        Session { node: String::new(), connection: None, peer, tracker, metrics, mode, label }
    }

    /// The node id (empty until a request carries one) and the peer address, for log lines.
    pub(super) fn names(&self) -> (&str, &str) {
        (&self.node, &self.peer)
    }

    /// Takes the node of a request: the first that carries one counts the stream as connected.
    pub(super) fn identify(&mut self, node: Option<&Node>) {
        if let Some(node) = node
            && self.connection.is_none()
        {
            self.node = node.id.clone();
            self.connection = Some(Connection::open(&self.tracker, &self.node, self.metrics.as_ref()));
            tracing::info!(node = %self.node, peer = %self.peer, "{} stream opened", self.label);
        }
    }

    /// Records a response of `type_url` at `version`, carrying `resources` resources in `bytes`
    /// encoded bytes, as sent.
    pub(super) fn sent(&self, type_url: &str, version: String, resources: u64, bytes: u64) {
        self.tracker.update(&self.node, type_url, |s| {
            s.sent_version = Some(version);
            s.sends += 1;
        });
        if let Some(m) = &self.metrics {
            XdsMetrics::inc(&m.pushes, type_url);
            m.sent(type_url, self.mode, resources, bytes);
        }
    }

    /// Records Envoy's ACK of `version` of `type_url`, and the change-to-ACK time of a version
    /// stamped on the metrics' clock.
    pub(super) fn acked(&self, type_url: &str, version: String) {
        if let Some(m) = &self.metrics {
            XdsMetrics::inc(&m.acks, type_url);
            if let Some(elapsed) = m.clock.acked(type_url, &version) {
                m.change_to_ack.observe(elapsed.as_secs_f64());
            }
        }
        self.on_stream(|s| {
            s.acked.insert(type_url.to_owned(), version.clone());
        });
        self.tracker.update(&self.node, type_url, |s| {
            s.acks += 1;
            s.acked_version = Some(version);
        });
    }

    /// Records Envoy's NACK of a response of `type_url`.
    pub(super) fn nacked(&self, type_url: &str, nack: Nack) {
        if let Some(m) = &self.metrics {
            XdsMetrics::inc(&m.nacks, type_url);
        }
        self.on_stream(|s| {
            s.nacked.insert(type_url.to_owned(), nack.clone());
        });
        self.tracker.update(&self.node, type_url, |s| {
            s.nacks += 1;
            s.last_nack = Some(nack);
        });
    }

    /// Records on this stream's [`StreamState`] (nothing before it is counted as connected).
    fn on_stream(&self, f: impl FnOnce(&mut StreamState)) {
        if let Some(c) = &self.connection {
            self.tracker.update_stream(c.id, f);
        }
    }
}

/// What differs between a state-of-the-world stream and a delta stream, as [`run`] drives them.
pub(super) trait Protocol: Send {
    /// What the client sends: `DiscoveryRequest` or `DeltaDiscoveryRequest`.
    type Request: Send;
    /// The stream's session.
    fn session(&self) -> &Session;
    /// Handles one request against the resources served now; false when the client is gone.
    fn on_request(&mut self, req: Self::Request, current: &Arc<ResourceSet>) -> impl Future<Output = bool> + Send;
    /// Sends what changed after the published resources changed; false when the client is gone.
    fn on_change(&mut self, current: &Arc<ResourceSet>) -> impl Future<Output = bool> + Send;
}

/// Serves one stream until the client ends it, a stream error, or the server's shutdown:
/// requests go to the protocol as they come, and each change of the published resources is
/// offered to it at once (the encoder task, [`super::publish`], is where bursts are coalesced, by
/// `--xds-debounce-ms`: a second wait per stream would only add latency). When the publisher is
/// gone the stream keeps serving what it has.
pub(super) async fn run<P: Protocol>(
    mut inbound: Streaming<P::Request>,
    mut protocol: P,
    mut resources: watch::Receiver<Arc<ResourceSet>>,
    mut shutdown: watch::Receiver<bool>,
) where
    Streaming<P::Request>: futures::Stream<Item = Result<P::Request, Status>> + Unpin,
{
    let mut current = resources.borrow_and_update().clone();
    let mut watching = true;
    loop {
        tokio::select! {
            msg = inbound.next() => match msg {
                Some(Ok(req)) => {
                    if !protocol.on_request(req, &current).await {
                        break;
                    }
                }
                Some(Err(status)) => {
                    let session = protocol.session();
                    let (node, peer) = session.names();
                    tracing::info!(node, peer, %status, "{} stream error", session.label);
                    break;
                }
                None => break,
            },
            changed = resources.changed(), if watching => {
                if changed.is_err() {
                    // The publisher is gone: keep serving what we have.
                    watching = false;
                    continue;
                }
                current = resources.borrow_and_update().clone();
                if !protocol.on_change(&current).await {
                    break;
                }
            }
            // The `Ref` wait_for returns is not Send: drop it inside the branch future.
            () = async { drop(shutdown.wait_for(|closed| *closed).await) } => break,
        }
    }
    let session = protocol.session();
    let (node, peer) = session.names();
    tracing::info!(node, peer, "{} stream closed", session.label);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resource_set::CLUSTER_TYPE_URL;
    use std::time::Duration;

    #[tokio::test]
    async fn a_stream_counts_as_connected_until_its_connection_is_dropped() {
        let t = AckTracker::new();
        let m = XdsMetrics::new();
        let a = Connection::open(&t, "n1", Some(&m));
        let b = Connection::open(&t, "n1", None);
        let c = Connection::open(&t, "n2", Some(&m));
        assert_eq!((t.connected_total(), t.connected("n1"), t.connected("n2"), t.connected("n3")), (3, 2, 1, 0));
        assert_eq!(m.connected.get(), 2, "only streams given the metrics count in the gauge");
        t.update_stream(a.id, |s| {
            s.acked.insert(CLUSTER_TYPE_URL.to_owned(), "v1".to_owned());
        });
        let streams = t.streams();
        assert_eq!(streams.iter().map(|s| s.node.as_str()).collect::<Vec<_>>(), ["n1", "n1", "n2"], "oldest first");
        assert_eq!(streams[0].acked.get(CLUSTER_TYPE_URL).map(String::as_str), Some("v1"));

        let t2 = t.clone();
        let waiter =
            tokio::spawn(async move { t2.wait_for(Duration::from_secs(5), |t| t.connected_total() == 0).await });
        drop((a, b));
        assert_eq!(t.connected("n1"), 0);
        drop(c);
        assert!(waiter.await.unwrap(), "closing wakes waiters");
        assert_eq!(m.connected.get(), 0);
        assert!(t.streams().is_empty());
    }
}
