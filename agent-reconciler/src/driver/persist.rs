//! The state dir (`--state-dir`) as the loop keeps it: each pod's record with the netns it was
//! served with, the last policy map, and the pod Event records (the ledger, the stranded service
//! keys, the link refusals), so a restarted agent serves the same clusters before the API server
//! answers and does not repeat an Event. Every write failure is logged and the loop goes on; a
//! loop without a state dir keeps nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use aether_agent_core::index::Index;
use aether_agent_core::pod_events::Ledger;
use aether_agent_core::record::{PodKey, PodRecord, PolicyRecord};
use aether_agent_core::refusal::Refusal;
use aether_crds::tiebreak::ServiceKey;

use crate::store::{StateStore, StoreError, StoredPod, StoredPodRef};

/// What the state dir keeps for pod Events (`pod-events.json`), as written.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct EventState {
    /// Pods already reported, with their cause.
    ledger: Ledger,
    /// `(namespace, service, policy)`: service keys whose winning policy was known when the CRD
    /// was reported absent, while it still is.
    stranded: Vec<(String, String, String)>,
    /// Pod UID → `(label, path, links)` of a link refusal, which sticks until the pod is gone.
    #[serde(default)]
    link_refused: BTreeMap<String, (String, String, u64)>,
}

/// The pod Event records of the state dir, as the loop holds them.
#[derive(Debug, Default)]
pub struct EventRecords {
    /// Pods already reported, with their cause.
    pub ledger: Ledger,
    /// Service key → the winning policy it had when the CRD was reported absent.
    pub stranded: BTreeMap<ServiceKey, String>,
    /// Pod UID → its link refusal.
    pub link_refused: HashMap<String, Refusal>,
}

/// The loop's state dir; `None` inside keeps nothing.
#[derive(Debug)]
pub struct StateDir {
    store: Option<StateStore>,
}

impl StateDir {
    /// The loop's state dir in `store`, or none.
    pub fn new(store: Option<StateStore>) -> Self {
        StateDir { store }
    }

    /// The pods of the state dir (unusable files are logged and skipped); `None` without a state
    /// dir.
    pub fn load_pods(&self) -> Option<Vec<StoredPod<PodRecord>>> {
        let store = self.store.as_ref()?;
        let (stored, mut errors): (Vec<(std::path::PathBuf, StoredPod<PodRecord>)>, _) = store.load_pods();
        let mut pods = Vec::with_capacity(stored.len());
        for (path, pod) in stored {
            if path.file_stem().is_some_and(|stem| *stem == *pod.record.uid) {
                pods.push(pod);
            } else {
                errors.push(StoreError::UidMismatch { path: path.display().to_string(), found: pod.record.uid });
            }
        }
        for e in errors {
            tracing::warn!(error = %e, "skipping a pod record in the state dir");
        }
        Some(pods)
    }

    /// The last policy map. With UDS workloads off (`uds_workloads` false) no policy is watched
    /// or applies, so a policy map left in the state dir by an earlier run must not count pods as
    /// policy-governed: none is loaded.
    pub fn load_policies(&self, uds_workloads: bool) -> Vec<PolicyRecord> {
        let Some(store) = &self.store else { return vec![] };
        match store.load_policies() {
            Ok(_) if !uds_workloads => vec![],
            Ok(p) => p.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "skipping the policy records in the state dir");
                vec![]
            }
        }
    }

    /// The pod Event records; `None` when there are none (or they are unusable: logged).
    pub fn load_events(&self) -> Option<EventRecords> {
        let store = self.store.as_ref()?;
        match store.load_pod_events::<EventState>() {
            Ok(Some(state)) => Some(EventRecords {
                ledger: state.ledger,
                stranded: state
                    .stranded
                    .into_iter()
                    .map(|(ns, name, policy)| (ServiceKey::new(ns, name), policy))
                    .collect(),
                link_refused: state.link_refused.into_iter().filter_map(link_refusal).collect(),
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "skipping the pod Event records in the state dir");
                None
            }
        }
    }

    /// Writes pod `rec`'s record with the netns it is served with.
    pub fn save_pod(&self, rec: &PodRecord, netns: Option<&str>) {
        let stored = StoredPodRef { record: rec, netns };
        if let Some(store) = &self.store
            && let Err(e) = store.save_pod(&rec.uid, &stored)
        {
            tracing::warn!(pod = %format!("{}/{}", rec.namespace, rec.name), error = %e, "cannot persist the pod record");
        }
    }

    /// Writes pod `uid`'s record as `index` holds it, with its netns; nothing for a pod the index
    /// does not hold.
    pub fn save_indexed(&self, index: &Index, uid: &str) {
        if let Some(rec) = index.pod(uid) {
            self.save_pod(rec, index.netns(uid));
        }
    }

    /// Removes the record of pod `uid` (`name`: `<namespace>/<name>`, for the log).
    pub fn remove_pod(&self, uid: &str, name: &str) {
        if let Some(store) = &self.store
            && let Err(e) = store.remove_pod(uid)
        {
            tracing::warn!(pod = %name, error = %e, "cannot remove the pod record");
        }
    }

    /// After a complete pod list: writes the records of the pods it re-rendered (a relist of the
    /// same state writes nothing; the index holds the records, so no second copy of the list is
    /// made) and removes those of pods not in `keep` (by UID).
    pub fn save_relisted(&self, index: &Index, rerendered: &[PodKey], keep: &HashSet<String>) {
        let Some(store) = &self.store else { return };
        let rerendered: HashSet<&str> = rerendered.iter().map(|k| &*k.uid).collect();
        for r in index.pods().filter(|r| rerendered.contains(r.uid.as_str())) {
            self.save_pod(r, index.netns(&r.uid));
        }
        match store.retain_pods(keep) {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "removed stale pod records from the state dir"),
            Err(e) => tracing::warn!(error = %e, "cannot prune the state dir"),
        }
    }

    /// Writes the policy map.
    pub fn save_policies<'a>(&self, policies: impl Iterator<Item = &'a PolicyRecord>) {
        if let Some(store) = &self.store {
            let records: Vec<PolicyRecord> = policies.cloned().collect();
            if let Err(e) = store.save_policies(&records) {
                tracing::warn!(error = %e, "cannot persist the policy records");
            }
        }
    }

    /// Writes the pod Event records: the `ledger`, the `stranded` service keys (with their
    /// policy) and the `link_refused` pods (by UID).
    pub fn save_events(
        &self,
        ledger: &Ledger,
        stranded: &BTreeMap<ServiceKey, String>,
        link_refused: &HashMap<String, Refusal>,
    ) {
        if let Some(store) = &self.store {
            let state = EventState {
                ledger: ledger.clone(),
                stranded: stranded.iter().map(|(k, p)| (k.namespace.clone(), k.name.clone(), p.clone())).collect(),
                link_refused: link_refused
                    .iter()
                    .filter_map(|(uid, r)| link_record(r).map(|l| (uid.clone(), l)))
                    .collect(),
            };
            if let Err(e) = store.save_pod_events(&state) {
                tracing::warn!(error = %e, "cannot persist the pod Event records");
            }
        }
    }
}

/// A link refusal as the state dir keeps it: `(label, path, links)`; `None` for another refusal.
fn link_record(r: &Refusal) -> Option<(String, String, u64)> {
    match r {
        Refusal::Symlink { path } => Some(("symlink".into(), path.clone(), 1)),
        Refusal::HardLink { path, links } => Some(("hard-link".into(), path.clone(), *links)),
        _ => None,
    }
}

/// A link refusal read back from the state dir ([`link_record`]); `None` for a record that is
/// not one.
fn link_refusal((uid, (label, path, links)): (String, (String, String, u64))) -> Option<(String, Refusal)> {
    match label.as_str() {
        "symlink" => Some((uid, Refusal::Symlink { path })),
        // 0 links was a socket unlinked while it was pinned (an app re-creating it), recorded as
        // a link by agents before 0.9.0: not a link, forgotten.
        "hard-link" if links == 0 => None,
        "hard-link" => Some((uid, Refusal::HardLink { path, links })),
        _ => None,
    }
}
