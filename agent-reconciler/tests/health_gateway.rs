//! The health gateway against a real Envoy (`tests/harness/install-envoy.sh`, started by the
//! workspace's one launcher with the chart's bootstrap): its listener is never replaced by pod
//! churn, a pod added is answered on a keep-alive connection opened before it, its checks are an
//! ECDS resource whose NACK withdraws nothing else, and Envoy's connection limit caps it.
//!
//! Each test serves our ADS on a Unix socket in a temp dir; health clusters check a Unix socket
//! that accepts (healthy) or one that does not exist (unhealthy). Every wait is bounded
//! ([`WAIT`]); the figures (how long a pod add takes to be answered) are in `make bench`.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aether_agent_reconciler::xds::{
    BuildOptions, CLUSTER_TYPE_URL, ClusterSpec, EXTENSION_CONFIG_TYPE_URL, Endpoint, HEALTH_CHECKS_NAME, HealthCheck,
    LISTENER_TYPE_URL, ResourceSet, Snapshot, build_cluster, build_health_checks, build_health_listener,
};
use aether_fixtures::envoy::WAIT;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::util::pack_any;
use support::ads::{Fixture, FixtureBuilder, exposition, test_options};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// One HTTP/1.1 connection to the gateway, kept open: every request goes over this one socket,
/// and a response that closes it (EOF, or `Connection: close`) is an error, never a silent
/// reconnect.
struct KeepAlive {
    stream: BufReader<UnixStream>,
}

impl KeepAlive {
    async fn open(socket: &Path) -> KeepAlive {
        KeepAlive { stream: BufReader::new(UnixStream::connect(socket).await.expect("connect to the gateway")) }
    }

    /// `GET path` on this connection: the status.
    async fn get(&mut self, path: &str) -> std::io::Result<u16> {
        tokio::time::timeout(Duration::from_secs(5), self.exchange(path))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 5 s"))?
    }

    async fn exchange(&mut self, path: &str) -> std::io::Result<u16> {
        use std::io::{Error, ErrorKind};
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        self.stream.get_mut().write_all(request.as_bytes()).await?;
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            return Err(Error::new(ErrorKind::UnexpectedEof, "the gateway closed the connection"));
        }
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        let status = status.ok_or_else(|| Error::new(ErrorKind::InvalidData, format!("status line {line:?}")))?;
        let (mut length, mut close) = (0usize, false);
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "the gateway closed the connection mid-response"));
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().map_err(|_| Error::new(ErrorKind::InvalidData, header.to_owned()))?;
            } else if name.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close") {
                close = true;
            }
        }
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).await?;
        if close {
            return Err(Error::new(ErrorKind::ConnectionAborted, format!("{status} with `Connection: close`")));
        }
        Ok(status)
    }
}

/// A Unix socket that accepts (and drops) every connection: a healthy connect-only check.
fn accepting(socket: &Path) -> tokio::task::JoinHandle<()> {
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let listener = UnixListener::bind(socket).expect("bind a health socket");
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
        }
    })
}

/// Our ADS server and a real Envoy (no inbound listener) with the agent's encoder (20 ms
/// debounce), the gateway capped at `max_connections`.
fn gateway(node: &str, max_connections: u64) -> FixtureBuilder {
    Fixture::builder(node)
        .debounce(Duration::from_millis(20))
        .options(move |dir| BuildOptions { health_max_connections: max_connections, ..test_options(dir) })
}

/// Polls `conn` for `path` until the answer is not 404 (bounded by [`WAIT`]): the status.
async fn first_answer(g: &Fixture, conn: &mut KeepAlive, path: &str) -> u16 {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = conn.get(path).await.unwrap_or_else(|e| panic!("GET {path} on the kept connection: {e}"));
        if status != 404 {
            return status;
        }
        assert!(Instant::now() < deadline, "{path} still 404 after {WAIT:?}\n{}", g.envoy_log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `conn` for `path` until it answers `want` (bounded by [`WAIT`]).
async fn until(g: &Fixture, conn: &mut KeepAlive, path: &str, want: u16) {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = conn.get(path).await.unwrap_or_else(|e| panic!("GET {path} on the kept connection: {e}"));
        if status == want {
            return;
        }
        assert!(Instant::now() < deadline, "{path}: want {want}, still {status}\n{}", g.envoy_log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pod's health cluster, checking `socket` by connecting to it.
fn health_cluster(name: &str, socket: &Path) -> ClusterSpec {
    ClusterSpec {
        name: name.to_owned(),
        endpoint: Endpoint::Pipe { path: socket.to_str().unwrap().to_owned() },
        health: Some(HealthCheck::Connect),
        http2: false,
    }
}

/// A snapshot whose health clusters are `pods` (name, socket).
fn snapshot(pods: &[(String, PathBuf)]) -> Snapshot {
    Snapshot {
        clusters: pods.iter().map(|(name, socket)| health_cluster(name, socket)).collect(),
        health_clusters: pods.iter().map(|(name, _)| name.clone()).collect(),
        ..Default::default()
    }
}

/// The listener counters and gauges pod churn must not move.
const CHURN_STATS: [&str; 6] = [
    "listener_manager.listener_added",
    "listener_manager.listener_modified",
    "listener_manager.listener_in_place_updated",
    "listener_manager.listener_removed",
    "listener_manager.total_filter_chains_draining",
    "listener_manager.total_listeners_draining",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_added_are_answered_on_a_connection_opened_before_them_and_the_listener_never_changes() {
    let g = gateway("node-churn", 64).snapshot(Snapshot::default()).await;
    let first = (String::from("health_ns_p0"), g.dir.path().join("p0.sock"));
    let mut live = vec![accepting(&first.1)];
    let mut pods = vec![first];
    g.push(snapshot(&pods));
    g.wait_acked().await;
    let mut conn = KeepAlive::open(&g.health_socket()).await;
    until(&g, &mut conn, "/healthz/health_ns_p0", 200).await;
    assert_eq!(conn.get("/healthz/health_ns_p1").await.unwrap(), 404, "not listed yet");
    assert_eq!(conn.get("/other").await.unwrap(), 404);
    let before: Vec<u64> = CHURN_STATS.iter().map(|s| g.stat(s)).collect();
    assert_eq!((before[4], before[5]), (0, 0), "nothing drains before the churn");
    let ecds_before = g.stat("extension_config_discovery.http_filter.aether_health_checks.update_success");
    let lds_sends = g.tracker().get(&g.node, LISTENER_TYPE_URL).sends;

    // Pods added one by one; odd pods have no socket (unhealthy). Each is answered (200 or 503,
    // not 404) on the connection opened before any of them, within a bounded wait.
    const ADDS: usize = 8;
    for i in 1..=ADDS {
        let pod = (format!("health_ns_p{i}"), g.dir.path().join(format!("p{i}.sock")));
        if i % 2 == 0 {
            live.push(accepting(&pod.1));
        }
        pods.push(pod);
        g.push(snapshot(&pods));
        let status = first_answer(&g, &mut conn, &format!("/healthz/health_ns_p{i}")).await;
        assert!(status == 200 || status == 503, "pod {i}: {status}");
    }
    g.wait_acked().await;
    for i in 1..=ADDS {
        let want = if i % 2 == 0 { 200 } else { 503 };
        until(&g, &mut conn, &format!("/healthz/health_ns_p{i}"), want).await;
    }

    // A pod removed: 404 for it on the same connection, the others still answered.
    pods.retain(|(name, _)| name != "health_ns_p2");
    g.push(snapshot(&pods));
    until(&g, &mut conn, "/healthz/health_ns_p2", 404).await;
    assert_eq!(conn.get("/healthz/health_ns_p4").await.unwrap(), 200);
    assert_eq!(conn.get("/healthz/health_ns_p3").await.unwrap(), 503);
    g.wait_acked().await;

    // Envoy's own account: no listener added, modified, updated in place or removed, nothing
    // draining; one downstream connection served everything; every change was an ECDS update.
    let after: Vec<u64> = CHURN_STATS.iter().map(|s| g.stat(s)).collect();
    assert_eq!(after, before, "{CHURN_STATS:?}");
    assert_eq!((after[4], after[5]), (0, 0));
    assert_eq!(g.stat("http.aether_health.downstream_cx_total"), 1, "one connection, never closed");
    assert_eq!(g.stat("http.aether_health.downstream_cx_destroy"), 0);
    let ecds = g.stat("extension_config_discovery.http_filter.aether_health_checks.update_success") - ecds_before;
    assert_eq!(ecds, ADDS as u64 + 1, "one ECDS update per add and one for the removal");
    assert_eq!(g.stat("extension_config_discovery.http_filter.aether_health_checks.update_rejected"), 0);
    assert_eq!(g.tracker().get(&g.node, LISTENER_TYPE_URL).sends, lds_sends, "no LDS push during the churn");
    drop(live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_gateway_config_withdraws_nothing_else_and_the_last_good_checks_keep_answering() {
    let dir_probe = tempfile::tempdir().unwrap();
    let sockets = dir_probe.path().to_owned();
    let (a, b) = (sockets.join("a.sock"), sockets.join("b.sock"));
    let _live = (accepting(&a), accepting(&b));
    let cluster =
        |name: &str, socket: &Path, opts: &BuildOptions| build_cluster(&health_cluster(name, socket), opts).unwrap();
    let resources = |opts: &BuildOptions, names: &[&str], checks: TypedExtensionConfig| {
        let clusters =
            names.iter().map(|n| cluster(n, if *n == "health_ns_a" { &a } else { &b }, opts)).collect::<Vec<_>>();
        ResourceSet::from_protos(clusters, vec![build_health_listener(opts).unwrap().unwrap()])
            .with_extension_configs(vec![checks])
    };
    let g = gateway("node-nack", 64)
        .raw(|opts| resources(opts, &["health_ns_a"], build_health_checks(&["health_ns_a".to_owned()])))
        .await;
    let mut conn = KeepAlive::open(&g.health_socket()).await;
    until(&g, &mut conn, "/healthz/health_ns_a", 200).await;
    let lds = g.tracker().acked_version(&g.node, LISTENER_TYPE_URL).unwrap();
    let ecds = g.tracker().acked_version(&g.node, EXTENSION_CONFIG_TYPE_URL).unwrap();

    // Cluster b arrives with checks of a type the listener does not accept (a router config
    // where an ExtensionWithMatcher is required): Envoy NACKs the ECDS response only.
    let wrong =
        TypedExtensionConfig { name: HEALTH_CHECKS_NAME.to_owned(), typed_config: Some(pack_any(Router::default())) };
    g.push_raw(resources(&g.opts, &["health_ns_a", "health_ns_b"], wrong));
    assert!(
        g.tracker().wait_for(WAIT, |t| t.nack_count(&g.node, EXTENSION_CONFIG_TYPE_URL) == 1).await,
        "no ECDS NACK: {:?}\n{}",
        g.states(),
        g.envoy_log()
    );
    let nack = g.tracker().get(&g.node, EXTENSION_CONFIG_TYPE_URL).last_nack.unwrap();
    eprintln!("ECDS NACK: {nack:?}");
    assert!(nack.message.contains("Router"), "{nack:?}");
    let expected = g.expected();
    assert!(
        g.tracker()
            .wait_for(WAIT, |t| t.acked_version(&g.node, CLUSTER_TYPE_URL) == Some(expected.clusters.version.clone()))
            .await,
        "CDS of the same push is applied: {:?}",
        g.states()
    );
    assert_eq!(g.tracker().nack_count(&g.node, CLUSTER_TYPE_URL), 0);
    assert_eq!(g.tracker().nack_count(&g.node, LISTENER_TYPE_URL), 0);
    assert_eq!(g.tracker().acked_version(&g.node, LISTENER_TYPE_URL), Some(lds.clone()), "LDS untouched");
    assert_eq!(g.tracker().acked_version(&g.node, EXTENSION_CONFIG_TYPE_URL), Some(ecds), "last good ECDS kept");
    assert!(g.envoy().cluster_names().unwrap().contains(&"health_ns_b".to_owned()));
    // The last good checks keep answering on the same connection; b is not listed in them.
    assert_eq!(conn.get("/healthz/health_ns_a").await.unwrap(), 200);
    assert_eq!(conn.get("/healthz/health_ns_b").await.unwrap(), 404);
    assert_eq!(g.stat("extension_config_discovery.http_filter.aether_health_checks.update_rejected"), 1);
    let nacks = exposition(g.metrics());
    assert!(nacks.contains("aether_xds_nacks_total{type=\"extension-config\"} 1"), "{nacks}");
    assert!(nacks.contains("aether_xds_nacks_total{type=\"cluster\"} 0"), "{nacks}");

    // Good checks again: ACKed, b answered on the same connection.
    let names = ["health_ns_a".to_owned(), "health_ns_b".to_owned()];
    g.push_raw(resources(&g.opts, &["health_ns_a", "health_ns_b"], build_health_checks(&names)));
    g.wait_acked().await;
    until(&g, &mut conn, "/healthz/health_ns_b", 200).await;
    assert_eq!(g.tracker().acked_version(&g.node, LISTENER_TYPE_URL), Some(lds));
    assert_eq!(g.stat("listener_manager.total_filter_chains_draining"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_gateways_cap_is_closed_at_once_and_counted() {
    let g = gateway("node-cap", 2).snapshot(Snapshot::default()).await;
    let socket = g.dir.path().join("p.sock");
    let _live = accepting(&socket);
    g.push(snapshot(&[("health_ns_p".to_owned(), socket)]));
    g.wait_acked().await;
    let mut one = KeepAlive::open(&g.health_socket()).await;
    let mut two = KeepAlive::open(&g.health_socket()).await;
    until(&g, &mut one, "/healthz/health_ns_p", 200).await;
    assert_eq!(two.get("/healthz/health_ns_p").await.unwrap(), 200);
    assert_eq!(g.stat("connection_limit.aether_health.active_connections"), 2);

    // The third is accepted by the kernel, then closed by Envoy before any answer.
    let mut three = KeepAlive::open(&g.health_socket()).await;
    let refused = three.get("/healthz/health_ns_p").await;
    assert!(refused.is_err(), "a third connection was served: {refused:?}");
    assert_eq!(g.stat("connection_limit.aether_health.limited_connections"), 1);
    // The two within the cap keep working.
    assert_eq!(one.get("/healthz/health_ns_p").await.unwrap(), 200);

    // One leaves: a new connection gets in.
    drop(two);
    let deadline = Instant::now() + WAIT;
    while g.stat("connection_limit.aether_health.active_connections") != 1 {
        assert!(Instant::now() < deadline, "Envoy never saw the connection close");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut four = KeepAlive::open(&g.health_socket()).await;
    assert_eq!(four.get("/healthz/health_ns_p").await.unwrap(), 200);
    assert_eq!(g.stat("connection_limit.aether_health.limited_connections"), 1);
}
