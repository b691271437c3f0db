//! What the agent reports to the admin endpoints and metrics, kept here so neither imports the
//! driver or the watch tasks:
//!
//! - [`Status`]: plain counts, written by the reconcile loop, read by `/readyz` and `/metrics`.
//! - [`WatchHealth`]: one per watch the agent runs (this node's pods, the EndpointPolicies),
//!   written by the watch tasks: `syncing`, `ok`, `failing since <t>: <reason>: <cause>` or `off`;
//!   [`WatchErrorReason`] is the closed set of failure reasons (the metric label), [`Transition`]
//!   says when a change deserves a log line (once per outage and once per recovery, never per
//!   retry), and [`overdue`] is the readiness rule: `/readyz` is 503 while a *required* watch has
//!   been failing for at least the grace period (`--watch-grace-seconds`).

use std::collections::{BTreeMap, HashMap};
/// What the loop reports to the admin endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Managed pods by effective delivery: `pipe`, `tcp`, `waiting`.
    pub pods: HashMap<&'static str, usize>,
    /// `Some(true)` once policies are watched, `Some(false)` while the CRD is absent, `None`
    /// before the API server answered.
    pub crd_installed: Option<bool>,
    /// True once the first complete pod list arrived from the API server.
    pub pods_synced: bool,
    /// True while the agent holds Envoy's ADS streams unanswered because it has nothing complete
    /// to serve yet: no pod was replayed from the state dir, and the first pod list or the listed
    /// socket pods' network namespaces have not arrived. Envoy keeps its last config meanwhile,
    /// instead of being offered fewer listeners and clusters than a previous agent served.
    pub holding_xds: bool,
    /// Set when `holding_xds` turns false: the number of the driver's publication to the xDS
    /// encoder task that completed the state. The ADS server answers once the resources it
    /// serves hold that publication (the encoder task debounces), so its first answer is the
    /// complete state.
    pub serve_from_publication: u64,
    /// Open policy conflicts.
    pub conflicts: usize,
    /// Managed pods by `(delivery, source)`: delivery `pipe`/`tcp`/`waiting`, source
    /// `annotation`/`policy`/`none` (where the socket request came from).
    pub by_source: BTreeMap<(&'static str, &'static str), usize>,
    /// Pods that asked for a socket and are delivered over TCP, by cause label
    /// ([`crate::TcpReason::label`]); every cause listed.
    pub fallbacks: BTreeMap<&'static str, usize>,
    /// Until when an LDS NACK is taken as the failure of a re-offer of withdrawn inbound
    /// listeners ([`crate::reoffer`]) rather than a configuration Envoy rejects: `/readyz` does
    /// not fail for it meanwhile. `None` before any re-offer.
    pub reoffer_grace_until: Option<std::time::Instant>,
}

// ------------------------------------------------------------------------------ watch health

/// The watch-health vocabulary, shared with the controller (crate `aether-watch-health`, pure
/// part: no kube client, no async runtime).
pub use aether_watch_health::{Transition, WatchErrorReason, WatchHealth, WatchPhase, overdue};
