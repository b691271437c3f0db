//! Pod Events the loop decides: every re-rendered pod (and every pod whose on-disk check changed)
//! is observed by the [`Ledger`] of [`crate::pod_events`], and what it decides is queued to the
//! event task without waiting ([`NoticeSender`]); the inbound listener Warnings (no netns, a
//! failed bind) are decided here too. The ledger and the "stranded" service keys (policies known
//! when the CRD went away) are kept in the state dir by the loop, so a restarted agent does not
//! repeat an Event (docs/troubleshooting.md "Pod Events").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use aether_agent_core::fold;
use aether_agent_core::index::{DeliveryMap, Index};
use aether_agent_core::pod_events::{self, Ledger, Notice, Severity};
use aether_agent_core::record::{PodKey, PolicyRecord};
use aether_agent_core::refusal::Refusal;
use aether_agent_core::reoffer::Reoffers;
use aether_crds::Budget;
use aether_crds::tiebreak::ServiceKey;

use super::netns::NoNetns;
use crate::recorder::NoticeSender;
use crate::xds::bind_failures::BindFailure;

/// The loop's pod Events: what was told, and where they go.
pub struct Notices {
    sender: NoticeSender,
    ledger: Ledger,
    /// Service key → the winning policy it had when the CRD was reported absent, while it still
    /// is.
    stranded: BTreeMap<ServiceKey, String>,
    /// `Normal` notices decided while booting from the state dir (e.g. a fallback cleared by a
    /// configuration fix across a restart): sent once the first complete pod list confirms the
    /// pod still exists and is still delivered over its socket.
    deferred: Vec<Notice>,
    /// Pods told (once) that the runtime reports no netns for them, so no inbound listener.
    no_netns_told: HashSet<String>,
}

impl Notices {
    /// Nothing told yet; notices go to `sender`.
    pub fn new(sender: NoticeSender) -> Self {
        Notices {
            sender,
            ledger: Ledger::new(),
            stranded: BTreeMap::new(),
            deferred: Vec::new(),
            no_netns_told: HashSet::new(),
        }
    }

    /// The pods already reported with a fallback Event, and their cause.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The stranded service keys, with their policy.
    pub fn stranded(&self) -> &BTreeMap<ServiceKey, String> {
        &self.stranded
    }

    /// Takes what a previous agent reported (from the state dir).
    pub fn remember(&mut self, ledger: Ledger, stranded: BTreeMap<ServiceKey, String>) {
        self.ledger = ledger;
        self.stranded = stranded;
    }

    /// Keeps only the reported pods `keep` accepts; true when one was dropped.
    pub fn retain(&mut self, keep: impl FnMut(&str) -> bool) -> bool {
        self.ledger.retain(keep)
    }

    /// Forgets a removed pod `uid`'s report; true when it was reported.
    pub fn forget(&mut self, uid: &str) -> bool {
        self.ledger.forget(uid)
    }

    /// Forgets that pod `uid` was told it has no netns (it is gone: a pod re-created is told
    /// again).
    pub fn forget_told(&mut self, uid: &str) {
        self.no_netns_told.remove(uid);
    }

    /// The CRD is reported absent: the service keys whose winning policy is known (among
    /// `policies`) are stranded, their pods asked for a socket. True when one was not yet.
    pub fn strand<'a>(&mut self, policies: impl Iterator<Item = &'a PolicyRecord>) -> bool {
        let mut by_key: BTreeMap<ServiceKey, Vec<&PolicyRecord>> = BTreeMap::new();
        for p in policies {
            by_key.entry(p.target.clone()).or_default().push(p);
        }
        let known: Vec<(ServiceKey, String)> =
            by_key.into_iter().filter_map(|(k, ps)| fold::select_policy(ps).map(|w| (k, w.name.clone()))).collect();
        let grew = known.iter().any(|(k, _)| !self.stranded.contains_key(k));
        self.stranded.extend(known);
        grew
    }

    /// The CRD is served: no key is stranded any more. Returns those that were.
    pub fn unstrand(&mut self) -> BTreeMap<ServiceKey, String> {
        std::mem::take(&mut self.stranded)
    }

    /// Runs the ledger over the pods `keys` (entries from `map`, on-disk refusals `refused`;
    /// `budget` adds the arithmetic to a path-too-long note) and queues what it decides. While
    /// `booting` from the state dir, a cleared fallback is deferred: the API server has not
    /// confirmed it. True when the ledger changed (the state dir and the status follow).
    pub fn observe(
        &mut self,
        map: &DeliveryMap,
        budget: Option<&Budget>,
        keys: &[PodKey],
        refused: &HashMap<PodKey, Refusal>,
        booting: bool,
    ) -> bool {
        // Only the observed pods' entries can change: compare those, not the whole ledger.
        let before: Vec<_> = keys.iter().map(|k| self.ledger.get(&k.uid)).collect();
        let observed = keys.iter().filter_map(|k| {
            let entry = map.get(k)?;
            let stranded = self.stranded.get(&entry.pod.service_key()).map(String::as_str);
            Some((k, entry, refused.get(k), stranded))
        });
        let notices = pod_events::decide(&mut self.ledger, budget, observed);
        for n in notices {
            if booting && n.severity == Severity::Normal {
                self.deferred.push(n);
                continue;
            }
            self.send(n);
        }
        keys.iter().zip(before).any(|(k, was)| self.ledger.get(&k.uid) != was)
    }

    /// Sends the notices deferred at boot for pods the first complete list (`listed`, by UID)
    /// still has and that are still delivered over their socket (in `map`); drops the others.
    pub fn send_deferred(&mut self, map: &DeliveryMap, listed: &HashSet<String>) {
        for n in std::mem::take(&mut self.deferred) {
            let piped = map.get(&n.pod).is_some_and(|e| e.delivery.is_pipe());
            if !listed.contains(&*n.pod.uid) || !piped || self.ledger.get(&n.pod.uid).is_some() {
                continue;
            }
            self.send(n);
        }
    }

    fn send(&self, n: Notice) {
        tracing::info!(pod = %n.pod, reason = n.reason, note = %n.note, "pod Event");
        self.sender.send(n);
    }

    /// Tells each pod in `answers` delivered over its socket (in `map`), once while it lives,
    /// that its network namespace is not known ([`NoNetns`]), so it gets no inbound listener
    /// until it is known.
    pub fn tell_no_netns(&mut self, map: &DeliveryMap, answers: &[NoNetns]) {
        if answers.is_empty() {
            return;
        }
        // One pass over the map: at start-up with the runtime down every pod has an answer.
        let by_uid: HashMap<&str, &Option<String>> = answers.iter().map(|(uid, e)| (uid.as_str(), e)).collect();
        for (key, entry) in map.iter() {
            let Some(error) = by_uid.get(&*key.uid) else { continue };
            if !entry.delivery.is_pipe() || !self.no_netns_told.insert(key.uid.to_string()) {
                continue;
            }
            let why = pod_events::no_netns_cause(error.as_deref());
            tracing::warn!(pod = %key, reason = %why, "pod network namespace not known; no inbound listener");
            self.sender.send(pod_events::inbound_no_netns(key, &why));
        }
    }

    /// Stops offering each inbound listener Envoy could not bind (`failures`, marked in `index`),
    /// schedules its pod's re-offer in `reoffers` at `now`, and tells its pod why once per cause
    /// ([`Reoffers::first_report`]: a re-offer failing again for the same reason is logged, not
    /// told again). A failure reported again, or for a pod not on this node, changes nothing.
    /// Returns the pods whose listeners were withdrawn.
    pub fn inbound_bind_failed(
        &self,
        index: &mut Index,
        reoffers: &mut Reoffers,
        failures: Vec<BindFailure>,
        now: Instant,
    ) -> Vec<PodKey> {
        let map = index.snapshot();
        let mut withdrawn = Vec::new();
        for f in failures {
            let found = map.iter().find(|(k, _)| *k.namespace == *f.namespace && *k.name == *f.pod);
            let Some((key, _)) = found else { continue };
            if !index.mark_inbound_failed(&key.uid, f.port).map_changed {
                continue;
            }
            withdrawn.push(key.clone());
            reoffers.withdrawn(&key.uid, now);
            if reoffers.first_report(&key.uid, f.port, &f.details) {
                tracing::warn!(pod = %key, port = f.port, details = %f.details, "inbound listener failed to bind; no longer offered, offered again later");
                self.sender.send(pod_events::inbound_bind_failed(key, f.port, &f.details));
            } else {
                tracing::info!(pod = %key, port = f.port, details = %f.details, "inbound listener offered again failed to bind as before; withdrawn again");
            }
        }
        withdrawn
    }
}
