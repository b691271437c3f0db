//! The decision board: the agent's live per-pod [`Decision`], kept by the reconcile loop and
//! served by the admin port (`GET /debug/pods/{namespace}/{name}`, `GET /debug/pods`,
//! see [`crate::admin`]) for `kubectl aether why`.
//!
//! Per change, never per pod: the driver ([`crate::driver::Collaborators::decisions`]) updates the
//! board only for the pods an event touched (re-rendered, removed, or whose on-disk check, netns
//! or inbound listeners changed) and for the service keys whose conflict appeared, altered or
//! ended. The conflict of a pod's service key is joined at read time, so a losing policy's edit
//! (which re-renders no pod) still shows on every pod of that service.
//!
//! Decided on read, for a lean process (docs/design-notes.md "Per-change work and a lean
//! process"): the board keeps, per pod, only what the decision is made of — the pod's index
//! entry ([`PodDelivery`], whose record is shared with the index, not copied), its on-disk refusal and when it was decided (a 16-byte timestamp) — and
//! projects the [`Decision`] (cluster and listener names, the sentence, the labels) when it is
//! asked for. A rendered `Decision` per pod held ~1 KiB of small strings per pod at 10k pods.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use aether_agent_core::decision::{ConflictView, Decision};
use k8s_openapi::jiff::Timestamp;

use crate::index::{Change, DeliveryMap, PodDelivery};
use crate::record::PodKey;
use aether_agent_core::refusal::Refusal;
use aether_crds::tiebreak::ServiceKey;

/// The most decisions `GET /debug/pods` lists; the answer says when it truncated.
pub const LIST_CAP: usize = 1000;

/// One pod on the board: what its decision is projected from.
struct Entry {
    /// `metadata.uid` (the board is keyed by namespace and name).
    uid: String,
    /// The pod's index entry when it was last decided.
    delivery: PodDelivery,
    /// The on-disk refusal of its socket then, if any.
    refusal: Option<Refusal>,
    /// When it was last decided.
    decided_at: Timestamp,
}

#[derive(Default)]
struct Board {
    /// `(namespace, name)` → what the pod's latest decision is made of.
    pods: BTreeMap<(String, String), Entry>,
    /// Open conflicts by service key.
    conflicts: HashMap<ServiceKey, ConflictView>,
}

/// The board, shared (cheap to clone) between the reconcile loop, which writes it, and the admin
/// port, which reads it.
#[derive(Clone)]
pub struct Decisions {
    node: Arc<str>,
    board: Arc<RwLock<Board>>,
    /// False for a [`Decisions::detached`] board, which keeps nothing.
    kept: bool,
}

/// `GET /debug/pods`: the decisions of the node's managed pods, by namespace and name.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Listing {
    /// The node the agent serves (`--node-name`).
    pub node: String,
    /// How many managed pods the agent knows.
    pub total: usize,
    /// True when `pods` holds only the first [`LIST_CAP`] of them.
    pub truncated: bool,
    /// The decisions, at most [`LIST_CAP`].
    pub pods: Vec<Decision>,
}

impl Decisions {
    /// An empty board for the agent of node `node`.
    pub fn new(node: &str) -> Self {
        Decisions { node: node.into(), board: Arc::default(), kept: true }
    }

    /// A board that keeps nothing (every update is a no-op, every lookup finds nothing), for a
    /// loop whose decisions nobody reads, e.g. in tests and benchmarks.
    pub fn detached() -> Self {
        Decisions { node: "".into(), board: Arc::default(), kept: false }
    }

    /// The node this board describes.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Re-decides the pods `keys` name from `map` (the index's current map) and the on-disk
    /// refusals: a pod in the map gets its entry and refusal recorded, stamped now; a pod no
    /// longer in it is dropped (unless a newer pod of the same name, another UID, holds the
    /// entry). O(`keys`).
    pub fn update(&self, map: &DeliveryMap, keys: &[PodKey], refused: &HashMap<PodKey, Refusal>) {
        if keys.is_empty() || !self.kept {
            return;
        }
        let now = Timestamp::now();
        let mut board = self.board.write().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            let id = (key.namespace.to_string(), key.name.to_string());
            match map.get(key) {
                Some(delivery) => {
                    let entry = Entry {
                        uid: key.uid.to_string(),
                        delivery: delivery.clone(),
                        refusal: refused.get(key).cloned(),
                        decided_at: now,
                    };
                    board.pods.insert(id, entry);
                }
                None => {
                    if board.pods.get(&id).is_some_and(|e| *e.uid == *key.uid) {
                        board.pods.remove(&id);
                    }
                }
            }
        }
    }

    /// Applies one index [`Change`]: removed pods go, re-rendered ones are re-decided, and the
    /// conflicts that appeared, altered or ended are recorded.
    pub fn changed(&self, map: &DeliveryMap, change: &Change, refused: &HashMap<PodKey, Refusal>) {
        self.update(map, &change.removed, refused);
        self.update(map, &change.rerendered, refused);
        if (change.conflicts.is_empty() && change.resolved.is_empty()) || !self.kept {
            return;
        }
        let mut board = self.board.write().unwrap_or_else(|e| e.into_inner());
        for key in &change.resolved {
            board.conflicts.remove(key);
        }
        for c in &change.conflicts {
            board.conflicts.insert(c.key.clone(), ConflictView::from(c));
        }
    }

    /// The decision for pod `namespace/name`, with the conflict on its service key, if the agent
    /// knows the pod.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Decision> {
        let board = self.board.read().unwrap_or_else(|e| e.into_inner());
        let id = (namespace.to_owned(), name.to_owned());
        let entry = board.pods.get(&id)?;
        Some(board.decide(&id, entry))
    }

    /// The first [`LIST_CAP`] decisions by namespace and name, and how many there are.
    pub fn list(&self) -> Listing {
        let board = self.board.read().unwrap_or_else(|e| e.into_inner());
        let pods: Vec<Decision> = board.pods.iter().take(LIST_CAP).map(|(id, e)| board.decide(id, e)).collect();
        Listing { node: self.node.to_string(), total: board.pods.len(), truncated: board.pods.len() > pods.len(), pods }
    }
}

impl Board {
    /// The decision of pod `(namespace, name)` projected from `entry`, with the conflict on its
    /// service key.
    fn decide(&self, (namespace, name): &(String, String), entry: &Entry) -> Decision {
        let key =
            PodKey { namespace: namespace.as_str().into(), name: name.as_str().into(), uid: entry.uid.as_str().into() };
        let at = Some(entry.decided_at.to_string());
        let mut d = Decision::project(&key, &entry.delivery, entry.refusal.as_ref(), None, at);
        d.conflict = self.conflicts.get(&entry.delivery.pod.service_key()).cloned();
        d
    }
}

#[cfg(test)]
mod tests {
    use aether_crds::EndpointPolicy;

    use super::*;
    use crate::fold::Settings;
    use crate::index::Index;
    use crate::record::{PodRecord, PolicyRecord};

    const UID: &str = aether_fixtures::UID;
    const UID_B: &str = "11111111-2222-4333-8444-555555555555";

    fn record(uid: &str, sa: &str) -> PodRecord {
        let pod = aether_fixtures::pod("shop", "cart-1").uid(uid).sa(sa).emptydir("s").ip("10.1.2.3").build();
        PodRecord::from_pod(&pod).unwrap().unwrap()
    }

    fn policy(name: &str, settings: &Settings) -> PolicyRecord {
        let p: EndpointPolicy = aether_fixtures::policy("shop", name).target("cart").socket("s/app.sock").build();
        PolicyRecord::from_policy(&p, settings).unwrap()
    }

    #[test]
    fn a_losing_policy_shows_on_the_pod_although_it_re_renders_nothing_and_goes_when_resolved() {
        let settings = Settings::new("/var/lib/kubelet/pods", true);
        let mut index = Index::new(settings.clone());
        let board = Decisions::new("node-a");
        let refused = HashMap::new();
        for change in [index.apply_policy(policy("a-wins", &settings)), index.apply_pod(record(UID, "cart"))] {
            board.changed(&index.snapshot(), &change, &refused);
        }
        assert_eq!(board.get("shop", "cart-1").unwrap().conflict, None);
        let change = index.apply_policy(policy("b-loses", &settings));
        assert!(change.rerendered.is_empty(), "a losing policy re-renders no pod");
        board.changed(&index.snapshot(), &change, &refused);
        let c = board.get("shop", "cart-1").unwrap().conflict.expect("the conflict shows");
        assert_eq!((c.winner.as_str(), c.losers.as_slice()), ("a-wins", &["b-loses".to_owned()][..]));
        let change = index.delete_policy("shop", "b-loses");
        board.changed(&index.snapshot(), &change, &refused);
        assert_eq!(board.get("shop", "cart-1").unwrap().conflict, None);
    }

    #[test]
    fn a_decision_is_projected_on_read_from_the_entry_and_refusal_it_was_decided_with() {
        let settings = Settings::new("/var/lib/kubelet/pods", true);
        let mut index = Index::new(settings.clone());
        let board = Decisions::new("node-a");
        index.apply_policy(policy("a-wins", &settings));
        let change = index.apply_pod(record(UID, "cart"));
        let key = change.rerendered[0].clone();
        let path = index.snapshot().get(&key).unwrap().delivery.path.as_ref().unwrap().as_str().to_owned();
        let refused = HashMap::from([(key.clone(), Refusal::Symlink { path: path.clone() })]);
        board.changed(&index.snapshot(), &change, &refused);
        let d = board.get("shop", "cart-1").unwrap();
        let expected = Decision::project(&key, index.snapshot().get(&key).unwrap(), refused.get(&key), None, None);
        assert_eq!(Decision { decided_at: None, ..d.clone() }, expected, "the projection of what was decided");
        assert_eq!(d.reason.as_deref(), Some(refused[&key].tcp_reason().label()), "the refusal is kept with the pod");
        assert!(d.detail.contains(&path), "{}", d.detail);
        assert!(!d.clusters.is_empty(), "rendered on read: {d:?}");
        // Read again: the same decision, stamped when it was decided, not when it was read.
        assert_eq!(board.get("shop", "cart-1").unwrap(), d);
        // Re-decided without the refusal: it is gone.
        board.update(&index.snapshot(), std::slice::from_ref(&key), &HashMap::new());
        let again = board.get("shop", "cart-1").unwrap();
        assert_eq!(again.reason, None, "{again:?}");
        assert_ne!(again.detail, d.detail);
    }

    #[test]
    fn a_deleted_pod_leaves_the_board_but_a_new_pod_of_the_same_name_stays() {
        let mut index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        let board = Decisions::new("node-a");
        let refused = HashMap::new();
        let change = index.apply_pod(record(UID, "cart"));
        board.changed(&index.snapshot(), &change, &refused);
        assert_eq!(board.get("shop", "cart-1").unwrap().uid, UID);
        // Re-created under the same name: the old UID is removed, the new one decided.
        let change = index.reset_pods([record(UID_B, "cart")]);
        board.changed(&index.snapshot(), &change, &refused);
        assert_eq!(board.get("shop", "cart-1").unwrap().uid, UID_B);
        // A late removal of the old UID does not drop the new pod's entry.
        let old = PodKey { namespace: "shop".into(), name: "cart-1".into(), uid: UID.into() };
        board.update(&index.snapshot(), &[old], &refused);
        assert_eq!(board.get("shop", "cart-1").unwrap().uid, UID_B);
        let change = index.delete_pod(UID_B);
        board.changed(&index.snapshot(), &change, &refused);
        assert!(board.get("shop", "cart-1").is_none());
        let listing = board.list();
        assert_eq!((listing.node.as_str(), listing.total, listing.truncated), ("node-a", 0, false));
    }

    #[test]
    fn the_listing_is_capped_and_says_so() {
        let mut index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        let board = Decisions::new("node-a");
        let pods = (0..LIST_CAP + 2).map(|i| {
            let pod = aether_fixtures::pod("shop", &format!("p-{i:05}")).uid(&aether_fixtures::uid(i)).sa("s").build();
            PodRecord::from_pod(&pod).unwrap().unwrap()
        });
        let change = index.reset_pods(pods);
        board.changed(&index.snapshot(), &change, &HashMap::new());
        let listing = board.list();
        assert_eq!((listing.total, listing.truncated, listing.pods.len()), (LIST_CAP + 2, true, LIST_CAP));
        assert_eq!(listing.pods[0].name, "p-00000", "sorted by namespace and name");
    }
}
