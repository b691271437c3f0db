//! One ADS stream (state of the world), from Envoy's first request to its end: the
//! `AggregatedDiscoveryService` of [`XdsServer`] spawns a task per stream.
//!
//! The task sends a type's resources when Envoy subscribes and again whenever that type's
//! version changes (the renderer already coalesced bursts: no second wait here), matches each
//! request's nonce
//! to the last response of its type (a stale nonce is ignored), and records every ACK and NACK
//! in the shared [`AckTracker`]. A NACK is logged with Envoy's message and the node id; nothing
//! is re-sent for it: Envoy keeps its last good config (for CDS, every cluster it could accept),
//! and the next change gets a new version.
//!
//! Types served: CDS, LDS and ECDS (the health gateway's checks, [`super::health_gateway`]). Each
//! type has its own version, nonce and ACK/NACK state, so a NACK of one type withdraws nothing of
//! another (Envoy keeps its last good version of the NACKed type and applies the others). ECDS is
//! subscribed by resource name; the server always sends its whole set of that type (one resource,
//! the one the gateway names).
//!
//! Incremental (delta) xDS, `DeltaAggregatedResources`, is served by [`super::delta`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_server::AggregatedDiscoveryService,
};
use futures::StreamExt;
use prometheus_client::metrics::gauge::Gauge;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::acks::{AckTracker, Nack, StreamState};
use super::metrics::{MODE_SOTW, XdsMetrics};
use super::resources::Resources;
use super::server::XdsServer;

static NONCE: AtomicU64 = AtomicU64::new(1);

/// A nonce no other response of this process carried (state of the world and delta alike).
pub(super) fn next_nonce() -> String {
    NONCE.fetch_add(1, Ordering::Relaxed).to_string()
}

/// One stream counted in the tracker and the gauge, from its first request that carried a node
/// until it is dropped: with its [`Stream`] (or a delta stream), however the stream's task ends.
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

/// Per-stream, per-type state.
#[derive(Default)]
struct Sent {
    subscribed: bool,
    version: Option<String>,
    nonce: Option<String>,
}

struct Stream {
    node: String,
    /// Set by the first request that carries a node; counts the stream as connected until the
    /// stream is dropped.
    connection: Option<Connection>,
    peer: String,
    types: HashMap<String, Sent>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    tracker: AckTracker,
    metrics: Option<XdsMetrics>,
}

impl Stream {
    /// Sends `type_url` from `resources` unless this stream already sent that version (or
    /// `force`, for a fresh subscription). Returns false when the client is gone.
    async fn push(&mut self, resources: &Resources, type_url: &str, force: bool) -> bool {
        let Some(set) = resources.get(type_url) else {
            return true;
        };
        let sent = self.types.entry(type_url.to_owned()).or_default();
        if !force && sent.version.as_deref() == Some(set.version.as_str()) {
            return true;
        }
        let nonce = next_nonce();
        sent.version = Some(set.version.clone());
        sent.nonce = Some(nonce.clone());
        let response = DiscoveryResponse {
            version_info: set.version.clone(),
            resources: set.iter().map(|r| r.resource.resource.clone()).collect(),
            type_url: type_url.to_owned(),
            nonce,
            ..Default::default()
        };
        tracing::debug!(node = %self.node, type_url, version = %set.version,
            resources = set.resources.len(), "xDS push");
        let version = set.version.clone();
        self.tracker.update(&self.node, type_url, |s| {
            s.sent_version = Some(version);
            s.sends += 1;
        });
        if let Some(m) = &self.metrics {
            XdsMetrics::inc(&m.pushes, type_url);
            m.sent(type_url, MODE_SOTW, response.resources.len() as u64, response.encoded_len() as u64);
        }
        self.out.send(Ok(response)).await.is_ok()
    }

    /// Handles one request; returns false when the client is gone.
    async fn request(&mut self, req: DiscoveryRequest, resources: &Resources) -> bool {
        if let Some(node) = &req.node
            && self.connection.is_none()
        {
            self.node = node.id.clone();
            self.connection = Some(Connection::open(&self.tracker, &self.node, self.metrics.as_ref()));
            tracing::info!(node = %self.node, peer = %self.peer, "xDS stream opened");
        }
        let type_url = req.type_url.clone();
        if resources.get(&type_url).is_none() {
            tracing::warn!(node = %self.node, type_url, "xDS request for a type we do not serve");
            return true;
        }
        if req.response_nonce.is_empty() {
            // A (re)subscription: always answer with the current state.
            self.types.entry(type_url.clone()).or_default().subscribed = true;
            return self.push(resources, &type_url, true).await;
        }
        let sent = self.types.entry(type_url.clone()).or_default();
        sent.subscribed = true;
        if sent.nonce.as_deref() != Some(req.response_nonce.as_str()) {
            tracing::debug!(node = %self.node, type_url, nonce = %req.response_nonce,
                "stale xDS nonce ignored");
            return true;
        }
        let sent_version = sent.version.clone().unwrap_or_default();
        if let Some(err) = req.error_detail {
            tracing::warn!(node = %self.node, type_url, version = %sent_version,
                applied_version = %req.version_info, code = err.code, error = %err.message,
                "Envoy rejected xDS update (NACK); it keeps its last good config");
            if let Some(m) = &self.metrics {
                XdsMetrics::inc(&m.nacks, &type_url);
            }
            let nack = Nack { version: sent_version, nonce: req.response_nonce, message: err.message, code: err.code };
            self.on_stream(|s| {
                s.nacked.insert(type_url.clone(), nack.clone());
            });
            self.tracker.update(&self.node, &type_url, |s| {
                s.nacks += 1;
                s.last_nack = Some(nack);
            });
        } else if req.version_info == sent_version {
            tracing::debug!(node = %self.node, type_url, version = %sent_version, "xDS ACK");
            if let Some(m) = &self.metrics {
                XdsMetrics::inc(&m.acks, &type_url);
                if let Some(elapsed) = m.clock.acked(&type_url, &sent_version) {
                    m.change_to_ack.observe(elapsed.as_secs_f64());
                }
            }
            self.on_stream(|s| {
                s.acked.insert(type_url.clone(), sent_version.clone());
            });
            self.tracker.update(&self.node, &type_url, |s| {
                s.acks += 1;
                s.acked_version = Some(sent_version);
            });
        }
        true
    }

    /// Records on this stream's [`StreamState`] (nothing before it is counted as connected).
    fn on_stream(&self, f: impl FnOnce(&mut StreamState)) {
        if let Some(c) = &self.connection {
            self.tracker.update_stream(c.id, f);
        }
    }

    async fn push_changes(&mut self, resources: &Resources) -> bool {
        for type_url in resources.type_urls() {
            let subscribed = self.types.get(type_url).is_some_and(|s| s.subscribed);
            if subscribed && !self.push(resources, type_url, false).await {
                return false;
            }
        }
        true
    }
}

/// One ADS session of either mode (state of the world: [`Stream`]; delta:
/// `super::delta::DeltaStream`), as [`serve`] drives it.
pub(super) trait Session: Send {
    /// What the client sends: `DiscoveryRequest` or `DeltaDiscoveryRequest`.
    type Request: Send;
    /// The stream's name in log lines (`xDS`, `delta xDS`).
    const LABEL: &'static str;
    /// The node id (empty until a request carries one) and the peer address, for log lines.
    fn names(&self) -> (&str, &str);
    /// Handles one request against the resources served now; false when the client is gone.
    fn on_request(&mut self, req: Self::Request, current: &Arc<Resources>) -> impl Future<Output = bool> + Send;
    /// Sends what changed after the published resources changed; false when the client is gone.
    fn on_change(&mut self, current: &Arc<Resources>) -> impl Future<Output = bool> + Send;
}

impl Session for Stream {
    type Request = DiscoveryRequest;
    const LABEL: &'static str = "xDS";

    fn names(&self) -> (&str, &str) {
        (&self.node, &self.peer)
    }

    fn on_request(&mut self, req: DiscoveryRequest, current: &Arc<Resources>) -> impl Future<Output = bool> + Send {
        self.request(req, current)
    }

    fn on_change(&mut self, current: &Arc<Resources>) -> impl Future<Output = bool> + Send {
        self.push_changes(current)
    }
}

/// Serves one session until the client ends it, a stream error, or the server's shutdown:
/// requests go to the session as they come, and each change of the published resources is
/// offered to it at once (the renderer, [`super::publish`], is where bursts are coalesced, by
/// `--xds-debounce-ms`: a second wait per stream would only add latency). When the publisher is
/// gone the session keeps serving what it has.
pub(super) async fn serve<S: Session>(
    mut inbound: Streaming<S::Request>,
    mut session: S,
    mut resources: watch::Receiver<Arc<Resources>>,
    mut shutdown: watch::Receiver<bool>,
) where
    Streaming<S::Request>: futures::Stream<Item = Result<S::Request, Status>> + Unpin,
{
    let mut current = resources.borrow_and_update().clone();
    let mut watching = true;
    loop {
        tokio::select! {
            msg = inbound.next() => match msg {
                Some(Ok(req)) => {
                    if !session.on_request(req, &current).await {
                        break;
                    }
                }
                Some(Err(status)) => {
                    let (node, peer) = session.names();
                    tracing::info!(node, peer, %status, "{} stream error", S::LABEL);
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
                if !session.on_change(&current).await {
                    break;
                }
            }
            // The `Ref` wait_for returns is not Send: drop it inside the branch future.
            () = async { drop(shutdown.wait_for(|closed| *closed).await) } => break,
        }
    }
    let (node, peer) = session.names();
    tracing::info!(node, peer, "{} stream closed", S::LABEL);
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let peer = request.remote_addr().map_or_else(|| "unix".to_owned(), |a| a.to_string());
        let (out, rx) = mpsc::channel(8);
        let stream = Stream {
            node: String::new(),
            connection: None,
            peer,
            types: HashMap::new(),
            out,
            tracker: self.tracker.clone(),
            metrics: self.metrics.clone(),
        };
        tokio::spawn(serve(request.into_inner(), stream, self.resources.clone(), self.shutdown.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = request.remote_addr().map_or_else(|| "unix".to_owned(), |a| a.to_string());
        let (out, rx) = mpsc::channel(8);
        tokio::spawn(super::delta::run(request.into_inner(), self.clone(), peer, out));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resources::CLUSTER_TYPE_URL;
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
