//! The node's cluster cap (`--max-clusters`): which pods the node's Envoy is given clusters for
//! when all of them would not fit. Pure bookkeeping, kept by the [`crate::Index`]. Why the cap and
//! its order: docs/workload-requirements.md, "Ports per pod and clusters per node".
//!
//! Each pod asks for [`PodRecord::cluster_demand`] clusters (its ports + 1 health; 0 over the
//! per-pod port cap). The rule, in this order:
//!
//! 1. **Pods admitted first keep theirs.** An admitted pod keeps its clusters while its demand
//!    does not grow, whatever arrives later; a pod whose demand shrinks keeps the smaller grant.
//! 2. **The others compete, oldest first** ([`Rank`]: `metadata.creationTimestamp`, then
//!    namespace, name, UID): new pods, pods refused earlier (only when room was freed) and a pod
//!    whose demand grew (it gives its grant back first). Each is admitted when its whole demand
//!    fits in what is left ("first fit": a smaller, younger pod can be admitted past an older one
//!    that does not fit); the others are refused and get no clusters at all, never a part of them.
//!
//! So adding a pod never takes clusters from another pod, a pod that grows can only lose its own,
//! and room freed by a deletion goes to the oldest refused pods first. The decision is made per
//! batch of pod changes (a relist, the boot from the state dir), so the pods of one batch compete
//! in [`Rank`] order, not in the order they were listed.
//!
//! Across an agent restart the grants are rebuilt from the state dir's pods in [`Rank`] order,
//! except that pods refused before the restart (the pod-event ledger remembers them) queue after
//! the others ([`Admission::remember_refused`]): a restart does not hand their room to them.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::record::PodRecord;

/// The order in which pods compete for room: the older `metadata.creationTimestamp` first (a pod
/// without one after every dated pod), then namespace, name and UID, so the order is total and the
/// same on every agent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank {
    created: i64,
    namespace: String,
    name: String,
    uid: String,
}

impl Rank {
    /// The rank of `pod`.
    pub fn of(pod: &PodRecord) -> Rank {
        Rank {
            created: pod.created.unwrap_or(i64::MAX),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        }
    }
}

/// One pod change for [`Admission::update`]: its UID and, unless it is gone, its rank and demand.
pub type Edit = (String, Option<(Rank, usize)>);

/// Who holds the node's clusters. Every known pod is either admitted (with the clusters granted)
/// or refused.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    max: Option<usize>,
    /// Admitted pods by UID, with the clusters granted (their demand when admitted or shrunk).
    granted: HashMap<String, usize>,
    /// The sum of `granted`.
    total: usize,
    /// Refused pods in the order they get freed room, with their demand.
    refused: BTreeMap<Rank, usize>,
    /// Refused pods by UID (to find their rank).
    refused_rank: HashMap<String, Rank>,
    /// UIDs refused before a restart: on arrival they queue after the pods arriving with them.
    refused_before: HashSet<String>,
}

impl Admission {
    /// Bookkeeping for a cap of `max` clusters (`None`: every pod is admitted).
    pub fn new(max: Option<usize>) -> Self {
        Admission { max, ..Admission::default() }
    }

    /// The cap.
    pub fn max(&self) -> Option<usize> {
        self.max
    }

    /// Clusters granted to admitted pods: what the node's Envoy is given once every admitted pod
    /// has an address (a pod waiting for its IP holds its grant).
    pub fn granted(&self) -> usize {
        self.total
    }

    /// The number of pods refused for the cap.
    pub fn refused(&self) -> usize {
        self.refused.len()
    }

    /// True when the pod `uid` is admitted (an unknown pod is not).
    pub fn is_admitted(&self, uid: &str) -> bool {
        self.granted.contains_key(uid)
    }

    /// Pods refused before an agent restart (the state dir's pod-event ledger): when they arrive
    /// they compete after every pod arriving in the same batch. Call before the boot's batch.
    pub fn remember_refused(&mut self, uids: impl IntoIterator<Item = String>) {
        self.refused_before.extend(uids);
    }

    /// Applies one batch of pod changes (a pod added or changed: its rank and demand; or gone)
    /// and decides again who is admitted (the [module](self) rules). Returns the UIDs, sorted, of
    /// the pods still known whose admission changed: those of the batch and the refused pods that
    /// the room freed by the batch admitted.
    pub fn update(&mut self, edits: impl IntoIterator<Item = Edit>) -> Vec<String> {
        let mut room_grew = false;
        // Keyed by uid: the last edit of a pod in the batch wins (a relist of 10k pods is one
        // batch, so a linear search per edit would make it quadratic).
        let mut candidates: HashMap<String, (Rank, usize)> = HashMap::new();
        let mut was_admitted: HashMap<String, bool> = HashMap::new();
        for (uid, edit) in edits {
            let held = self.granted.remove(&uid);
            if let Some(g) = held {
                self.total -= g;
            }
            let was_refused = self.unrefuse(&uid);
            if held.is_some() || was_refused {
                was_admitted.entry(uid.clone()).or_insert(held.is_some());
            }
            match (edit, held) {
                (None, held) => {
                    // Gone later in the same batch: no longer a candidate either.
                    candidates.remove(&uid);
                    room_grew |= held.is_some_and(|g| g > 0);
                }
                (Some((_, demand)), Some(g)) if demand <= g => {
                    self.grant(uid, demand);
                    room_grew |= demand < g;
                }
                (Some((rank, demand)), held) => {
                    room_grew |= held.is_some_and(|g| g > 0);
                    candidates.insert(uid, (rank, demand));
                }
            }
        }
        // A refused pod's demand is over the room left when it was refused, and the room only
        // shrank since unless this batch freed some: only then do the refused compete again.
        if room_grew {
            for (rank, demand) in std::mem::take(&mut self.refused) {
                self.refused_rank.remove(&rank.uid);
                was_admitted.entry(rank.uid.clone()).or_insert(false);
                candidates.insert(rank.uid.clone(), (rank, demand));
            }
        }
        let late = |rank: &Rank| self.refused_before.contains(&rank.uid);
        let mut queue: Vec<(bool, Rank, usize)> = candidates.into_values().map(|(r, d)| (late(&r), r, d)).collect();
        queue.sort();
        let mut changed = Vec::new();
        for (_, rank, demand) in queue {
            self.refused_before.remove(&rank.uid);
            let fits = self.max.is_none_or(|max| self.total + demand <= max);
            if was_admitted.get(&rank.uid).is_some_and(|was| *was != fits) {
                changed.push(rank.uid.clone());
            }
            if fits {
                self.grant(rank.uid, demand);
            } else {
                self.refused_rank.insert(rank.uid.clone(), rank.clone());
                self.refused.insert(rank, demand);
            }
        }
        changed.sort();
        changed
    }

    fn grant(&mut self, uid: String, demand: usize) {
        self.total += demand;
        self.granted.insert(uid, demand);
    }

    /// Takes `uid` out of the refused pods; true when it was one.
    fn unrefuse(&mut self, uid: &str) -> bool {
        match self.refused_rank.remove(uid) {
            Some(rank) => self.refused.remove(&rank).is_some(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pod `name` created at second `created`, asking for `demand` clusters.
    fn pod(name: &str, created: i64, demand: usize) -> Edit {
        let rank = Rank { created, namespace: "ns".into(), name: name.into(), uid: name.into() };
        (name.to_owned(), Some((rank, demand)))
    }

    fn gone(name: &str) -> Edit {
        (name.to_owned(), None)
    }

    fn admitted(a: &Admission, names: &[&str]) -> Vec<String> {
        names.iter().filter(|n| a.is_admitted(n)).map(|n| n.to_string()).collect()
    }

    #[test]
    fn without_a_cap_every_pod_is_admitted() {
        let mut a = Admission::new(None);
        assert!(a.update([pod("a", 1, 10_000), pod("b", 2, 65)]).is_empty());
        assert_eq!(admitted(&a, &["a", "b"]), ["a", "b"]);
        assert_eq!((a.granted(), a.refused()), (10_065, 0));
    }

    #[test]
    fn a_batch_competes_oldest_first_whatever_order_it_is_listed_in_and_first_fit() {
        let mut a = Admission::new(Some(6));
        // Listed youngest first; c (3) does not fit after a (2) + b (3), d (1) still does.
        a.update([pod("d", 4, 1), pod("c", 3, 3), pod("b", 2, 3), pod("a", 1, 2)]);
        assert_eq!(admitted(&a, &["a", "b", "c", "d"]), ["a", "b", "d"]);
        assert_eq!((a.granted(), a.refused()), (6, 1));
    }

    #[test]
    fn adding_a_pod_never_takes_clusters_from_an_admitted_one_even_an_older_pod() {
        let mut a = Admission::new(Some(4));
        a.update([pod("young", 10, 2), pod("younger", 11, 2)]);
        // A pod created before both (scheduled late) finds no room: they keep theirs.
        assert_eq!(a.update([pod("old", 1, 2)]), Vec::<String>::new());
        assert_eq!(admitted(&a, &["old", "young", "younger"]), ["young", "younger"]);
    }

    #[test]
    fn a_pod_that_grows_past_the_room_loses_only_its_own_clusters() {
        let mut a = Admission::new(Some(10));
        a.update([pod("a", 1, 4), pod("b", 2, 4)]);
        // a asks for 8: with b's 4 it does not fit. b is untouched, a is refused whole.
        assert_eq!(a.update([pod("a", 1, 8)]), ["a"]);
        assert_eq!(admitted(&a, &["a", "b"]), ["b"]);
        // Shrinking back below the room admits it again.
        assert_eq!(a.update([pod("a", 1, 6)]), ["a"]);
        assert_eq!((a.granted(), a.refused()), (10, 0));
        // A shrinking pod keeps its (smaller) grant.
        assert!(a.update([pod("a", 1, 2)]).is_empty());
        assert_eq!(a.granted(), 6);
    }

    #[test]
    fn a_pod_edited_twice_in_one_batch_counts_its_last_edit_only() {
        let mut a = Admission::new(Some(4));
        // Grown, then shrunk, in one batch: one grant of its last demand.
        a.update([pod("a", 1, 3), pod("b", 2, 1), pod("a", 1, 2)]);
        assert_eq!((a.granted(), a.refused()), (3, 0));
        // Listed, then gone, in one batch: nothing granted, nothing refused, room for c.
        a.update([pod("c", 3, 2), gone("c")]);
        assert_eq!(admitted(&a, &["a", "b", "c"]), ["a", "b"]);
        assert_eq!((a.granted(), a.refused()), (3, 0));
    }

    #[test]
    fn room_freed_by_a_deletion_goes_to_the_oldest_refused_pod_that_fits() {
        let mut a = Admission::new(Some(6));
        a.update([pod("a", 1, 4), pod("b", 2, 2)]);
        a.update([pod("d", 4, 2)]);
        a.update([pod("c", 3, 2)]);
        assert_eq!(admitted(&a, &["a", "b", "c", "d"]), ["a", "b"]);
        // 4 clusters freed: c (older) and then d both fit.
        assert_eq!(a.update([gone("a")]), ["c", "d"]);
        assert_eq!(admitted(&a, &["b", "c", "d"]), ["b", "c", "d"]);
        // Freed again by one: the younger refused pod is admitted only if the older one is.
        a.update([pod("e", 5, 2), pod("f", 6, 1)]);
        assert_eq!(admitted(&a, &["e", "f"]), Vec::<String>::new());
        assert_eq!(a.update([gone("b")]), ["e"]);
        assert!(!a.is_admitted("f"));
    }

    #[test]
    fn a_pod_asking_for_nothing_is_always_admitted_and_a_gone_pod_is_forgotten() {
        let mut a = Admission::new(Some(2));
        a.update([pod("full", 1, 2), pod("over-the-port-cap", 2, 0)]);
        assert!(a.is_admitted("over-the-port-cap"));
        a.update([pod("x", 3, 1)]);
        assert_eq!(a.refused(), 1);
        assert!(a.update([gone("x")]).is_empty(), "a gone pod is not reported");
        assert_eq!(a.refused(), 0);
        assert!(!a.is_admitted("x"));
    }

    #[test]
    fn pods_refused_before_a_restart_queue_after_the_others_of_the_boot_batch() {
        let boot = || [pod("old", 1, 2), pod("young", 2, 2)];
        let mut fresh = Admission::new(Some(2));
        fresh.update(boot());
        assert_eq!(admitted(&fresh, &["old", "young"]), ["old"]);
        // Before the restart "old" arrived late and was refused: the restart keeps it so.
        let mut restarted = Admission::new(Some(2));
        restarted.remember_refused(["old".to_owned()]);
        restarted.update(boot());
        assert_eq!(admitted(&restarted, &["old", "young"]), ["young"]);
        // The memory is spent on arrival: once room frees it competes as usual.
        restarted.update([pod("newer", 5, 2)]);
        assert_eq!(restarted.update([gone("young")]), ["old"]);
    }

    #[test]
    fn a_smaller_cap_after_a_restart_refuses_the_youngest() {
        let mut a = Admission::new(Some(3));
        a.update([pod("c", 3, 1), pod("b", 2, 1), pod("a", 1, 2)]);
        assert_eq!(admitted(&a, &["a", "b", "c"]), ["a", "b"]);
    }
}
