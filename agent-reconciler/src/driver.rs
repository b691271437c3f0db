//! The reconcile loop: the one task that owns the [`Index`]. Watch drivers send it [`Event`]s;
//! after each it checks the re-rendered pipes on disk ([`crate::fscheck`]), persists what changed
//! ([`StateStore`]), re-renders ([`crate::render::render_pod`]) only the pods the change touched
//! (the index's [`Index::take_changed`] and the pods whose on-disk verdict moved) and sends the
//! renderer task only those whose rendering differs ([`PodSpecsSender`]): the work of a change is
//! in proportion to the pods it touched, and the status's counts are kept by difference (issue
//! 15). Fallbacks and conflicts are logged once per change, never per resync.
//!
//! Pod Events: every re-rendered pod (and every pod whose on-disk check changed) is observed by
//! the [`Ledger`] of [`crate::pod_events`]; what it decides is queued to the event task without
//! waiting ([`NoticeSender`]). The ledger and the "stranded" service keys (policies known when
//! the CRD went away) are kept in the state dir, so a restarted agent does not repeat an Event.
//! A change that alters what the renderer is sent is stamped on the xDS [`ChangeClock`] with the
//! arrival time of the event that caused it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use aether_crds::EndpointPolicy;
use aether_crds::tiebreak::ServiceKey;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};

use crate::cni::CniRecords;
use crate::fold;
use crate::fscheck::{self, Refusal};
use crate::index::{Change, Index};
use crate::pod_events::{self, Ledger};
use crate::record::{self, PodKey, PodRecord, PolicyRecord};
use crate::recorder::NoticeSender;
use crate::render::{self, Effective};
use crate::replay;
use crate::runtime::{NetnsLookup, NetnsUpdate};
use crate::store::{StateStore, StoredPod, StoredPodRef};
use crate::xds::publish::PodSpecsSender;
use crate::xds::resources::PodRender;
use crate::xds::server::ChangeClock;

/// What the watch drivers tell the loop.
#[derive(Debug)]
pub enum Event {
    /// A pod on this node was added or changed. A pod that is no longer managed, or has finished
    /// (phase `Succeeded`/`Failed`), is removed as if deleted.
    PodApplied(Box<Pod>),
    /// A pod on this node was deleted.
    PodDeleted(Box<Pod>),
    /// The records of a complete list of this node's managed pods (start-up, or a relist after
    /// 410 Gone), made by the watch as each pod arrives so the list is never held as Pod objects
    /// ([`crate::watch`], issue 15 item 3). Finished pods have no record, so they count as absent:
    /// they and their state-dir records are pruned.
    PodsListed(Vec<PodRecord>),
    /// An EndpointPolicy was added or changed (already parsed; malformed ones never get here).
    PolicyApplied(Box<EndpointPolicy>),
    /// An EndpointPolicy was deleted.
    PolicyDeleted {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A complete list of EndpointPolicies.
    PoliciesListed(Vec<EndpointPolicy>),
    /// The EndpointPolicy CRD is not served: no policy applies.
    CrdAbsent,
    /// Re-run the on-disk checks of every pipe, and ask the container runtime again for the
    /// netns of pods it has not answered for.
    Recheck,
    /// The container runtime's answers for pods' network namespaces
    /// ([`crate::runtime::NetnsLookup`]), as many as had arrived: one publish for all of them
    /// (at start-up every pod gets an answer; one publish each would be O(pods²)).
    Netns(Vec<NetnsUpdate>),
    /// Inbound listeners Envoy could not bind, read from its config dump after an LDS NACK
    /// ([`crate::xds::bind_failures`]): each is no longer offered, its pod gets a Warning Event.
    InboundBindFailed(Vec<crate::xds::bind_failures::BindFailure>),
    /// Something was created, removed or renamed in these pods' volume dirs
    /// ([`crate::socket_watch`]): re-verify (and re-pin) them now.
    SocketsChanged(Vec<String>),
    /// No Kubernetes client can be configured at all (no in-cluster environment, no kubeconfig):
    /// no pod list will ever come, so the state dir is all there is to serve and a holding loop
    /// serves it now ([`Status::holding_xds`]).
    NoApiServer,
}

pub use aether_agent_core::status::Status;

/// How long a holding agent ([`Status::holding_xds`]) waits, after the first complete pod list,
/// for the container runtime's netns answers before it serves Envoy without the missing ones
/// (checked on the periodic re-check, so up to one `--recheck-seconds` later). Every lookup
/// answers within its own timeout; this bounds a queue that could not take every pod at once.
pub const HOLD_NETNS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the state dir keeps for pod Events (`pod-events.json`).
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

/// The loop's state.
pub struct Driver {
    index: Index,
    store: Option<StateStore>,
    cni: CniRecords,
    refused: HashMap<PodKey, Refusal>,
    /// Each pod's last logged delivery line, as its [`line_digest`] (a digest, not the line:
    /// 8 bytes per pod instead of a sentence).
    logged: HashMap<PodKey, u64>,
    snapshot: PodSpecsSender,
    /// Each pod's last rendering (what the renderer was sent) and what it counts for.
    rendered: HashMap<PodKey, (Arc<PodRender>, Tally)>,
    /// Pods whose on-disk verdict changed since the last publish (the index reports its own
    /// changes, [`Index::take_changed`]).
    dirty: BTreeSet<PodKey>,
    /// The status's and the cluster metrics' counts, kept per change.
    counts: Counts,
    status: watch::Sender<Status>,
    ledger: Ledger,
    stranded: BTreeMap<ServiceKey, String>,
    notices: Option<NoticeSender>,
    clock: Option<ChangeClock>,
    event_at: Option<Instant>,
    booting: bool,
    /// `Normal` notices decided while booting from the state dir (e.g. a fallback cleared by a
    /// configuration fix across a restart): sent once the first complete pod list confirms the
    /// pod still exists and is still delivered over its socket.
    deferred: Vec<pod_events::Notice>,
    /// Pod network namespaces from the container runtime (when `--cri-endpoint` is set), and
    /// when to ask again.
    netns: crate::runtime::PodNetns,
    /// Socket pinning (`--pin-dir`): pins each verified socket inode where Envoy dials it.
    pinner: Option<crate::pin::Pinner>,
    /// inotify on the volume dirs of pods with a socket path, for prompt re-checks.
    socket_watch: Option<crate::socket_watch::SocketWatch>,
    /// Pods delivered over a socket that does not exist yet (the app has not bound it, or
    /// cannot start): they are logged as delivered over their socket once it is verified.
    awaiting_socket: HashSet<PodKey>,
    /// Pods whose socket path ever held a link (symlink anywhere, or a second hard link): the
    /// refusal sticks until the pod is gone (issue 13: otherwise the pod could retry the swap
    /// after every clean check). Kept in the state dir.
    link_refused: HashMap<String, Refusal>,
    /// Pods told (once) that the runtime reports no netns for them, so no inbound listener.
    no_netns_told: HashSet<String>,
    /// While set, the xDS server holds Envoy's streams unanswered ([`Status::holding_xds`]): the
    /// loop has nothing complete to serve yet. Taken from the status at start; cleared once.
    holding: bool,
    /// When the first complete pod list arrived while holding: the bound on waiting for the
    /// runtime's netns answers ([`HOLD_NETNS_WAIT`]).
    listed_at: Option<Instant>,
    /// Served clusters, the cap and the refused pods, set on every publish.
    cluster_metrics: Option<crate::metrics::ClusterMetrics>,
    /// The live per-pod decisions (`/debug/pods`), updated only for the pods a change touched.
    decisions: Option<crate::decisions::Decisions>,
}

impl Driver {
    /// A loop over `index` that publishes to `snapshot` and `status`, persisting to `store`.
    pub fn new(
        index: Index,
        store: Option<StateStore>,
        cni: CniRecords,
        snapshot: PodSpecsSender,
        status: watch::Sender<Status>,
    ) -> Self {
        let holding = status.borrow().holding_xds;
        Driver {
            index,
            store,
            cni,
            refused: HashMap::new(),
            logged: HashMap::new(),
            snapshot,
            rendered: HashMap::new(),
            dirty: BTreeSet::new(),
            counts: Counts::default(),
            status,
            ledger: Ledger::new(),
            stranded: BTreeMap::new(),
            notices: None,
            netns: crate::runtime::PodNetns::default(),
            no_netns_told: HashSet::new(),
            holding,
            listed_at: None,
            link_refused: HashMap::new(),
            pinner: None,
            socket_watch: None,
            awaiting_socket: HashSet::new(),
            clock: None,
            event_at: None,
            booting: false,
            deferred: Vec::new(),
            cluster_metrics: None,
            decisions: None,
        }
    }

    /// Same loop, setting `metrics` (served clusters vs `--max-clusters`, pods refused by a cap)
    /// on every publish.
    pub fn with_cluster_metrics(mut self, metrics: crate::metrics::ClusterMetrics) -> Self {
        self.cluster_metrics = Some(metrics);
        self
    }

    /// Same loop, keeping each touched pod's decision on `board` (served on the admin port's
    /// `/debug/pods`): updated per change, only for the pods it touched.
    pub fn with_decisions(mut self, board: crate::decisions::Decisions) -> Self {
        self.decisions = Some(board);
        self
    }

    /// Same loop, pinning each pod's verified socket with `pinner` (the index's settings must
    /// carry the same pin dir, so render dials the pins).
    pub fn with_pinner(mut self, pinner: crate::pin::Pinner) -> Self {
        self.pinner = Some(pinner);
        self
    }

    /// Same loop, watching pinned pods' volume dirs with `watch` ([`Event::SocketsChanged`]).
    pub fn with_socket_watch(mut self, watch: crate::socket_watch::SocketWatch) -> Self {
        self.socket_watch = Some(watch);
        self
    }

    /// Same loop, queueing pod Events to `notices` (without it, decisions are only logged).
    pub fn with_notices(mut self, notices: NoticeSender) -> Self {
        self.notices = Some(notices);
        self
    }

    /// Same loop, stamping every published change on `clock` (for the change-to-ACK histogram).
    pub fn with_change_clock(mut self, clock: ChangeClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The pods already reported with a fallback Event, and their cause.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Loads the state dir (pods and the last policy map) so the node serves the same clusters
    /// before the API server answers. Unusable files are logged and skipped.
    pub fn boot(&mut self) {
        let Some(store) = &self.store else { return };
        let (stored, errors): (Vec<StoredPod<PodRecord>>, _) = store.load_pods();
        for e in errors {
            tracing::warn!(error = %e, "skipping a pod record in the state dir");
        }
        // Each pod's netns as it was served, so the first push offers Envoy the same inbound
        // listeners and in-netns clusters as before the restart; the runtime is asked to confirm.
        let (mut replayed, mut gone) = (Vec::new(), 0usize);
        let mut pods = Vec::with_capacity(stored.len());
        for StoredPod { record, netns } in stored {
            if let Some(path) = netns {
                match replay::netns_present(std::path::Path::new(&path)) {
                    replay::Presence::Gone => {
                        tracing::info!(pod = %format!("{}/{}", record.namespace, record.name), netns = %path,
                            "the pod's network namespace from the state dir is gone; asking the runtime again");
                        gone += 1;
                    }
                    _ => {
                        self.netns.replay(&record.uid, path, &record.pod_ips);
                        replayed.push(record.uid.clone());
                    }
                }
            }
            pods.push(record);
        }
        // With UDS workloads off no policy is watched or applies, so a policy map left in the
        // state dir by an earlier run must not count pods as policy-governed.
        let policies: Vec<PolicyRecord> = match store.load_policies() {
            Ok(_) if !self.index.settings().uds_workloads() => vec![],
            Ok(p) => p.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "skipping the policy records in the state dir");
                vec![]
            }
        };
        match store.load_pod_events::<EventState>() {
            Ok(Some(state)) => {
                self.ledger = state.ledger;
                self.stranded =
                    state.stranded.into_iter().map(|(ns, name, policy)| (ServiceKey::new(ns, name), policy)).collect();
                self.link_refused = state
                    .link_refused
                    .into_iter()
                    .filter_map(|(uid, (label, path, links))| match label.as_str() {
                        "symlink" => Some((uid, Refusal::Symlink { path })),
                        // 0 links was a socket unlinked while it was pinned (an app re-creating
                        // it), recorded as a link by agents before 0.9.0: not a link, forgotten.
                        "hard-link" if links == 0 => None,
                        "hard-link" => Some((uid, Refusal::HardLink { path, links })),
                        _ => None,
                    })
                    .collect();
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "skipping the pod Event records in the state dir"),
        }
        tracing::info!(
            pods = pods.len(),
            netns_replayed = replayed.len(),
            netns_gone = gone,
            policies = policies.len(),
            reported = self.ledger.len(),
            "loaded the state dir"
        );
        let uids: HashSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
        // Pods refused for the cluster cap before the restart stay behind the others.
        let capped = self.ledger.reported_with(crate::TcpReason::NodeClusterCap).map(str::to_owned);
        self.index.remember_refused(capped.collect::<Vec<_>>());
        self.event_at = Some(Instant::now());
        self.booting = true;
        let mut change = self.index.reset_pods(pods);
        merge(&mut change, self.index.reset_policies(policies));
        merge(&mut change, self.refresh_netns(replayed.iter().map(String::as_str)));
        self.after(change, false);
        self.booting = false;
        if !uids.is_empty() {
            self.serve("the pods of the state dir, as a previous agent served them");
        }
        if self.ledger.retain(|uid| uids.contains(uid)) {
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

    /// Same loop, asking `lookup` for pods' network namespaces (its answers must be fed back as
    /// [`Event::Netns`]).
    pub fn with_netns_lookup(mut self, lookup: NetnsLookup) -> Self {
        self.netns = crate::runtime::PodNetns::with_lookup(lookup);
        self
    }

    /// Applies one event.
    pub fn handle(&mut self, event: Event) {
        self.event_at = Some(Instant::now());
        match event {
            Event::PodApplied(pod) => match PodRecord::from_pod(&pod) {
                Ok(Some(rec)) => {
                    let uid = rec.uid.clone();
                    self.netns.ask(&rec.uid, &rec.pod_ips);
                    let mut change = self.index.apply_pod(rec.clone());
                    if !change.rerendered.is_empty() {
                        self.save_pod(&uid, &rec);
                    }
                    merge(&mut change, self.refresh_netns([uid.as_str()]));
                    self.after(change, false);
                }
                Ok(None) => self.delete_pod(&pod),
                Err(e) => tracing::warn!(pod = %pod_name(&pod), error = %e, "ignoring a pod the agent cannot read"),
            },
            Event::PodDeleted(pod) => self.delete_pod(&pod),
            Event::PodsListed(records) => {
                let keep: HashSet<String> = records.iter().map(|r| r.uid.clone()).collect();
                records.iter().for_each(|r| self.netns.ask(&r.uid, &r.pod_ips));
                self.netns.retain(|u| keep.contains(u));
                let mut change = self.index.reset_pods(records);
                if let Some(pinner) = &self.pinner {
                    match pinner.retain(&keep) {
                        0 => {}
                        n => tracing::info!(removed = n, "removed pins of pods no longer on this node"),
                    }
                }
                if let Some(store) = &self.store {
                    // Only what the relist changed is written; a relist of the same state writes nothing.
                    // The index holds the records: no second copy of the list.
                    let rerendered: HashSet<&str> = change.rerendered.iter().map(|k| &*k.uid).collect();
                    for r in self.index.pods().filter(|r| rerendered.contains(r.uid.as_str())) {
                        self.save_pod(&r.uid, r);
                    }
                    match store.retain_pods(&keep) {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(removed = n, "removed stale pod records from the state dir"),
                        Err(e) => tracing::warn!(error = %e, "cannot prune the state dir"),
                    }
                }
                self.status.send_modify(|s| s.pods_synced = true);
                merge(&mut change, self.refresh_netns(keep.iter().map(String::as_str)));
                self.after(change, false);
                self.send_deferred(&keep);
                if self.holding {
                    self.listed_at.get_or_insert_with(Instant::now);
                    self.serve_when_complete(false);
                }
            }
            Event::PolicyApplied(policy) => match PolicyRecord::from_policy(&policy, self.index.settings()) {
                Ok(rec) => {
                    if let Some(why) = &rec.invalid {
                        tracing::warn!(policy = %format!("{}/{}", rec.namespace, rec.name), reason = %why, "EndpointPolicy is invalid on this node and is ignored");
                    }
                    let change = self.index.apply_policy(rec);
                    self.after(change, true);
                }
                Err(e) => tracing::warn!(error = %e, "ignoring an EndpointPolicy the agent cannot read"),
            },
            Event::PolicyDeleted { namespace, name } => {
                let change = self.index.delete_policy(&namespace, &name);
                self.after(change, true);
            }
            Event::PoliciesListed(list) => {
                let settings = self.index.settings().clone();
                let records: Vec<PolicyRecord> =
                    list.iter().filter_map(|p| PolicyRecord::from_policy(p, &settings).ok()).collect();
                let change = self.index.reset_policies(records);
                self.status.send_modify(|s| s.crd_installed = Some(true));
                // The CRD is served: no key is stranded any more; re-observe the pods that were.
                let was = std::mem::take(&mut self.stranded);
                self.after(change, true);
                if !was.is_empty() {
                    self.save_events();
                    let keys = self.pods_of(|k| was.contains_key(k));
                    self.observe(&keys);
                }
            }
            Event::CrdAbsent => {
                // Keys whose winning policy the agent knew: their pods asked for a socket.
                let mut by_key: BTreeMap<ServiceKey, Vec<&PolicyRecord>> = BTreeMap::new();
                for p in self.index.policies() {
                    by_key.entry(p.target.clone()).or_default().push(p);
                }
                let known: Vec<(ServiceKey, String)> = by_key
                    .into_iter()
                    .filter_map(|(k, ps)| fold::select_policy(ps).map(|w| (k, w.name.clone())))
                    .collect();
                let grew = known.iter().any(|(k, _)| !self.stranded.contains_key(k));
                self.stranded.extend(known);
                if grew {
                    self.save_events();
                }
                let change = self.index.reset_policies(Vec::new());
                self.status.send_modify(|s| s.crd_installed = Some(false));
                self.after(change, true);
            }
            Event::Netns(updates) => {
                // Per answer, a lookup in the index: answers arrive in small batches, and copying
                // every live UID per batch made a recheck at 10k pods cost ~300 ms CPU (perf,
                // make bench section 3e).
                let mut changed = Vec::new();
                let mut without = Vec::new();
                let now = Instant::now();
                for update in updates {
                    let uid = update.0.clone();
                    let live = self.index.has_pod(&uid);
                    if live && !self.netns.is_known(&uid) {
                        match &update.1 {
                            Ok(None) => without.push((uid.clone(), None)),
                            Err(e) => without.push((uid.clone(), Some(e.to_string()))),
                            Ok(Some(_)) => {}
                        }
                    }
                    if self.netns.update(update, live, now) {
                        changed.push(uid);
                    }
                }
                self.tell_no_netns(&without);
                if self.refresh_netns(changed.iter().map(String::as_str)).map_changed {
                    self.publish();
                }
                if self.holding && self.listed_at.is_some() {
                    self.serve_when_complete(false);
                }
            }
            Event::InboundBindFailed(failures) => self.inbound_bind_failed(failures),
            Event::NoApiServer => self.serve("the state dir only: no Kubernetes client configuration"),
            Event::SocketsChanged(uids) => {
                // O(batch): a flood of events from one pod never walks the node's pods.
                let keys: Vec<PodKey> = uids.iter().filter_map(|uid| self.index.pod(uid)).map(PodRecord::key).collect();
                let changed = self.check_pipes(&keys);
                if !changed.is_empty() {
                    self.observe(&changed);
                    self.publish();
                }
            }
            Event::Recheck => {
                let now = Instant::now();
                self.netns.ask_due(self.index.pods().map(|r| (r.uid.as_str(), r.pod_ips.as_slice())), now);
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
                if self.holding && self.listed_at.is_some_and(|t| now.duration_since(t) >= HOLD_NETNS_WAIT) {
                    self.serve_when_complete(true);
                }
            }
        }
    }

    /// While holding: serves once every listed pod delivered over its socket that has pod IPs has
    /// its netns answered by the runtime (a path, none, or an error), or at once when `deadline`
    /// (then naming how many answers are missing).
    fn serve_when_complete(&mut self, deadline: bool) {
        let map = self.index.snapshot();
        let awaiting = map
            .iter()
            .filter(|(k, e)| e.delivery.is_pipe() && !e.pod.pod_ips.is_empty() && self.netns.awaiting(&k.uid))
            .count();
        match (awaiting, deadline) {
            (0, _) => self.serve("the first pod list and the socket pods' network namespaces"),
            (n, true) => {
                tracing::warn!(awaiting = n, wait = ?HOLD_NETNS_WAIT,
                    "the container runtime has not answered for every socket pod's network namespace; serving Envoy without those pods' inbound listeners");
                self.serve("the first pod list, without some network namespaces");
            }
            (_, false) => {}
        }
    }

    /// Ends holding: the xDS server answers Envoy from now on ([`Status::holding_xds`]).
    fn serve(&mut self, from: &str) {
        if !std::mem::take(&mut self.holding) {
            return;
        }
        let pods = self.index.pods().count();
        let through = self.snapshot.published();
        tracing::info!(pods, from, publication = through, "serving Envoy");
        self.status.send_modify(|s| {
            s.holding_xds = false;
            s.serve_from_publication = through;
        });
    }

    /// Tells each pod in `answers` delivered over its socket, once while it lives, that its network
    /// namespace is not known: the runtime reports none of its own (`None`: a host-network pod) or
    /// could not be asked (`Some(error)`), so it gets no inbound listener until it is known.
    fn tell_no_netns(&mut self, answers: &[(String, Option<String>)]) {
        if answers.is_empty() {
            return;
        }
        // One pass over the map: at start-up with the runtime down every pod has an answer.
        let by_uid: HashMap<&str, &Option<String>> = answers.iter().map(|(uid, e)| (uid.as_str(), e)).collect();
        let map = self.index.snapshot();
        for (key, entry) in map.iter() {
            let Some(error) = by_uid.get(&*key.uid) else { continue };
            if !entry.delivery.is_pipe() || !self.no_netns_told.insert(key.uid.to_string()) {
                continue;
            }
            let why = match error {
                None => "the container runtime reports no network namespace of its own for the pod (host network?)"
                    .to_owned(),
                Some(e) => format!("the container runtime could not say where the pod's network namespace is ({e})"),
            };
            let note = format!(
                "{why}: the node proxy cannot listen on its ports inside it, so traffic to them through its \
                 Service does not reach the socket until the namespace is known"
            );
            tracing::warn!(pod = %key, reason = %why, "pod network namespace not known; no inbound listener");
            if let Some(tx) = &self.notices {
                tx.send(pod_events::Notice {
                    pod: key.clone(),
                    severity: pod_events::Severity::Warning,
                    reason: pod_events::INBOUND_NO_NETNS_REASON,
                    label: pod_events::INBOUND_NO_NETNS_LABEL,
                    action: "ListenInPodNetns",
                    note: pod_events::clip_note(note),
                });
            }
        }
    }

    /// Stops offering each inbound listener Envoy could not bind, and tells the pod why.
    fn inbound_bind_failed(&mut self, failures: Vec<crate::xds::bind_failures::BindFailure>) {
        let map = self.index.snapshot();
        let mut changed = false;
        for f in failures {
            let found = map.iter().find(|(k, _)| *k.namespace == *f.namespace && *k.name == *f.pod);
            let Some((key, _)) = found else { continue };
            if !self.index.mark_inbound_failed(&key.uid, f.port).map_changed {
                continue;
            }
            self.decided(std::slice::from_ref(key));
            changed = true;
            let note = format!(
                "the node proxy could not listen on port {} in the pod's network namespace ({}); \
                 is the app also listening on it? Traffic to this port through its Service does not \
                 reach the socket. The listener is tried again when the pod is re-created",
                f.port, f.details
            );
            tracing::warn!(pod = %key, port = f.port, details = %f.details, "inbound listener failed to bind; no longer offered");
            if let Some(tx) = &self.notices {
                tx.send(pod_events::Notice {
                    pod: key.clone(),
                    severity: pod_events::Severity::Warning,
                    reason: pod_events::INBOUND_BIND_FAILED_REASON,
                    label: pod_events::INBOUND_BIND_FAILED_LABEL,
                    action: "ListenInPodNetns",
                    note: pod_events::clip_note(note),
                });
            }
        }
        if changed {
            self.publish();
        }
    }

    /// Gathers the netns fact of each pod in `uids` (the runtime's answer first, then a CNI
    /// record under `--cni-records-dir`, else none: the pod IP is dialed) and stores it in the
    /// index, so render does no I/O. Runs on the pod's events, the runtime's answers and the
    /// periodic re-check; a CNI record is read there, never per publish.
    fn refresh_netns<'a>(&mut self, uids: impl IntoIterator<Item = &'a str>) -> Change {
        let mut change = Change::default();
        for uid in uids {
            let fact = self.netns.path(uid).map(str::to_owned).or_else(|| self.cni.netns(uid));
            let one = self.index.set_netns(uid, fact);
            // The netns is part of what a restarted agent replays: keep it with the pod's record.
            if !one.rerendered.is_empty()
                && !self.booting
                && let Some(rec) = self.index.pod(uid)
            {
                self.save_pod(uid, rec);
            }
            change.rerendered.extend(one.rerendered);
            change.map_changed |= one.map_changed;
        }
        change.rerendered.sort();
        self.decided(&change.rerendered);
        change
    }

    fn delete_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else { return };
        self.netns.forget(uid);
        self.no_netns_told.remove(uid);
        if let Some(store) = &self.store
            && let Err(e) = store.remove_pod(uid)
        {
            tracing::warn!(pod = %pod_name(pod), error = %e, "cannot remove the pod record");
        }
        let change = self.index.delete_pod(uid);
        if !change.removed.is_empty() && record::is_finished(pod) {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
            tracing::info!(pod = %pod_name(pod), phase, "the pod finished; removing its clusters");
        }
        self.after(change, false);
    }

    fn save_pod(&self, uid: &str, rec: &PodRecord) {
        let stored = StoredPodRef { record: rec, netns: self.index.netns(uid) };
        if let Some(store) = &self.store
            && let Err(e) = store.save_pod(uid, &stored)
        {
            tracing::warn!(pod = %format!("{}/{}", rec.namespace, rec.name), error = %e, "cannot persist the pod record");
        }
    }

    /// Re-checks the listed pods' pipes on disk; returns the pods whose refusal appeared,
    /// altered or cleared.
    fn check_pipes(&mut self, keys: &[PodKey]) -> Vec<PodKey> {
        let map = self.index.snapshot();
        let pods_dir = self.index.settings().budget().map(|b| b.pods_dir().to_owned()).unwrap_or_default();
        let mut changed = Vec::new();
        let mut verified = Vec::new();
        let mut stuck = false;
        for key in keys {
            let socket = map.get(key).and_then(|e| e.delivery.path.as_ref());
            let sticky = socket.and_then(|_| self.link_refused.get(&*key.uid).cloned());
            let (verdict, present) = match (&self.pinner, socket) {
                _ if sticky.is_some() => (sticky, true),
                (Some(pinner), Some(p)) => {
                    let (verdict, present) = pin_verdict(pinner, key, p);
                    if let Some(w) = &self.socket_watch {
                        // Watched unless refused for a link (that lasts the pod's life): a pod
                        // waiting for its socket, or fallen back because the path held a FIFO, a
                        // file or a directory, is served over its socket as soon as one appears.
                        if matches!(verdict, Some(Refusal::Symlink { .. } | Refusal::HardLink { .. })) {
                            w.unwatch(&key.uid);
                        } else {
                            w.watch(&key.uid, std::path::Path::new(p.volume_dir()), p.file_name());
                        }
                    }
                    (verdict, present)
                }
                (Some(pinner), None) => {
                    pinner.unpin(&key.uid);
                    if let Some(w) = &self.socket_watch {
                        w.unwatch(&key.uid);
                    }
                    (None, true)
                }
                (None, Some(p)) => match fscheck::check(&pods_dir, p) {
                    Ok(()) => (None, std::fs::symlink_metadata(p.as_str()).is_ok()),
                    Err(r) => (Some(r), true),
                },
                (None, None) => (None, true),
            };
            if verdict.is_none() && !present && socket.is_some() {
                self.awaiting_socket.insert(key.clone());
            } else if self.awaiting_socket.remove(key) && verdict.is_none() {
                self.logged.remove(key);
                verified.push(key.clone());
            }
            if let Some(r @ (Refusal::Symlink { .. } | Refusal::HardLink { .. })) = &verdict
                && !self.link_refused.contains_key(&*key.uid)
            {
                tracing::warn!(pod = %key, reason = r.label(), detail = %r, "the pod's socket path held a link: TCP until the pod is re-created");
                if let Some(pinner) = &self.pinner {
                    pinner.unpin(&key.uid);
                }
                self.link_refused.insert(key.uid.to_string(), r.clone());
                stuck = true;
            }
            let before = self.refused.get(key);
            if before != verdict.as_ref() {
                changed.push(key.clone());
                self.dirty.insert(key.clone());
                match verdict {
                    Some(r) => {
                        tracing::warn!(pod = %key, reason = r.label(), detail = %r, "refusing the pod's socket path; delivering over TCP");
                        self.refused.insert(key.clone(), r);
                    }
                    None => {
                        if self.refused.remove(key).is_some() && present {
                            tracing::info!(pod = %key, "the pod's socket path holds a socket again; delivering over it");
                        }
                    }
                }
            }
        }
        if stuck {
            self.save_events();
        }
        self.decided(&changed);
        // A socket that appeared is what makes "delivering over the pod's Unix socket" true.
        self.log_deliveries(&verified);
        changed
    }

    fn after(&mut self, change: Change, policy_event: bool) {
        for c in &change.conflicts {
            tracing::warn!(service = %c.key, winner = %c.winner, losers = ?c.losers, "several EndpointPolicies target one Service; only the lexicographically smallest name applies");
        }
        for key in &change.resolved {
            tracing::info!(service = %key, "EndpointPolicy conflict resolved");
        }
        for key in &change.removed {
            if let Some(pinner) = &self.pinner {
                pinner.unpin(&key.uid);
            }
            if let Some(w) = &self.socket_watch {
                w.unwatch(&key.uid);
            }
            if self.link_refused.remove(&*key.uid).is_some() {
                self.save_events();
            }
            self.refused.remove(key);
            self.logged.remove(key);
            self.awaiting_socket.remove(key);
            if self.ledger.forget(&key.uid) {
                self.save_events();
                self.publish_status();
            }
        }
        let fs_changed = !self.check_pipes(&change.rerendered).is_empty();
        if let Some(board) = &self.decisions {
            board.changed(&self.index.snapshot(), &change, &self.refused);
        }
        self.observe(&change.rerendered);
        if change.map_changed || fs_changed {
            self.log_deliveries(&change.rerendered);
            self.publish();
        }
        if policy_event || !change.conflicts.is_empty() || !change.resolved.is_empty() {
            self.save_policies();
        }
    }

    /// Re-decides the pods `keys` on the decision board, if any: O(`keys`).
    fn decided(&self, keys: &[PodKey]) {
        if let Some(board) = &self.decisions {
            board.update(&self.index.snapshot(), keys, &self.refused);
        }
    }

    /// The keys of the pods whose service key `pred` accepts.
    fn pods_of(&self, pred: impl Fn(&ServiceKey) -> bool) -> Vec<PodKey> {
        self.index.snapshot().iter().filter(|(_, e)| pred(&e.pod.service_key())).map(|(k, _)| k.clone()).collect()
    }

    /// Runs the pod-event ledger over `keys` and queues what it decides. While booting from the
    /// state dir, a cleared fallback is recorded silently: the API server has not confirmed it.
    fn observe(&mut self, keys: &[PodKey]) {
        let map = self.index.snapshot();
        let budget = self.index.settings().budget().ok();
        // Only the observed pods' entries can change: compare those, not the whole ledger.
        let before: Vec<_> = keys.iter().map(|k| self.ledger.get(&k.uid)).collect();
        let observed = keys.iter().filter_map(|k| {
            let entry = map.get(k)?;
            let stranded = self.stranded.get(&entry.pod.service_key()).map(String::as_str);
            Some((k, entry, self.refused.get(k), stranded))
        });
        let notices = pod_events::decide(&mut self.ledger, budget, observed);
        for n in notices {
            if self.booting && n.severity == pod_events::Severity::Normal {
                self.deferred.push(n);
                continue;
            }
            tracing::info!(pod = %n.pod, reason = n.reason, note = %n.note, "pod Event");
            if let Some(tx) = &self.notices {
                tx.send(n);
            }
        }
        if keys.iter().zip(before).any(|(k, was)| self.ledger.get(&k.uid) != was) {
            self.save_events();
            self.publish_status();
        }
    }

    /// Sends the notices deferred at boot for pods the first complete list still has and that
    /// are still delivered over their socket; drops the others.
    fn send_deferred(&mut self, listed: &HashSet<String>) {
        let map = self.index.snapshot();
        for n in std::mem::take(&mut self.deferred) {
            let piped = map.get(&n.pod).is_some_and(|e| e.delivery.is_pipe());
            if !listed.contains(&*n.pod.uid) || !piped || self.ledger.get(&n.pod.uid).is_some() {
                continue;
            }
            tracing::info!(pod = %n.pod, reason = n.reason, note = %n.note, "pod Event");
            if let Some(tx) = &self.notices {
                tx.send(n);
            }
        }
    }

    fn save_events(&self) {
        if let Some(store) = &self.store {
            let state = EventState {
                ledger: self.ledger.clone(),
                stranded: self.stranded.iter().map(|(k, p)| (k.namespace.clone(), k.name.clone(), p.clone())).collect(),
                link_refused: self
                    .link_refused
                    .iter()
                    .filter_map(|(uid, r)| match r {
                        Refusal::Symlink { path } => Some((uid.clone(), ("symlink".into(), path.clone(), 1))),
                        Refusal::HardLink { path, links } => {
                            Some((uid.clone(), ("hard-link".into(), path.clone(), *links)))
                        }
                        _ => None,
                    })
                    .collect(),
            };
            if let Err(e) = store.save_pod_events(&state) {
                tracing::warn!(error = %e, "cannot persist the pod Event records");
            }
        }
    }

    /// Updates the status's counts without publishing a snapshot.
    fn publish_status(&mut self) {
        let fallbacks = pod_events::by_label(&self.ledger.counts());
        self.status.send_modify(|s| s.fallbacks = fallbacks);
    }

    fn save_policies(&self) {
        if let Some(store) = &self.store {
            let records: Vec<PolicyRecord> = self.index.policies().cloned().collect();
            if let Err(e) = store.save_policies(&records) {
                tracing::warn!(error = %e, "cannot persist the policy records");
            }
        }
    }

    fn log_deliveries(&mut self, keys: &[PodKey]) {
        let map = self.index.snapshot();
        for key in keys {
            let Some(entry) = map.get(key) else { continue };
            let d = &entry.delivery;
            let line = line_digest(d.source.label(), &d.reason);
            if self.logged.get(key) == Some(&line) {
                continue;
            }
            match (d.is_pipe(), &d.socket) {
                _ if d.tcp_reason().is_some_and(crate::TcpReason::serves_nothing) => {
                    tracing::warn!(pod = %key, reason = d.source.label(), detail = %d.reason, "pod is served no clusters")
                }
                // Refused on disk: `check_pipes` logged the refusal (and logs its end).
                (true, _) if self.refused.contains_key(key) => continue,
                (true, _) if self.awaiting_socket.contains(key) => {
                    // Logged as delivered once the socket is verified (`check_pipes`).
                    tracing::debug!(pod = %key, path = %d.path.as_ref().map(|p| p.as_str()).unwrap_or(""), "the pod's socket does not exist yet; delivering over it once its app binds it");
                    continue;
                }
                (true, _) => {
                    tracing::info!(pod = %key, source = d.source.label(), path = %d.path.as_ref().map(|p| p.as_str()).unwrap_or(""), "delivering over the pod's Unix socket")
                }
                (false, Some(socket)) => {
                    tracing::warn!(pod = %key, socket = %socket, reason = d.source.label(), detail = %d.reason, "pod declared a socket but is delivered over TCP")
                }
                (false, None) => tracing::debug!(pod = %key, "delivering over TCP"),
            }
            self.logged.insert(key.clone(), line);
        }
    }

    /// Re-renders the pods the index changed since the last publish and those whose on-disk
    /// verdict changed (nothing else: O(changed), never a pass over the node), updates the
    /// status's and the metrics' counts by their difference, and sends the renderer the pods whose
    /// rendering differs, stamping the change on the clock. A resync that changed nothing sends
    /// nothing.
    fn publish(&mut self) {
        let map = self.index.snapshot();
        let mut keys = self.index.take_changed();
        keys.append(&mut self.dirty);
        let mut sent: Vec<(PodKey, Option<Arc<PodRender>>)> = Vec::with_capacity(keys.len());
        // A boot or relist renders every pod at once: grow the map once (by what it may still
        // lack, so re-rendering known pods never grows it), not by doubling.
        self.rendered.reserve(keys.len().saturating_sub(self.rendered.len()));
        for key in keys {
            let now = map.get(&key).map(|entry| {
                let render = render::render_pod(entry, self.refused.get(&key));
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
        if let Some(m) = &self.cluster_metrics {
            m.set(self.counts.clusters, self.index.admission().max(), &self.counts.refused);
        }
        let conflicts = self.index.conflicts().count();
        let fallbacks = pod_events::by_label(&self.ledger.counts());
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
        // Stamped before the renderer is woken, so it always finds it.
        if let Some(clock) = &self.clock {
            clock.changed(self.event_at.unwrap_or_else(Instant::now));
        }
        self.snapshot.send(sent);
    }
}

/// The digest [`Driver`] keeps of a pod's logged delivery line (its source label and reason):
/// SipHash-1-3 with fixed keys ([`std::hash::DefaultHasher::new`]), so equal lines give equal
/// digests for the life of the process.
fn line_digest(source: &str, reason: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (source, reason).hash(&mut h);
    h.finish()
}

/// What one pod counts for in the status and the cluster metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tally {
    /// `pipe`, `tcp`, `waiting` or `refused` (its effective delivery).
    kind: &'static str,
    /// `annotation`, `policy` or `none`: what asked for a socket.
    source: &'static str,
    /// Clusters it renders.
    clusters: usize,
    /// The cap that refused it any cluster, if one did.
    refused: Option<crate::TcpReason>,
}

impl Tally {
    fn of(entry: &crate::index::PodDelivery, render: &PodRender) -> Tally {
        let kind = match render.effective {
            Effective::Pipe(_) => "pipe",
            Effective::Tcp => "tcp",
            Effective::Waiting => "waiting",
            Effective::Refused => "refused",
        };
        let source = if entry.pod.uds_socket.is_some() {
            "annotation"
        } else if entry.delivery.policy.is_some() {
            "policy"
        } else {
            "none"
        };
        let refused = entry.delivery.tcp_reason().filter(|r| r.serves_nothing());
        Tally { kind, source, clusters: render.clusters.len(), refused }
    }
}

/// The node's counts (pods by delivery and source, clusters, pods refused by a cap), kept by
/// adding and removing each re-rendered pod's [`Tally`]; a count that drops to zero is removed,
/// as a fresh count would not list it.
#[derive(Debug, Default)]
struct Counts {
    pods: HashMap<&'static str, usize>,
    by_source: BTreeMap<(&'static str, &'static str), usize>,
    clusters: usize,
    refused: BTreeMap<crate::TcpReason, usize>,
}

impl Counts {
    fn add(&mut self, t: &Tally) {
        *self.pods.entry(t.kind).or_default() += 1;
        *self.by_source.entry((t.kind, t.source)).or_default() += 1;
        self.clusters += t.clusters;
        if let Some(r) = t.refused {
            *self.refused.entry(r).or_default() += 1;
        }
    }

    fn remove(&mut self, t: &Tally) {
        /// Decrements a count; true when it reached zero.
        fn dec(n: Option<&mut usize>) -> bool {
            n.is_some_and(|n| {
                *n -= 1;
                *n == 0
            })
        }
        if dec(self.pods.get_mut(t.kind)) {
            self.pods.remove(t.kind);
        }
        if dec(self.by_source.get_mut(&(t.kind, t.source))) {
            self.by_source.remove(&(t.kind, t.source));
        }
        self.clusters -= t.clusters;
        if let Some(r) = t.refused
            && dec(self.refused.get_mut(&r))
        {
            self.refused.remove(&r);
        }
    }
}

/// Pins `key`'s socket; the refusal, if any. A socket that does not exist yet is no refusal (the
/// pin path reaches nothing: unhealthy, like a port not listening yet); a failed mount is logged
/// and is no refusal of the pod either (the pin path reaches nothing until a re-check succeeds).
/// Pins pod `key`'s socket: its refusal, if any, and whether a socket is there (pinned, or
/// refused). A socket that does not exist yet is no refusal: the pin path reaches nothing, like a
/// port nobody listens on.
fn pin_verdict(pinner: &crate::pin::Pinner, key: &PodKey, socket: &aether_crds::SocketPath) -> (Option<Refusal>, bool) {
    match pinner.pin(&key.uid, socket) {
        Ok(_) => (None, true),
        Err(crate::pin::PinError::NotYet { .. }) => (None, false),
        Err(crate::pin::PinError::Refused(r)) => (Some(r), true),
        Err(e @ crate::pin::PinError::Mount { .. }) => {
            tracing::error!(pod = %key, error = %e, "cannot pin the pod's socket; its pipe reaches nothing until a re-check succeeds");
            (None, false)
        }
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

fn pod_name(pod: &Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use aether_fixtures::PodBuilder;

    use super::*;
    use crate::fold::Settings;

    const UID_A: &str = aether_fixtures::UID;
    const UID_B: &str = "11111111-2222-4333-8444-555555555555";

    /// Managed pod shop/<name> of ServiceAccount cart (the Service [`cart_policy`] targets), with
    /// one container and emptyDir `s`; no socket annotation and no status (no IP) yet.
    fn cart(name: &str, uid: &str) -> PodBuilder {
        aether_fixtures::pod("shop", name)
            .uid(uid)
            .sa("cart")
            .container("app", "registry.example/uds-echo:test")
            .emptydir("s")
    }

    /// [`Event::PodsListed`] of `pods`, as the watch makes it: the records of the readable,
    /// managed, unfinished ones.
    fn listed(pods: Vec<Pod>) -> Event {
        Event::PodsListed(pods.iter().filter_map(|p| PodRecord::from_pod(p).ok().flatten()).collect())
    }

    /// [`cart`] annotated with socket [`SOCKET`].
    fn pod(name: &str, uid: &str) -> Pod {
        cart(name, uid).annotation_socket(SOCKET).build()
    }

    fn driver(state: &std::path::Path) -> (Driver, crate::xds::publish::PodSpecs) {
        driver_with(state, Settings::new("/var/lib/kubelet/pods", true))
    }

    fn driver_with(state: &std::path::Path, settings: Settings) -> (Driver, crate::xds::publish::PodSpecs) {
        let (tx, rx) = crate::xds::publish::pod_specs();
        let (status, _) = watch::channel(Status::default());
        let store = StateStore::open(state).unwrap();
        let d = Driver::new(Index::new(settings), Some(store), CniRecords::default(), tx, status);
        (d, rx)
    }

    fn records(state: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(state.join("pods"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    /// The endpoint of `shop/<name>`'s app cluster in the last published snapshot.
    fn app_endpoint(rx: &crate::xds::publish::PodSpecs, name: &str) -> crate::xds::resources::Endpoint {
        let snap = rx.snapshot();
        let cluster = snap.clusters.iter().find(|c| c.name == format!("app_shop_{name}_8080")).expect("app cluster");
        cluster.endpoint.clone()
    }

    #[test]
    fn the_runtimes_netns_answer_makes_tcp_delivery_dial_inside_the_pod_until_the_pod_goes() {
        use crate::runtime::{NetnsDirs, RuntimeError};
        use crate::xds::resources::Endpoint;
        let dir = tempfile::tempdir().unwrap();
        let (mut d, rx) = driver(dir.path());
        let p = cart("a", UID_A).ip("10.1.2.3").build();
        d.handle(listed(vec![p.clone()]));
        let by_ip = Endpoint::Tcp { address: "10.1.2.3".parse().unwrap(), port: 8080, netns: None };
        assert_eq!(app_endpoint(&rx, "a"), by_ip);

        let dirs = NetnsDirs::new(std::path::Path::new("/run/netns"), None).unwrap();
        let netns = |f: &str| dirs.translate(&format!("/var/run/netns/{f}")).unwrap();
        d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns("cni-1"))))]));
        let inside =
            Endpoint::Tcp { address: "127.0.0.1".parse().unwrap(), port: 8080, netns: Some("/run/netns/cni-1".into()) };
        assert_eq!(app_endpoint(&rx, "a"), inside);

        // A failed lookup keeps what was known; an answer for a pod the agent does not know is dropped.
        let timeout = RuntimeError::Timeout {
            endpoint: "unix:///x".into(),
            call: "ListPodSandbox",
            after: std::time::Duration::from_secs(2),
        };
        d.handle(Event::Netns(vec![(UID_A.into(), Err(timeout))]));
        d.handle(Event::Netns(vec![(UID_B.into(), Ok(Some(netns("cni-2"))))]));
        assert_eq!(app_endpoint(&rx, "a"), inside);
        assert!(!d.netns.is_known(UID_B));

        // No sandbox netns any more (e.g. host network): back to the pod IP. A delete forgets.
        d.handle(Event::Netns(vec![(UID_A.into(), Ok(None))]));
        assert_eq!(app_endpoint(&rx, "a"), by_ip);
        d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns("cni-3"))))]));
        d.handle(Event::PodDeleted(Box::new(p)));
        assert!(d.netns.is_empty());
    }

    #[test]
    fn a_cni_record_is_read_on_the_pods_events_and_the_recheck_never_per_publish() {
        use crate::xds::resources::Endpoint;
        let (state, records) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (tx, rx) = crate::xds::publish::pod_specs();
        let (status, _) = watch::channel(Status::default());
        let cni = CniRecords::new(Some(records.path().to_owned()));
        let settings = Settings::new("/var/lib/kubelet/pods", true);
        let mut d = Driver::new(Index::new(settings), Some(StateStore::open(state.path()).unwrap()), cni, tx, status);
        let p = cart("a", UID_A).ip("10.1.2.3").build();
        d.handle(Event::PodApplied(Box::new(p.clone())));
        let by_ip = Endpoint::Tcp { address: "10.1.2.3".parse().unwrap(), port: 8080, netns: None };
        assert_eq!(app_endpoint(&rx, "a"), by_ip);

        // Written after the pod's event: another pod's event (a publish) does not read it ...
        std::fs::write(records.path().join(format!("{UID_A}.json")), br#"{"netns": "/var/run/netns/cni-1"}"#).unwrap();
        d.handle(Event::PodApplied(Box::new(cart("b", UID_B).build())));
        assert_eq!(app_endpoint(&rx, "a"), by_ip);
        // ... the periodic re-check does.
        d.handle(Event::Recheck);
        let inside = Endpoint::Tcp {
            address: "127.0.0.1".parse().unwrap(),
            port: 8080,
            netns: Some("/var/run/netns/cni-1".into()),
        };
        assert_eq!(app_endpoint(&rx, "a"), inside);
    }

    #[test]
    fn a_listener_envoy_could_not_bind_is_withdrawn_alone_and_its_pod_gets_one_warning() {
        use crate::xds::bind_failures::BindFailure;
        let dir = tempfile::tempdir().unwrap();
        let (d, rx) = driver(dir.path());
        let (mut d, mut events) = with_notices(d);
        let p = cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build();
        d.handle(listed(vec![p]));
        let dirs = crate::runtime::NetnsDirs::new(std::path::Path::new("/run/netns"), None).unwrap();
        let netns = dirs.translate("/var/run/netns/cni-1").unwrap();
        d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns)))]));
        let listeners = |rx: &crate::xds::publish::PodSpecs| -> Vec<String> {
            rx.snapshot().listeners.iter().map(|l| l.name.clone()).collect()
        };
        assert_eq!(listeners(&rx), ["inbound_shop_a_8080"]);
        drain(&mut events);

        let failure = |pod: &str| BindFailure {
            namespace: "shop".into(),
            pod: pod.into(),
            port: 8080,
            details: "cannot bind '0.0.0.0:8080': Address already in use".into(),
        };
        d.handle(Event::InboundBindFailed(vec![failure("a"), failure("not-on-this-node")]));
        assert!(listeners(&rx).is_empty());
        assert!(cluster_names(&rx).contains(&"app_shop_a_8080".to_owned()), "its clusters stay");
        let reasons = drain(&mut events);
        assert_eq!(reasons, [pod_events::INBOUND_BIND_FAILED_REASON]);
        // Envoy reporting the same failure again changes nothing and says nothing.
        d.handle(Event::InboundBindFailed(vec![failure("a")]));
        assert!(drain(&mut events).is_empty());
    }

    #[test]
    fn a_socket_pod_without_a_netns_of_its_own_is_told_once_and_gets_no_listener() {
        let dir = tempfile::tempdir().unwrap();
        let (d, rx) = driver(dir.path());
        let (mut d, mut events) = with_notices(d);
        let tcp_pod = cart("t", UID_B).ip("10.1.2.4").build();
        d.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build(), tcp_pod]));
        drain(&mut events);
        for _ in 0..2 {
            d.handle(Event::Netns(vec![(UID_A.into(), Ok(None)), (UID_B.into(), Ok(None))]));
        }
        assert_eq!(drain(&mut events), [pod_events::INBOUND_NO_NETNS_REASON], "once, and not for the TCP pod");
        assert!(rx.snapshot().listeners.is_empty());

        // A runtime that cannot be asked: the same Event, once, naming the error.
        let (d2, _rx2) = driver(tempfile::tempdir().unwrap().path());
        let (mut d2, mut events2) = with_notices(d2);
        d2.handle(listed(vec![cart("b", UID_B).annotation_socket(SOCKET).ip("10.1.2.5").build()]));
        drain(&mut events2);
        let timeout = || crate::runtime::RuntimeError::Timeout {
            endpoint: "unix:///x".into(),
            call: "ListPodSandbox",
            after: std::time::Duration::from_secs(2),
        };
        d2.handle(Event::Netns(vec![(UID_B.into(), Err(timeout()))]));
        d2.handle(Event::Netns(vec![(UID_B.into(), Err(timeout()))]));
        let notes: Vec<pod_events::Notice> = std::iter::from_fn(|| events2.try_recv().ok()).collect();
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].note.contains("could not say") && notes[0].note.contains("ListPodSandbox"),
            "{}",
            notes[0].note
        );
    }

    #[test]
    fn a_socket_path_that_held_a_link_stays_refused_until_the_pod_is_gone_across_a_restart() {
        let (state, pods) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let settings = || Settings::new(pods.path().to_str().unwrap(), true);
        let volume = pods.path().join(UID_A).join("volumes/kubernetes.io~empty-dir/s");
        std::fs::create_dir_all(&volume).unwrap();
        std::os::unix::fs::symlink("/elsewhere/app.sock", volume.join("app.sock")).unwrap();
        let app_is_pipe = |rx: &crate::xds::publish::PodSpecs| {
            rx.snapshot().clusters.iter().any(|c| {
                c.name == "app_shop_a_8080" && matches!(c.endpoint, crate::xds::resources::Endpoint::Pipe { .. })
            })
        };
        let p = cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build();
        let (mut d, rx) = driver_with(state.path(), settings());
        d.handle(listed(vec![p.clone()]));
        assert!(!app_is_pipe(&rx), "a symlinked socket is refused");
        // The pod puts a real socket back: still refused, at every re-check.
        std::fs::remove_file(volume.join("app.sock")).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(volume.join("app.sock")).unwrap();
        d.handle(Event::Recheck);
        assert!(!app_is_pipe(&rx), "the refusal sticks");
        // ... and across an agent restart (the state dir remembers it).
        drop(d);
        let (mut again, rx) = driver_with(state.path(), settings());
        again.boot();
        again.handle(listed(vec![p.clone()]));
        again.handle(Event::Recheck);
        assert!(!app_is_pipe(&rx), "the refusal sticks across a restart");
        // The pod is gone: forgotten; a pod re-created (new UID) starts clean.
        again.handle(Event::PodDeleted(Box::new(p)));
        assert!(again.link_refused.is_empty());
    }

    #[test]
    fn a_zero_link_record_of_an_older_agent_is_forgotten_at_boot_and_a_real_link_stays() {
        let (state, pods) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let settings = || Settings::new(pods.path().to_str().unwrap(), true);
        let (mut d, _rx) = driver_with(state.path(), settings());
        // What an agent before 0.9.0 saved when an app re-created its socket while it was pinned.
        d.link_refused.insert(UID_A.to_owned(), Refusal::HardLink { path: "/p/a.sock".into(), links: 0 });
        d.link_refused.insert(UID_B.to_owned(), Refusal::HardLink { path: "/p/b.sock".into(), links: 2 });
        d.save_events();
        drop(d);
        let (mut again, _rx) = driver_with(state.path(), settings());
        again.boot();
        assert!(!again.link_refused.contains_key(UID_A), "0 links is no link");
        assert_eq!(again.link_refused.get(UID_B), Some(&Refusal::HardLink { path: "/p/b.sock".into(), links: 2 }));
    }

    #[test]
    fn a_restarted_driver_serves_the_same_snapshot_from_the_state_dir_before_any_list() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, rx) = driver(dir.path());
        d.handle(listed(vec![pod("a", UID_A), pod("b", UID_B)]));
        let served = rx.snapshot();
        assert_eq!(served.clusters.len(), 4, "{served:?}");
        drop(d);
        let (mut again, rx2) = driver(dir.path());
        again.boot();
        assert_eq!(rx2.snapshot(), served);
    }

    /// A netns the runtime answers with, as a file in `dir` (the host and proxy netns dir).
    fn netns_in(dir: &std::path::Path, file: &str) -> crate::runtime::NetnsPath {
        std::fs::write(dir.join(file), b"").unwrap();
        let dirs = crate::runtime::NetnsDirs::new(dir, None).unwrap();
        dirs.translate(&dir.join(file).display().to_string()).unwrap()
    }

    #[test]
    fn a_restarted_driver_replays_each_pods_netns_so_its_first_push_equals_what_was_served() {
        let (state, netns_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut d, rx) = driver(state.path());
        let socket_pod = cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build();
        let tcp_pod = cart("b", UID_B).ip("10.1.2.4").build();
        d.handle(listed(vec![socket_pod, tcp_pod]));
        d.handle(Event::Netns(vec![
            (UID_A.into(), Ok(Some(netns_in(netns_dir.path(), "cni-a")))),
            (UID_B.into(), Ok(Some(netns_in(netns_dir.path(), "cni-b")))),
        ]));
        let served = rx.snapshot();
        assert_eq!(served.listeners.len(), 1, "the socket pod's inbound listener: {served:?}");
        drop(d);

        // No API server, no runtime answer yet: the state dir alone gives the same push.
        let (mut again, rx2) = driver(state.path());
        again.boot();
        assert_eq!(rx2.snapshot(), served, "listeners and in-netns clusters replayed");

        // A netns that is gone (the sandbox was replaced while the agent was down) is not
        // replayed: that pod loses its listener and dials its pod IP until the runtime answers.
        std::fs::remove_file(netns_dir.path().join("cni-a")).unwrap();
        std::fs::remove_file(netns_dir.path().join("cni-b")).unwrap();
        let (mut third, rx3) = driver(state.path());
        third.boot();
        let replayed = rx3.snapshot();
        assert!(replayed.listeners.is_empty(), "{replayed:?}");
        let by_ip =
            crate::xds::resources::Endpoint::Tcp { address: "10.1.2.4".parse().unwrap(), port: 8080, netns: None };
        assert_eq!(app_endpoint(&rx3, "b"), by_ip);
    }

    /// A driver whose status starts holding Envoy's streams, as `aether-agent run` starts it,
    /// with a netns lookup that never answers by itself (the test hands the answers over).
    fn holding_driver(state: &std::path::Path) -> (Driver, watch::Receiver<Status>) {
        struct Silent;
        impl crate::runtime::NetnsSource for Silent {
            fn endpoint(&self) -> &str {
                "unix:///silent"
            }
            fn netns_of(
                &self,
                _: &str,
            ) -> impl Future<Output = Result<Option<crate::runtime::NetnsPath>, crate::runtime::RuntimeError>> + Send
            {
                std::future::pending()
            }
        }
        let (tx, _rx) = crate::xds::publish::pod_specs();
        let (status, status_rx) = watch::channel(Status { holding_xds: true, ..Status::default() });
        let store = StateStore::open(state).unwrap();
        let settings = Settings::new("/var/lib/kubelet/pods", true);
        let (lookup, _answers) = crate::runtime::NetnsLookup::spawn(Silent, 16);
        let d =
            Driver::new(Index::new(settings), Some(store), CniRecords::default(), tx, status).with_netns_lookup(lookup);
        (d, status_rx)
    }

    #[tokio::test]
    async fn a_new_agent_serves_envoy_only_after_the_pod_list_and_its_socket_pods_netns() {
        let (state, netns_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut d, status) = holding_driver(state.path());
        d.boot();
        assert!(status.borrow().holding_xds, "an empty state dir: nothing complete to serve");
        d.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
        assert!(status.borrow().holding_xds, "listed, but the socket pod's netns is not answered yet");
        d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns_in(netns_dir.path(), "cni-a"))))]));
        assert!(!status.borrow().holding_xds, "every socket pod answered");

        // TCP pods wait for nothing; an error is an answer too (the pod is told why it has no listener).
        let (mut d2, status2) = holding_driver(tempfile::tempdir().unwrap().path());
        d2.handle(listed(vec![cart("t", UID_B).ip("10.1.2.4").build()]));
        assert!(!status2.borrow().holding_xds, "a TCP pod's netns is never waited for");
        let (mut d5, status5) = holding_driver(tempfile::tempdir().unwrap().path());
        d5.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
        let refused = crate::runtime::RuntimeError::Connect { endpoint: "unix:///x".into(), detail: "refused".into() };
        d5.handle(Event::Netns(vec![(UID_A.into(), Err(refused))]));
        assert!(!status5.borrow().holding_xds);

        // A runtime that never answers is waited for HOLD_NETNS_WAIT after the list, then served.
        let (mut d3, status3) = holding_driver(tempfile::tempdir().unwrap().path());
        d3.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
        d3.handle(Event::Recheck);
        assert!(status3.borrow().holding_xds);
        d3.listed_at = Some(Instant::now() - HOLD_NETNS_WAIT);
        d3.handle(Event::Recheck);
        assert!(!status3.borrow().holding_xds);

        // A restarted agent with pods in its state dir serves them at once.
        drop(d);
        let (mut again, status4) = holding_driver(state.path());
        again.boot();
        assert!(!status4.borrow().holding_xds);
    }

    #[test]
    fn deleted_pods_lose_their_record_and_a_relist_prunes_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, _rx) = driver(dir.path());
        d.handle(listed(vec![pod("a", UID_A), pod("b", UID_B)]));
        assert_eq!(records(dir.path()), [format!("{UID_A}.json"), format!("{UID_B}.json")]);
        d.handle(Event::PodDeleted(Box::new(pod("a", UID_A))));
        assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
        // A pod deleted while the agent was down: the next complete list removes its record.
        let (mut fresh, _rx) = driver(dir.path());
        fresh.boot();
        fresh.handle(listed(vec![pod("a", UID_A)]));
        assert_eq!(records(dir.path()), [format!("{UID_A}.json")]);
    }

    /// The cluster names of the last published snapshot, sorted.
    fn cluster_names(rx: &crate::xds::publish::PodSpecs) -> Vec<String> {
        let mut names: Vec<String> = rx.snapshot().clusters.iter().map(|c| c.name.clone()).collect();
        names.sort();
        names
    }

    /// A driver whose [`Status`] (what `aether_agent_pods` reports) the test can read.
    fn driver_with_status(state: &std::path::Path) -> (Driver, crate::xds::publish::PodSpecs, watch::Receiver<Status>) {
        let (tx, rx) = crate::xds::publish::pod_specs();
        let (status_tx, status) = watch::channel(Status::default());
        let index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        let d = Driver::new(index, Some(StateStore::open(state).unwrap()), CniRecords::default(), tx, status_tx);
        (d, rx, status)
    }

    fn counted(status: &watch::Receiver<Status>) -> usize {
        status.borrow().pods.values().sum()
    }

    const B_CLUSTERS: [&str; 2] = ["app_shop_b_8080", "health_shop_b"];

    #[test]
    fn a_served_pod_that_turns_succeeded_loses_its_clusters_record_and_ledger_entry_on_that_event() {
        let dir = tempfile::tempdir().unwrap();
        let (d, rx, status) = driver_with_status(dir.path());
        let (mut d, mut events) = with_notices(d);
        // Pod a has a ledger entry (an over-budget socket) so the test sees it handled too.
        // Running with an IP, so a TCP-delivered pod gets clusters, not "waiting".
        let a = cart("a", UID_A).annotation_socket(LONG).phase("Running").ip("10.1.2.3");
        d.handle(listed(vec![a.clone().build(), pod("b", UID_B)]));
        assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
        assert_eq!(cluster_names(&rx).len(), 4);
        assert_eq!(counted(&status), 2);

        let finished = a.phase("Succeeded").build();
        d.handle(Event::PodApplied(Box::new(finished.clone())));
        assert_eq!(cluster_names(&rx), B_CLUSTERS, "the finished pod keeps clusters");
        assert_eq!(counted(&status), 1, "the finished pod is still counted");
        assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
        assert!(d.ledger().get(UID_A).is_none(), "the ledger still holds the finished pod");
        assert_eq!(status.borrow().fallbacks.get("path-too-long"), Some(&0));
        assert_eq!(drain(&mut events), Vec::<&str>::new(), "finishing is not a delivery change to report");

        // Resyncs of the finished pod and its final delete change nothing.
        d.handle(Event::PodApplied(Box::new(finished.clone())));
        d.handle(Event::PodDeleted(Box::new(finished)));
        assert_eq!(cluster_names(&rx), B_CLUSTERS);
        assert_eq!(drain(&mut events), Vec::<&str>::new());

        // A restart does not resurrect it from the state dir.
        drop(d);
        let (mut again, rx2) = driver(dir.path());
        again.boot();
        assert_eq!(cluster_names(&rx2), B_CLUSTERS);
        assert!(again.ledger().is_empty());
    }

    #[test]
    fn a_failed_pod_gets_no_clusters_from_its_first_event() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, rx, status) = driver_with_status(dir.path());
        d.handle(listed(vec![pod("b", UID_B)]));
        d.handle(Event::PodApplied(Box::new(cart("a", UID_A).annotation_socket(SOCKET).phase("Failed").build())));
        assert_eq!(cluster_names(&rx), B_CLUSTERS);
        assert_eq!(counted(&status), 1);
        assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
    }

    #[test]
    fn a_relist_with_a_served_pod_now_finished_prunes_it_and_its_state_dir_record() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _rx) = driver(dir.path());
        let (mut d, mut events) = with_notices(d);
        let a = cart("a", UID_A).annotation_socket(LONG).phase("Running").ip("10.1.2.3");
        d.handle(listed(vec![a.clone().build(), pod("b", UID_B)]));
        assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
        drop(d);
        // The pod finished while the agent was down: the boot serves it from the state dir, the
        // first list (where it is Failed) drops it, its record and its ledger entry.
        let (again, rx, status) = driver_with_status(dir.path());
        let (mut again, mut events) = with_notices(again);
        again.boot();
        assert_eq!(cluster_names(&rx).len(), 4);
        again.handle(listed(vec![a.phase("Failed").build(), pod("b", UID_B)]));
        assert_eq!(cluster_names(&rx), B_CLUSTERS);
        assert_eq!(counted(&status), 1);
        assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
        assert!(again.ledger().is_empty());
        assert_eq!(drain(&mut events), Vec::<&str>::new());
    }

    #[test]
    fn a_draining_pod_keeps_its_clusters_until_it_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, mut rx, status) = driver_with_status(dir.path());
        let a = cart("a", UID_A).annotation_socket(SOCKET).phase("Running").ip("10.1.2.3");
        d.handle(listed(vec![a.clone().build(), pod("b", UID_B)]));
        let served = cluster_names(&rx);
        assert_eq!(served.len(), 4);
        rx.mark_unchanged();

        // Being deleted (a `deletionTimestamp`): kubelet is stopping it.
        let draining = a.deleting("2030-01-01T00:00:00Z");
        d.handle(Event::PodApplied(Box::new(draining.clone().build())));
        d.handle(listed(vec![draining.clone().build(), pod("b", UID_B)]));
        assert!(!rx.has_changed(), "a deletionTimestamp alone changed the snapshot");
        assert_eq!(cluster_names(&rx), served);
        assert_eq!(counted(&status), 2);
        assert_eq!(records(dir.path()), [format!("{UID_A}.json"), format!("{UID_B}.json")]);

        d.handle(Event::PodApplied(Box::new(draining.phase("Succeeded").build())));
        assert_eq!(cluster_names(&rx), B_CLUSTERS);
        assert_eq!(counted(&status), 1);
        assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
    }

    #[test]
    fn a_relist_of_the_same_state_writes_nothing_and_publishes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, mut rx) = driver(dir.path());
        d.handle(listed(vec![pod("a", UID_A)]));
        rx.mark_unchanged();
        let file = dir.path().join(format!("pods/{UID_A}.json"));
        let before = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        d.handle(listed(vec![pod("a", UID_A)]));
        assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), before, "record rewritten");
        assert!(!rx.has_changed(), "a snapshot was published for a no-op relist");
    }

    fn with_notices(d: Driver) -> (Driver, tokio::sync::mpsc::Receiver<pod_events::Notice>) {
        let (tx, rx) = NoticeSender::channel(Arc::new(crate::metrics::Metrics::new()));
        (d.with_notices(tx), rx)
    }

    fn drain(rx: &mut tokio::sync::mpsc::Receiver<pod_events::Notice>) -> Vec<&'static str> {
        std::iter::from_fn(|| rx.try_recv().ok()).map(|n| n.reason).collect()
    }

    /// The socket [`pod`] declares and [`cart_policy`] names.
    const SOCKET: &str = "s/app.sock";

    const LONG: &str = "sockets/app1234567890.sock";

    /// Policy shop/cart-uds: Service cart (the fixture pods' ServiceAccount) over [`SOCKET`].
    fn cart_policy() -> EndpointPolicy {
        aether_fixtures::policy("shop", "cart-uds").target("cart").socket(SOCKET).build()
    }

    #[test]
    fn a_policy_change_sends_the_renderer_only_the_pods_of_its_service_and_a_resync_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, rx, status) = driver_with_status(dir.path());
        let other =
            |name: &str, uid: &str| aether_fixtures::pod("shop", name).uid(uid).sa("other").ip("10.0.0.9").build();
        let pods = vec![
            cart("a", UID_A).ip("10.0.0.1").build(),
            cart("b", UID_B).ip("10.0.0.2").build(),
            other("x", "22222222-2222-4333-8444-555555555555"),
            other("y", "33333333-2222-4333-8444-555555555555"),
        ];
        d.handle(listed(pods));
        assert_eq!(rx.take(false).len(), 4, "the first list sends every pod");
        assert_eq!(status.borrow().pods.get("tcp"), Some(&4));

        d.handle(Event::PolicyApplied(Box::new(cart_policy())));
        let sent: Vec<String> =
            rx.take(false).into_iter().map(|(k, r)| format!("{}:{}", k.name, r.is_some())).collect();
        assert_eq!(sent, ["a:true", "b:true"], "only the policy's service's pods, re-rendered");
        let s = status.borrow().clone();
        assert_eq!((s.pods.get("tcp"), s.pods.values().sum::<usize>()), (Some(&2), 4), "counts kept by difference");
        assert_eq!(s.by_source.get(&("tcp", "none")), Some(&2));

        d.handle(Event::PolicyApplied(Box::new(cart_policy())));
        d.handle(Event::PodApplied(Box::new(other("x", "22222222-2222-4333-8444-555555555555"))));
        assert!(rx.take(false).is_empty(), "a resync sends nothing");

        d.handle(Event::PodDeleted(Box::new(other("y", "33333333-2222-4333-8444-555555555555"))));
        let sent: Vec<String> =
            rx.take(false).into_iter().map(|(k, r)| format!("{}:{}", k.name, r.is_some())).collect();
        assert_eq!(sent, ["y:false"]);
        assert_eq!(status.borrow().pods.values().sum::<usize>(), 3);
        assert_eq!(rx.snapshot().health_clusters.len(), 3, "the whole picture is still there");
    }

    #[test]
    fn a_fallback_event_is_queued_once_across_resyncs_and_an_agent_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _rx) = driver(dir.path());
        let (mut d, mut events) = with_notices(d);
        let long = cart("a", UID_A).annotation_socket(LONG).build();
        d.handle(listed(vec![long.clone(), pod("b", UID_B)]));
        assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
        d.handle(Event::PodApplied(Box::new(long.clone())));
        d.handle(listed(vec![long.clone(), pod("b", UID_B)]));
        d.handle(Event::Recheck);
        assert_eq!(drain(&mut events), Vec::<&str>::new());
        drop(d);
        // A restart boots from the state dir and relists: nothing is told twice.
        let (again, _rx) = driver(dir.path());
        let (mut again, mut events) = with_notices(again);
        again.boot();
        again.handle(listed(vec![long.clone(), pod("b", UID_B)]));
        assert_eq!(drain(&mut events), Vec::<&str>::new());
        assert_eq!(again.ledger().get(UID_A), Some(crate::TcpReason::PathTooLong));
        // Fixed: one Normal event; deleted while away: forgotten by the relist.
        again.handle(Event::PodApplied(Box::new(cart("a", UID_A).annotation_socket(SOCKET).build())));
        assert_eq!(drain(&mut events), [pod_events::DELIVERED_REASON]);
        again.handle(Event::PodApplied(Box::new(long.clone())));
        again.handle(listed(vec![pod("b", UID_B)]));
        assert!(again.ledger().is_empty());
        assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
    }

    #[test]
    fn a_fallback_fixed_by_configuration_across_a_restart_gets_its_delivered_event_once_the_pod_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _rx) = driver_with(dir.path(), Settings::new("/var/lib/kubelet/pods", false));
        let (mut d, mut events) = with_notices(d);
        d.handle(listed(vec![pod("a", UID_A), pod("b", UID_B)]));
        assert_eq!(drain(&mut events), ["UdsDisabled", "UdsDisabled"]);
        drop(d);
        // Restarted with --uds-workloads=true: the boot decides "delivered" but says nothing
        // until the API server confirms the pods; pod b was deleted meanwhile.
        let (again, _rx) = driver(dir.path());
        let (mut again, mut events) = with_notices(again);
        again.boot();
        assert_eq!(drain(&mut events), Vec::<&str>::new(), "nothing before the API server confirms");
        again.handle(listed(vec![pod("a", UID_A)]));
        let sent: Vec<pod_events::Notice> = std::iter::from_fn(|| events.try_recv().ok()).collect();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!((sent[0].reason, &*sent[0].pod.uid), (pod_events::DELIVERED_REASON, UID_A));
        again.handle(listed(vec![pod("a", UID_A)]));
        assert_eq!(drain(&mut events), Vec::<&str>::new(), "sent once");
    }

    #[test]
    fn pods_of_a_policy_whose_crd_went_away_get_one_crd_missing_event_and_the_gauge_follows() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, _rx) = crate::xds::publish::pod_specs();
        let (status_tx, status) = watch::channel(Status::default());
        let d = Driver::new(
            Index::new(Settings::new("/var/lib/kubelet/pods", true)),
            Some(StateStore::open(dir.path()).unwrap()),
            CniRecords::default(),
            tx,
            status_tx,
        );
        let (mut d, mut events) = with_notices(d);
        d.handle(Event::PoliciesListed(vec![cart_policy()]));
        d.handle(listed(vec![cart("a", UID_A).build()]));
        assert_eq!(drain(&mut events), Vec::<&str>::new());
        assert_eq!(status.borrow().by_source.get(&("pipe", "policy")), Some(&1));
        d.handle(Event::CrdAbsent);
        assert_eq!(drain(&mut events), ["UdsPolicyCrdMissing"]);
        assert_eq!(status.borrow().fallbacks.get("policy-crd-missing"), Some(&1));
        d.handle(Event::CrdAbsent);
        d.handle(listed(vec![cart("a", UID_A).build()]));
        assert_eq!(drain(&mut events), Vec::<&str>::new());
        // Served again (CRD re-installed, its objects gone): the cause ends without an event.
        d.handle(Event::PoliciesListed(vec![]));
        assert_eq!(drain(&mut events), Vec::<&str>::new());
        assert_eq!(status.borrow().fallbacks.get("policy-crd-missing"), Some(&0));
        // No pod IP in the fixture: TCP without an address is "waiting".
        assert_eq!(status.borrow().by_source.get(&("waiting", "none")), Some(&1));
    }

    #[test]
    fn with_uds_workloads_off_a_policy_map_left_in_the_state_dir_governs_no_pod() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, _rx) = driver(dir.path());
        d.handle(Event::PoliciesListed(vec![cart_policy()]));
        d.handle(listed(vec![cart("a", UID_A).build()]));
        let key = |d: &Driver| d.index.snapshot().iter().next().map(|(_, e)| e.delivery.policy.clone()).unwrap();
        assert_eq!(key(&d), Some("cart-uds".to_owned()));
        drop(d);
        let (mut off, _rx) = driver_with(dir.path(), Settings::new("/var/lib/kubelet/pods", false));
        off.boot();
        assert_eq!(key(&off), None, "a policy from the state dir still governs the pod");
    }

    /// [`cart`] with an IP (so its clusters render), created at second `created`.
    fn dated(name: &str, uid: &str, created: i64) -> Pod {
        let mut p = cart(name, uid).ip("10.1.2.3").build();
        let at = k8s_openapi::jiff::Timestamp::from_second(created).unwrap();
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
        p
    }

    #[test]
    fn the_cluster_cap_is_metered_told_and_kept_across_an_agent_restart() {
        const UID_C: &str = "22222222-2222-4333-8444-555555555555";
        let dir = tempfile::tempdir().unwrap();
        let capped = || Settings::new("/var/lib/kubelet/pods", true).with_max_clusters(Some(4));
        let metrics = crate::metrics::Metrics::new();
        let (d, rx) = driver_with(dir.path(), capped());
        let (mut d, mut events) = with_notices(d.with_cluster_metrics(metrics.clusters.clone()));
        d.handle(listed(vec![dated("a", UID_A, 200), dated("b", UID_B, 300)]));
        // Created before both, seen after them (scheduled here late): it waits.
        d.handle(Event::PodApplied(Box::new(dated("late", UID_C, 100))));
        assert_eq!(drain(&mut events), ["UdsNodeClusterCapReached"]);
        let names = |rx: &crate::xds::publish::PodSpecs| -> Vec<String> {
            let mut v: Vec<String> = rx.snapshot().clusters.iter().map(|c| c.name.clone()).collect();
            v.sort();
            v
        };
        let served = ["app_shop_a_8080", "app_shop_b_8080", "health_shop_a", "health_shop_b"];
        assert_eq!(names(&rx), served);
        let text = metrics.encode(&Status::default());
        for want in [
            "aether_agent_clusters 4",
            "aether_agent_clusters_max 4",
            "aether_agent_pods_refused{reason=\"node-cluster-cap\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "missing {want:?} in\n{text}");
        }
        drop(d);

        // A restart from the state dir serves the same pods, and tells nobody again.
        let (d, rx) = driver_with(dir.path(), capped());
        let (mut d, mut events) = with_notices(d);
        d.boot();
        assert_eq!(names(&rx), served);
        d.handle(listed(vec![dated("late", UID_C, 100), dated("a", UID_A, 200), dated("b", UID_B, 300)]));
        assert_eq!(names(&rx), served);
        assert_eq!(drain(&mut events), Vec::<&str>::new());
        // b goes: the late pod gets its room.
        d.handle(Event::PodDeleted(Box::new(dated("b", UID_B, 300))));
        assert_eq!(names(&rx), ["app_shop_a_8080", "app_shop_late_8080", "health_shop_a", "health_shop_late"]);
    }
}
