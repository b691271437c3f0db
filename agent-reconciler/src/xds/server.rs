//! The ADS gRPC server (state of the world) that serves CDS and LDS to the node's Envoy.
//!
//! One task per stream: it sends a type's resources when Envoy subscribes and again whenever
//! that type's version changes (after a short debounce that coalesces bursts), and it records
//! every ACK and NACK in a shared [`AckTracker`]. A NACK is logged with Envoy's message and the
//! node id; nothing is re-sent for it: Envoy keeps its last good config (for CDS, every cluster
//! it could accept), and the next change gets a new version.
//!
//! The tracker also counts the streams open now, per node id: a stream counts from its first
//! request that carries a node until it ends, however it ends (the client went away, an error,
//! the server's shutdown); see [`AckTracker::connected`] and [`AckTracker::streams`] (what each
//! open stream ACKed, read by `/readyz` through [`super::readiness`]).
//!
//! Metrics ([`XdsMetrics`], optional): responses sent, ACKs and NACKs per resource type, the
//! streams open now, and the time from a change (stamped on a [`ChangeClock`] by whoever
//! publishes snapshots) to Envoy's ACK of the version that change produced.
//!
//! Shutdown ([`serve_listener`]): stop accepting, remove the own socket file (if still ours),
//! wait up to [`XdsServer::with_shutdown_wait`] for the clients to close their streams, end the
//! rest; the returned [`Drained`] says whether the clients had gone.
//!
//! Incremental (delta) xDS is not implemented: `DeltaAggregatedResources` answers
//! `UNIMPLEMENTED`, so Envoy must use `api_type: GRPC` (the state-of-the-world default).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_server::{AggregatedDiscoveryService, AggregatedDiscoveryServiceServer},
};
use futures::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::resources::{Renderer, Resources, Snapshot};
use crate::shutdown::FileId;

/// Default debounce: how long a change waits for further changes before it is pushed.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(20);

/// What Envoy said about one NACKed response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nack {
    /// Version of the rejected response.
    pub version: String,
    /// Nonce of the rejected response.
    pub nonce: String,
    /// `error_detail.message`: Envoy's reason, verbatim.
    pub message: String,
    /// `error_detail.code` (a gRPC status code; Envoy uses 13, INTERNAL).
    pub code: i32,
}

/// ACK/NACK state of one type URL for one node, across its streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeState {
    /// Version of the last response sent.
    pub sent_version: Option<String>,
    /// Number of responses sent: one per (re)subscription plus one per version change; an
    /// unchanged version is never re-sent on a stream.
    pub sends: u64,
    /// Version Envoy last acknowledged (applied).
    pub acked_version: Option<String>,
    /// Number of ACKs received.
    pub acks: u64,
    /// Number of NACKs received.
    pub nacks: u64,
    /// The most recent NACK, kept after later ACKs (see `nacks` for whether one happened).
    pub last_nack: Option<Nack>,
}

/// What one open ADS stream has done, for readers of [`AckTracker::streams`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamState {
    /// Envoy's node id, from the stream's first request that carried a node.
    pub node: String,
    /// Per type URL: the version Envoy last acknowledged on this stream.
    pub acked: HashMap<String, String>,
    /// Per type URL: the last NACK on this stream (kept after later ACKs).
    pub nacked: HashMap<String, Nack>,
}

#[derive(Debug, Default)]
struct TrackerState {
    /// Node id -> type URL -> state, across the node's streams (closed ones included).
    nodes: HashMap<String, HashMap<String, TypeState>>,
    /// Open streams by a per-tracker id (increasing: oldest first).
    streams: BTreeMap<u64, StreamState>,
    next_stream: u64,
}

/// Shared, queryable ACK/NACK state per node id and type URL, and the ADS streams open now;
/// cheap to clone. Readers are tests, `/readyz`, metrics and the shutdown wait; every recorded
/// event (a send, an ACK, a NACK, a stream opening or closing) wakes [`AckTracker::wait_for`].
///
/// A stream counts as connected from its first request that carries a node until it ends,
/// however it ends (the client went away, an error, the server's shutdown).
#[derive(Clone, Debug)]
pub struct AckTracker {
    state: Arc<Mutex<TrackerState>>,
    changes: watch::Sender<u64>,
}

impl Default for AckTracker {
    fn default() -> Self {
        AckTracker { state: Arc::default(), changes: watch::Sender::new(0) }
    }
}

impl AckTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state of `type_url` for `node` (default if never seen).
    pub fn get(&self, node: &str, type_url: &str) -> TypeState {
        self.lock().nodes.get(node).and_then(|types| types.get(type_url)).cloned().unwrap_or_default()
    }

    /// Node ids seen so far (connected now or not), sorted.
    pub fn nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.lock().nodes.keys().cloned().collect();
        nodes.sort();
        nodes
    }

    /// Last acked version of `type_url` for `node`.
    pub fn acked_version(&self, node: &str, type_url: &str) -> Option<String> {
        self.get(node, type_url).acked_version
    }

    /// Total NACKs of `type_url` from `node`.
    pub fn nack_count(&self, node: &str, type_url: &str) -> u64 {
        self.get(node, type_url).nacks
    }

    /// Number of ADS streams open now, all nodes together.
    pub fn connected_total(&self) -> usize {
        self.lock().streams.len()
    }

    /// Number of ADS streams open now from `node`.
    pub fn connected(&self, node: &str) -> usize {
        self.lock().streams.values().filter(|s| s.node == node).count()
    }

    /// The ADS streams open now, oldest first.
    pub fn streams(&self) -> Vec<StreamState> {
        self.lock().streams.values().cloned().collect()
    }

    /// Waits until `pred(self)` holds, re-checking on every recorded event, for at most
    /// `timeout`. Returns whether it held.
    pub async fn wait_for(&self, timeout: Duration, mut pred: impl FnMut(&AckTracker) -> bool) -> bool {
        let mut rx = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if pred(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return pred(self),
            }
        }
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn update(&self, node: &str, type_url: &str, f: impl FnOnce(&mut TypeState)) {
        {
            let mut state = self.lock();
            let entry = state.nodes.entry(node.to_owned()).or_default().entry(type_url.to_owned()).or_default();
            f(entry);
        }
        self.notify();
    }

    /// Records an ACK or NACK on open stream `id` (nothing if it is not open).
    fn update_stream(&self, id: u64, f: impl FnOnce(&mut StreamState)) {
        if let Some(stream) = self.lock().streams.get_mut(&id) {
            f(stream);
        }
        self.notify();
    }

    /// Counts a stream from `node` as open; returns its id for [`AckTracker::stream_closed`].
    fn stream_opened(&self, node: &str) -> u64 {
        let id = {
            let mut state = self.lock();
            state.next_stream += 1;
            let id = state.next_stream;
            state.streams.insert(id, StreamState { node: node.to_owned(), ..StreamState::default() });
            id
        };
        self.notify();
        id
    }

    fn stream_closed(&self, id: u64) {
        self.lock().streams.remove(&id);
        self.notify();
    }
}

/// One stream counted in the tracker and the gauge, from its first request that carried a node
/// until it is dropped: with its [`Stream`], however the stream's task ends.
struct Connection {
    id: u64,
    tracker: AckTracker,
    gauge: Option<Gauge>,
}

impl Connection {
    fn open(tracker: &AckTracker, node: &str, metrics: Option<&XdsMetrics>) -> Connection {
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

/// The metric label of a type URL: `cluster`, `listener`, or `other` (bounded).
pub fn type_label(type_url: &str) -> &'static str {
    match type_url {
        super::resources::CLUSTER_TYPE_URL => "cluster",
        super::resources::LISTENER_TYPE_URL => "listener",
        _ => "other",
    }
}

/// Label set `{type}` of the xDS counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// `cluster` (CDS), `listener` (LDS), `other`.
    pub r#type: &'static str,
}

/// Carries the time of the earliest change not yet acknowledged from the snapshot publisher
/// (the reconcile loop) through the debounced renderer to the ACK of the version it produced.
///
/// - [`ChangeClock::changed`]: a published snapshot differs; keeps the earliest such instant
///   until the renderer takes it.
/// - the renderer ([`spawn_renderer_with_clock`]) stamps each type whose version changed with
///   that instant, or with the instant already pending on that type if it is earlier (a version
///   superseded before its ACK hands its start on: Envoy may never ACK it).
/// - [`ChangeClock::acked`]: the first ACK of a stamped version ends it.
///
/// Memory is bounded: one pending instant, and one stamped version per type URL.
#[derive(Clone, Debug, Default)]
pub struct ChangeClock {
    state: Arc<Mutex<ClockState>>,
}

#[derive(Debug, Default)]
struct ClockState {
    unrendered: Option<Instant>,
    stamped: HashMap<String, (String, Instant)>,
}

impl ChangeClock {
    /// A clock with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A snapshot that differs from the last one was published; `at` is when the change that
    /// caused it was seen (a watch event's arrival). The earliest unrendered instant is kept.
    pub fn changed(&self, at: Instant) {
        let mut s = self.lock();
        s.unrendered = Some(s.unrendered.map_or(at, |t| t.min(at)));
    }

    /// The renderer published new resources: stamp every type whose version differs from
    /// `previous` with the earliest pending change. Types with an unchanged version keep what
    /// they had; a change that produced no new version is dropped.
    pub fn rendered(&self, previous: &Resources, next: &Resources) {
        let mut s = self.lock();
        let since = s.unrendered.take();
        for type_url in next.type_urls() {
            let (Some(new), old) = (next.get(type_url), previous.get(type_url)) else { continue };
            if old.is_some_and(|o| o.version == new.version) {
                continue;
            }
            let carried = s.stamped.get(type_url).map(|(_, t)| *t);
            let start = match (since, carried) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(start) = start {
                s.stamped.insert(type_url.to_owned(), (new.version.clone(), start));
            }
        }
    }

    /// Forgets an unrendered change without stamping anything (the initial render: its versions
    /// are what a restarted agent serves anyway, not the effect of a change).
    pub fn discard_unrendered(&self) {
        self.lock().unrendered = None;
    }

    /// Envoy ACKed `version` of `type_url`: the time since the change that produced it, once
    /// per stamped version (later ACKs of it, from other streams or re-subscriptions, get `None`).
    pub fn acked(&self, type_url: &str, version: &str) -> Option<Duration> {
        let mut s = self.lock();
        match s.stamped.get(type_url) {
            Some((v, at)) if v == version => {
                let elapsed = at.elapsed();
                s.stamped.remove(type_url);
                Some(elapsed)
            }
            _ => None,
        }
    }

    /// Number of versions waiting for their ACK (at most one per type URL).
    pub fn pending(&self) -> usize {
        self.lock().stamped.len()
    }
}

/// The xDS server's Prometheus metrics; cheap to clone (the metrics are shared).
#[derive(Clone, Debug)]
pub struct XdsMetrics {
    /// `aether_xds_pushes_total{type}`: DiscoveryResponses sent (one per subscription plus one
    /// per version change, per stream).
    pub pushes: Family<TypeLabel, Counter>,
    /// `aether_xds_acks_total{type}`: ACKs received (a request acknowledging the last response).
    pub acks: Family<TypeLabel, Counter>,
    /// `aether_xds_nacks_total{type}`: NACKs received (a request with `error_detail`).
    pub nacks: Family<TypeLabel, Counter>,
    /// `aether_xds_change_to_ack_seconds`: seconds from the watch event whose effect produced a
    /// new resource version to Envoy's first ACK of that version (see [`ChangeClock`]).
    pub change_to_ack: Histogram,
    /// `aether_xds_connected_streams`: ADS streams open now, all nodes together (a stream counts
    /// from its first request that carries a node until it ends).
    pub connected: Gauge,
    /// The clock the publisher, the renderer and the server share.
    pub clock: ChangeClock,
}

impl Default for XdsMetrics {
    fn default() -> Self {
        XdsMetrics {
            pushes: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            // 5 ms .. ~41 s: a debounce (20 ms) plus Envoy applying a config is tens of ms.
            change_to_ack: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            connected: Gauge::default(),
            clock: ChangeClock::new(),
        }
    }
}

impl XdsMetrics {
    /// Fresh metrics with their own clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the metrics (names in the field docs; counters get `_total` on encoding). The
    /// counters of both served types exist from the start, at zero.
    pub fn register(&self, registry: &mut Registry) {
        for type_url in [super::resources::CLUSTER_TYPE_URL, super::resources::LISTENER_TYPE_URL] {
            for family in [&self.pushes, &self.acks, &self.nacks] {
                family.get_or_create(&TypeLabel { r#type: type_label(type_url) }).inc_by(0);
            }
        }
        registry.register("aether_xds_pushes", "xDS responses sent to Envoy, by resource type", self.pushes.clone());
        registry.register("aether_xds_acks", "xDS ACKs received from Envoy, by resource type", self.acks.clone());
        registry.register("aether_xds_nacks", "xDS NACKs received from Envoy, by resource type", self.nacks.clone());
        registry.register(
            "aether_xds_change_to_ack_seconds",
            "Seconds from a pod or policy change to Envoy's ACK of the xDS version it produced",
            self.change_to_ack.clone(),
        );
        registry.register(
            "aether_xds_connected_streams",
            "ADS streams from Envoy open now (counted from the first request that names a node)",
            self.connected.clone(),
        );
    }

    fn inc(family: &Family<TypeLabel, Counter>, type_url: &str) {
        family.get_or_create(&TypeLabel { r#type: type_label(type_url) }).inc();
    }
}

/// The ADS service: serves the latest [`Resources`] from a watch channel to every Envoy stream.
#[derive(Clone, Debug)]
pub struct XdsServer {
    resources: watch::Receiver<Arc<Resources>>,
    tracker: AckTracker,
    metrics: Option<XdsMetrics>,
    debounce: Duration,
    shutdown_wait: Duration,
    shutdown: watch::Receiver<bool>,
    shutdown_tx: Arc<watch::Sender<bool>>,
}

static NONCE: AtomicU64 = AtomicU64::new(1);

impl XdsServer {
    /// A server of `resources` (whatever the channel holds now and later), with a fresh
    /// [`AckTracker`] and [`DEFAULT_DEBOUNCE`].
    pub fn new(resources: watch::Receiver<Arc<Resources>>) -> Self {
        let (shutdown_tx, shutdown) = watch::channel(false);
        XdsServer {
            resources,
            tracker: AckTracker::new(),
            metrics: None,
            debounce: DEFAULT_DEBOUNCE,
            shutdown_wait: Duration::ZERO,
            shutdown,
            shutdown_tx: Arc::new(shutdown_tx),
        }
    }

    /// Same server, with this debounce (`Duration::ZERO` pushes every change at once).
    pub fn with_debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
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

/// Renders every snapshot `snapshots` receives (after `debounce`, so a burst renders once) with
/// a caching [`Renderer`] and publishes the result, only when a version changed. Returns the
/// receiver to give [`XdsServer::new`] and the task, which ends when `snapshots`' sender is
/// dropped. Rejected specs are logged (warn) and listed in [`Resources::rejected`].
pub fn spawn_renderer(
    snapshots: watch::Receiver<Arc<Snapshot>>,
    renderer: Renderer,
    debounce: Duration,
) -> (watch::Receiver<Arc<Resources>>, JoinHandle<()>) {
    spawn_renderer_with_clock(snapshots, renderer, debounce, ChangeClock::new())
}

/// [`spawn_renderer`] that also stamps every new version on `clock` (see [`ChangeClock`]).
pub fn spawn_renderer_with_clock(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut renderer: Renderer,
    debounce: Duration,
    clock: ChangeClock,
) -> (watch::Receiver<Arc<Resources>>, JoinHandle<()>) {
    let first = Arc::new(render_logged(&mut renderer, &snapshots.borrow_and_update()));
    clock.discard_unrendered();
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        while snapshots.changed().await.is_ok() {
            if !debounce.is_zero() {
                tokio::time::sleep(debounce).await;
            }
            let snapshot = snapshots.borrow_and_update().clone();
            let next = render_logged(&mut renderer, &snapshot);
            tx.send_if_modified(|current| {
                // Stamp before receivers are notified, so an ACK can never precede its stamp.
                clock.rendered(current, &next);
                if current.same_versions(&next) && current.rejected == next.rejected {
                    false
                } else {
                    *current = Arc::new(next);
                    true
                }
            });
        }
    });
    (rx, task)
}

fn render_logged(renderer: &mut Renderer, snapshot: &Snapshot) -> Resources {
    let resources = renderer.render(snapshot);
    for r in &resources.rejected {
        tracing::warn!(cluster = %r.name, reason = r.error.label(), error = %r.error,
            "xDS resource left out before rendering");
    }
    resources
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
        let nonce = NONCE.fetch_add(1, Ordering::Relaxed).to_string();
        sent.version = Some(set.version.clone());
        sent.nonce = Some(nonce.clone());
        let response = DiscoveryResponse {
            version_info: set.version.clone(),
            resources: set.resources.iter().map(|r| r.resource.clone()).collect(),
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

async fn run_stream(
    mut inbound: Streaming<DiscoveryRequest>,
    mut stream: Stream,
    mut resources: watch::Receiver<Arc<Resources>>,
    mut shutdown: watch::Receiver<bool>,
    debounce: Duration,
) {
    let mut current = resources.borrow_and_update().clone();
    let mut watching = true;
    loop {
        tokio::select! {
            msg = inbound.next() => match msg {
                Some(Ok(req)) => {
                    if !stream.request(req, &current).await {
                        break;
                    }
                }
                Some(Err(status)) => {
                    tracing::info!(node = %stream.node, peer = %stream.peer, %status, "xDS stream error");
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
                if !debounce.is_zero() {
                    tokio::time::sleep(debounce).await;
                }
                current = resources.borrow_and_update().clone();
                if !stream.push_changes(&current).await {
                    break;
                }
            }
            // The `Ref` wait_for returns is not Send: drop it inside the branch future.
            () = async { drop(shutdown.wait_for(|closed| *closed).await) } => break,
        }
    }
    tracing::info!(node = %stream.node, peer = %stream.peer, "xDS stream closed");
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
        tokio::spawn(run_stream(
            request.into_inner(),
            stream,
            self.resources.clone(),
            self.shutdown.clone(),
            self.debounce,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("delta xDS is not served; use state-of-the-world ADS (api_type: GRPC)"))
    }
}

/// Where the ADS server listens: `unix://<path>` (or `unix:<path>`) or `<ip>:<port>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XdsAddr {
    /// A TCP address (port 0 picks a free port; see [`XdsListener::local_addr`]).
    Tcp(SocketAddr),
    /// A Unix socket path; a stale socket file there is replaced.
    Unix(PathBuf),
}

impl FromStr for XdsAddr {
    type Err = ServeError;

    /// Parses `unix:///run/x.sock`, `unix:/run/x.sock` or `127.0.0.1:18000`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://").or_else(|| s.strip_prefix("unix:")) {
            if path.is_empty() {
                return Err(ServeError::Address(s.to_owned()));
            }
            return Ok(XdsAddr::Unix(PathBuf::from(path)));
        }
        s.parse().map(XdsAddr::Tcp).map_err(|_| ServeError::Address(s.to_owned()))
    }
}

impl std::fmt::Display for XdsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XdsAddr::Tcp(a) => write!(f, "{a}"),
            XdsAddr::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// Errors of [`XdsAddr::from_str`], [`XdsListener::bind`] and [`serve`].
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Neither `unix://<path>` nor `<ip>:<port>`.
    #[error("invalid xDS listen address {0:?}: want unix://<path> or <ip>:<port>")]
    Address(String),
    /// Binding failed (address in use, permission, missing directory, or a non-socket file at
    /// the Unix path, which is never removed).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gRPC server failed while serving.
    #[error("xDS gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A bound listener, so callers (tests) learn the port before serving.
#[derive(Debug)]
pub enum XdsListener {
    /// Bound TCP listener.
    Tcp(tokio::net::TcpListener),
    /// Bound Unix listener, its path, and the identity of the socket file it created there.
    Unix(tokio::net::UnixListener, PathBuf, FileId),
}

impl XdsListener {
    /// Binds `addr`. A Unix path that holds a stale socket (left by a previous run: nothing
    /// accepts on it) is removed first; a live socket or any other file there is an error.
    ///
    /// # Errors
    /// [`ServeError::Bind`].
    pub async fn bind(addr: &XdsAddr) -> Result<Self, ServeError> {
        let bind_err = |source| ServeError::Bind { addr: addr.to_string(), source };
        match addr {
            XdsAddr::Tcp(a) => Ok(XdsListener::Tcp(tokio::net::TcpListener::bind(a).await.map_err(bind_err)?)),
            XdsAddr::Unix(path) => {
                use std::os::unix::fs::FileTypeExt;
                if let Ok(meta) = std::fs::symlink_metadata(path)
                    && meta.file_type().is_socket()
                {
                    // A socket someone still accepts on belongs to a live process (another agent):
                    // never take it over. Only a stale one (connection refused) is replaced.
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(bind_err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            "another process is serving on this socket (is a second agent running?)",
                        )));
                    }
                    std::fs::remove_file(path).map_err(bind_err)?;
                }
                let l = tokio::net::UnixListener::bind(path).map_err(bind_err)?;
                let id = FileId::of(&std::fs::symlink_metadata(path).map_err(bind_err)?);
                Ok(XdsListener::Unix(l, path.clone(), id))
            }
        }
    }

    /// The Unix socket path and the identity of the socket file bound there (`None` for TCP).
    fn own_socket(&self) -> Option<(PathBuf, FileId)> {
        match self {
            XdsListener::Unix(_, path, id) => Some((path.clone(), *id)),
            XdsListener::Tcp(_) => None,
        }
    }

    /// The bound TCP address (`None` for a Unix socket).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            XdsListener::Tcp(l) => l.local_addr().ok(),
            XdsListener::Unix(..) => None,
        }
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
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    let router = builder.add_service(server.into_service());
    match listener {
        XdsListener::Tcp(l) => {
            router.serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(l), stop).await
        }
        XdsListener::Unix(l, ..) => {
            router.serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(l), stop).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resources::{CLUSTER_TYPE_URL, LISTENER_TYPE_URL};

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "unix:///run/aether/xds.sock".parse::<XdsAddr>().unwrap(),
            XdsAddr::Unix("/run/aether/xds.sock".into())
        );
        assert_eq!("unix:/x.sock".parse::<XdsAddr>().unwrap(), XdsAddr::Unix("/x.sock".into()));
        assert_eq!("127.0.0.1:18000".parse::<XdsAddr>().unwrap(), XdsAddr::Tcp("127.0.0.1:18000".parse().unwrap()));
        assert!("unix://".parse::<XdsAddr>().is_err());
        assert!("localhost:1".parse::<XdsAddr>().is_err());
    }

    fn resources(cds: &str, lds: &str) -> Resources {
        let mut r = Resources::default();
        r.clusters.version = cds.to_owned();
        r.listeners.version = lds.to_owned();
        r
    }

    #[test]
    fn the_clock_measures_from_the_earliest_unacknowledged_change_once_per_version() {
        let clock = ChangeClock::new();
        let t0 = Instant::now() - Duration::from_secs(3);
        clock.changed(t0 + Duration::from_secs(1));
        clock.changed(t0);
        // Only CDS changed: LDS gets no stamp, and the unrendered instant is consumed.
        clock.rendered(&resources("c1", "l1"), &resources("c2", "l1"));
        assert_eq!(clock.pending(), 1);
        assert_eq!(clock.acked(LISTENER_TYPE_URL, "l1"), None);
        // c2 is superseded by c3 before its ACK: c3 inherits the earlier start.
        clock.changed(Instant::now());
        clock.rendered(&resources("c2", "l1"), &resources("c3", "l1"));
        assert_eq!(clock.acked(CLUSTER_TYPE_URL, "c2"), None, "an ACK of a superseded version is not observed");
        let took = clock.acked(CLUSTER_TYPE_URL, "c3").expect("c3 was stamped");
        assert!(took >= Duration::from_secs(3), "{took:?}");
        assert_eq!(clock.acked(CLUSTER_TYPE_URL, "c3"), None, "observed once per version");
        assert_eq!(clock.pending(), 0);
        // A change that renders to the same versions leaves nothing behind.
        clock.changed(Instant::now());
        clock.rendered(&resources("c3", "l1"), &resources("c3", "l1"));
        clock.rendered(&resources("c3", "l1"), &resources("c4", "l1"));
        assert_eq!(clock.pending(), 0);
    }

    #[tokio::test]
    async fn the_tracker_wakes_waiters_and_times_out() {
        let t = AckTracker::new();
        let t2 = t.clone();
        let waiter =
            tokio::spawn(
                async move { t2.wait_for(Duration::from_secs(5), |t| t.acked_version("n", "x").is_some()).await },
            );
        tokio::time::sleep(Duration::from_millis(20)).await;
        t.update("n", "x", |s| s.acked_version = Some("v1".into()));
        assert!(waiter.await.unwrap());
        assert!(!t.wait_for(Duration::from_millis(30), |t| t.nack_count("n", "x") > 0).await);
        assert_eq!(t.nodes(), vec!["n".to_owned()]);
    }

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
