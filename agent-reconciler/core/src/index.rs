//! The incremental index: pods and policies as the watches last reported them, and the
//! [`DeliveryMap`] the fold makes of them.
//!
//! Every mutation returns a [`Change`] naming exactly what was re-rendered:
//! - a pod event re-renders that pod only;
//! - a policy event re-renders only the pods of the service keys it touches, and only when the
//!   winning policy of that key changed (a losing policy's edit re-renders nothing);
//! - an event that leaves a record equal to the stored one re-renders nothing (a resync);
//! - a relist ([`Index::reset_pods`], [`Index::reset_policies`]) applies the difference, so the
//!   result equals a fresh build on the same state.
//!
//! Conflicts (several valid policies on one service key) are reported in the [`Change`] that
//! makes them appear or alter, never again on a resync. Both are contracts: docs/contracts.md,
//! "The index: a relist equals a fresh build".
//!
//! With a cluster cap ([`Settings::max_clusters`]) the index also keeps who holds the
//! node's clusters ([`crate::admission`]): a pod past the cap is delivered as
//! [`TcpReason::NodeClusterCap`] (no clusters at all), and a pod event that frees room re-renders
//! the refused pods it admits (they are in [`Change::rerendered`]). Admission is sticky, so with
//! pods refused for the cap a relist keeps who holds the clusters, where a fresh build would
//! decide in [`Rank`] order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use aether_crds::tiebreak::{Resolution, ServiceKey};

use crate::admission::{Admission, Rank};
use crate::fallback::TcpReason;
use crate::fold::{self, Delivery, Settings, Source};
use crate::record::{PodKey, PodRecord, PolicyRecord};

/// One pod's entry in the [`DeliveryMap`]: its record (ports, health, IPs for rendering), its
/// delivery, and the node facts render needs that the API does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDelivery {
    /// The pod as last reported.
    pub pod: Arc<PodRecord>,
    /// What the fold decided for it.
    pub delivery: Delivery,
    /// For a pipe, the path Envoy dials: the pin path (`<pin-dir>/<uid>.sock`) when pinning is on,
    /// else the socket path itself ([`Delivery::path`]). `None` for TCP.
    pub dial: Option<String>,
    /// The pod's network-namespace file as the proxy sees it (absolute path), when the shell
    /// has learnt it (container runtime, else a CNI record) via [`Index::set_netns`]; TCP is then
    /// dialed at `127.0.0.1` inside it. `None` = dial the pod IP.
    pub netns: Option<String>,
    /// Declared ports whose inbound listener Envoy could not bind in that netns (e.g. the app
    /// also listens on the port), via [`Index::mark_inbound_failed`]: no listener is offered for
    /// them until they are offered again ([`Index::reoffer_inbound`], on the schedule of
    /// [`crate::reoffer`]), the pod's netns changes or the pod is re-created.
    pub inbound_failed: BTreeSet<u16>,
}

/// Every managed pod on the node and its delivery, ordered by [`PodKey`]. Entries are shared
/// (`Arc`), so cloning the map copies pointers, not records; the index hands out
/// `Arc<DeliveryMap>` snapshots that later changes never alter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryMap {
    entries: BTreeMap<PodKey, Arc<PodDelivery>>,
}

impl DeliveryMap {
    /// The entry of one pod.
    pub fn get(&self, key: &PodKey) -> Option<&PodDelivery> {
        self.entries.get(key).map(Arc::as_ref)
    }

    /// All entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&PodKey, &PodDelivery)> {
        self.entries.iter().map(|(k, v)| (k, v.as_ref()))
    }

    /// The number of pods.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no managed pod is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Several valid policies target one service: `winner` (smallest name) applies, `losers` do not
/// (docs/contracts.md, "Precedence: which delivery a pod gets").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The contested service key.
    pub key: ServiceKey,
    /// The name of the policy in effect.
    pub winner: String,
    /// The names of the other valid policies, sorted.
    pub losers: Vec<String>,
}

/// What one index mutation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// Pods whose delivery was recomputed, sorted (their entry may or may not have changed).
    pub rerendered: Vec<PodKey>,
    /// Pods removed from the map, sorted.
    pub removed: Vec<PodKey>,
    /// True when the [`DeliveryMap`] differs from the one before the mutation: the only case in
    /// which a new snapshot needs to be pushed.
    pub map_changed: bool,
    /// Conflicts that appeared or altered (other winner or losers) with this mutation.
    pub conflicts: Vec<Conflict>,
    /// Service keys whose conflict ended with this mutation.
    pub resolved: Vec<ServiceKey>,
}

impl Change {
    /// True when the mutation changed nothing observable.
    pub fn is_empty(&self) -> bool {
        *self == Change::default()
    }
}

/// A policy's identity: `(namespace, name)`.
type PolicyId = (String, String);

/// The node's pods and policies, the delivery map derived from them, and the open conflicts.
#[derive(Debug, Clone)]
pub struct Index {
    settings: Settings,
    pods: HashMap<String, Arc<PodRecord>>,
    policies: BTreeMap<PolicyId, Arc<PolicyRecord>>,
    pods_by_service: HashMap<ServiceKey, BTreeSet<String>>,
    policies_by_service: HashMap<ServiceKey, BTreeSet<PolicyId>>,
    conflicts: BTreeMap<ServiceKey, Conflict>,
    /// Pod UID → netns path: node facts gathered by the shell when the pod changes, kept here so
    /// render does no I/O.
    netns: HashMap<String, String>,
    /// Pod UID → ports whose inbound listener failed to bind (a node fact from Envoy).
    inbound_failed: HashMap<String, BTreeSet<u16>>,
    /// Who holds the node's clusters under `--max-clusters`.
    admission: Admission,
    map: Arc<DeliveryMap>,
    /// Pods whose entry in `map` was added, replaced or removed since the last
    /// [`Index::take_changed`]: what the next publish re-renders (per-change work in proportion to
    /// the pods a change touched, never a pass over the whole map).
    changed: BTreeSet<PodKey>,
}

impl Index {
    /// An empty index for the node's settings.
    pub fn new(settings: Settings) -> Self {
        Index {
            pods: HashMap::new(),
            policies: BTreeMap::new(),
            pods_by_service: HashMap::new(),
            policies_by_service: HashMap::new(),
            conflicts: BTreeMap::new(),
            netns: HashMap::new(),
            inbound_failed: HashMap::new(),
            admission: Admission::new(settings.max_clusters()),
            settings,
            map: Arc::default(),
            changed: BTreeSet::new(),
        }
    }

    /// Who holds the node's clusters: the cap, the clusters granted, the pods refused.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Pods refused for the cluster cap before an agent restart (the state dir's pod-event
    /// ledger): in the boot's batch they queue after the other pods
    /// ([`Admission::remember_refused`]). Call before the first [`Index::reset_pods`].
    pub fn remember_refused(&mut self, uids: impl IntoIterator<Item = String>) {
        self.admission.remember_refused(uids);
    }

    /// The settings the fold runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The current delivery map; cheap (one `Arc` clone) and never altered afterwards.
    pub fn snapshot(&self) -> Arc<DeliveryMap> {
        Arc::clone(&self.map)
    }

    /// The pods whose entry in the [`DeliveryMap`] was added, replaced or removed since the last
    /// call (all of them on the first call after a build), sorted; the set is emptied. A pod
    /// whose entry came back to what it was is listed too: the caller compares.
    pub fn take_changed(&mut self) -> BTreeSet<PodKey> {
        std::mem::take(&mut self.changed)
    }

    /// The open conflicts, by service key.
    pub fn conflicts(&self) -> impl Iterator<Item = &Conflict> {
        self.conflicts.values()
    }

    /// The stored pod records (for the state dir), in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values().map(Arc::as_ref)
    }

    /// Whether a pod of UID `uid` is stored: one hash lookup (a caller checking a batch of
    /// answers against the live pods asks per answer instead of copying every UID).
    pub fn has_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// The stored record of pod `uid`: one hash lookup.
    pub fn pod(&self, uid: &str) -> Option<&PodRecord> {
        self.pods.get(uid).map(Arc::as_ref)
    }

    /// The network-namespace path of pod `uid` as last set by [`Index::set_netns`] (what its
    /// renders use), for the state dir: a restarted agent replays it ([`Index::pod`]'s companion).
    pub fn netns(&self, uid: &str) -> Option<&str> {
        self.netns.get(uid).map(String::as_str)
    }

    /// The stored policy records (for the state dir), by namespace and name.
    pub fn policies(&self) -> impl Iterator<Item = &PolicyRecord> {
        self.policies.values().map(Arc::as_ref)
    }

    /// A pod was added or modified (watch `Apply`). Re-renders that pod only, or nothing when
    /// the record equals the stored one.
    pub fn apply_pod(&mut self, pod: PodRecord) -> Change {
        let uid = pod.uid.clone();
        self.edit_pods([(uid, Some(pod))])
    }

    /// A pod was deleted (watch `Delete`), by UID. Nothing happens for an unknown UID.
    pub fn delete_pod(&mut self, uid: &str) -> Change {
        self.edit_pods([(uid.to_owned(), None)])
    }

    /// A relist of pods (watch `Init`..`InitDone`, e.g. after 410 Gone): `pods` is the whole
    /// truth. Pods not in it are removed; only added or changed pods are re-rendered. A UID
    /// listed twice keeps its last record.
    pub fn reset_pods(&mut self, pods: impl IntoIterator<Item = PodRecord>) -> Change {
        let listed: BTreeMap<String, PodRecord> = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        let gone: Vec<String> = self.pods.keys().filter(|uid| !listed.contains_key(*uid)).cloned().collect();
        // Grow the pod map once for what it may still lack (a relist of known pods never grows it).
        self.pods.reserve(listed.len().saturating_sub(self.pods.len()));
        let listed = listed.into_iter().map(|(uid, p)| (uid, Some(p)));
        self.edit_pods(listed.chain(gone.into_iter().map(|uid| (uid, None))))
    }

    /// Sets (or, with `None`, clears) the network-namespace path of pod `uid`, a fact the shell
    /// gathers from the container runtime or a CNI record when the pod changes (and on the periodic
    /// re-check). Re-renders that pod when the value changed and the pod is known; a fact for an
    /// unknown UID is not kept (the pod's first event asks again). Nothing for an equal value.
    pub fn set_netns(&mut self, uid: &str, netns: Option<String>) -> Change {
        let mut change = Change::default();
        if self.netns.get(uid) == netns.as_ref() {
            return change;
        }
        let Some(pod) = self.pods.get(uid).cloned() else { return change };
        match netns {
            Some(path) => self.netns.insert(uid.to_owned(), path),
            None => self.netns.remove(uid),
        };
        // A new namespace is a new sandbox: ports that failed to bind in the old one are tried again.
        self.inbound_failed.remove(uid);
        self.render(pod, &mut change);
        change
    }

    /// Records that Envoy could not bind the inbound listener of `port` for pod `uid` (a node fact
    /// the shell learns from Envoy after an LDS NACK). Re-renders that pod without the listener,
    /// so the node's next LDS update is accepted; the other ports and pods keep theirs. Nothing
    /// for an unknown pod or a port already marked.
    pub fn mark_inbound_failed(&mut self, uid: &str, port: u16) -> Change {
        let mut change = Change::default();
        let Some(pod) = self.pods.get(uid).cloned() else { return change };
        if !self.inbound_failed.entry(uid.to_owned()).or_default().insert(port) {
            return change;
        }
        self.render(pod, &mut change);
        change
    }

    /// Offers the inbound listeners withdrawn from pod `uid` ([`Index::mark_inbound_failed`]) again:
    /// what held their ports may be gone (docs/design-notes.md, "Agent": a withdrawn listener is
    /// offered again). Re-renders that pod with them; nothing for an unknown pod or one with none withdrawn.
    pub fn reoffer_inbound(&mut self, uid: &str) -> Change {
        let mut change = Change::default();
        let Some(pod) = self.pods.get(uid).cloned() else { return change };
        if self.inbound_failed.remove(uid).is_none() {
            return change;
        }
        self.render(pod, &mut change);
        change
    }

    /// A policy was added or modified. Re-renders the pods of its service key (and of its old
    /// key if the target moved) when the winner there changed; nothing otherwise.
    pub fn apply_policy(&mut self, policy: PolicyRecord) -> Change {
        let id = (policy.namespace.clone(), policy.name.clone());
        self.edit_policies([(id, Some(policy))])
    }

    /// A policy was deleted. Nothing happens for an unknown policy.
    pub fn delete_policy(&mut self, namespace: &str, name: &str) -> Change {
        self.edit_policies([((namespace.to_owned(), name.to_owned()), None)])
    }

    /// A relist of policies: `policies` is the whole truth (an empty list is also what the driver
    /// sends when the CRD is deleted: docs/contracts.md, "When the EndpointPolicy CRD is missing").
    /// Conflicts are compared before and after the whole relist, so a transient state between two
    /// list items is never reported.
    pub fn reset_policies(&mut self, policies: impl IntoIterator<Item = PolicyRecord>) -> Change {
        let listed: BTreeMap<PolicyId, PolicyRecord> =
            policies.into_iter().map(|p| ((p.namespace.clone(), p.name.clone()), p)).collect();
        let gone: Vec<PolicyId> = self.policies.keys().filter(|id| !listed.contains_key(*id)).cloned().collect();
        let listed = listed.into_iter().map(|(id, p)| (id, Some(p)));
        self.edit_policies(listed.chain(gone.into_iter().map(|id| (id, None))))
    }

    /// Stores, replaces or removes pods by UID, decides the cluster cap again for the whole batch,
    /// and re-renders each changed pod and each pod whose admission changed.
    fn edit_pods(&mut self, edits: impl IntoIterator<Item = (String, Option<PodRecord>)>) -> Change {
        let mut change = Change::default();
        let mut touched: Vec<String> = Vec::new();
        let mut admission = Vec::new();
        for (uid, new) in edits {
            if self.pods.get(&uid).map(Arc::as_ref) == new.as_ref() {
                continue;
            }
            if let Some(old) = self.pods.remove(&uid) {
                unlink(&mut self.pods_by_service, &old.service_key(), &uid);
                if new.is_none() {
                    self.netns.remove(&uid);
                    self.inbound_failed.remove(&uid);
                }
                // The UID is the same: the key is the same when namespace and name are.
                let same_key = new.as_ref().is_some_and(|n| (&n.namespace, &n.name) == (&old.namespace, &old.name));
                if !same_key {
                    let old_key = old.key();
                    Arc::make_mut(&mut self.map).entries.remove(&old_key);
                    self.changed.insert(old_key.clone());
                    change.removed.push(old_key);
                    change.map_changed = true;
                }
            }
            match new {
                Some(new) => {
                    admission.push((uid.clone(), Some((Rank::of(&new), new.cluster_demand()))));
                    self.pods_by_service.entry(new.service_key()).or_default().insert(uid.clone());
                    self.pods.insert(uid.clone(), Arc::new(new));
                    touched.push(uid);
                }
                None => admission.push((uid, None)),
            }
        }
        touched.extend(self.admission.update(admission));
        touched.sort();
        touched.dedup();
        for uid in touched {
            if let Some(pod) = self.pods.get(&uid).cloned() {
                self.render(pod, &mut change);
            }
        }
        change.rerendered.sort();
        change.removed.sort();
        change
    }

    /// Stores, replaces or removes policies, then re-renders the pods of every service key whose
    /// winner changed and reports the conflicts that appeared, altered or ended.
    fn edit_policies(&mut self, edits: impl IntoIterator<Item = (PolicyId, Option<PolicyRecord>)>) -> Change {
        let mut winners_before: BTreeMap<ServiceKey, Option<PolicyRecord>> = BTreeMap::new();
        for (id, new) in edits {
            let old = self.policies.get(&id);
            if old.map(Arc::as_ref) == new.as_ref() {
                continue;
            }
            for key in old.map(|p| &p.target).into_iter().chain(new.as_ref().map(|p| &p.target)) {
                if !winners_before.contains_key(key) {
                    winners_before.insert(key.clone(), self.winner(key).cloned());
                }
            }
            if let Some(old) = self.policies.remove(&id) {
                unlink(&mut self.policies_by_service, &old.target, &id);
            }
            if let Some(new) = new {
                self.policies_by_service.entry(new.target.clone()).or_default().insert(id.clone());
                self.policies.insert(id, Arc::new(new));
            }
        }

        let mut change = Change::default();
        for (key, before) in winners_before {
            if self.winner(&key) != before.as_ref() {
                let pods: Vec<Arc<PodRecord>> = self
                    .pods_by_service
                    .get(&key)
                    .into_iter()
                    .flatten()
                    .map(|uid| Arc::clone(&self.pods[uid]))
                    .collect();
                for pod in pods {
                    self.render(pod, &mut change);
                }
            }
            match (self.conflict(&key), self.conflicts.get(&key)) {
                (Some(now), Some(was)) if now == *was => {}
                (Some(now), _) => {
                    change.conflicts.push(now.clone());
                    self.conflicts.insert(key, now);
                }
                (None, Some(_)) => {
                    self.conflicts.remove(&key);
                    change.resolved.push(key);
                }
                (None, None) => {}
            }
        }
        change.rerendered.sort();
        change
    }

    /// The competition among the policies targeting one service key ([`fold::resolve_policies`]).
    fn resolution(&self, key: &ServiceKey) -> Resolution<&PolicyRecord> {
        let ids = self.policies_by_service.get(key).into_iter().flatten();
        fold::resolve_policies(ids.map(|id| self.policies[id].as_ref()))
    }

    /// The winning policy of one service key.
    fn winner(&self, key: &ServiceKey) -> Option<&PolicyRecord> {
        self.resolution(key).winner
    }

    /// The conflict on one service key, if two or more valid policies target it.
    fn conflict(&self, key: &ServiceKey) -> Option<Conflict> {
        let resolution = self.resolution(key);
        let winner = resolution.winner.filter(|_| resolution.is_conflict())?;
        let losers = resolution.conflicted.iter().map(|p| p.name.clone()).collect();
        Some(Conflict { key: key.clone(), winner: winner.name.clone(), losers })
    }

    /// Folds one pod (past the cluster cap: [`node_cap`]) and stores its entry; records it as
    /// re-rendered.
    fn render(&mut self, pod: Arc<PodRecord>, change: &mut Change) {
        let key = pod.key();
        let mut delivery = fold::deliver(&pod, self.winner(&pod.service_key()), &self.settings);
        if let (Some(max), false) = (self.admission.max(), self.admission.is_admitted(&pod.uid))
            && delivery.tcp_reason() != Some(TcpReason::TooManyPorts)
        {
            delivery = node_cap(delivery, &pod, max);
        }
        let netns = self.netns.get(&pod.uid).cloned();
        let inbound_failed = self.inbound_failed.get(&pod.uid).cloned().unwrap_or_default();
        let dial = delivery.path.as_ref().map(|p| match self.settings.pin_dir() {
            Some(dir) => crate::names::pin_path(dir, &pod.uid),
            None => p.as_str().to_owned(),
        });
        let entry = PodDelivery { pod, delivery, dial, netns, inbound_failed };
        if self.map.entries.get(&key).map(Arc::as_ref) != Some(&entry) {
            Arc::make_mut(&mut self.map).entries.insert(key.clone(), Arc::new(entry));
            self.changed.insert(key.clone());
            change.map_changed = true;
        }
        change.rerendered.push(key);
    }
}

/// The delivery of a pod refused for the cluster cap: no clusters ([`TcpReason::NodeClusterCap`]),
/// keeping the socket and policy the fold considered (its Event names them). The sentence states
/// only what does not move while the pod waits (the cap and its demand), so its entry changes
/// only when the pod does.
fn node_cap(fold: Delivery, pod: &PodRecord, max: usize) -> Delivery {
    let demand = pod.cluster_demand();
    let ports = pod.ports.len();
    Delivery {
        source: Source::Tcp(TcpReason::NodeClusterCap),
        path: None,
        reason: format!(
            "the node's Envoy is given at most {max} clusters (--max-clusters) and pods admitted before this one \
             leave fewer than the {demand} it needs ({ports} port{} and its health check); pods admitted first keep \
             theirs, so this pod is served no clusters until room frees",
            if ports == 1 { "" } else { "s" }
        ),
        ..fold
    }
}

/// Removes `member` from the set of `key`, dropping the set when it empties.
fn unlink<T: Ord>(by_service: &mut HashMap<ServiceKey, BTreeSet<T>>, key: &ServiceKey, member: &T) {
    if let Some(set) = by_service.get_mut(key) {
        set.remove(member);
        if set.is_empty() {
            by_service.remove(key);
        }
    }
}
