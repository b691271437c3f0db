//! The one vocabulary of TCP-fallback reasons: why a pod that could be delivered over its Unix
//! socket is delivered over TCP; and of the two cap refusals ([`Detail::Cap`]): why a
//! pod is served no clusters at all, whatever its delivery.
//!
//! Every reason is declared once, in the `vocabulary!` list at the bottom of this file, with
//! everything that is said about it:
//!
//! | property | method | used as |
//! |---|---|---|
//! | label | [`TcpReason::label`] | kebab-case token: the metric label `reason` (`aether_agent_tcp_fallbacks`, `aether_agent_pod_events_total`), the log field `reason`, the `--state-dir/pod-events.json` spelling, the `aether-agent plan` prefix |
//! | Event reason | [`TcpReason::event_reason`] | the CamelCase `reason` of the pod's Warning Event |
//! | detail | [`TcpReason::detail`] | where the reason is decided and what the Event note adds to the fold's sentence (the budget arithmetic, the on-disk refusal, the stranded policy) |
//! | meaning | [`TcpReason::meaning`] | the variant's doc comment: one sentence for an operator |
//! | remedy | [`TcpReason::remedy`] | what an operator should do about it |
//!
//! [`TcpReason::ALL`] is generated from the same list, so metrics (which list every label, also
//! at zero) cannot miss a reason. The operator table in `docs/workload-requirements.md` ("Why did
//! my pod stay on TCP?") is checked against this list by a test.
//!
//! Adding a reason: one entry in the list below, the rule that produces it (the fold in
//! [`crate::fold::deliver`], an on-disk [`crate::refusal::Refusal`], or
//! [`crate::pod_events::classify`]), and the row the docs test prints.
//!
//! Plain TCP (no socket declared) is not a fallback and has no reason here: it is
//! [`crate::fold::Source::NoSocketDeclared`]. A cap refusal ([`TcpReason::serves_nothing`]) is
//! reported for every pod it hits, whether or not it asked for a socket.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where a [`TcpReason`] is decided, and so what the detail of its Event note is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Detail {
    /// Decided by the precedence fold; the note is the fold's sentence ([`crate::fold::Delivery::reason`]).
    Fold,
    /// Decided by the fold against the byte budget; the note adds the budget arithmetic
    /// (`107 - len(pods dir) - 70 = N bytes`) when the node has a budget.
    FoldWithBudget,
    /// Decided by the on-disk check (`aether_agent_reconciler::fscheck`); the note adds the refusal.
    Refusal,
    /// Decided from the CRD's absence; the note names the policy that governed the pod's service
    /// key when the EndpointPolicy CRD went away.
    StrandedPolicy,
    /// A cap on what the node's Envoy is given, so one pod cannot fill its memory
    /// (docs/workload-requirements.md, "Ports per pod and clusters per node"): the per-pod port cap
    /// (decided by the fold) or the node's `--max-clusters` (decided by [`crate::admission`] in the
    /// index). The pod is served *no clusters at all*, over TCP or its socket; the note names the
    /// count and the cap.
    Cap,
}

/// What the vocabulary says about one reason.
struct Entry {
    label: &'static str,
    event: &'static str,
    detail: Detail,
    meaning: &'static str,
    remedy: &'static str,
}

/// Declares [`TcpReason`], [`TcpReason::ALL`] and every property from one list, so that a reason
/// cannot be added without its label, Event reason, detail, meaning and remedy, nor be left out
/// of `ALL`.
macro_rules! vocabulary {
    ($(
        $(#[doc = $doc:literal])+
        $variant:ident {
            label: $label:literal,
            event: $event:literal,
            detail: $detail:ident,
            remedy: $remedy:literal $(,)?
        }
    )+) => {
        /// Why a pod is delivered over TCP instead of its Unix socket: one reason from the fold,
        /// the on-disk check or the CRD watch. See the [module docs](self) for its properties.
        ///
        /// | Event reason | label | meaning |
        /// |---|---|---|
        $(
            #[doc = concat!("| `", $event, "` | `", $label, "` |", $($doc,)+ " |")]
        )+
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum TcpReason {
            $(
                $(#[doc = $doc])+
                $variant,
            )+
        }

        impl TcpReason {
            /// Every reason, in declaration order. Generated from the list that declares the
            /// enum, so it cannot miss a variant.
            pub const ALL: &'static [TcpReason] = &[$(TcpReason::$variant),+];

            /// Every label, in the order of [`TcpReason::ALL`].
            const LABELS: &'static [&'static str] = &[$($label),+];

            const fn entry(self) -> Entry {
                match self {
                    $(
                        TcpReason::$variant => Entry {
                            label: $label,
                            event: $event,
                            detail: Detail::$detail,
                            meaning: concat!($($doc),+),
                            remedy: $remedy,
                        },
                    )+
                }
            }
        }
    };
}

impl TcpReason {
    /// The kebab-case label, e.g. `path-too-long`: the metric label `reason`, the log field
    /// `reason`, and the spelling in `--state-dir/pod-events.json`.
    pub const fn label(self) -> &'static str {
        self.entry().label
    }

    /// The Event `reason`: a CamelCase token (Kubernetes API conventions), e.g. `UdsPathTooLong`.
    pub const fn event_reason(self) -> &'static str {
        self.entry().event
    }

    /// Where the reason is decided and what the Event note adds to the fold's sentence.
    pub const fn detail(self) -> Detail {
        self.entry().detail
    }

    /// One sentence for an operator: what happened (the variant's doc comment, trimmed).
    pub fn meaning(self) -> &'static str {
        self.entry().meaning.trim()
    }

    /// What an operator should do about it.
    pub const fn remedy(self) -> &'static str {
        self.entry().remedy
    }

    /// True for the cap refusals ([`Detail::Cap`]): the pod is served no clusters at all, not
    /// TCP.
    pub const fn serves_nothing(self) -> bool {
        matches!(self.detail(), Detail::Cap)
    }

    /// The reason whose [`TcpReason::label`] is `label`.
    pub fn from_label(label: &str) -> Option<TcpReason> {
        TcpReason::ALL.iter().copied().find(|r| r.label() == label)
    }
}

impl fmt::Display for TcpReason {
    /// The [`TcpReason::label`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Serialized as its [`TcpReason::label`] (the `--state-dir/pod-events.json` spelling).
impl Serialize for TcpReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.label())
    }
}

/// Read from its [`TcpReason::label`]. If a label is ever renamed, map its old spelling here so
/// that state dirs written by earlier agents still load.
impl<'de> Deserialize<'de> for TcpReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let label = String::deserialize(deserializer)?;
        TcpReason::from_label(&label).ok_or_else(|| D::Error::unknown_variant(&label, TcpReason::LABELS))
    }
}

vocabulary! {
    /// Unix socket delivery is off on this node (`--uds-workloads=false`); reported for pods with
    /// the annotation only, since policies are not watched then.
    UdsDisabled {
        label: "uds-disabled",
        event: "UdsDisabled",
        detail: Fold,
        remedy: "enable it: chart value `proxy.udsWorkloads.enabled=true` (agent flag `--uds-workloads`)",
    }
    /// The kubelet pods dir leaves less than the shortest socket value (`a/b`, 3 bytes) in
    /// sun_path, so no socket fits on this node.
    BudgetConfig {
        label: "budget-config",
        event: "UdsNoSocketBudget",
        detail: Fold,
        remedy: "mount the pods dir at a shorter path: chart value `proxy.udsWorkloads.mountPath`",
    }
    /// An `endpoint.aether.io/port`, `ports`, `protocol`, `health-path`, `grpc-health-service` or `inbound-proxy`
    /// annotation is unusable; the pod runs on the defaults over TCP.
    InvalidEndpointAnnotation {
        label: "invalid-endpoint-annotation",
        event: "UdsInvalidEndpointAnnotation",
        detail: Fold,
        remedy: "fix the annotation the Event names",
    }
    /// The `endpoint.aether.io/uds-socket` annotation breaks the `<volume>/<file>` grammar (an
    /// invalid annotation still wins over a policy).
    InvalidAnnotation {
        label: "invalid-annotation",
        event: "UdsInvalidSocket",
        detail: Fold,
        remedy: "fix or remove the annotation",
    }
    /// The winning EndpointPolicy's socket fails the agent's own check (e.g. admitted under
    /// another pods dir): the agent does not trust admission.
    InvalidPolicy {
        label: "invalid-policy",
        event: "UdsInvalidPolicySocket",
        detail: Fold,
        remedy: "fix the policy's `spec.udsSocket`",
    }
    /// The socket value is longer than the byte budget of this node's pods dir: the path would
    /// not fit in sun_path.
    PathTooLong {
        label: "path-too-long",
        event: "UdsPathTooLong",
        detail: FoldWithBudget,
        remedy: "shorter volume and file names, or a shorter pods-dir mount path",
    }
    /// The named volume is missing or not an emptyDir volume of the pod (policy/pod-template
    /// drift).
    VolumeNotEmptyDir {
        label: "volume-not-emptydir",
        event: "UdsVolumeNotEmptyDir",
        detail: Fold,
        remedy: "add the emptyDir volume to the pod, or fix the volume name",
    }
    /// A static (mirror) pod: its volumes live under a config hash any pod creator can forge, so
    /// it is always delivered over TCP.
    StaticPod {
        label: "static-pod",
        event: "UdsStaticPod",
        detail: Fold,
        remedy: "none: run the workload as an ordinary pod to use its socket",
    }
    /// The pod UID is not a canonical lowercase UUID, so it cannot name a directory.
    BadPodUid {
        label: "bad-pod-uid",
        event: "UdsBadPodUid",
        detail: Fold,
        remedy: "none: the API server assigns UIDs; report it",
    }
    /// The on-disk `lstat` check found a symlink on the way to the socket (pod dir, volume dir or
    /// the socket itself); a pipe is never rendered through a link.
    Symlink {
        label: "symlink",
        event: "UdsSymlinkRefused",
        detail: Refusal,
        remedy: "let the app create a real socket in a real emptyDir, then re-create the pod (a link refusal lasts the pod's life)",
    }
    /// The on-disk `lstat` check found something other than a directory where a directory must be
    /// (pod dir, `volumes`, `kubernetes.io~empty-dir`, the volume dir).
    NotADirectory {
        label: "not-a-directory",
        event: "UdsNotADirectory",
        detail: Refusal,
        remedy: "let the app create a real socket in a real emptyDir",
    }
    /// The on-disk `lstat` check found something other than a Unix socket at the socket path (e.g.
    /// a regular file).
    NotASocket {
        label: "not-a-socket",
        event: "UdsNotASocket",
        detail: Refusal,
        remedy: "let the app create a real socket in a real emptyDir",
    }
    /// The socket file has more than one hard link: another name (possibly another pod's) reaches
    /// the same socket, so it is not this pod's own.
    HardLink {
        label: "hard-link",
        event: "UdsHardLinkRefused",
        detail: Refusal,
        remedy: "let the app create a real socket in a real emptyDir, then re-create the pod (a link refusal lasts the pod's life)",
    }
    /// The on-disk check could not `lstat` a component of the socket path.
    Unreadable {
        label: "unreadable",
        event: "UdsPathUnreadable",
        detail: Refusal,
        remedy: "check the agent's read access to the pods dir mount (the Event names the OS error)",
    }
    /// The pod's service had a winning EndpointPolicy, but the EndpointPolicy CRD is no longer
    /// served (until it is served again).
    PolicyCrdMissing {
        label: "policy-crd-missing",
        event: "UdsPolicyCrdMissing",
        detail: StrandedPolicy,
        remedy: "reinstall `charts/aether-crds`",
    }
    /// The pod declares more than 64 ports, or an `endpoint.aether.io/ports` value over 1024 bytes
    /// (not read): it is served no clusters at all, so one pod cannot fill the node proxy's memory.
    TooManyPorts {
        label: "too-many-ports",
        event: "UdsTooManyPorts",
        detail: Cap,
        remedy: "declare at most 64 ports (one pod per role if it serves more)",
    }
    /// The node's Envoy already has `--max-clusters` clusters for pods admitted before this one: it
    /// is served no clusters at all until room frees (pods admitted first keep theirs).
    NodeClusterCap {
        label: "node-cluster-cap",
        event: "UdsNodeClusterCapReached",
        detail: Cap,
        remedy: "raise chart value `agent.maxClusters` together with `proxy.resources.limits.memory`, or spread the pods over more nodes",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn is_kebab(s: &str) -> bool {
        !s.is_empty()
            && !s.starts_with('-')
            && !s.ends_with('-')
            && !s.contains("--")
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    #[test]
    fn every_reason_has_a_distinct_kebab_label_and_a_distinct_event_reason() {
        let mut labels = HashSet::new();
        let mut events = HashSet::new();
        // `ALL` is generated from the list that declares the enum; it holds every discriminant
        // once, in order (no variant left out, none twice).
        for (i, r) in TcpReason::ALL.iter().copied().enumerate() {
            assert_eq!(r as usize, i, "{r:?} is listed once, in declaration order");
            assert!(is_kebab(r.label()), "{r:?}: label {:?} is not kebab-case", r.label());
            assert!(labels.insert(r.label()), "{r:?}: label {:?} is taken", r.label());
            let event = r.event_reason();
            assert!(
                event.starts_with("Uds") && event.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{r:?}: Event reason {event:?} is not a CamelCase `Uds...` token"
            );
            assert!(events.insert(event), "{r:?}: Event reason {event:?} is taken");
            assert!(!r.meaning().is_empty() && !r.remedy().is_empty(), "{r:?} says what and what to do");
            assert!(!r.meaning().contains('|') && !r.remedy().contains('|'), "{r:?}: no `|` (a table cell)");
            assert_eq!(TcpReason::from_label(r.label()), Some(r));
            assert_eq!(r.to_string(), r.label());
        }
        assert_eq!(TcpReason::LABELS.len(), TcpReason::ALL.len());
        assert_eq!(TcpReason::from_label("no-socket-declared"), None, "plain TCP is not a fallback");
    }

    #[test]
    fn every_reason_round_trips_through_its_persisted_label() {
        for r in TcpReason::ALL.iter().copied() {
            let json = serde_json::to_value(r).unwrap();
            assert_eq!(json, r.label(), "persisted spelling of {r:?}");
            assert_eq!(serde_json::from_value::<TcpReason>(json).unwrap(), r);
        }
        let err = serde_json::from_str::<TcpReason>("\"no-such-reason\"").unwrap_err().to_string();
        assert!(err.contains("no-such-reason") && err.contains("path-too-long"), "{err}");
    }

    #[test]
    fn the_detail_matches_where_each_reason_is_decided() {
        use crate::refusal::Refusal;
        let refusals = [
            Refusal::Symlink { path: "/p".into() },
            Refusal::NotDirectory { path: "/p".into() },
            Refusal::NotSocket { path: "/p".into(), found: "regular file" },
            Refusal::HardLink { path: "/p".into(), links: 2 },
            Refusal::Unreadable { path: "/p".into(), error: "EACCES".into() },
        ];
        let from_disk: HashSet<TcpReason> = refusals.iter().map(Refusal::tcp_reason).collect();
        assert_eq!(from_disk.len(), refusals.len(), "each refusal has its own reason");
        for r in TcpReason::ALL.iter().copied() {
            assert_eq!(r.detail() == Detail::Refusal, from_disk.contains(&r), "{r:?}");
        }
        assert_eq!(TcpReason::PolicyCrdMissing.detail(), Detail::StrandedPolicy);
        assert_eq!(TcpReason::PathTooLong.detail(), Detail::FoldWithBudget);
        let caps: Vec<TcpReason> = TcpReason::ALL.iter().copied().filter(|r| r.serves_nothing()).collect();
        assert_eq!(caps, [TcpReason::TooManyPorts, TcpReason::NodeClusterCap], "only the caps serve nothing");
    }

    /// The operator text of the port cap states the record's constants, so the docs cannot drift
    /// from the code.
    #[test]
    fn the_port_cap_reason_states_the_caps_the_record_applies() {
        use crate::record::{MAX_PORTS, MAX_PORTS_ANNOTATION_BYTES};
        let says = format!("{} {}", TcpReason::TooManyPorts.meaning(), TcpReason::TooManyPorts.remedy());
        for number in [format!("{MAX_PORTS} ports"), format!("{MAX_PORTS_ANNOTATION_BYTES} bytes")] {
            assert!(says.contains(&number), "{number:?} missing from {says:?}");
        }
    }

    /// The operator table of `docs/workload-requirements.md` lists every reason as declared here.
    #[test]
    fn the_operator_docs_list_every_reason() {
        let doc = include_str!("../../../docs/workload-requirements.md");
        let mut missing = Vec::new();
        for r in TcpReason::ALL.iter().copied() {
            let meaning = r.meaning().split_whitespace().collect::<Vec<_>>().join(" ");
            let row = format!("| `{}` | `{}` | {meaning} | {} |", r.event_reason(), r.label(), r.remedy());
            if !doc.lines().any(|l| l.trim() == row) {
                missing.push(row);
            }
        }
        assert!(
            missing.is_empty(),
            "docs/workload-requirements.md lacks these rows (paste them into its table):\n{}",
            missing.join("\n")
        );
    }
}
