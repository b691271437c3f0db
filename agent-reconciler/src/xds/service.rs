//! The ADS gRPC service, [`XdsServer`]: tonic's `AggregatedDiscoveryService` over the latest
//! published [`ResourceSet`], one task per Envoy stream, state of the world
//! (`StreamAggregatedResources`, `sotw`) or incremental (`DeltaAggregatedResources`,
//! [`super::delta`]), both driven by `session::run` and recording into one
//! [`AckTracker`] and one set of metrics.
//!
//! Envoy picks the variant with its bootstrap's `ads_config.api_type`: `GRPC` (state of the
//! world) or `DELTA_GRPC` (delta: a change sends only the resources that changed and the names
//! removed). Listening and shutdown are [`super::server`]'s.

use std::sync::Arc;
use std::time::Duration;

use aether_serve_policy::{Gate, ListenerKind, ListenerMetrics};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_server::{AggregatedDiscoveryService, AggregatedDiscoveryServiceServer},
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::acks::AckTracker;
use super::delta::DeltaStream;
use super::metrics::XdsMetrics;
use super::resource_set::ResourceSet;
use super::session;
use super::sotw::SotwStream;

/// The ADS service: serves the latest [`ResourceSet`] from a watch channel to every Envoy stream,
/// state of the world or delta.
#[derive(Clone, Debug)]
pub struct XdsServer {
    resources: watch::Receiver<Arc<ResourceSet>>,
    tracker: AckTracker,
    metrics: Option<XdsMetrics>,
    pub(super) shutdown_wait: Duration,
    shutdown: watch::Receiver<bool>,
    shutdown_tx: Arc<watch::Sender<bool>>,
    pub(super) gate: Gate,
}

impl XdsServer {
    /// A server of `resources` (whatever the channel holds now and later), with a fresh
    /// [`AckTracker`], and the default xDS connection policy
    /// ([`ListenerKind::Xds`]) counting into metrics nobody scrapes.
    pub fn new(resources: watch::Receiver<Arc<ResourceSet>>) -> Self {
        let (shutdown_tx, shutdown) = watch::channel(false);
        XdsServer {
            resources,
            tracker: AckTracker::new(),
            metrics: None,
            shutdown_wait: Duration::ZERO,
            shutdown,
            shutdown_tx: Arc::new(shutdown_tx),
            gate: Gate::new(ListenerKind::Xds.default_policy(), &ListenerMetrics::new()),
        }
    }

    /// Same server, admitting connections through `gate`: its cap, first-byte timeout and
    /// HTTP/2 keepalive (the policy's [`keepalive`](aether_serve_policy::ConnectionPolicy::keepalive);
    /// none when the policy has an idle timeout instead), counting into the gate's metrics.
    pub fn with_connection_gate(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// Same server, waiting up to `wait` at shutdown for the clients to close their streams
    /// before it ends the rest itself (see [`serve_listener`](super::server::serve_listener)).
    /// Default: zero, end them at once.
    pub fn with_shutdown_wait(mut self, wait: Duration) -> Self {
        self.shutdown_wait = wait;
        self
    }

    /// Same server, recording into `tracker` (to share one tracker with other readers).
    pub fn with_tracker(mut self, tracker: AckTracker) -> Self {
        self.tracker = tracker;
        self
    }

    /// Same server, counting pushes, ACKs and NACKs into `metrics` and observing the
    /// change-to-ACK time of versions stamped on its clock.
    pub fn with_metrics(mut self, metrics: XdsMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The tracker this server records ACKs and NACKs into.
    pub fn tracker(&self) -> AckTracker {
        self.tracker.clone()
    }

    /// Ends every open stream (Envoy sees the RPC finish and reconnects to whoever serves
    /// next). [`serve_listener`](super::server::serve_listener) calls it when its shutdown wait
    /// ends.
    pub fn close_streams(&self) {
        let _ = self.shutdown_tx.send(true);
    }

    /// The tonic service to add to a `tonic::transport::Server`.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<XdsServer> {
        AggregatedDiscoveryServiceServer::new(self)
    }
}

/// The peer of `request`, for log lines (`unix` on a Unix socket).
fn peer<T>(request: &Request<T>) -> String {
    request.remote_addr().map_or_else(|| "unix".to_owned(), |a| a.to_string())
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (out, rx) = mpsc::channel(8);
        let stream = SotwStream::new(peer(&request), self.tracker.clone(), self.metrics.clone(), out);
        tokio::spawn(session::run(request.into_inner(), stream, self.resources.clone(), self.shutdown.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (out, rx) = mpsc::channel(8);
        let stream = DeltaStream::new(peer(&request), self.tracker.clone(), self.metrics.clone(), out);
        tokio::spawn(session::run(request.into_inner(), stream, self.resources.clone(), self.shutdown.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
