//! The reconcile loop's input ([`Event`]): what the watches, the container runtime, the socket
//! watch, Envoy's config dump and the re-check timer tell the loop ([`crate::driver`]). Not to be
//! confused with a pod Event, the Kubernetes Event the agent publishes on a pod
//! ([`crate::pod_events`]).
//!
//! A watched [`Pod`] is read here, and only here ([`Event::pod_applied`], [`Event::pod_deleted`],
//! [`listed_record`]): the loop is handed records, never Pod objects.

use k8s_openapi::api::core::v1::Pod;

use aether_agent_core::record::{self, PodRecord};
use aether_crds::EndpointPolicy;

use crate::runtime::NetnsUpdate;
use crate::xds::bind_failures::BindFailure;

/// What the watch drivers tell the loop.
#[derive(Debug)]
pub enum Event {
    /// A pod on this node was added or changed, and is managed and unfinished: its record.
    PodApplied(Box<PodRecord>),
    /// A pod on this node is no longer served: deleted, no longer managed, or finished (phase
    /// `Succeeded`/`Failed`).
    PodGone(PodGone),
    /// The records of a complete list of this node's managed pods (start-up, or a relist after
    /// 410 Gone), made by the watch as each pod arrives so the list is never held as Pod objects
    /// ([`crate::watch`]). Finished pods have no record, so they count as absent: they and their
    /// state-dir records are pruned.
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
    InboundBindFailed(Vec<BindFailure>),
    /// One of Envoy's ADS streams ended (an Envoy exited, or its stream broke): whatever held the
    /// ports of withdrawn inbound listeners may be gone, so they are offered again
    /// ([`aether_agent_core::reoffer`]).
    EnvoyStreamEnded,
    /// Something was created, removed or renamed in these pods' volume dirs
    /// ([`crate::socket_watch`]): re-verify (and re-pin) them now.
    SocketsChanged(Vec<String>),
    /// No Kubernetes client can be configured at all (no in-cluster environment, no kubeconfig):
    /// no pod list will ever come, so the state dir is all there is to serve and a holding loop
    /// serves it now ([`aether_agent_core::status::Status::holding_xds`]).
    NoApiServer,
}

/// A pod the loop stops serving, as read from its last Pod object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodGone {
    /// `metadata.uid`.
    pub uid: String,
    /// `<namespace>/<name>`, for log lines (a missing part is empty).
    pub name: String,
    /// `status.phase` of a finished pod (`Succeeded` or `Failed`), logged when its clusters go;
    /// `None` for a pod that did not finish.
    pub finished: Option<String>,
}

impl PodGone {
    /// What the loop needs of `pod` to remove it; `None` without a UID (nothing to remove).
    pub fn of(pod: &Pod) -> Option<PodGone> {
        let uid = pod.metadata.uid.clone()?;
        let finished =
            record::is_finished(pod).then(|| pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default());
        Some(PodGone { uid, name: pod_name(pod), finished })
    }
}

impl Event {
    /// The event for a pod the watch saw added or changed: [`Event::PodApplied`] with its record,
    /// or [`Event::PodGone`] for a pod that is not managed or has finished. `None` for a pod the
    /// agent cannot read (logged, as for a listed pod) and for a pod not served without a UID.
    pub fn pod_applied(pod: &Pod) -> Option<Event> {
        match read(pod)? {
            Some(rec) => Some(Event::PodApplied(Box::new(rec))),
            None => PodGone::of(pod).map(Event::PodGone),
        }
    }

    /// The event for a pod the watch saw deleted; `None` without a UID (nothing to remove).
    pub fn pod_deleted(pod: &Pod) -> Option<Event> {
        PodGone::of(pod).map(Event::PodGone)
    }
}

/// The record of a pod of a complete list ([`Event::PodsListed`]): `None` for a pod that is not
/// managed or has finished, and for a pod the agent cannot read (logged).
pub fn listed_record(pod: &Pod) -> Option<PodRecord> {
    read(pod).flatten()
}

/// [`PodRecord::from_pod`]: `Some(None)` for a pod not served (not managed, or finished), `None`
/// for a pod that cannot be read, which is logged with the error.
fn read(pod: &Pod) -> Option<Option<PodRecord>> {
    match PodRecord::from_pod(pod) {
        Ok(rec) => Some(rec),
        Err(e) => {
            tracing::warn!(pod = %pod_name(pod), error = %e, "ignoring a pod the agent cannot read");
            None
        }
    }
}

/// `<namespace>/<name>`, for log lines.
fn pod_name(pod: &Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""))
}
