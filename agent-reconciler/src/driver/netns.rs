//! Pods' network namespaces as the loop gathers them: the container runtime's answers
//! ([`PodNetns`]), else a CNI record under `--cni-records-dir` ([`CniRecords`]), else none (the
//! pod IP is dialed). The fact is stored in the index ([`Index::set_netns`]) so render does no I/O;
//! it is gathered on the pod's events, the runtime's answers and the periodic re-check, never per
//! publish.

use std::path::Path;
use std::time::Instant;

use aether_agent_core::index::{Change, Index};
use aether_agent_core::record::PodRecord;

use crate::cni::CniRecords;
use crate::replay;
use crate::runtime::{NetnsUpdate, PodNetns};
use crate::store::StoredPod;

/// A pod UID and why the runtime gave no netns for it: `None` it reports none of the pod's own,
/// `Some(error)` it could not be asked.
pub type NoNetns = (String, Option<String>);

/// The loop's netns sources.
#[derive(Debug)]
pub struct Netns {
    /// The container runtime's answers, and when to ask again.
    pub runtime: PodNetns,
    cni: CniRecords,
}

impl Netns {
    /// Netns facts from `runtime` (with or without a lookup), then `cni`.
    pub fn new(runtime: PodNetns, cni: CniRecords) -> Self {
        Netns { runtime, cni }
    }

    /// Takes the netns each pod of the state dir was served with as known, unless it is gone (the
    /// sandbox was replaced while the agent was down: the runtime is asked again) or breaks the
    /// netns path rules ([`crate::runtime::NetnsDirs::served`]: e.g. `/proc/1/ns/net` in an edited
    /// record is never given to Envoy). Returns the records, the UIDs whose netns was replayed,
    /// and how many were not (gone or refused).
    pub fn replay(&mut self, stored: Vec<StoredPod<PodRecord>>) -> (Vec<PodRecord>, Vec<String>, usize) {
        let (mut replayed, mut gone) = (Vec::new(), 0usize);
        let mut pods = Vec::with_capacity(stored.len());
        for StoredPod { record, netns } in stored {
            if let Some(path) = netns {
                if let Err(e) = self.cni.dirs().served(&path) {
                    tracing::warn!(pod = %format!("{}/{}", record.namespace, record.name), error = %e,
                        "not replaying the pod's network namespace from the state dir; asking the runtime again");
                    gone += 1;
                    pods.push(record);
                    continue;
                }
                match replay::netns_present(Path::new(&path)) {
                    replay::Presence::Gone => {
                        tracing::info!(pod = %format!("{}/{}", record.namespace, record.name), netns = %path,
                            "the pod's network namespace from the state dir is gone; asking the runtime again");
                        gone += 1;
                    }
                    _ => {
                        self.runtime.replay(&record.uid, path, &record.pod_ips);
                        replayed.push(record.uid.clone());
                    }
                }
            }
            pods.push(record);
        }
        (pods, replayed, gone)
    }

    /// Stores in `index` the netns fact of each pod in `uids` (the runtime's answer first, then
    /// a CNI record, else none); `moved` is called for each pod whose fact re-rendered it (the
    /// netns is part of what a restarted agent replays: its record is saved with it). The
    /// re-rendered pods come sorted.
    pub fn refresh<'a>(
        &self,
        index: &mut Index,
        uids: impl IntoIterator<Item = &'a str>,
        mut moved: impl FnMut(&Index, &str),
    ) -> Change {
        let mut change = Change::default();
        for uid in uids {
            let fact = self.runtime.path(uid).map(str::to_owned).or_else(|| self.cni.netns(uid));
            let one = index.set_netns(uid, fact);
            if !one.rerendered.is_empty() {
                moved(index, uid);
            }
            change.rerendered.extend(one.rerendered);
            change.map_changed |= one.map_changed;
        }
        change.rerendered.sort();
        change
    }

    /// Takes the runtime's `updates` at `now`: the UIDs whose known path changed, and the pods
    /// the index holds that have no path known and got none ([`NoNetns`]: told once, by the
    /// caller). An answer for a pod the index does not hold is dropped.
    pub fn answered(&mut self, index: &Index, updates: Vec<NetnsUpdate>, now: Instant) -> (Vec<String>, Vec<NoNetns>) {
        // Per answer, a lookup in the index: answers arrive in small batches, and copying every
        // live UID per batch made a re-check at 10k pods cost ~300 ms of CPU.
        let mut changed = Vec::new();
        let mut without = Vec::new();
        for update in updates {
            let uid = update.0.clone();
            let live = index.has_pod(&uid);
            if live && !self.runtime.is_known(&uid) {
                match &update.1 {
                    Ok(None) => without.push((uid.clone(), None)),
                    Err(e) => without.push((uid.clone(), Some(e.to_string()))),
                    Ok(Some(_)) => {}
                }
            }
            if self.runtime.update(update, live, now) {
                changed.push(uid);
            }
        }
        (changed, without)
    }
}
