//! The ADS gRPC server that serves CDS, LDS and ECDS to the node's Envoy, over state-of-the-world
//! (`StreamAggregatedResources`) and incremental (`DeltaAggregatedResources`) streams alike:
//! [`XdsServer`], and [`serve`] / [`serve_listener`] with their graceful shutdown.
//!
//! Its parts live in sibling modules, and their public items are re-exported here under their
//! old paths: [`super::acks`] (the [`AckTracker`]), [`super::metrics`] ([`XdsMetrics`],
//! [`ChangeClock`]), [`super::publish`] ([`spawn_renderer`]), [`super::listen`] ([`XdsAddr`],
//! [`XdsListener`], [`ServeError`]), the private `stream` module (one state-of-the-world
//! stream's request/response loop, ACK/NACK handling) and [`super::delta`] (one delta stream's).
//!
//! Shutdown ([`serve_listener`]): stop accepting, remove the own socket file (if still ours),
//! wait up to [`XdsServer::with_shutdown_wait`] for the clients to close their streams, end the
//! rest; the returned [`Drained`] says whether the clients had gone.
//!
//! Connections ([`XdsServer::with_connection_gate`], docs/listeners.md): at most the policy's
//! `max_connections` at once (more are closed at once and counted), the first byte within the
//! first-byte timeout of accept, then no idle timeout (the ADS stream is quiet between pushes):
//! HTTP/2 PINGs every keepalive interval find a dead peer instead.
//!
//! Envoy picks the variant with its bootstrap's `ads_config.api_type`: `GRPC` (state of the
//! world) or `DELTA_GRPC` (delta: a change sends only the resources that changed and the names
//! removed).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aether_serve_policy::{Gate, GatedListener, ListenerKind, ListenerMetrics};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use tokio::sync::watch;

pub use super::acks::{AckTracker, Nack, StreamState, TypeState};
pub use super::listen::{ServeError, XdsAddr, XdsListener};
pub use super::metrics::{ChangeClock, TypeLabel, XdsMetrics, type_label};
pub use super::publish::{spawn_renderer, spawn_renderer_with_clock};
use super::resources::Resources;
use crate::shutdown::FileId;

/// Default debounce of the renderer ([`spawn_renderer`], `--xds-debounce-ms`): how long a change
/// waits for further changes before it is rendered and pushed. The only wait on the way: the ADS
/// streams push each rendered version at once.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(20);

/// The ADS service: serves the latest [`Resources`] from a watch channel to every Envoy stream,
/// state of the world or delta.
#[derive(Clone, Debug)]
pub struct XdsServer {
    pub(super) resources: watch::Receiver<Arc<Resources>>,
    pub(super) tracker: AckTracker,
    pub(super) metrics: Option<XdsMetrics>,
    shutdown_wait: Duration,
    pub(super) shutdown: watch::Receiver<bool>,
    shutdown_tx: Arc<watch::Sender<bool>>,
    gate: Gate,
}

impl XdsServer {
    /// A server of `resources` (whatever the channel holds now and later), with a fresh
    /// [`AckTracker`], and the default xDS connection policy
    /// ([`ListenerKind::Xds`]) counting into metrics nobody scrapes.
    pub fn new(resources: watch::Receiver<Arc<Resources>>) -> Self {
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
    /// before it ends the rest itself (see [`serve_listener`]). Default: zero, end them at once.
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
    /// next). [`serve_listener`] calls it when its shutdown wait ends.
    pub fn close_streams(&self) {
        let _ = self.shutdown_tx.send(true);
    }

    /// The tonic service to add to a `tonic::transport::Server`.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<XdsServer> {
        AggregatedDiscoveryServiceServer::new(self)
    }
}

/// How [`serve_listener`] shut down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// ADS streams still open when the shutdown wait ended, which the server then ended itself.
    /// 0: every client had closed its streams (or none was connected).
    pub left_open: usize,
}

impl Drained {
    /// Whether every client closed its streams within the wait: the proxies went away too.
    pub fn clients_gone(&self) -> bool {
        self.left_open == 0
    }
}

/// Binds `addr` and serves `server` until `shutdown` completes; see [`serve_listener`].
///
/// # Errors
/// [`ServeError::Bind`] or [`ServeError::Transport`].
pub async fn serve(
    addr: &XdsAddr,
    server: XdsServer,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Drained, ServeError> {
    serve_listener(XdsListener::bind(addr).await?, server, shutdown).await
}

/// Serves ADS on an already-bound listener until `shutdown` completes, then:
///
/// 1. stops accepting connections and removes its Unix socket file, if the path still holds the
///    socket it bound (see [`crate::shutdown::remove_own_socket`]);
/// 2. waits up to the server's shutdown wait ([`XdsServer::with_shutdown_wait`]; default zero)
///    for the clients to close every open ADS stream;
/// 3. ends the streams still open (Envoy sees the RPC finish and keeps its config) and returns
///    once connections have drained, saying how many it had to end.
///
/// # Errors
/// [`ServeError::Transport`].
pub async fn serve_listener(
    listener: XdsListener,
    server: XdsServer,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Drained, ServeError> {
    let own_socket = listener.own_socket();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = drain_after(shutdown, server.clone(), stop_tx, own_socket.clone());
    let serving = serve_until(listener, server, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(serving, drain);
    tokio::select! {
        drained = &mut drain => {
            serving.await?;
            Ok(drained)
        }
        // The server ended before shutdown was asked for (a transport error).
        result = &mut serving => {
            if let Some((path, id)) = &own_socket {
                crate::shutdown::remove_own_socket(path, *id);
            }
            result?;
            Ok(Drained { left_open: 0 })
        }
    }
}

/// The gRPC server on `listener` until `stop` completes (it stops accepting at once, then waits
/// for open connections to finish).
async fn serve_until(
    listener: XdsListener,
    server: XdsServer,
    stop: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let gate = server.gate.clone();
    let keepalive = gate.policy().keepalive();
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(keepalive.map(|k| k.interval))
        .http2_keepalive_timeout(keepalive.map(|k| k.timeout));
    let router = builder.add_service(server.into_service());
    match listener {
        XdsListener::Tcp(l) => router.serve_with_incoming_shutdown(GatedListener::new(l, gate).incoming(), stop).await,
        XdsListener::Unix(l, ..) => {
            router.serve_with_incoming_shutdown(GatedListener::new(l, gate).incoming(), stop).await
        }
    }
}

/// After `shutdown`: stops the accept loop (`stop`), removes the own socket, waits for the
/// clients, ends what is left.
async fn drain_after(
    shutdown: impl Future<Output = ()>,
    server: XdsServer,
    stop: tokio::sync::oneshot::Sender<()>,
    own_socket: Option<(PathBuf, FileId)>,
) -> Drained {
    shutdown.await;
    let _ = stop.send(());
    if let Some((path, id)) = &own_socket {
        crate::shutdown::remove_own_socket(path, *id);
    }
    let tracker = server.tracker();
    let open = tracker.connected_total();
    if open > 0 && !server.shutdown_wait.is_zero() {
        tracing::info!(streams = open, wait = ?server.shutdown_wait, "waiting for Envoy to close its ADS streams");
        tracker.wait_for(server.shutdown_wait, |t| t.connected_total() == 0).await;
    }
    let left_open = tracker.connected_total();
    if left_open > 0 {
        tracing::info!(streams = left_open, "ending the ADS streams still open (Envoy keeps its config)");
    }
    server.close_streams();
    Drained { left_open }
}
