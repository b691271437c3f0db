//! One competition rule (docs/endpointpolicy.md, "Which pods a policy reaches": among valid
//! policies the lexicographically smallest name wins), seen from both sides. For random policy sets
//! (names, namespaces, targets, valid and invalid specs, pods dirs with and without a budget) and
//! random sets of existing Services, the policy the agent applies to a service key is the one the
//! status writer reports in effect (`Accepted` when its Service exists, `AcceptedWithoutService`
//! when it does not: the agent never looks at Services), the agent's conflict names the policies
//! the status writer reports Conflicted (with or without the Service), and both sides agree on
//! which are invalid.
//!
//! Both sides run their real code: on the agent `PolicyRecord::from_policy`, the index (whose
//! fold names the policy it applied in each pod's delivery) and `fold::select_policy`; on the
//! controller `status::desired`, as the status writer calls it.

use std::collections::{BTreeMap, BTreeSet};

use aether_agent_reconciler::fold::select_policy;
use aether_agent_reconciler::{Index, PodRecord, PolicyRecord, Settings};
use aether_controller::status::{self, Reason};
use aether_crds::Rules;
use aether_crds::policy::EndpointPolicy;
use aether_crds::tiebreak::ServiceKey;
use proptest::prelude::*;

const NAMESPACES: &[&str] = &["shop", "bank"];
const TARGETS: &[&str] = &["echo", "cart"];
/// A 16-byte budget, a 35-byte one, and none at all (every policy is invalid).
const PODS_DIRS: &[&str] = &["/var/lib/kubelet/pods", "/k", "/var/snap/microk8s/common/var/lib/kubelet/pods"];
/// Within the default budget, over it (valid with `/k` only), and broken grammar.
const SOCKETS: &[&str] = &["s/app.sock", "sockets/app.sock", "sockets/application.sock", "a/b/c", "Bad/x.sock", "s/.."];
/// Mostly the right kind; `service` is invalid (case-sensitive).
const KINDS: &[&str] = &["Service", "Service", "Service", "service"];

/// Policies with names unique per namespace (as the API server keeps them), in random order.
fn policy_sets() -> impl Strategy<Value = Vec<EndpointPolicy>> {
    let id = (0..NAMESPACES.len(), "[a-c0-9][a-c0-9.-]{0,4}");
    let spec = (0..TARGETS.len(), 0..SOCKETS.len(), 0..KINDS.len());
    prop::collection::btree_map(id, spec, 0..10)
        .prop_map(|drawn| {
            drawn
                .into_iter()
                .map(|((ns, name), (t, s, k))| {
                    aether_fixtures::policy(NAMESPACES[ns], &name)
                        .target(TARGETS[t])
                        .target_kind(KINDS[k])
                        .socket(SOCKETS[s])
                        .generation(1)
                        .build()
                })
                .collect::<Vec<_>>()
        })
        .prop_shuffle()
}

/// The agent's view of one key: the policy its fold applied, the winner of `select_policy`,
/// the losers of its conflict (and that conflict's winner), and the invalid policies.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    applied: Option<String>,
    conflicted: BTreeSet<String>,
    invalid: BTreeSet<String>,
}

fn agent_view(policies: &[EndpointPolicy], pods_dir: &str, keys: &BTreeSet<ServiceKey>) -> BTreeMap<ServiceKey, Seen> {
    let settings = Settings::new(pods_dir, true);
    let records: Vec<PolicyRecord> =
        policies.iter().map(|p| PolicyRecord::from_policy(p, &settings).expect("named policy")).collect();
    let mut index = Index::new(settings);
    index.reset_policies(records.clone());
    // A managed pod per key without a socket annotation: its delivery comes from the policy.
    let pods: Vec<PodRecord> = keys
        .iter()
        .enumerate()
        .map(|(n, key)| {
            let api = aether_fixtures::pod(&key.namespace, &format!("pod-{n}"))
                .uid(&aether_fixtures::uid(n))
                .sa(&key.name)
                .emptydir("s")
                .emptydir("sockets")
                .build();
            PodRecord::from_pod(&api).expect("a well-formed pod").expect("a managed pod")
        })
        .collect();
    index.reset_pods(pods.clone());
    let snapshot = index.snapshot();
    let conflicts: BTreeMap<&ServiceKey, _> = index.conflicts().map(|c| (&c.key, c)).collect();
    let mut out = BTreeMap::new();
    for (key, pod) in keys.iter().zip(&pods) {
        let of_key: Vec<&PolicyRecord> = records.iter().filter(|r| r.target == *key).collect();
        let selected = select_policy(of_key.iter().copied()).map(|p| p.name.clone());
        let applied = snapshot.get(&pod.key()).expect("the pod is in the map").delivery.policy.clone();
        assert_eq!(applied, selected, "{key}: the fold applies select_policy's winner");
        let conflict = conflicts.get(key);
        if let Some(c) = conflict {
            assert_eq!(Some(&c.winner), applied.as_ref(), "{key}: the conflict's winner is the applied policy");
        }
        out.insert(
            key.clone(),
            Seen {
                applied,
                conflicted: conflict.map(|c| c.losers.iter().cloned().collect()).unwrap_or_default(),
                invalid: of_key.iter().filter(|r| !r.is_valid()).map(|r| r.name.clone()).collect(),
            },
        );
    }
    out
}

fn controller_view(
    policies: &[EndpointPolicy],
    pods_dir: &str,
    keys: &BTreeSet<ServiceKey>,
    services: &BTreeSet<ServiceKey>,
) -> BTreeMap<ServiceKey, Seen> {
    let rules = Rules::new(pods_dir);
    let mut out: BTreeMap<ServiceKey, Seen> = keys
        .iter()
        .map(|k| (k.clone(), Seen { applied: None, conflicted: BTreeSet::new(), invalid: BTreeSet::new() }))
        .collect();
    for p in policies {
        let others: Vec<&EndpointPolicy> = policies.iter().filter(|o| !std::ptr::eq(*o, p)).collect();
        let key = ServiceKey::of_policy(p);
        let exists = services.contains(&key);
        let desired = status::desired(p, &others, exists, &rules);
        let seen = out.get_mut(&key).expect("every policy's key is listed");
        let name = p.metadata.name.clone().expect("named policy");
        assert_eq!(desired.accepted, desired.reason.in_effect(), "{name}: {desired:?}");
        match desired.reason {
            Reason::Accepted | Reason::AcceptedWithoutService => {
                let want = if exists { Reason::Accepted } else { Reason::AcceptedWithoutService };
                assert_eq!(desired.reason, want, "{name}: Service {key} exists: {exists}");
                assert!(
                    seen.applied.is_none(),
                    "two policies in effect for one Service: {:?} and {name}",
                    seen.applied
                );
                seen.applied = Some(name);
            }
            Reason::Conflicted => {
                seen.conflicted.insert(name);
            }
            Reason::Invalid => {
                seen.invalid.insert(name);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_agent_applies_the_policy_the_status_writer_accepts(
        policies in policy_sets(),
        dir in 0..PODS_DIRS.len(),
        existing in prop::collection::btree_set((0..NAMESPACES.len(), 0..TARGETS.len()), 0..=4),
    ) {
        let keys: BTreeSet<ServiceKey> = policies.iter().map(ServiceKey::of_policy).collect();
        let services: BTreeSet<ServiceKey> =
            existing.into_iter().map(|(ns, t)| ServiceKey::new(NAMESPACES[ns], TARGETS[t])).collect();
        let agent = agent_view(&policies, PODS_DIRS[dir], &keys);
        let controller = controller_view(&policies, PODS_DIRS[dir], &keys, &services);
        prop_assert_eq!(agent, controller);
    }
}
