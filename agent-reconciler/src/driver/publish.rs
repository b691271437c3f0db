//! What the loop publishes: the pods whose rendering changed, to the encoder task
//! ([`PodSpecsSender`]), stamped on the xDS [`ChangeClock`] with the arrival time of the event
//! that caused them; the status ([`Status`]: counts kept by difference, [`Counts`]) and the
//! cluster metrics; and when the xDS server may answer Envoy at all (holding,
//! [`Status::holding_xds`], until the loop has a complete state to serve).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aether_agent_core::index::Index;
use aether_agent_core::pod_events::{self, Ledger};
use aether_agent_core::record::PodKey;
use aether_agent_core::refusal::Refusal;
use aether_agent_core::render::{self, PodRender};
use aether_agent_core::status::Status;
use tokio::sync::watch;

use super::tally::{Counts, Tally};
use crate::metrics::ClusterMetrics;
use crate::runtime::PodNetns;
use crate::xds::metrics::ChangeClock;
use crate::xds::publish::PodSpecsSender;

/// How long after a re-offer of withdrawn inbound listeners an LDS NACK is taken as that offer's
/// (the port still held) and does not fail `/readyz`: the agent reads the failure from Envoy's
/// admin (up to 5 reads, 2 s apart) and withdraws the listener again well within it.
pub const REOFFER_GRACE: Duration = Duration::from_secs(30);

/// How long a holding agent ([`Status::holding_xds`]) waits, after the first complete pod list,
/// for the container runtime's netns answers before it serves Envoy without the missing ones
/// (checked on the periodic re-check, so up to one `--recheck-seconds` later). Every lookup
/// answers within its own timeout; this bounds a queue that could not take every pod at once.
pub const HOLD_NETNS_WAIT: Duration = Duration::from_secs(30);

/// The loop's outputs.
pub struct Publisher {
    snapshot: PodSpecsSender,
    status: watch::Sender<Status>,
    clock: ChangeClock,
    /// Served clusters, the cap and the refused pods, set on every publish.
    cluster_metrics: ClusterMetrics,
    /// Each pod's last rendering (what the encoder task was sent) and what it counts for.
    rendered: HashMap<PodKey, (Arc<PodRender>, Tally)>,
    /// The status's and the cluster metrics' counts, kept per change.
    counts: Counts,
    /// Pods whose on-disk verdict changed since the last publish (the index reports its own
    /// changes, [`Index::take_changed`]).
    dirty: BTreeSet<PodKey>,
    /// When the event being handled arrived: the change it causes is stamped with it.
    pub(super) event_at: Option<Instant>,
    /// While set, the xDS server holds Envoy's streams unanswered ([`Status::holding_xds`]): the
    /// loop has nothing complete to serve yet. Taken from the status at start; cleared once.
    holding: bool,
    /// When the first complete pod list arrived while holding: the bound on waiting for the
    /// runtime's netns answers ([`HOLD_NETNS_WAIT`]).
    pub(super) listed_at: Option<Instant>,
}

impl Publisher {
    /// Publishes to `snapshot`, `status` (holding while it says so), `clock` and
    /// `cluster_metrics`.
    pub fn new(
        snapshot: PodSpecsSender,
        status: watch::Sender<Status>,
        clock: ChangeClock,
        cluster_metrics: ClusterMetrics,
    ) -> Self {
        let holding = status.borrow().holding_xds;
        Publisher {
            snapshot,
            status,
            clock,
            cluster_metrics,
            rendered: HashMap::new(),
            counts: Counts::default(),
            dirty: BTreeSet::new(),
            event_at: None,
            holding,
            listed_at: None,
        }
    }

    /// Marks `keys` for re-rendering at the next publish (their on-disk verdict changed).
    pub fn mark(&mut self, keys: &[PodKey]) {
        self.dirty.extend(keys.iter().cloned());
    }

    /// Changes the status (without publishing a snapshot).
    pub fn status(&self, change: impl FnOnce(&mut Status)) {
        self.status.send_modify(change);
    }

    /// The status as last published (the loop's tests read it).
    #[cfg(test)]
    pub fn status_now(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Withdrawn inbound listeners were offered again at `now`: an LDS NACK of that offer (the
    /// port still held) does not make `/readyz` fail for [`REOFFER_GRACE`].
    pub fn reoffering(&self, now: Instant) {
        self.status.send_modify(|s| s.reoffer_grace_until = Some(now + REOFFER_GRACE));
    }

    /// Re-renders the pods `index` changed since the last publish and those marked (nothing
    /// else: O(changed), never a pass over the node), with the on-disk refusals `refused`;
    /// updates the status's and the metrics' counts by their difference (the fallbacks from
    /// `ledger`), and sends the encoder task the pods whose rendering differs, stamping the change on
    /// the clock. A resync that changed nothing sends nothing.
    pub fn publish(&mut self, index: &mut Index, refused: &HashMap<PodKey, Refusal>, ledger: &Ledger) {
        let sent = self.render(index, refused);
        self.cluster_metrics.set(self.counts.clusters, index.admission().max(), &self.counts.refused);
        let conflicts = index.conflicts().count();
        let fallbacks = pod_events::by_label(&ledger.counts());
        let (pods, by_source) = (self.counts.pods.clone(), self.counts.by_source.clone());
        self.status.send_modify(|s| {
            s.pods = pods;
            s.by_source = by_source;
            s.fallbacks = fallbacks;
            s.conflicts = conflicts;
        });
        if sent.is_empty() {
            return;
        }
        // Stamped before the encoder task is woken, so it always finds it.
        self.clock.changed(self.event_at.unwrap_or_else(Instant::now));
        self.snapshot.send(sent);
    }

    /// Re-renders the changed and marked pods, counting them; the pods whose rendering differs.
    fn render(
        &mut self,
        index: &mut Index,
        refused: &HashMap<PodKey, Refusal>,
    ) -> Vec<(PodKey, Option<Arc<PodRender>>)> {
        let map = index.snapshot();
        let mut keys = index.take_changed();
        keys.append(&mut self.dirty);
        let mut sent: Vec<(PodKey, Option<Arc<PodRender>>)> = Vec::with_capacity(keys.len());
        // A boot or relist renders every pod at once: grow the map once (by what it may still
        // lack, so re-rendering known pods never grows it), not by doubling.
        self.rendered.reserve(keys.len().saturating_sub(self.rendered.len()));
        for key in keys {
            let now = map.get(&key).map(|entry| {
                let render = render::render_pod(entry, refused.get(&key));
                let tally = Tally::of(entry, &render);
                (Arc::new(render), tally)
            });
            let before = match &now {
                Some(n) => self.rendered.insert(key.clone(), n.clone()),
                None => self.rendered.remove(&key),
            };
            if let Some((_, t)) = &before {
                self.counts.remove(t);
            }
            if let Some((_, t)) = &now {
                self.counts.add(t);
            }
            if before.as_ref().map(|(r, _)| r.as_ref()) != now.as_ref().map(|(r, _)| r.as_ref()) {
                sent.push((key, now.map(|(r, _)| r)));
            }
        }
        sent
    }

    /// Updates the status's fallback counts from `ledger` without publishing a snapshot.
    pub fn publish_status(&self, ledger: &Ledger) {
        let fallbacks = pod_events::by_label(&ledger.counts());
        self.status.send_modify(|s| s.fallbacks = fallbacks);
    }

    /// Ends holding: the xDS server answers Envoy from now on ([`Status::holding_xds`]), from
    /// the last publication. `from` names what is served, for the log; `index` holds the pods.
    pub fn serve(&mut self, index: &Index, from: &str) {
        if !std::mem::take(&mut self.holding) {
            return;
        }
        let pods = index.pods().count();
        let through = self.snapshot.published();
        tracing::info!(pods, from, publication = through, "serving Envoy");
        self.status.send_modify(|s| {
            s.holding_xds = false;
            s.serve_from_publication = through;
        });
    }

    /// The first complete pod list arrived: while holding, the wait for the runtime's netns
    /// answers starts ([`HOLD_NETNS_WAIT`]) and, if none is missing, Envoy is served.
    pub fn listed(&mut self, index: &Index, netns: &PodNetns) {
        if self.holding {
            self.listed_at.get_or_insert_with(Instant::now);
            self.serve_when_complete(index, netns, false);
        }
    }

    /// The runtime answered: while holding after the first list, Envoy is served once no answer
    /// is missing.
    pub fn answered(&mut self, index: &Index, netns: &PodNetns) {
        if self.holding && self.listed_at.is_some() {
            self.serve_when_complete(index, netns, false);
        }
    }

    /// The periodic re-check at `now`: while holding for longer than [`HOLD_NETNS_WAIT`] after
    /// the first list, Envoy is served without the missing answers.
    pub fn rechecked(&mut self, index: &Index, netns: &PodNetns, now: Instant) {
        if self.holding && self.listed_at.is_some_and(|t| now.duration_since(t) >= HOLD_NETNS_WAIT) {
            self.serve_when_complete(index, netns, true);
        }
    }

    /// While holding: serves once every listed pod delivered over its socket that has pod IPs has
    /// its netns answered by the runtime (a path, none, or an error), or at once when `deadline`
    /// (then naming how many answers are missing).
    fn serve_when_complete(&mut self, index: &Index, netns: &PodNetns, deadline: bool) {
        let map = index.snapshot();
        let awaiting = map
            .iter()
            .filter(|(k, e)| e.delivery.is_pipe() && !e.pod.pod_ips.is_empty() && netns.awaiting(&k.uid))
            .count();
        match (awaiting, deadline) {
            (0, _) => self.serve(index, "the first pod list and the socket pods' network namespaces"),
            (n, true) => {
                tracing::warn!(awaiting = n, wait = ?HOLD_NETNS_WAIT,
                    "the container runtime has not answered for every socket pod's network namespace; serving Envoy without those pods' inbound listeners");
                self.serve(index, "the first pod list, without some network namespaces");
            }
            (_, false) => {}
        }
    }
}
