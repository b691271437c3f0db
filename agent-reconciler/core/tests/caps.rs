//! One pod must not be able to OOM the node proxy (docs/workload-requirements.md, "Ports per pod
//! and clusters per node"). The per-pod port cap (the fold) and the node's cluster cap
//! (`--max-clusters`, the index's admission), driven through the public API as the agent's
//! reconcile loop drives it: records from API pods, the index, render (what the xDS layer serves)
//! and the pod-event ledger.

use std::collections::{BTreeSet, HashMap};

use aether_agent_core::fallback::TcpReason;
use aether_agent_core::index::{Change, Index};
use aether_agent_core::pod_events::{self, CAP_ACTION, Ledger, Severity};
use aether_agent_core::record::{MAX_PORTS, PodKey, PodRecord};
use aether_agent_core::render::{Effective, Rendered, render};
use aether_agent_core::settings::Settings;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const PODS_DIR: &str = "/var/lib/kubelet/pods";

/// Managed pod `shop/<name>` (UID `uid(n)`), created at second `created`, with IP 10.0.0.<n>,
/// an emptyDir `s`, the socket annotation `s/app.sock` and `ports` ports (8080, 8081, ...).
fn pod(n: usize, name: &str, created: i64, ports: usize) -> PodRecord {
    let list = (0..ports).map(|i| (8080 + i).to_string()).collect::<Vec<_>>().join(",");
    let mut api = aether_fixtures::pod("shop", name)
        .uid(&aether_fixtures::uid(n))
        .sa("cart")
        .emptydir("s")
        .ip(&format!("10.0.0.{n}"))
        .annotation_socket("s/app.sock")
        .annotation_ports(&list)
        .build();
    let at = k8s_openapi::jiff::Timestamp::from_second(created).unwrap();
    api.metadata.creation_timestamp = Some(Time(at));
    PodRecord::from_pod(&api).unwrap().unwrap()
}

fn capped(max: usize) -> Index {
    Index::new(Settings::new(PODS_DIR, true).with_max_clusters(Some(max)))
}

fn rendered(index: &Index) -> Rendered {
    render(&index.snapshot(), &HashMap::new())
}

/// The cluster names the node's Envoy would get, sorted.
fn clusters(index: &Index) -> BTreeSet<String> {
    rendered(index).snapshot.clusters.into_iter().map(|c| c.name).collect()
}

/// The pods (by name) served no clusters, and why.
fn refused(index: &Index) -> Vec<(String, TcpReason)> {
    let map = index.snapshot();
    map.iter()
        .filter_map(|(k, e)| e.delivery.tcp_reason().filter(|r| r.serves_nothing()).map(|r| (k.name.to_string(), r)))
        .collect()
}

fn names(change: &Change) -> Vec<&str> {
    change.rerendered.iter().map(|k| &*k.name).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// a (2 clusters) and b (3) fill 5 of 6; c (2), the youngest, does not fit and gets nothing.
fn at_the_cap() -> Index {
    let mut index = capped(6);
    // Listed youngest first: the order of a batch does not matter, creation time does.
    index.reset_pods([pod(3, "c", 300, 1), pod(2, "b", 200, 2), pod(1, "a", 100, 1)]);
    index
}

#[test]
fn a_node_at_the_cap_serves_exactly_the_oldest_pods_that_fit_and_refuses_the_rest_whole() {
    let mut index = at_the_cap();
    for n in 1..=3 {
        index.set_netns(&aether_fixtures::uid(n), Some(format!("/run/netns/cni-{n}")));
    }
    assert_eq!(
        clusters(&index),
        set(&["app_shop_a_8080", "app_shop_b_8080", "app_shop_b_8081", "health_shop_a", "health_shop_b"])
    );
    assert_eq!(refused(&index), [("c".to_owned(), TcpReason::NodeClusterCap)]);
    let r = rendered(&index);
    let c = PodKey { namespace: "shop".into(), name: "c".into(), uid: aether_fixtures::uid(3).into() };
    assert_eq!(r.effective[&c], Effective::Refused);
    let listeners: Vec<&str> = r.snapshot.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(listeners, ["inbound_shop_a_8080", "inbound_shop_b_8080", "inbound_shop_b_8081"], "none for c");
    assert!(r.snapshot.health_clusters.contains(&"health_shop_c".to_owned()), "listed: the gateway answers 503");
    let map = index.snapshot();
    let d = &map.get(&c).unwrap().delivery;
    assert_eq!((d.path.as_ref(), d.socket.as_deref()), (None, Some("s/app.sock")), "no pipe, socket still named");
    assert_eq!((index.admission().granted(), index.admission().refused()), (5, 1));
}

#[test]
fn adding_a_pod_never_takes_clusters_from_another_even_when_it_is_older() {
    let mut index = at_the_cap();
    let before = clusters(&index);
    // Created before every other pod (scheduled here late): it waits, nobody else moves.
    let change = index.apply_pod(pod(4, "d", 1, 1));
    assert_eq!(names(&change), ["d"], "only the new pod is re-rendered");
    assert_eq!(clusters(&index), before);
    assert_eq!(refused(&index).len(), 2);
}

#[test]
fn a_pod_that_grows_loses_only_its_own_clusters() {
    let mut index = at_the_cap();
    // a asks for 5 ports + health = 6: with b's 3 it does not fit. b keeps its clusters; the 2 a
    // gave back go to the oldest refused pod that fits, c.
    let change = index.apply_pod(pod(1, "a", 100, 5));
    assert_eq!(names(&change), ["a", "c"]);
    assert_eq!(
        clusters(&index),
        set(&["app_shop_b_8080", "app_shop_b_8081", "app_shop_c_8080", "health_shop_b", "health_shop_c"])
    );
    assert_eq!(refused(&index), [("a".to_owned(), TcpReason::NodeClusterCap)]);
}

#[test]
fn room_freed_by_a_deletion_goes_to_the_refused_pods_oldest_first_and_they_are_rerendered() {
    let mut index = at_the_cap();
    index.apply_pod(pod(5, "e", 400, 1));
    let change = index.delete_pod(&aether_fixtures::uid(1));
    // a's 2 clusters: c (older) is admitted, e still does not fit.
    assert_eq!(names(&change), ["c"], "the admitted pod is in the change, so its Event is decided");
    assert!(clusters(&index).contains("app_shop_c_8080"));
    assert_eq!(refused(&index), [("e".to_owned(), TcpReason::NodeClusterCap)]);
}

#[test]
fn resyncs_and_relists_of_the_same_pods_change_nothing_at_the_cap() {
    let mut index = at_the_cap();
    let before = index.snapshot();
    assert!(index.apply_pod(pod(3, "c", 300, 1)).is_empty(), "a resync of a refused pod");
    assert!(index.apply_pod(pod(1, "a", 100, 1)).is_empty(), "a resync of an admitted pod");
    assert!(index.reset_pods([pod(1, "a", 100, 1), pod(2, "b", 200, 2), pod(3, "c", 300, 1)]).is_empty());
    assert_eq!(index.snapshot(), before);
}

#[test]
fn every_listing_order_admits_the_same_pods() {
    let pods = [pod(1, "a", 100, 1), pod(2, "b", 200, 2), pod(3, "c", 300, 1), pod(4, "d", 300, 1)];
    let mut seen = BTreeSet::new();
    for rotation in 0..pods.len() {
        let mut listed = pods.to_vec();
        listed.rotate_left(rotation);
        if rotation % 2 == 1 {
            listed.reverse();
        }
        let mut index = capped(7);
        index.reset_pods(listed);
        seen.insert(clusters(&index));
    }
    // c and d were created in the same second: the name decides, c first.
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen.first().unwrap().contains("app_shop_c_8080") && !seen.first().unwrap().contains("health_shop_d"));
}

#[test]
fn a_restart_keeps_pods_refused_before_it_behind_the_others() {
    // Before the restart d (created first) arrived late and was refused.
    let mut live = capped(4);
    live.reset_pods([pod(2, "b", 200, 1), pod(3, "c", 300, 1)]);
    live.apply_pod(pod(4, "d", 1, 1));
    assert_eq!(refused(&live), [("d".to_owned(), TcpReason::NodeClusterCap)]);
    // The restarted agent boots from the same records, told who was refused (the ledger).
    let mut restarted = capped(4);
    restarted.remember_refused([aether_fixtures::uid(4)]);
    restarted.reset_pods([pod(4, "d", 1, 1), pod(3, "c", 300, 1), pod(2, "b", 200, 1)]);
    assert_eq!(clusters(&restarted), clusters(&live));
    // Without that memory the oldest pod would take c's clusters at the restart.
    let mut forgetful = capped(4);
    forgetful.reset_pods([pod(4, "d", 1, 1), pod(3, "c", 300, 1), pod(2, "b", 200, 1)]);
    assert_eq!(refused(&forgetful), [("c".to_owned(), TcpReason::NodeClusterCap)]);
}

#[test]
fn a_pod_over_the_port_cap_gets_no_clusters_and_takes_no_room_even_with_sockets_off() {
    for uds in [true, false] {
        let mut index = Index::new(Settings::new(PODS_DIR, uds).with_max_clusters(Some(4)));
        index.reset_pods([pod(1, "wide", 100, MAX_PORTS + 1), pod(2, "b", 200, 3)]);
        assert_eq!(refused(&index), [("wide".to_owned(), TcpReason::TooManyPorts)]);
        assert_eq!(clusters(&index), set(&["app_shop_b_8080", "app_shop_b_8081", "app_shop_b_8082", "health_shop_b"]));
        assert_eq!(index.admission().granted(), 4, "the refused pod holds nothing");
    }
    // Exactly the cap is served whole.
    let mut index = Index::new(Settings::new(PODS_DIR, true));
    index.apply_pod(pod(1, "wide", 100, MAX_PORTS));
    assert_eq!(clusters(&index).len(), MAX_PORTS + 1);
}

/// The 60 KB annotation of the issue, end to end: no clusters, a small record, one Event.
#[test]
fn a_10_000_port_pod_is_served_nothing_and_told_once_with_the_count_and_the_cap() {
    let big = pod(1, "wide", 100, 10_000);
    assert!(serde_json::to_vec(&big).unwrap().len() < 2_000, "the state dir keeps a small record");
    let mut index = Index::new(Settings::new(PODS_DIR, true).with_max_clusters(Some(4_000)));
    let change = index.apply_pod(big.clone());
    assert!(clusters(&index).is_empty());
    let mut ledger = Ledger::new();
    let observe = |index: &Index, ledger: &mut Ledger, keys: &[PodKey]| {
        let map = index.snapshot();
        let observed: Vec<_> = keys.iter().filter_map(|k| map.get(k).map(|e| (k, e, None, None))).collect();
        pod_events::decide(ledger, None, observed)
    };
    let notices = observe(&index, &mut ledger, &change.rerendered);
    assert_eq!(notices.len(), 1);
    let n = &notices[0];
    assert_eq!(
        (n.severity, n.reason, n.label, n.action),
        (Severity::Warning, "UdsTooManyPorts", "too-many-ports", CAP_ACTION)
    );
    assert!(n.note.starts_with("pod shop/wide: annotation endpoint.aether.io/ports is "), "{}", n.note);
    assert!(n.note.contains("(10000 entries, not read): a pod may declare at most 64 ports"), "{}", n.note);
    assert!(n.note.ends_with("serving the pod no clusters"), "{}", n.note);
    // A resync is silent.
    let change = index.apply_pod(big);
    assert!(change.is_empty() && observe(&index, &mut ledger, std::slice::from_ref(&n.pod)).is_empty());
}

#[test]
fn the_node_cap_is_told_to_every_refused_pod_and_a_socket_pod_served_again_gets_the_normal_event() {
    let mut index = at_the_cap();
    // Even a pod that asks for no socket (plain TCP) is told.
    let mut plain = pod(6, "plain", 500, 1);
    plain.uds_socket = None;
    index.apply_pod(plain);
    let mut ledger = Ledger::new();
    let decide = |index: &Index, ledger: &mut Ledger| {
        let map = index.snapshot();
        let keys: Vec<PodKey> = map.iter().map(|(k, _)| k.clone()).collect();
        let observed: Vec<_> = keys.iter().map(|k| (k, map.get(k).unwrap(), None, None)).collect();
        pod_events::decide(ledger, None, observed)
    };
    let notices = decide(&index, &mut ledger);
    let told: Vec<(&str, &str)> = notices.iter().map(|n| (&*n.pod.name, n.reason)).collect();
    assert_eq!(told, [("c", "UdsNodeClusterCapReached"), ("plain", "UdsNodeClusterCapReached")]);
    let note = &notices[0].note;
    assert!(
        note.contains("at most 6 clusters (--max-clusters)") && note.contains("fewer than the 2 it needs"),
        "{note}"
    );
    assert_eq!(notices[0].action, CAP_ACTION);
    assert_eq!(ledger.reported_with(TcpReason::NodeClusterCap).count(), 2);
    // b goes: c (a socket pod) and plain are admitted; c gets the Normal event, plain nothing.
    index.delete_pod(&aether_fixtures::uid(2));
    let notices = decide(&index, &mut ledger);
    let told: Vec<(&str, &str)> = notices.iter().map(|n| (&*n.pod.name, n.reason)).collect();
    assert_eq!(told, [("c", pod_events::DELIVERED_REASON)]);
    assert!(ledger.is_empty());
}
