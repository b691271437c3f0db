//! Pod events: which pods are told, with a Kubernetes Event, that they asked for a Unix socket
//! but are delivered over TCP, and when. Pure: no I/O, no clock; the driver feeds it and the
//! event task (the agent's `recorder` module) publishes what it decides.
//!
//! **Asked for a socket** means: a non-empty `endpoint.aether.io/uds-socket` annotation, or a
//! winning valid EndpointPolicy on the pod's service key (the fold's [`Delivery::socket`]). A pod
//! that asked and is delivered over TCP has one [`TcpReason`] ([`classify`]): the fold's reason
//! (`UdsDisabled` only for a pod with the annotation: policies are not watched then), the on-disk
//! check's [`Refusal`], or `PolicyCrdMissing` (below). [`crate::fallback`] declares every reason
//! with its Event reason, its metric label and how its note is made ([`TcpReason::detail`]).
//!
//! **Caps** (docs/workload-requirements.md "Ports per pod and clusters per node"): a pod served no
//! clusters at all because it declares more ports than a pod may (`UdsTooManyPorts`) or because
//! the node's `--max-clusters` is taken by pods admitted before it (`UdsNodeClusterCapReached`)
//! is told so whether or not it asked for a socket: the action is
//! [`CAP_ACTION`] and the note names the count and the cap. When it is served again over its
//! socket it gets the `Normal` event; a TCP pod's cause ends silently.
//!
//! **CRD missing**: while the EndpointPolicy CRD is not served, no policy can exist, so "a policy
//! targets the pod" can only come from what the agent last knew. A pod without the annotation
//! gets `UdsPolicyCrdMissing` when its service key had a winning valid policy in the agent's
//! policy map at the moment the CRD was reported absent (the state dir's map at boot, or the live
//! one when the CRD disappears) and the CRD is still not served. Policies deleted before the CRD
//! went away (`kubectl delete crd` deletes its objects first and the watch reports each deletion)
//! are gone, not missing: their pods get no event. Once the CRD is served again the cause ends.
//!
//! **De-duplication** ([`Ledger`]): an event is decided only when a pod's `(uid, cause)` changes,
//! so resyncs, relists, watch restarts and unrelated pod updates never repeat one. The pod is
//! forgotten when it is deleted, when it no longer asked for a socket, and when it is delivered
//! over its socket again; in that last case one `Normal` event `UdsSocketDelivered` says the
//! fallback is over (a pod that was never reported gets no Normal event). The ledger is small and
//! serializable: the driver keeps it in the state dir so an agent restart does not re-emit.

use std::collections::BTreeMap;

use aether_crds::Budget;
use aether_crds::udspath::{FIXED_BYTES, SUN_PATH_MAX};
use serde::{Deserialize, Serialize};

use crate::fallback::{Detail, TcpReason};
use crate::fold::{Delivery, Source};
use crate::index::PodDelivery;
use crate::record::PodKey;
use crate::refusal::Refusal;

/// The Event reason of the one `Normal` event: a reported pod is delivered over its socket again.
pub const DELIVERED_REASON: &str = "UdsSocketDelivered";
/// The metric label of [`DELIVERED_REASON`] (kebab-case, like every [`TcpReason::label`]).
pub const DELIVERED_LABEL: &str = "socket-delivered";
/// The Event `action` of a warning: what the agent did.
pub const FALLBACK_ACTION: &str = "DeliverOverTcp";
/// The Event `action` of the `Normal` event.
pub const DELIVERED_ACTION: &str = "DeliverOverSocket";
/// The Event `action` of a cap refusal ([`TcpReason::serves_nothing`]): the pod gets no clusters.
pub const CAP_ACTION: &str = "ServeNoClusters";
/// Longest Event note the API server accepts (`note` is at most 1 kB).
pub const NOTE_MAX_BYTES: usize = 1024;
/// Event reason when the node proxy could not bind a pod's inbound listener (docs/service-meshes.md):
/// the pod is delivered over its socket, but traffic to that port through its Service does not
/// reach it.
pub const INBOUND_BIND_FAILED_REASON: &str = "UdsInboundListenerFailed";
/// The metric label of [`INBOUND_BIND_FAILED_REASON`].
pub const INBOUND_BIND_FAILED_LABEL: &str = "inbound-listener-failed";
/// Event reason when the container runtime reports no network namespace of the pod's own (a
/// host-network pod): no inbound listener, so traffic through its Service does not reach the socket.
pub const INBOUND_NO_NETNS_REASON: &str = "UdsInboundNoNetns";
/// The metric label of [`INBOUND_NO_NETNS_REASON`].
pub const INBOUND_NO_NETNS_LABEL: &str = "inbound-no-netns";

/// The Event `action` of both inbound listener Warnings ([`inbound_bind_failed`],
/// [`inbound_no_netns`]): the node proxy listens on the pod's ports in its network namespace.
pub const INBOUND_ACTION: &str = "ListenInPodNetns";

/// Why a pod delivered over its socket gets no inbound listener for want of its network
/// namespace: the container runtime reports none of the pod's own (`error` is `None`: a
/// host-network pod) or could not be asked (`Some(error)`, the runtime's error).
pub fn no_netns_cause(error: Option<&str>) -> String {
    match error {
        None => "the container runtime reports no network namespace of its own for the pod (host network?)".to_owned(),
        Some(e) => format!("the container runtime could not say where the pod's network namespace is ({e})"),
    }
}

/// The Warning [`INBOUND_NO_NETNS_REASON`] on pod `key`; `cause` is the [`no_netns_cause`].
pub fn inbound_no_netns(key: &PodKey, cause: &str) -> Notice {
    let note = format!(
        "{cause}: the node proxy cannot listen on its ports inside it, so traffic to them through its \
         Service does not reach the socket until the namespace is known"
    );
    inbound_warning(key, INBOUND_NO_NETNS_REASON, INBOUND_NO_NETNS_LABEL, note)
}

/// The Warning [`INBOUND_BIND_FAILED_REASON`] on pod `key`: the node proxy could not listen on
/// `port` in the pod's network namespace; `details` is Envoy's reason.
pub fn inbound_bind_failed(key: &PodKey, port: u16, details: &str) -> Notice {
    let note = format!(
        "the node proxy could not listen on port {port} in the pod's network namespace ({details}); \
         is the app also listening on it? Traffic to this port through its Service does not \
         reach the socket. The listener is offered again when an Envoy on the node exits, after a \
         back-off (2 to 32 minutes), and when the pod is re-created"
    );
    inbound_warning(key, INBOUND_BIND_FAILED_REASON, INBOUND_BIND_FAILED_LABEL, note)
}

fn inbound_warning(key: &PodKey, reason: &'static str, label: &'static str, note: String) -> Notice {
    Notice {
        pod: key.clone(),
        severity: Severity::Warning,
        reason,
        label,
        action: INBOUND_ACTION,
        note: clip_note(note),
    }
}

/// `note` cut to at most [`NOTE_MAX_BYTES`] at a character boundary, ending in `…` when cut.
pub fn clip_note(note: String) -> String {
    truncate(note, NOTE_MAX_BYTES)
}

/// The cause of one pod's TCP delivery, if it asked for a socket (see the module docs).
///
/// `refusal` is the on-disk check's verdict for a pod the fold pipes; `stranded` is the name of
/// the policy that governed the pod's service key when the CRD was reported absent, while it
/// still is.
pub fn classify(entry: &PodDelivery, refusal: Option<&Refusal>, stranded: Option<&str>) -> Option<TcpReason> {
    let d = &entry.delivery;
    match d.source {
        // A cap refusal is news for every pod it hits, socket or not.
        Source::Tcp(reason) if reason.serves_nothing() => Some(reason),
        Source::Annotation | Source::Policy => refusal.map(Refusal::tcp_reason),
        Source::NoSocketDeclared => {
            stranded.filter(|_| entry.pod.uds_socket.is_none()).map(|_| TcpReason::PolicyCrdMissing)
        }
        // With UDS workloads off no policy is watched: only the annotation is a request.
        Source::Tcp(TcpReason::UdsDisabled) => entry.pod.uds_socket.as_ref().map(|_| TcpReason::UdsDisabled),
        Source::Tcp(reason) => d.socket.as_ref().map(|_| reason),
    }
}

/// What the [`Ledger`] says to report about a pod: a Warning (it falls back to TCP for a new cause) or a Normal (it is delivered over its socket again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The pod falls back to TCP for a cause not reported yet for this UID.
    Warn(TcpReason),
    /// A reported pod is delivered over its socket again (it had `was`).
    Delivered {
        /// The cause that was reported.
        was: TcpReason,
    },
}

/// The pods already reported, by UID, with the cause reported. Equal to "the pods currently
/// falling back, by cause" as long as every re-rendered pod is observed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    reported: BTreeMap<String, TcpReason>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the pod `uid`'s current cause (`None`: it did not ask, or it is served over its
    /// socket, which `piped` says) and decides what to publish: an event only when the cause
    /// changed since the last observation.
    pub fn observe(&mut self, uid: &str, now: Option<TcpReason>, piped: bool) -> Option<Report> {
        match now {
            Some(cause) => {
                let before = self.reported.insert(uid.to_owned(), cause);
                (before != Some(cause)).then_some(Report::Warn(cause))
            }
            None => {
                let was = self.reported.remove(uid)?;
                piped.then_some(Report::Delivered { was })
            }
        }
    }

    /// Forgets a deleted pod; true when it was reported.
    pub fn forget(&mut self, uid: &str) -> bool {
        self.reported.remove(uid).is_some()
    }

    /// Keeps only the pods `keep` accepts (a relist prunes pods deleted while the agent was
    /// away); true when something was dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) -> bool {
        let before = self.reported.len();
        self.reported.retain(|uid, _| keep(uid));
        self.reported.len() != before
    }

    /// The cause reported for `uid`.
    pub fn get(&self, uid: &str) -> Option<TcpReason> {
        self.reported.get(uid).copied()
    }

    /// The pods reported with `cause`, by UID (e.g. those refused for the node's cluster cap, for
    /// [`crate::Index::remember_refused`] at boot).
    pub fn reported_with(&self, cause: TcpReason) -> impl Iterator<Item = &str> {
        self.reported.iter().filter(move |(_, c)| **c == cause).map(|(uid, _)| uid.as_str())
    }

    /// Pods per cause, every cause of [`TcpReason::ALL`] listed (zero included).
    pub fn counts(&self) -> BTreeMap<TcpReason, usize> {
        let mut out: BTreeMap<TcpReason, usize> = TcpReason::ALL.iter().map(|c| (*c, 0)).collect();
        for cause in self.reported.values() {
            *out.entry(*cause).or_default() += 1;
        }
        out
    }

    /// The number of reported pods.
    pub fn len(&self) -> usize {
        self.reported.len()
    }

    /// True when no pod is reported.
    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
    }
}

/// Event severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

/// One Event to publish on a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The pod (the Event's `regarding`).
    pub pod: PodKey,
    /// `Warning` for a fallback, `Normal` when it ended.
    pub severity: Severity,
    /// The CamelCase Event reason.
    pub reason: &'static str,
    /// The kebab-case metric label of the same: the [`TcpReason::label`] of a warning,
    /// [`DELIVERED_LABEL`] for the `Normal` event.
    pub label: &'static str,
    /// The CamelCase action.
    pub action: &'static str,
    /// The human message (at most [`NOTE_MAX_BYTES`]): pod, value, rule, arithmetic.
    pub note: String,
}

/// The Event for a [`Report`] about `key`. `budget` (the node's socket budget, when it has
/// one) adds the arithmetic to a path-too-long note.
pub fn notice(
    key: &PodKey,
    entry: &PodDelivery,
    refusal: Option<&Refusal>,
    stranded: Option<&str>,
    budget: Option<&Budget>,
    report: Report,
) -> Notice {
    let d: &Delivery = &entry.delivery;
    let pod = format!("pod {}/{}", key.namespace, key.name);
    let (severity, reason, label, action, note) = match report {
        Report::Warn(cause) => {
            let detail = match (cause.detail(), refusal, stranded, budget) {
                (Detail::StrandedPolicy, _, Some(policy), _) => format!(
                    "EndpointPolicy {}/{policy} governed service {}, but the EndpointPolicy CRD \
                     (endpointpolicies.config.aether.io) is not served by the API server, so no policy applies",
                    key.namespace,
                    entry.pod.service_key()
                ),
                (Detail::Refusal, Some(r), _, _) if d.is_pipe() => format!("{}: refused: {r}", d.reason),
                (Detail::FoldWithBudget, _, _, Some(b)) => format!(
                    "{}: {SUN_PATH_MAX} - {} (pods dir) - {FIXED_BYTES} (/<uid>/volumes/kubernetes.io~empty-dir/) = {} bytes",
                    d.reason,
                    b.pods_dir().len(),
                    b.bytes()
                ),
                _ => d.reason.clone(),
            };
            if cause.serves_nothing() {
                // The fold's (or the index's) sentence names the count, the cap and the outcome.
                let note = format!("{pod}: {}", d.reason);
                (Severity::Warning, cause.event_reason(), cause.label(), CAP_ACTION, note)
            } else {
                // Name the value when the fold's sentence does not (UDS disabled, static pod, ...).
                let detail = match &d.socket {
                    Some(value) if !detail.contains(value.as_str()) => format!("socket {value:?}: {detail}"),
                    _ => detail,
                };
                let note = format!("{pod}: {detail}; delivering over TCP");
                (Severity::Warning, cause.event_reason(), cause.label(), FALLBACK_ACTION, note)
            }
        }
        Report::Delivered { was } => {
            let path = d.path.as_ref().map(|p| p.as_str()).unwrap_or_default();
            (
                Severity::Normal,
                DELIVERED_REASON,
                DELIVERED_LABEL,
                DELIVERED_ACTION,
                format!(
                    "{pod}: delivering over its Unix socket {path} ({}); the earlier {} fallback is over",
                    d.reason,
                    was.event_reason()
                ),
            )
        }
    };
    Notice { pod: key.clone(), severity, reason, label, action, note: truncate(note, NOTE_MAX_BYTES) }
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut with `…`.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
    s
}

/// Decides and builds the notices for a batch of observations; a helper so the driver and the
/// tests run the same code. `observed` yields, per pod, its key, entry, refusal and stranded
/// policy; `piped` is true when the pod's effective delivery is its socket.
pub fn decide<'a>(
    ledger: &mut Ledger,
    budget: Option<&Budget>,
    observed: impl IntoIterator<Item = (&'a PodKey, &'a PodDelivery, Option<&'a Refusal>, Option<&'a str>)>,
) -> Vec<Notice> {
    let mut out = Vec::new();
    for (key, entry, refusal, stranded) in observed {
        let cause = classify(entry, refusal, stranded);
        let piped = entry.delivery.is_pipe() && refusal.is_none();
        if let Some(report) = ledger.observe(&key.uid, cause, piped) {
            out.push(notice(key, entry, refusal, stranded, budget, report));
        }
    }
    out
}

/// [`Ledger::counts`] keyed by [`TcpReason::label`] (the metric label).
pub fn by_label(counts: &BTreeMap<TcpReason, usize>) -> BTreeMap<&'static str, usize> {
    counts.iter().map(|(c, n)| (c.label(), *n)).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::fold::Settings;
    use crate::index::Index;
    use crate::record::{PodRecord, PolicyRecord};

    const UID_A: &str = aether_fixtures::UID;
    const UID_B: &str = "11111111-2222-4333-8444-555555555555";
    const PODS: &str = "/var/lib/kubelet/pods";

    /// Managed pod `shop/<name>` of service account `cart` on node `n`, with an emptyDir `s`, IP
    /// 10.0.0.7, `labels` and, when given, the `uds-socket` annotation.
    fn record(name: &str, uid: &str, socket: Option<&str>, labels: &[(&str, &str)]) -> PodRecord {
        let mut pod = aether_fixtures::pod("shop", name).uid(uid).node("n").sa("cart").emptydir("s").ip("10.0.0.7");
        if let Some(s) = socket {
            pod = pod.annotation_socket(s);
        }
        for (k, v) in labels {
            pod = pod.label(k, v);
        }
        PodRecord::from_pod(&pod.build()).unwrap().unwrap()
    }

    /// Policy `shop/<name>` on Service `cart` over `socket`.
    fn policy(name: &str, socket: &str) -> PolicyRecord {
        let p = aether_fixtures::policy("shop", name).target("cart").socket(socket).build();
        PolicyRecord::from_policy(&p, &Settings::new(PODS, true)).unwrap()
    }

    /// Runs the index like the driver does and observes the re-rendered pods.
    struct Node {
        index: Index,
        ledger: Ledger,
        refused: HashMap<PodKey, Refusal>,
        stranded: Option<String>,
    }

    impl Node {
        fn new(uds: bool) -> Self {
            Node {
                index: Index::new(Settings::new(PODS, uds)),
                ledger: Ledger::new(),
                refused: HashMap::new(),
                stranded: None,
            }
        }
        fn observe(&mut self, keys: &[PodKey]) -> Vec<Notice> {
            let map = self.index.snapshot();
            let budget = self.index.settings().budget().ok().cloned();
            let stranded = self.stranded.clone();
            let observed: Vec<_> = keys
                .iter()
                .filter_map(|k| map.get(k).map(|e| (k, e, self.refused.get(k), stranded.as_deref())))
                .collect();
            decide(&mut self.ledger, budget.as_ref(), observed)
        }
        fn apply(&mut self, rec: PodRecord) -> Vec<Notice> {
            let change = self.index.apply_pod(rec);
            self.observe(&change.rerendered)
        }
        fn relist(&mut self, recs: Vec<PodRecord>) -> Vec<Notice> {
            let change = self.index.reset_pods(recs);
            for k in &change.removed {
                self.ledger.forget(&k.uid);
            }
            self.observe(&change.rerendered)
        }
        fn policies(&mut self, recs: Vec<PolicyRecord>) -> Vec<Notice> {
            let change = self.index.reset_policies(recs);
            self.observe(&change.rerendered)
        }
        fn all(&self) -> Vec<PodKey> {
            self.index.snapshot().iter().map(|(k, _)| k.clone()).collect()
        }
    }

    fn reasons(n: &[Notice]) -> Vec<&'static str> {
        n.iter().map(|n| n.reason).collect()
    }

    const LONG: &str = "sockets/app1234567890.sock";

    #[test]
    fn an_over_budget_annotation_is_reported_once_with_the_arithmetic() {
        let mut node = Node::new(true);
        let first = node.apply(record("a", UID_A, Some(LONG), &[]));
        assert_eq!(reasons(&first), ["UdsPathTooLong"]);
        let note = &first[0].note;
        assert_eq!(first[0].severity, Severity::Warning);
        assert!(
            note.starts_with(
                "pod shop/a: annotation endpoint.aether.io/uds-socket: \"sockets/app1234567890.sock\" is 26 bytes"
            ),
            "{note}"
        );
        assert!(
            note.contains("107 - 21 (pods dir) - 70 (/<uid>/volumes/kubernetes.io~empty-dir/) = 16 bytes"),
            "{note}"
        );
        assert!(note.ends_with("delivering over TCP"), "{note}");
    }

    #[test]
    fn resyncs_relists_and_unrelated_updates_never_repeat_an_event() {
        let mut node = Node::new(true);
        assert_eq!(node.apply(record("a", UID_A, Some(LONG), &[])).len(), 1);
        // The same object again (a resync), a relist of the same state, an unrelated label.
        assert!(node.apply(record("a", UID_A, Some(LONG), &[])).is_empty());
        assert!(node.relist(vec![record("a", UID_A, Some(LONG), &[])]).is_empty());
        assert!(node.apply(record("a", UID_A, Some(LONG), &[("team", "x")])).is_empty());
        // A policy on its service re-renders it (the note would change), but the cause does not.
        assert!(node.policies(vec![policy("p", "s/app.sock")]).is_empty());
        // Even re-observing every pod decides nothing.
        let all = node.all();
        assert!(node.observe(&all).is_empty());
    }

    #[test]
    fn a_different_cause_for_the_same_pod_is_a_new_event() {
        let mut node = Node::new(true);
        assert_eq!(reasons(&node.apply(record("a", UID_A, Some(LONG), &[]))), ["UdsPathTooLong"]);
        assert_eq!(reasons(&node.apply(record("a", UID_A, Some("../x"), &[]))), ["UdsInvalidSocket"]);
        assert_eq!(reasons(&node.apply(record("a", UID_A, Some("other/app.sock"), &[]))), ["UdsVolumeNotEmptyDir"]);
    }

    #[test]
    fn a_pod_delivered_over_its_socket_again_gets_one_normal_event_and_is_forgotten() {
        let mut node = Node::new(true);
        node.apply(record("a", UID_A, Some(LONG), &[]));
        let fixed = node.apply(record("a", UID_A, Some("s/app.sock"), &[]));
        assert_eq!(reasons(&fixed), [DELIVERED_REASON]);
        assert_eq!(fixed[0].severity, Severity::Normal);
        assert!(fixed[0].note.contains("UdsPathTooLong"), "{}", fixed[0].note);
        assert!(node.ledger.is_empty());
        // Breaking it again is reported again.
        assert_eq!(reasons(&node.apply(record("a", UID_A, Some(LONG), &[]))), ["UdsPathTooLong"]);
    }

    #[test]
    fn pods_never_reported_get_no_normal_event_and_plain_tcp_pods_get_nothing() {
        let mut node = Node::new(true);
        assert!(node.apply(record("a", UID_A, Some("s/app.sock"), &[])).is_empty());
        assert!(node.apply(record("b", UID_B, None, &[])).is_empty());
        // Removing the annotation of a reported pod forgets it silently (it no longer asks).
        node.apply(record("a", UID_A, Some(LONG), &[]));
        assert!(node.apply(record("a", UID_A, None, &[])).is_empty());
        assert!(node.ledger.is_empty());
    }

    #[test]
    fn a_deleted_pod_is_forgotten_and_a_recreated_one_with_a_new_uid_is_reported_again() {
        let mut node = Node::new(true);
        node.apply(record("a", UID_A, Some(LONG), &[]));
        assert!(node.relist(vec![]).is_empty());
        assert!(node.ledger.is_empty());
        assert_eq!(reasons(&node.apply(record("a", UID_B, Some(LONG), &[]))), ["UdsPathTooLong"]);
    }

    #[test]
    fn uds_disabled_reports_only_annotated_pods() {
        let mut node = Node::new(false);
        let n = node.apply(record("a", UID_A, Some("s/app.sock"), &[]));
        assert_eq!(reasons(&n), ["UdsDisabled"]);
        assert!(
            n[0].note.starts_with("pod shop/a: socket \"s/app.sock\": Unix socket delivery is disabled"),
            "{}",
            n[0].note
        );
        assert!(node.apply(record("b", UID_B, None, &[])).is_empty());
        // A policy from the state dir does not count as a request while policies are off.
        assert!(node.policies(vec![policy("p", "s/app.sock")]).is_empty());
    }

    #[test]
    fn an_on_disk_refusal_is_reported_and_clears_with_a_normal_event() {
        let mut node = Node::new(true);
        let rec = record("a", UID_A, Some("s/app.sock"), &[]);
        let key = rec.key();
        assert!(node.apply(rec).is_empty());
        node.refused.insert(key.clone(), Refusal::Symlink { path: "/x/app.sock".into() });
        let n = node.observe(std::slice::from_ref(&key));
        assert_eq!(reasons(&n), ["UdsSymlinkRefused"]);
        assert!(n[0].note.contains("/x/app.sock is a symlink"), "{}", n[0].note);
        assert!(node.observe(std::slice::from_ref(&key)).is_empty(), "a re-check finding the same is silent");
        node.refused.insert(key.clone(), Refusal::NotSocket { path: "/x/app.sock".into(), found: "regular file" });
        assert_eq!(reasons(&node.observe(std::slice::from_ref(&key))), ["UdsNotASocket"]);
        node.refused.clear();
        assert_eq!(reasons(&node.observe(std::slice::from_ref(&key))), [DELIVERED_REASON]);
    }

    #[test]
    fn a_policy_pod_whose_crd_went_away_is_reported_as_crd_missing_only_while_stranded() {
        let mut node = Node::new(true);
        node.policies(vec![policy("p", "s/app.sock")]);
        assert!(node.apply(record("a", UID_A, None, &[])).is_empty(), "piped by the policy");
        // The CRD is reported absent: the driver strands the key, then empties the policies.
        node.stranded = Some("p".into());
        let n = node.policies(vec![]);
        assert_eq!(reasons(&n), ["UdsPolicyCrdMissing"]);
        assert!(n[0].note.contains("EndpointPolicy shop/p governed service shop/cart"), "{}", n[0].note);
        // An annotated pod on the same key is not governed by the policy: no such event.
        assert!(node.apply(record("b", UID_B, Some("s/app.sock"), &[])).is_empty());
        // The CRD is back without the policy: the cause ends silently (plain TCP, not piped).
        node.stranded = None;
        let all = node.all();
        assert!(node.observe(&all).is_empty());
        assert!(node.ledger.is_empty());
    }

    #[test]
    fn the_ledger_round_trips_through_json_with_the_metric_tokens() {
        let mut l = Ledger::new();
        l.observe(UID_A, Some(TcpReason::PathTooLong), false);
        l.observe(UID_B, Some(TcpReason::PolicyCrdMissing), false);
        let text = serde_json::to_string(&l).unwrap();
        assert!(text.contains("\"path-too-long\"") && text.contains("\"policy-crd-missing\""), "{text}");
        assert_eq!(serde_json::from_str::<Ledger>(&text).unwrap(), l);
        for c in TcpReason::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.label(), "serde spelling of {c:?}");
            assert!(c.event_reason().starts_with("Uds") && !c.event_reason().contains('-'), "{}", c.event_reason());
        }
        let counts = by_label(&l.counts());
        assert_eq!((counts["path-too-long"], counts["symlink"]), (1, 0));
    }

    /// `pod-events.json` ledgers written by agents before the vocabulary was unified still load:
    /// the persisted spelling of every cause is unchanged.
    #[test]
    fn a_ledger_written_by_the_previous_agent_still_loads() {
        let written = serde_json::json!({"reported": {
            "a": "uds-disabled", "b": "budget-config", "c": "invalid-endpoint-annotation",
            "d": "invalid-annotation", "e": "invalid-policy", "f": "path-too-long",
            "g": "volume-not-emptydir", "h": "static-pod", "i": "bad-pod-uid", "j": "symlink",
            "k": "not-a-directory", "l": "not-a-socket", "m": "unreadable", "n": "policy-crd-missing"
        }});
        let l: Ledger = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(l.get("f"), Some(TcpReason::PathTooLong));
        assert_eq!(l.get("k"), Some(TcpReason::NotADirectory));
        assert_eq!(l.get("n"), Some(TcpReason::PolicyCrdMissing));
        assert_eq!(l.counts().values().filter(|n| **n == 1).count(), 14, "14 distinct causes: {:?}", l.counts());
        assert_eq!(serde_json::to_value(&l).unwrap(), written, "and is written back unchanged");
    }

    #[test]
    fn a_long_note_is_cut_to_the_api_limit_on_a_character_boundary() {
        let s = truncate("é".repeat(1000), NOTE_MAX_BYTES);
        assert!(s.len() <= NOTE_MAX_BYTES && s.ends_with('…'));
    }
}
