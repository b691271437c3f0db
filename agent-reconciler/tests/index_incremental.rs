//! The incremental index fed watcher events: what each event re-renders, resyncs, relists,
//! conflicts reported once per change (docs/contracts.md, "The index: a relist equals a fresh
//! build"), and the fallbacks: removing the annotation falls back to the policy, removing the
//! policy reverts the pods to TCP.

mod support;

use aether_agent_reconciler::{Conflict, Index, PodRecord, Source};
use aether_crds::tiebreak::ServiceKey;
use support::*;

fn source_of(index: &Index, pod: &PodRecord) -> Source {
    index.snapshot().get(&pod.key()).expect("the pod is in the map").delivery.source
}

/// 3 services × 100 pods, one valid policy per service.
fn three_services() -> (Index, Vec<PodRecord>) {
    let mut index = Index::new(settings());
    let mut pods = Vec::new();
    for (s, service) in ["cart", "checkout", "search"].iter().enumerate() {
        index.apply_policy(policy("shop", &format!("{service}-uds"), service, "sockets/p.sock"));
        for i in 0..100 {
            pods.push(pod("shop", &format!("{service}-{i}"), &uid(s * 1000 + i), service));
        }
    }
    index.reset_pods(pods.clone());
    (index, pods)
}

#[test]
fn a_policy_change_rerenders_only_the_pods_of_its_service() {
    let (mut index, pods) = three_services();
    assert_eq!(index.snapshot().len(), 300);
    let change = index.apply_policy(policy("shop", "checkout-uds", "checkout", "sockets/q.sock"));
    assert_eq!(change.rerendered.len(), 100);
    assert!(change.rerendered.iter().all(|k| k.name.starts_with("checkout-")));
    assert!(change.map_changed);
    let map = index.snapshot();
    for pod in &pods {
        let d = &map.get(&pod.key()).unwrap().delivery;
        let want = if pod.service_account == "checkout" { "sockets/q.sock" } else { "sockets/p.sock" };
        assert_eq!(d.socket.as_deref(), Some(want));
    }
}

#[test]
fn deleting_a_policy_rerenders_only_its_service_and_returns_it_to_tcp() {
    let (mut index, pods) = three_services();
    let change = index.delete_policy("shop", "search-uds");
    assert_eq!(change.rerendered.len(), 100);
    assert!(change.rerendered.iter().all(|k| k.name.starts_with("search-")));
    for pod in pods.iter().filter(|p| p.service_account == "search") {
        assert_eq!(source_of(&index, pod), Source::NoSocketDeclared);
    }
}

#[test]
fn a_losing_policy_change_rerenders_nothing_but_reports_the_conflict() {
    let (mut index, _) = three_services();
    let change = index.apply_policy(policy("shop", "zz-cart", "cart", "sockets/z.sock"));
    assert!(change.rerendered.is_empty(), "the winner cart-uds did not change");
    assert!(!change.map_changed);
    assert_eq!(
        change.conflicts,
        [Conflict { key: ServiceKey::new("shop", "cart"), winner: "cart-uds".into(), losers: vec!["zz-cart".into()] }]
    );
}

#[test]
fn an_invalid_policy_event_rerenders_nothing() {
    let (mut index, _) = three_services();
    let change = index.apply_policy(policy("shop", "a-cart", "cart", "sockets/too-long.sock"));
    assert!(change.rerendered.is_empty() && change.conflicts.is_empty(), "{change:?}");
}

#[test]
fn a_pod_change_rerenders_only_that_pod() {
    let (mut index, pods) = three_services();
    let mut changed = pods[150].clone();
    changed.uds_socket = Some("sockets/own.sock".into());
    let change = index.apply_pod(changed.clone());
    assert_eq!(change.rerendered, [changed.key()]);
    assert!(change.map_changed);
    assert_eq!(source_of(&index, &changed), Source::Annotation);
}

#[test]
fn a_resync_of_the_same_records_rerenders_nothing() {
    let (mut index, pods) = three_services();
    let before = index.snapshot();
    for pod in &pods[..10] {
        assert!(index.apply_pod(pod.clone()).is_empty());
    }
    assert!(index.apply_policy(policy("shop", "cart-uds", "cart", "sockets/p.sock")).is_empty());
    assert!(index.reset_pods(pods.clone()).is_empty());
    let policies: Vec<_> = index.policies().cloned().collect();
    assert!(index.reset_policies(policies).is_empty());
    assert!(std::sync::Arc::ptr_eq(&before, &index.snapshot()), "no new snapshot to push");
}

#[test]
fn deleting_an_unknown_pod_or_policy_changes_nothing() {
    let (mut index, _) = three_services();
    assert!(index.delete_pod(&uid(99_999)).is_empty());
    assert!(index.delete_policy("shop", "nope").is_empty());
}

#[test]
fn deleting_a_pod_removes_only_that_pod() {
    let (mut index, pods) = three_services();
    let change = index.delete_pod(&pods[7].uid);
    assert_eq!(change.removed, [pods[7].key()]);
    assert!(change.rerendered.is_empty() && change.map_changed);
    assert_eq!(index.snapshot().len(), 299);
}

#[test]
fn snapshots_handed_out_are_never_altered_by_later_changes() {
    let (mut index, pods) = three_services();
    let old = index.snapshot();
    index.delete_policy("shop", "cart-uds");
    index.delete_pod(&pods[299].uid);
    assert_eq!(old.len(), 300);
    assert_eq!(old.get(&pods[0].key()).unwrap().delivery.source, Source::Policy);
    assert_eq!(source_of(&index, &pods[0]), Source::NoSocketDeclared);
}

#[test]
fn removing_the_annotation_falls_back_to_the_policy() {
    let mut index = Index::new(settings());
    index.apply_policy(policy("shop", "cart-uds", "cart", "sockets/p.sock"));
    let annotated = pod_with_socket("shop", "cart-1", UID, "cart", "sockets/a.sock");
    index.apply_pod(annotated.clone());
    assert_eq!(source_of(&index, &annotated), Source::Annotation);
    let plain = pod("shop", "cart-1", UID, "cart");
    let change = index.apply_pod(plain.clone());
    assert_eq!(change.rerendered, [plain.key()]);
    assert_eq!(source_of(&index, &plain), Source::Policy);
}

#[test]
fn removing_the_policy_returns_the_pods_to_tcp() {
    let mut index = Index::new(settings());
    index.apply_policy(policy("shop", "cart-uds", "cart", "sockets/p.sock"));
    let p = pod("shop", "cart-1", UID, "cart");
    index.apply_pod(p.clone());
    assert_eq!(source_of(&index, &p), Source::Policy);
    index.delete_policy("shop", "cart-uds");
    assert_eq!(source_of(&index, &p), Source::NoSocketDeclared);
}

#[test]
fn deleting_the_winner_promotes_the_next_valid_policy() {
    let mut index = Index::new(settings());
    index.apply_policy(policy("shop", "a", "cart", "sockets/a.sock"));
    index.apply_policy(policy("shop", "b", "cart", "sockets/too-long.sock"));
    index.apply_policy(policy("shop", "c", "cart", "sockets/c.sock"));
    let p = pod("shop", "cart-1", UID, "cart");
    index.apply_pod(p.clone());
    index.delete_policy("shop", "a");
    let map = index.snapshot();
    let d = &map.get(&p.key()).unwrap().delivery;
    assert_eq!((d.policy.as_deref(), d.socket.as_deref()), (Some("c"), Some("sockets/c.sock")));
}

#[test]
fn a_conflict_is_reported_once_per_change_not_per_resync() {
    let key = ServiceKey::new("shop", "cart");
    let mut index = Index::new(settings());
    assert!(index.apply_policy(policy("shop", "b", "cart", "sockets/b.sock")).conflicts.is_empty());

    // Appears.
    let change = index.apply_policy(policy("shop", "c", "cart", "sockets/c.sock"));
    assert_eq!(change.conflicts, [Conflict { key: key.clone(), winner: "b".into(), losers: vec!["c".into()] }]);
    // Resyncs: nothing.
    assert!(index.apply_policy(policy("shop", "c", "cart", "sockets/c.sock")).conflicts.is_empty());
    assert!(index.apply_policy(policy("shop", "b", "cart", "sockets/b.sock")).conflicts.is_empty());
    let all: Vec<_> = index.policies().cloned().collect();
    assert!(index.reset_policies(all).is_empty());
    // A loser's socket changes: same conflict, nothing new.
    assert!(index.apply_policy(policy("shop", "c", "cart", "sockets/c2.sock")).conflicts.is_empty());
    // Alters: a new winner.
    let change = index.apply_policy(policy("shop", "a", "cart", "sockets/a.sock"));
    assert_eq!(
        change.conflicts,
        [Conflict { key: key.clone(), winner: "a".into(), losers: vec!["b".into(), "c".into()] }]
    );
    assert_eq!(index.conflicts().count(), 1);
    // Ends.
    index.delete_policy("shop", "a");
    let change = index.delete_policy("shop", "b");
    assert_eq!(change.resolved, [key]);
    assert!(change.conflicts.is_empty());
    assert_eq!(index.conflicts().count(), 0);
}

#[test]
fn a_relist_reports_a_conflict_once_and_not_its_transient_states() {
    let mut index = Index::new(settings());
    index.apply_policy(policy("shop", "a", "cart", "sockets/a.sock"));
    // The relist swaps "a" for "b": between the two items a→{a,b} conflict would be transient.
    let change = index.reset_policies([policy("shop", "b", "cart", "sockets/b.sock")]);
    assert!(change.conflicts.is_empty() && change.resolved.is_empty(), "{change:?}");
}

#[test]
fn relist_after_a_missed_policy_delete_removes_its_effect() {
    // The watch expired (410 Gone) while "cart-uds" was deleted; the relist no longer lists it.
    let (mut index, pods) = three_services();
    let remaining: Vec<_> = index.policies().filter(|p| p.name != "cart-uds").cloned().collect();
    let change = index.reset_policies(remaining.clone());
    assert_eq!(change.rerendered.len(), 100);
    for pod in pods.iter().filter(|p| p.service_account == "cart") {
        assert_eq!(source_of(&index, pod), Source::NoSocketDeclared);
    }
    // Equal to a fresh start on the same state.
    let mut fresh = Index::new(settings());
    fresh.reset_policies(remaining);
    fresh.reset_pods(pods);
    assert_eq!(*fresh.snapshot(), *index.snapshot());
}

#[test]
fn relist_of_pods_removes_pods_deleted_while_the_watch_was_down() {
    let (mut index, pods) = three_services();
    let change = index.reset_pods(pods[..250].to_vec());
    assert_eq!(change.removed.len(), 50);
    assert!(change.rerendered.is_empty());
    assert_eq!(index.snapshot().len(), 250);
}

#[test]
fn pod_recreated_under_the_same_name_replaces_its_predecessor() {
    let mut index = Index::new(settings());
    index.apply_pod(pod("shop", "cart-0", &uid(1), "cart"));
    index.delete_pod(&uid(1));
    let change = index.apply_pod(pod("shop", "cart-0", &uid(2), "cart"));
    assert_eq!(change.rerendered.len(), 1);
    let map = index.snapshot();
    assert_eq!(map.len(), 1);
    assert_eq!(&*map.iter().next().unwrap().0.uid, uid(2));
}

#[test]
fn uninstalling_the_crd_reverts_policy_pods_to_tcp_and_keeps_annotation_pods() {
    // An empty policy relist is what the driver sends when the CRD disappears.
    let mut index = Index::new(settings());
    index.apply_policy(policy("shop", "cart-uds", "cart", "sockets/p.sock"));
    let by_policy = pod("shop", "cart-1", &uid(1), "cart");
    let by_annotation = pod_with_socket("shop", "cart-2", &uid(2), "cart", "sockets/a.sock");
    index.reset_pods([by_policy.clone(), by_annotation.clone()]);
    index.reset_policies([]);
    assert_eq!(source_of(&index, &by_policy), Source::NoSocketDeclared);
    assert_eq!(source_of(&index, &by_annotation), Source::Annotation);
}

#[test]
fn a_netns_fact_rerenders_its_pod_only_survives_a_refold_and_goes_with_the_pod() {
    let (mut index, pods) = three_services();
    let (a, b) = (&pods[0], &pods[1]);
    let netns_of = |index: &Index, p: &PodRecord| index.snapshot().get(&p.key()).unwrap().netns.clone();

    let change = index.set_netns(&a.uid, Some("/run/netns/cni-a".into()));
    assert_eq!(change.rerendered, [a.key()]);
    assert!(change.map_changed);
    assert!(index.set_netns(&a.uid, Some("/run/netns/cni-a".into())).is_empty(), "an equal fact changes nothing");
    assert!(index.set_netns(&uid(99_999), Some("/run/netns/x".into())).is_empty(), "no fact for an unknown pod");

    // A policy change re-folds the pod; its netns fact stays.
    index.apply_policy(policy("shop", "cart-uds", "cart", "sockets/q.sock"));
    assert_eq!(netns_of(&index, a).as_deref(), Some("/run/netns/cni-a"));
    assert_eq!(netns_of(&index, b), None);

    // Deleted and re-added under the same UID: the old fact is gone with it.
    index.delete_pod(&a.uid);
    index.apply_pod(a.clone());
    assert_eq!(netns_of(&index, a), None);
    let change = index.set_netns(&a.uid, None);
    assert!(change.is_empty());
}
