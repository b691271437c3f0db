//! Property: whatever sequence of watch events and relists the index sees, its state equals a fresh
//! build on the same pods and policies (docs/contracts.md, "The index: a relist equals a fresh
//! build"), every event re-renders only what it may, and a repeated event re-renders nothing.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use aether_agent_reconciler::{Conflict, Index, PodRecord, PolicyRecord};
use aether_crds::tiebreak::ServiceKey;
use proptest::prelude::*;
use support::*;

const NAMESPACES: [&str; 2] = ["shop", "bank"];
const ACCOUNTS: [&str; 3] = ["cart", "pay", "default"];
const SOCKETS: [&str; 5] = ["sockets/a.sock", "sockets/b.sock", "other/a.sock", "sockets/too-long.sock", "../x"];

fn pod_strategy() -> impl Strategy<Value = PodRecord> {
    (0..12usize, 0..2usize, 0..3usize, prop::option::of(0..5usize), any::<bool>()).prop_map(
        |(n, ns, sa, socket, with_ports)| {
            let mut api = api_pod(NAMESPACES[ns], &format!("pod-{n}"), &uid(n), ACCOUNTS[sa]);
            if let Some(s) = socket {
                api = api.annotation_socket(SOCKETS[s]);
            }
            if with_ports {
                api = api.annotation_ports("8080,9090=h2");
            }
            record(&api.build())
        },
    )
}

fn policy_strategy() -> impl Strategy<Value = PolicyRecord> {
    (0..2usize, 0..4usize, 0..3usize, 0..5usize)
        .prop_map(|(ns, n, sa, s)| policy(NAMESPACES[ns], &format!("p{n}"), ACCOUNTS[sa], SOCKETS[s]))
}

#[derive(Debug, Clone)]
enum Event {
    ApplyPod(Box<PodRecord>),
    DeletePod(usize),
    ApplyPolicy(PolicyRecord),
    DeletePolicy(usize, usize),
    RelistPods(Vec<PodRecord>),
    RelistPolicies(Vec<PolicyRecord>),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => pod_strategy().prop_map(|p| Event::ApplyPod(Box::new(p))),
        2 => (0..12usize).prop_map(Event::DeletePod),
        4 => policy_strategy().prop_map(Event::ApplyPolicy),
        2 => (0..2usize, 0..4usize).prop_map(|(ns, n)| Event::DeletePolicy(ns, n)),
        1 => prop::collection::vec(pod_strategy(), 0..8).prop_map(Event::RelistPods),
        1 => prop::collection::vec(policy_strategy(), 0..5).prop_map(Event::RelistPolicies),
    ]
}

/// The truth the API server holds, as the watches would report it.
#[derive(Default, Clone)]
struct Model {
    pods: BTreeMap<String, PodRecord>,
    policies: BTreeMap<(String, String), PolicyRecord>,
}

impl Model {
    fn fresh_index(&self) -> Index {
        let mut index = Index::new(settings());
        index.reset_policies(self.policies.values().cloned());
        index.reset_pods(self.pods.values().cloned());
        index
    }

    /// The service keys whose pods an event may re-render.
    fn keys_of_policies(&self, ids: impl IntoIterator<Item = (String, String)>) -> BTreeSet<ServiceKey> {
        ids.into_iter().filter_map(|id| self.policies.get(&id)).map(|p| p.target.clone()).collect()
    }
}

fn conflicts(index: &Index) -> Vec<Conflict> {
    index.conflicts().cloned().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_event_sequence_equals_a_fresh_build_and_rerenders_only_what_it_may(events in prop::collection::vec(event(), 1..40)) {
        let mut index = Index::new(settings());
        let mut model = Model::default();
        for event in events {
            let before = model.clone();
            let change = match event.clone() {
                Event::ApplyPod(p) => {
                    let p = *p;
                    model.pods.insert(p.uid.clone(), p.clone());
                    let key = p.key();
                    let change = index.apply_pod(p);
                    prop_assert!(change.rerendered.iter().all(|k| *k == key), "a pod event re-renders that pod only");
                    change
                }
                Event::DeletePod(n) => {
                    model.pods.remove(&uid(n));
                    let change = index.delete_pod(&uid(n));
                    prop_assert!(change.rerendered.is_empty());
                    change
                }
                Event::ApplyPolicy(p) => {
                    let id = (p.namespace.clone(), p.name.clone());
                    model.policies.insert(id.clone(), p.clone());
                    let mut keys = before.keys_of_policies([id.clone()]);
                    keys.extend(model.keys_of_policies([id]));
                    let change = index.apply_policy(p);
                    let allowed: BTreeSet<_> = model.pods.values().filter(|p| keys.contains(&p.service_key())).map(PodRecord::key).collect();
                    prop_assert!(change.rerendered.iter().all(|k| allowed.contains(k)), "a policy event re-renders only its service's pods");
                    change
                }
                Event::DeletePolicy(ns, n) => {
                    let id = (NAMESPACES[ns].to_owned(), format!("p{n}"));
                    let keys = before.keys_of_policies([id.clone()]);
                    model.policies.remove(&id);
                    let change = index.delete_policy(&id.0, &id.1);
                    let allowed: BTreeSet<_> = model.pods.values().filter(|p| keys.contains(&p.service_key())).map(PodRecord::key).collect();
                    prop_assert!(change.rerendered.iter().all(|k| allowed.contains(k)));
                    change
                }
                Event::RelistPods(pods) => {
                    model.pods = pods.iter().map(|p| (p.uid.clone(), p.clone())).collect();
                    index.reset_pods(pods)
                }
                Event::RelistPolicies(policies) => {
                    model.policies = policies.iter().map(|p| ((p.namespace.clone(), p.name.clone()), p.clone())).collect();
                    index.reset_policies(policies)
                }
            };

            let fresh = model.fresh_index();
            prop_assert_eq!(&*index.snapshot(), &*fresh.snapshot(), "after {:?}", event);
            prop_assert_eq!(conflicts(&index), conflicts(&fresh));
            prop_assert_eq!(change.map_changed, before.fresh_index().snapshot() != fresh.snapshot(), "map_changed is exact");

            // The same event again is a resync: nothing re-rendered, nothing reported.
            let again = match event {
                Event::ApplyPod(p) => index.apply_pod(*p),
                Event::DeletePod(n) => index.delete_pod(&uid(n)),
                Event::ApplyPolicy(p) => index.apply_policy(p),
                Event::DeletePolicy(ns, n) => index.delete_policy(NAMESPACES[ns], &format!("p{n}")),
                Event::RelistPods(pods) => index.reset_pods(pods),
                Event::RelistPolicies(policies) => index.reset_policies(policies),
            };
            prop_assert!(again.is_empty(), "repeat re-rendered {:?}", again);
        }
    }
}
