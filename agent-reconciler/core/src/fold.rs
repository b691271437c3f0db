//! The precedence fold: one pod, the winning policy of its service, the node's settings → one
//! [`Delivery`] (docs/contracts.md, "Precedence: which delivery a pod gets").
//!
//! Rules, in the order they are applied:
//! 0. A pod whose `endpoint.aether.io/ports` is over the per-pod cap ([`PodRecord::too_many_ports`])
//!    is served no clusters at all ([`TcpReason::TooManyPorts`]), whatever else it declares. The
//!    node's cluster cap (`--max-clusters`) is applied after the fold, by the index
//!    ([`crate::admission`], [`TcpReason::NodeClusterCap`]).
//! 1. `--uds-workloads=false` → TCP ([`TcpReason::UdsDisabled`]) for every pod.
//! 2. A pods dir that leaves no socket budget → TCP ([`TcpReason::BudgetConfig`]) for every pod.
//! 3. A pod with an unusable `endpoint.aether.io/*` annotation (port, ports, protocol, health
//!    path) → TCP on the defaults ([`TcpReason::InvalidEndpointAnnotation`]).
//! 4. The declared socket: a non-empty `endpoint.aether.io/uds-socket` annotation wins, *even an
//!    invalid one*; else the winning valid EndpointPolicy of the pod's service key (its namespace
//!    and ServiceAccount: Services are never looked at, so a policy applies whether or not a
//!    Service of that name exists, which the status writer reports as `AcceptedWithoutService`);
//!    else plain TCP ([`Source::NoSocketDeclared`]).
//! 5. The value must pass the grammar and fit the budget ([`TcpReason::InvalidAnnotation`],
//!    [`TcpReason::InvalidPolicy`], [`TcpReason::PathTooLong`]); an invalid annotation never
//!    falls back to the policy.
//! 6. The named volume must be an `emptyDir` volume of the pod ([`TcpReason::VolumeNotEmptyDir`]).
//! 7. The pod's directory id: the API UID ([`TcpReason::BadPodUid`] otherwise). Static (mirror)
//!    pods are always TCP ([`TcpReason::StaticPod`]): their directory is named by a config hash
//!    that any pod creator can forge in the mirror annotation.
//!
//! A failure degrades that one pod to TCP with a [`TcpReason`] (the one fallback vocabulary,
//! [`crate::fallback`]) and a human message; it never affects another pod.

use aether_crds::pod::UDS_SOCKET_ANNOTATION;
use aether_crds::tiebreak::{self, Resolution};
use aether_crds::udspath::{PodDirId, SocketError, SocketPath, UID_BYTES};

use crate::fallback::TcpReason;
use crate::record::{PodRecord, PolicyRecord};

pub use crate::settings::Settings;

/// Where a pod's delivery comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A pipe from the pod's `endpoint.aether.io/uds-socket` annotation.
    Annotation,
    /// A pipe from the winning EndpointPolicy of the pod's service.
    Policy,
    /// Plain TCP, not a fallback: neither the annotation nor a valid policy declares a socket.
    NoSocketDeclared,
    /// TCP loopback in the pod's netns (or `<pod IP>:<port>`) instead of a socket, and why.
    Tcp(TcpReason),
}

impl Source {
    /// The kebab-case label: `annotation`, `policy`, `no-socket-declared`, or the
    /// [`TcpReason::label`].
    pub fn label(self) -> &'static str {
        match self {
            Source::Annotation => "annotation",
            Source::Policy => "policy",
            Source::NoSocketDeclared => "no-socket-declared",
            Source::Tcp(reason) => reason.label(),
        }
    }
}

/// How the node proxy reaches one pod.
///
/// Invariant: `path` is `Some` exactly when `source` is [`Source::Annotation`] or
/// [`Source::Policy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Annotation, policy, plain TCP, or TCP with its fallback reason.
    pub source: Source,
    /// The declared socket value (`<volume>/<file>`) from the annotation or the winning policy,
    /// even when it was rejected; `None` when neither declares one.
    pub socket: Option<String>,
    /// The name of the EndpointPolicy whose socket was considered, if it came from one.
    pub policy: Option<String>,
    /// The resolved host path of the socket for a pipe: at most 107 bytes (sun_path) under
    /// `--socket-limit sun-path`; longer under `filesystem`, where Envoy dials only the pin.
    pub path: Option<SocketPath>,
    /// A human sentence saying why (names the annotation, policy, volume or rule).
    pub reason: String,
}

impl Delivery {
    /// True when the proxy dials a Unix socket.
    pub fn is_pipe(&self) -> bool {
        self.path.is_some()
    }

    /// The fallback reason; `None` for a pipe and for plain TCP ([`Source::NoSocketDeclared`]).
    pub fn tcp_reason(&self) -> Option<TcpReason> {
        match self.source {
            Source::Tcp(reason) => Some(reason),
            Source::Annotation | Source::Policy | Source::NoSocketDeclared => None,
        }
    }
}

/// The competition among `candidates` (all for one service key), decided by
/// [`aether_crds::tiebreak::resolve`] on each record's name and [`PolicyRecord::is_valid`]: the
/// *valid* one with the lexicographically smallest name (byte order) wins; invalid policies never
/// win and never shadow a valid one (the tie-break of docs/contracts.md, "Precedence: which
/// delivery a pod gets").
pub fn resolve_policies<'a>(candidates: impl IntoIterator<Item = &'a PolicyRecord>) -> Resolution<&'a PolicyRecord> {
    tiebreak::resolve(candidates, |p| p.name.as_str(), |p| p.is_valid())
}

/// The winning policy among `candidates` (all for one service key): the winner of
/// [`resolve_policies`].
pub fn select_policy<'a>(candidates: impl IntoIterator<Item = &'a PolicyRecord>) -> Option<&'a PolicyRecord> {
    resolve_policies(candidates).winner
}

/// Decides the delivery of one pod (the module doc lists the rules in order).
///
/// `policy` is the winner for the pod's service key (see [`select_policy`]); a policy that is
/// invalid or targets another service key is ignored. Pure and total: every failure becomes
/// a TCP delivery with its reason.
pub fn deliver(pod: &PodRecord, policy: Option<&PolicyRecord>, settings: &Settings) -> Delivery {
    let key = pod.service_key();
    let policy = policy.filter(|p| p.is_valid() && p.target == key);
    let (source, socket) = match (&pod.uds_socket, policy) {
        (Some(value), _) => (Source::Annotation, Some(value.as_str())),
        (None, Some(p)) => (Source::Policy, Some(p.socket.as_str())),
        (None, None) => (Source::NoSocketDeclared, None),
    };
    let policy_used = policy.filter(|_| source == Source::Policy).map(|p| p.name.clone());
    let origin = match (source, policy) {
        (Source::Policy, Some(p)) => format!("EndpointPolicy {}/{} for service {key}", p.namespace, p.name),
        _ => format!("annotation {UDS_SOCKET_ANNOTATION}"),
    };
    let tcp = |reason: TcpReason, message: String| Delivery {
        source: Source::Tcp(reason),
        socket: socket.map(str::to_owned),
        policy: policy_used.clone(),
        path: None,
        reason: message,
    };

    if let Some(over) = &pod.too_many_ports {
        return tcp(TcpReason::TooManyPorts, format!("{over}; serving the pod no clusters"));
    }
    if !settings.uds_workloads() {
        return tcp(
            TcpReason::UdsDisabled,
            "Unix socket delivery is disabled on this node (--uds-workloads=false)".into(),
        );
    }
    let budget = match settings.budget() {
        Ok(budget) => budget,
        Err(e) => return tcp(TcpReason::BudgetConfig, e.to_string()),
    };
    if let Some(defect) = pod.defects.first() {
        let more = if pod.defects.len() > 1 { format!(" (and {} more)", pod.defects.len() - 1) } else { String::new() };
        return tcp(TcpReason::InvalidEndpointAnnotation, format!("{defect}{more}; serving the defaults over TCP"));
    }
    let Some(value) = socket else {
        return Delivery {
            source: Source::NoSocketDeclared,
            socket: None,
            policy: None,
            path: None,
            reason: format!("no {UDS_SOCKET_ANNOTATION} annotation and no valid EndpointPolicy for service {key}"),
        };
    };
    let socket_error = |e: SocketError| {
        let reason = match (&e, source) {
            (SocketError::TooLong { .. }, _) => TcpReason::PathTooLong,
            (_, Source::Policy) => TcpReason::InvalidPolicy,
            _ => TcpReason::InvalidAnnotation,
        };
        let shadowed = match (source, policy) {
            (Source::Annotation, Some(p)) => {
                format!("; the annotation takes precedence, so EndpointPolicy {}/{} is not used", p.namespace, p.name)
            }
            _ => String::new(),
        };
        tcp(reason, format!("{origin}: {value:?} {e}{shadowed}"))
    };
    let volume = match budget.check(value) {
        Ok(parsed) => parsed.volume,
        Err(e) => return socket_error(e),
    };
    if !pod.empty_dirs.contains(volume) {
        return tcp(
            TcpReason::VolumeNotEmptyDir,
            format!("{origin}: {value:?} names volume {volume:?}, which is not an emptyDir volume of this pod"),
        );
    }
    let dir = match pod_dir(pod) {
        Ok(dir) => dir,
        Err((reason, message)) => return tcp(reason, message),
    };
    match budget.resolve(&dir, value) {
        Err(e) => socket_error(e),
        Ok(path) => {
            let placeholder = if dir.is_placeholder() { " (placeholder UID: offline plan)" } else { "" };
            Delivery {
                source,
                socket: Some(value.to_owned()),
                policy: policy_used.clone(),
                path: Some(path),
                reason: format!("{origin}: {value:?}{placeholder}"),
            }
        }
    }
}

/// The pod's directory under the pods dir: its API UID. Static (mirror) pods are never piped:
/// kubelet keeps their volumes under the config hash named in the `kubernetes.io/config.mirror`
/// annotation, and whoever can create pods can write that annotation (and a Node owner reference)
/// on an ordinary pod, pointing it at another static pod's directory. Fail closed: TCP.
fn pod_dir(pod: &PodRecord) -> Result<PodDirId, (TcpReason, String)> {
    if let Some(mirror) = &pod.static_pod {
        return Err((
            TcpReason::StaticPod,
            format!(
                "static pod (kubernetes.io/config.mirror {:?}): its volumes live under a config hash any pod creator can forge, so it is never delivered over a socket",
                mirror.config_hash
            ),
        ));
    }
    PodDirId::new(&pod.uid)
        .ok()
        .filter(|id| id.as_str().len() == UID_BYTES)
        .ok_or_else(|| (TcpReason::BadPodUid, format!("pod UID {:?} is not a canonical lowercase UUID", pod.uid)))
}
