//! The reconcile loop: the one task that owns the [`Index`]. Watch drivers send it [`Event`]s;
//! after each it checks the re-rendered pipes on disk (`sockets`), persists what changed
//! (`persist`), re-renders only the pods the change touched (the index's
//! [`Index::take_changed`] and the pods whose on-disk verdict moved) and sends the encoder task
//! only those whose rendering differs (`publish`): the work of a change is in proportion to the
//! pods it touched, and the status's counts are kept by difference (`tally`;
//! docs/design-notes.md "Per-change work and a lean process"). Fallbacks and conflicts are logged
//! once per change, never per resync.
//!
//! Pod Events (`notices`): every re-rendered pod (and every pod whose on-disk check changed) is
//! observed by the ledger of [`crate::pod_events`]; what it decides is queued to the event task
//! without waiting. The ledger and the "stranded" service keys are kept in the state dir, so a
//! restarted agent does not repeat an Event. A change that alters what the encoder task is sent is
//! stamped on the xDS change clock with the arrival time of the event that caused it.
//!
//! This file holds the loop itself: its state (one value per concern), the dispatch of each
//! [`Event`] and the steps every change goes through ([`Driver::handle`]); each concern is a
//! child module that owns its state and never reaches back into this one.

mod netns;
mod notices;
mod persist;
mod publish;
mod sockets;
mod tally;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::time::Instant;

use aether_agent_core::fallback::TcpReason;
use aether_agent_core::index::{Change, Index};
use aether_agent_core::pod_events::Ledger;
use aether_agent_core::record::{PodKey, PodRecord, PolicyRecord};
use aether_agent_core::reoffer::Reoffers;
use aether_agent_core::status::Status;
use aether_crds::EndpointPolicy;
use aether_crds::tiebreak::ServiceKey;
use tokio::sync::{mpsc, watch};

use crate::cni::CniRecords;
use crate::decisions::Decisions;
use crate::event::{Event, PodGone};
use crate::metrics::ClusterMetrics;
use crate::recorder::NoticeSender;
use crate::runtime::{NetnsUpdate, PodNetns};
use crate::store::StateStore;
use crate::xds::bind_failures::BindFailure;
use crate::xds::metrics::ChangeClock;
use crate::xds::publish::PodSpecsSender;
use netns::Netns;
use notices::Notices;
use persist::StateDir;
use publish::Publisher;
use sockets::Sockets;
use tally::DeliveryLog;

pub use publish::{HOLD_NETNS_WAIT, REOFFER_GRACE};
pub use sockets::SocketCheck;

/// What the loop drives besides its index, state dir and outputs: always present, each with a
/// form that does nothing ([`Collaborators::detached`]).
pub struct Collaborators {
    /// The pod Event queue ([`NoticeSender::detached`]: decisions are only logged).
    pub notices: NoticeSender,
    /// Stamped with every published change, for the change-to-ACK histogram.
    pub clock: ChangeClock,
    /// Served clusters vs `--max-clusters` and the pods refused by a cap, set on every publish.
    pub cluster_metrics: ClusterMetrics,
    /// The live per-pod decisions (`/debug/pods`), updated only for the pods a change touched.
    pub decisions: Decisions,
    /// How pods' sockets are verified: on disk, or pinned (`--pin-dir`) and watched.
    pub sockets: SocketCheck,
    /// The container runtime's answers for pods' network namespaces; with a lookup
    /// ([`PodNetns::with_lookup`]) its answers must be fed back as [`Event::Netns`].
    pub netns: PodNetns,
}

impl Collaborators {
    /// Nothing driven: no Events published, an unread clock, metrics and decision board, sockets
    /// checked on disk, no container runtime asked.
    pub fn detached() -> Self {
        Collaborators {
            notices: NoticeSender::detached(),
            clock: ChangeClock::new(),
            cluster_metrics: ClusterMetrics::new(),
            decisions: Decisions::detached(),
            sockets: SocketCheck::OnDisk,
            netns: PodNetns::default(),
        }
    }
}

/// The loop's state.
pub struct Driver {
    index: Index,
    netns: Netns,
    sockets: Sockets,
    notices: Notices,
    said: DeliveryLog,
    out: Publisher,
    state_dir: StateDir,
    decisions: Decisions,
    /// When the inbound listeners Envoy could not bind are offered again.
    reoffers: Reoffers,
    /// Set while the state dir is replayed: nothing is written back, `Normal` notices wait.
    booting: bool,
}

impl Driver {
    /// A loop over `index` that publishes to `snapshot` and `status` (holding Envoy while the
    /// status says so), persisting to `store` and driving `with`.
    pub fn new(
        index: Index,
        store: Option<StateStore>,
        cni: CniRecords,
        snapshot: PodSpecsSender,
        status: watch::Sender<Status>,
        with: Collaborators,
    ) -> Self {
        let Collaborators { notices, clock, cluster_metrics, decisions, sockets, netns } = with;
        let policies_known = !index.settings().uds_workloads();
        Driver {
            index,
            netns: Netns::new(netns, cni),
            sockets: Sockets::new(sockets, policies_known),
            notices: Notices::new(notices),
            said: DeliveryLog::default(),
            out: Publisher::new(snapshot, status, clock, cluster_metrics),
            state_dir: StateDir::new(store),
            decisions,
            reoffers: Reoffers::new(),
            booting: false,
        }
    }

    /// The pods already reported with a fallback Event, and their cause.
    pub fn ledger(&self) -> &Ledger {
        self.notices.ledger()
    }

    /// Loads the state dir (pods with the netns they were served with, the last policy map, the
    /// pod Event records) so the node serves the same clusters before the API server answers.
    /// Unusable files are logged and skipped.
    pub fn boot(&mut self) {
        let Some(stored) = self.state_dir.load_pods() else { return };
        // Each pod's netns as it was served, so the first push offers Envoy the same inbound
        // listeners and in-netns clusters as before the restart; the runtime is asked to confirm.
        let (pods, replayed, gone) = self.netns.replay(stored);
        let policies = self.state_dir.load_policies(self.index.settings().uds_workloads());
        if let Some(events) = self.state_dir.load_events() {
            self.notices.remember(events.ledger, events.stranded);
            self.sockets.remember_links(events.link_refused);
        }
        tracing::info!(
            pods = pods.len(),
            netns_replayed = replayed.len(),
            netns_gone = gone,
            policies = policies.len(),
            reported = self.notices.ledger().len(),
            "loaded the state dir"
        );
        let uids: HashSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
        // Pods refused for the cluster cap before the restart stay behind the others.
        let capped = self.notices.ledger().reported_with(TcpReason::NodeClusterCap).map(str::to_owned);
        self.index.remember_refused(capped.collect::<Vec<_>>());
        self.out.event_at = Some(Instant::now());
        self.booting = true;
        let mut change = self.index.reset_pods(pods);
        merge(&mut change, self.index.reset_policies(policies));
        merge(&mut change, self.refresh_netns(replayed.iter().map(String::as_str)));
        self.after(change, false);
        self.booting = false;
        if !uids.is_empty() {
            self.out.serve(&self.index, "the pods of the state dir, as a previous agent served them");
        }
        if self.notices.retain(|uid| uids.contains(uid)) {
            self.save_events();
        }
    }

    /// Runs until `events` closes.
    pub async fn run(mut self, mut events: mpsc::Receiver<Event>) {
        self.publish();
        while let Some(event) = events.recv().await {
            self.handle(event);
        }
    }

    /// Applies one event.
    pub fn handle(&mut self, event: Event) {
        self.out.event_at = Some(Instant::now());
        match event {
            Event::PodApplied(rec) => self.pod_applied(*rec),
            Event::PodGone(pod) => self.pod_gone(&pod),
            Event::PodsListed(records) => self.pods_listed(records),
            Event::PolicyApplied(policy) => self.policy_applied(&policy),
            Event::PolicyDeleted { namespace, name } => self.policy_deleted(&namespace, &name),
            Event::PoliciesListed(list) => self.policies_listed(&list),
            Event::CrdAbsent => self.crd_absent(),
            Event::Netns(updates) => self.netns_answered(updates),
            Event::InboundBindFailed(failures) => self.inbound_bind_failed(failures),
            Event::EnvoyStreamEnded => self.envoy_stream_ended(),
            Event::NoApiServer => self.out.serve(&self.index, "the state dir only: no Kubernetes client configuration"),
            Event::SocketsChanged(uids) => self.sockets_changed(&uids),
            Event::Recheck => self.recheck(),
        }
    }

    fn pod_applied(&mut self, rec: PodRecord) {
        let uid = rec.uid.clone();
        self.netns.runtime.ask(&rec.uid, &rec.pod_ips);
        let mut change = self.index.apply_pod(rec.clone());
        if !change.rerendered.is_empty() {
            self.state_dir.save_pod(&rec, self.index.netns(&uid));
        }
        merge(&mut change, self.refresh_netns([uid.as_str()]));
        self.after(change, false);
    }

    fn pod_gone(&mut self, pod: &PodGone) {
        self.netns.runtime.forget(&pod.uid);
        self.notices.forget_told(&pod.uid);
        self.state_dir.remove_pod(&pod.uid, &pod.name);
        let change = self.index.delete_pod(&pod.uid);
        if let Some(phase) = pod.finished.as_deref().filter(|_| !change.removed.is_empty()) {
            tracing::info!(pod = %pod.name, phase, "the pod finished; removing its clusters");
        }
        self.after(change, false);
    }

    fn pods_listed(&mut self, records: Vec<PodRecord>) {
        let keep: HashSet<String> = records.iter().map(|r| r.uid.clone()).collect();
        records.iter().for_each(|r| self.netns.runtime.ask(&r.uid, &r.pod_ips));
        self.netns.runtime.retain(|u| keep.contains(u));
        let mut change = self.index.reset_pods(records);
        self.sockets.retain(&keep);
        self.state_dir.save_relisted(&self.index, &change.rerendered, &keep);
        self.out.status(|s| s.pods_synced = true);
        merge(&mut change, self.refresh_netns(keep.iter().map(String::as_str)));
        self.after(change, false);
        self.notices.send_deferred(&self.index.snapshot(), &keep);
        self.out.listed(&self.index, &self.netns.runtime);
    }

    fn policy_applied(&mut self, policy: &EndpointPolicy) {
        match PolicyRecord::from_policy(policy, self.index.settings()) {
            Ok(rec) => {
                if let Some(why) = &rec.invalid {
                    tracing::warn!(policy = %format!("{}/{}", rec.namespace, rec.name), reason = %why, "EndpointPolicy is invalid on this node and is ignored");
                }
                let change = self.index.apply_policy(rec);
                self.after(change, true);
            }
            Err(e) => tracing::warn!(error = %e, "ignoring an EndpointPolicy the agent cannot read"),
        }
    }

    fn policy_deleted(&mut self, namespace: &str, name: &str) {
        let change = self.index.delete_policy(namespace, name);
        self.after(change, true);
    }

    fn policies_listed(&mut self, list: &[EndpointPolicy]) {
        let settings = self.index.settings().clone();
        let records: Vec<PolicyRecord> =
            list.iter().filter_map(|p| PolicyRecord::from_policy(p, &settings).ok()).collect();
        let change = self.index.reset_policies(records);
        self.out.status(|s| s.crd_installed = Some(true));
        // The CRD is served: no key is stranded any more; re-observe the pods that were.
        let was = self.notices.unstrand();
        self.after(change, true);
        self.policies_now_known();
        if !was.is_empty() {
            self.save_events();
            let keys = self.pods_of(|k| was.contains_key(k));
            self.observe(&keys);
        }
    }

    fn crd_absent(&mut self) {
        // Keys whose winning policy the agent knew: their pods asked for a socket.
        if self.notices.strand(self.index.policies()) {
            self.save_events();
        }
        let change = self.index.reset_policies(Vec::new());
        self.out.status(|s| s.crd_installed = Some(false));
        self.after(change, true);
        self.policies_now_known();
    }

    /// The first time the policies are known: the pods without a socket are re-checked, so that
    /// a pin kept for want of the policy list (a pod no policy names any more) goes.
    fn policies_now_known(&mut self) {
        if self.sockets.policies_known() {
            let tcp: Vec<PodKey> = self
                .index
                .snapshot()
                .iter()
                .filter(|(_, e)| e.delivery.path.is_none())
                .map(|(k, _)| k.clone())
                .collect();
            if !self.check_pipes(&tcp).is_empty() {
                self.publish();
            }
        }
    }

    fn netns_answered(&mut self, updates: Vec<NetnsUpdate>) {
        let (changed, without) = self.netns.answered(&self.index, updates, Instant::now());
        self.notices.tell_no_netns(&self.index.snapshot(), &without);
        if self.refresh_netns(changed.iter().map(String::as_str)).map_changed {
            self.publish();
        }
        self.out.answered(&self.index, &self.netns.runtime);
    }

    fn inbound_bind_failed(&mut self, failures: Vec<BindFailure>) {
        let now = Instant::now();
        let withdrawn = self.notices.inbound_bind_failed(&mut self.index, &mut self.reoffers, failures, now);
        if !withdrawn.is_empty() {
            self.decided(&withdrawn);
            self.publish();
        }
    }

    /// An ADS stream ended (an Envoy exited): the ports it held are free, so every withdrawn
    /// inbound listener is offered again now.
    fn envoy_stream_ended(&mut self) {
        let uids = self.reoffers.all_due();
        self.reoffer(&uids, "an Envoy's ADS stream ended");
    }

    /// Offers the withdrawn inbound listeners of the pods `uids` again, and publishes.
    fn reoffer(&mut self, uids: &[String], why: &str) {
        let mut change = Change::default();
        for uid in uids {
            merge(&mut change, self.index.reoffer_inbound(uid));
        }
        if !change.map_changed {
            return;
        }
        for key in &change.rerendered {
            tracing::info!(pod = %key, "offering the inbound listeners Envoy could not bind again ({why})");
        }
        self.out.reoffering(Instant::now());
        self.decided(&change.rerendered);
        self.publish();
    }

    fn sockets_changed(&mut self, uids: &[String]) {
        // O(batch): a flood of events from one pod never walks the node's pods.
        let keys: Vec<PodKey> = uids.iter().filter_map(|uid| self.index.pod(uid)).map(PodRecord::key).collect();
        let changed = self.check_pipes(&keys);
        if !changed.is_empty() {
            self.observe(&changed);
            self.publish();
        }
    }

    fn recheck(&mut self) {
        let now = Instant::now();
        let due = self.reoffers.take_due(now);
        self.reoffer(&due, "its back-off elapsed");
        self.netns.runtime.ask_due(self.index.pods().map(|r| (r.uid.as_str(), r.pod_ips.as_slice())), now);
        let all: Vec<PodKey> = self.index.snapshot().iter().map(|(k, _)| k.clone()).collect();
        // CNI records written since the pod's last event are picked up here.
        let netns_moved = self.refresh_netns(all.iter().map(|k| &*k.uid)).map_changed;
        let changed = self.check_pipes(&all);
        if !changed.is_empty() {
            self.observe(&changed);
        }
        if !changed.is_empty() || netns_moved {
            self.publish();
        }
        self.out.rechecked(&self.index, &self.netns.runtime, now);
    }

    /// Stores the netns fact of each pod in `uids` in the index ([`Netns::refresh`]), saving the
    /// record of each pod it moved (not while booting: the state dir is what is replayed), and
    /// re-decides them.
    fn refresh_netns<'a>(&mut self, uids: impl IntoIterator<Item = &'a str>) -> Change {
        let (state_dir, booting) = (&self.state_dir, self.booting);
        let change = self.netns.refresh(&mut self.index, uids, |index, uid| {
            if !booting {
                state_dir.save_indexed(index, uid);
            }
        });
        self.decided(&change.rerendered);
        change
    }

    /// What every change goes through: its conflicts logged, its removed pods forgotten, its
    /// re-rendered pods re-checked on disk, re-decided and observed for pod Events; then a
    /// publish when the map or an on-disk verdict changed, and the policy map saved after a
    /// policy event or a conflict change.
    fn after(&mut self, change: Change, policy_event: bool) {
        log_conflicts(&change);
        for key in &change.removed {
            self.forget(key);
        }
        let fs_changed = !self.check_pipes(&change.rerendered).is_empty();
        self.decisions.changed(&self.index.snapshot(), &change, self.sockets.refused());
        self.observe(&change.rerendered);
        if change.map_changed || fs_changed {
            self.said.log(&self.index.snapshot(), &change.rerendered, self.sockets.refused(), self.sockets.awaiting());
            self.publish();
        }
        if policy_event || !change.conflicts.is_empty() || !change.resolved.is_empty() {
            self.state_dir.save_policies(self.index.policies());
        }
    }

    /// Forgets a pod the index removed: its pin, watch, verdicts, logged line and report.
    fn forget(&mut self, key: &PodKey) {
        if self.sockets.forget(key) {
            self.save_events();
        }
        self.said.forget(key);
        self.reoffers.forget(&key.uid);
        if self.notices.forget(&key.uid) {
            self.save_events();
            self.out.publish_status(self.notices.ledger());
        }
    }

    /// Re-checks the listed pods' pipes on disk; returns the pods whose refusal appeared,
    /// altered or cleared (re-rendered at the next publish, and re-decided).
    fn check_pipes(&mut self, keys: &[PodKey]) -> Vec<PodKey> {
        let map = self.index.snapshot();
        let pods_dir = self.index.settings().budget().map(|b| b.pods_dir().to_owned()).unwrap_or_default();
        let checked = self.sockets.check(&map, &pods_dir, keys);
        self.out.mark(&checked.changed);
        if checked.stuck {
            self.save_events();
        }
        self.decided(&checked.changed);
        // A socket that appeared is what makes "delivering over the pod's Unix socket" true.
        checked.verified.iter().for_each(|k| self.said.forget(k));
        self.said.log(&map, &checked.verified, self.sockets.refused(), self.sockets.awaiting());
        checked.changed
    }

    /// Observes the pods `keys` for pod Events ([`Notices::observe`]); a changed ledger is saved
    /// and counted in the status.
    fn observe(&mut self, keys: &[PodKey]) {
        let budget = self.index.settings().budget().ok();
        if self.notices.observe(&self.index.snapshot(), budget, keys, self.sockets.refused(), self.booting) {
            self.save_events();
            self.out.publish_status(self.notices.ledger());
        }
    }

    fn publish(&mut self) {
        self.out.publish(&mut self.index, self.sockets.refused(), self.notices.ledger());
    }

    /// Re-decides the pods `keys` on the decision board: O(`keys`).
    fn decided(&self, keys: &[PodKey]) {
        self.decisions.update(&self.index.snapshot(), keys, self.sockets.refused());
    }

    fn save_events(&self) {
        self.state_dir.save_events(self.notices.ledger(), self.notices.stranded(), self.sockets.link_refused());
    }

    /// The keys of the pods whose service key `pred` accepts.
    fn pods_of(&self, pred: impl Fn(&ServiceKey) -> bool) -> Vec<PodKey> {
        self.index.snapshot().iter().filter(|(_, e)| pred(&e.pod.service_key())).map(|(k, _)| k.clone()).collect()
    }
}

/// Logs the conflicts `change` opened or altered, and those it resolved.
fn log_conflicts(change: &Change) {
    for c in &change.conflicts {
        tracing::warn!(service = %c.key, winner = %c.winner, losers = ?c.losers, "several EndpointPolicies target one Service; only the lexicographically smallest name applies");
    }
    for key in &change.resolved {
        tracing::info!(service = %key, "EndpointPolicy conflict resolved");
    }
}

fn merge(into: &mut Change, other: Change) {
    into.rerendered.extend(other.rerendered);
    into.rerendered.sort();
    into.rerendered.dedup();
    into.removed.extend(other.removed);
    into.map_changed |= other.map_changed;
    into.conflicts.extend(other.conflicts);
    into.resolved.extend(other.resolved);
}
