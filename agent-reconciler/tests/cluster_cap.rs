//! The node's cluster cap against a real Envoy (docs/workload-requirements.md, "Ports per pod and
//! clusters per node"): a node at its cluster cap (`--max-clusters`) serves exactly the pods
//! admitted first, and the pod past it gets nothing until room frees.
//!
//! The agent's own index (capped), render and xDS server feed an Envoy started with the chart's
//! bootstrap (the shared fixture, `support::ads`); each pod is served over its socket by a UDS echo server in
//! a kubelet-like pods dir, so "served" is observable three ways: the clusters Envoy holds, traffic
//! through a static routing listener, and the health gateway (200 for a served healthy pod, 503
//! for a refused one although its app is up). Also: the chart's `agent.maxClusters` default and
//! bounds are the binary's.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use aether_agent_reconciler::cli::MAX_CLUSTERS_RANGE;
use aether_agent_reconciler::record::PodRecord;
use aether_agent_reconciler::xds::Snapshot;
use aether_agent_reconciler::{Index, Settings, TcpReason, render};
use aether_fixtures::envoy::Envoy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use support::ads::Fixture;
use support::start_path_echo as echo;

/// The kubelet layout of pod `uid`'s socket `s/app.sock` under `pods`.
fn socket_of(pods: &Path, uid: &str) -> PathBuf {
    pods.join(uid).join("volumes/kubernetes.io~empty-dir/s/app.sock")
}

/// Managed pod `shop/<name>` (UID `uid(n)`), created at second `created`, declaring `ports`
/// ports from 8080 and served over its socket `s/app.sock`.
fn pod(n: usize, name: &str, created: i64, ports: usize) -> PodRecord {
    let list = (0..ports).map(|i| (8080 + i).to_string()).collect::<Vec<_>>().join(",");
    let mut api = aether_fixtures::pod("shop", name)
        .uid(&aether_fixtures::uid(n))
        .sa("cart")
        .emptydir("s")
        .ip(&format!("10.0.0.{n}"))
        .annotation_socket("s/app.sock")
        .annotation_ports(&list)
        .annotation_health_path("/ready")
        .build();
    api.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created).unwrap()));
    PodRecord::from_pod(&api).unwrap().unwrap()
}

/// What the agent serves for `index`: render with no on-disk refusal.
fn snapshot(index: &Index) -> Snapshot {
    render::render(&index.snapshot(), &HashMap::new()).snapshot
}

/// The `app_`/`health_` clusters Envoy holds, sorted.
fn served(envoy: &Envoy) -> BTreeSet<String> {
    let names = envoy.cluster_names().expect("Envoy's /clusters");
    names.into_iter().filter(|n| n.starts_with("app_") || n.starts_with("health_")).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_the_cluster_cap_serves_exactly_the_pods_admitted_first() {
    let dir = tempfile::Builder::new().prefix("acap").tempdir().unwrap();
    let pods = dir.path().join("pods");
    // a: 1 port (2 clusters), b: 2 ports (3), c: 1 port (2), youngest; the cap is 6.
    let settings = Settings::new(pods.to_str().unwrap(), true).with_max_clusters(Some(6));
    let mut index = Index::new(settings);
    let (a, b, c) = (pod(1, "a", 100, 1), pod(2, "b", 200, 2), pod(3, "c", 300, 1));
    let _echoes: Vec<_> = [&a, &b, &c].iter().map(|p| echo(&socket_of(&pods, &p.uid), &p.name)).collect();
    index.reset_pods([c.clone(), b.clone(), a.clone()]);
    let refused: Vec<_> =
        index.snapshot().iter().filter_map(|(k, e)| Some((k.name.to_string(), e.delivery.tcp_reason()?))).collect();
    assert_eq!(refused, [("c".to_owned(), TcpReason::NodeClusterCap)]);

    // The agent's xDS path: render → encoder (fast health checks) → ADS server on a Unix socket.
    let f = Fixture::builder("node-cap")
        .in_dir(dir)
        .inbound()
        .debounce(Duration::from_millis(20))
        .snapshot(snapshot(&index))
        .await;

    // Exactly a's and b's clusters; c's app is up, but Envoy has nothing for it.
    let capped = set(&["app_shop_a_8080", "app_shop_b_8080", "app_shop_b_8081", "health_shop_a", "health_shop_b"]);
    f.eventually("the capped set", capped.clone(), || async { served(f.envoy()) }).await;
    assert_eq!(f.envoy().via("app_shop_b_8081", "/x").unwrap(), (200, "b /x".to_owned()), "b is served");
    assert_eq!(f.envoy().via("app_shop_c_8080", "/x").unwrap().0, 503, "c is not: no such cluster");
    f.eventually("a served and healthy", 200, || f.gateway("/healthz/health_shop_a")).await;
    assert_eq!(f.gateway("/healthz/health_shop_c").await, 503, "c is listed, unhealthy: unpromoted");

    // A new pod, even one created before all others, takes nothing from them.
    let d = pod(4, "d", 1, 1);
    let _d_echo = echo(&socket_of(&pods, &d.uid), "d");
    let change = index.apply_pod(d);
    assert_eq!(change.rerendered.iter().map(|k| &*k.name).collect::<Vec<_>>(), ["d"]);
    f.push(snapshot(&index));
    f.wait_acked().await;
    assert_eq!(served(f.envoy()), capped);

    // a goes: its 2 clusters go to the oldest refused pod that fits. d was created first.
    let change = index.delete_pod(&a.uid);
    assert_eq!(change.rerendered.iter().map(|k| &*k.name).collect::<Vec<_>>(), ["d"]);
    f.push(snapshot(&index));
    let now = set(&["app_shop_b_8080", "app_shop_b_8081", "app_shop_d_8080", "health_shop_b", "health_shop_d"]);
    f.eventually("d admitted in a's room", now, || async { served(f.envoy()) }).await;
    assert_eq!(f.envoy().via("app_shop_d_8080", "/y").unwrap(), (200, "d /y".to_owned()));
    f.eventually("d healthy", 200, || f.gateway("/healthz/health_shop_d")).await;
    assert_eq!(f.gateway("/healthz/health_shop_c").await, 503, "c still waits");
    assert_eq!(f.gateway("/healthz/health_shop_a").await, 404, "a is gone");
}

/// `charts/aether`: `agent.maxClusters` defaults to the binary's default, and the schema's bounds
/// are the flag's, so a value the schema lets through never stops the agent at start-up.
#[test]
fn the_charts_max_clusters_default_and_bounds_are_the_binarys() {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/aether");
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let default = values.lines().find_map(|l| l.strip_prefix("  maxClusters: ")).expect("agent.maxClusters");
    assert_eq!(default.trim().parse::<usize>().unwrap(), aether_agent_core::settings::DEFAULT_MAX_CLUSTERS);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap()).unwrap();
    let field = &schema["properties"]["agent"]["properties"]["maxClusters"];
    assert_eq!(field["minimum"].as_u64(), Some(*MAX_CLUSTERS_RANGE.start() as u64), "{field}");
    assert_eq!(field["maximum"].as_u64(), Some(*MAX_CLUSTERS_RANGE.end() as u64), "{field}");
    let template = std::fs::read_to_string(chart.join("templates/node-daemonset.yaml")).unwrap();
    assert!(template.contains("- --max-clusters={{ .Values.agent.maxClusters }}"), "passed to the agent");
}
