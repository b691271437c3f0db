//! What the reconcile loop reports to the admin endpoints and metrics: plain counts, written by
//! the driver and read by `/readyz` and `/metrics` (kept here so neither imports the driver).

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
    /// Open policy conflicts.
    pub conflicts: usize,
    /// Managed pods by `(delivery, source)`: delivery `pipe`/`tcp`/`waiting`, source
    /// `annotation`/`policy`/`none` (where the socket request came from).
    pub by_source: BTreeMap<(&'static str, &'static str), usize>,
    /// Pods that asked for a socket and are delivered over TCP, by cause label
    /// ([`crate::TcpReason::label`]); every cause listed.
    pub fallbacks: BTreeMap<&'static str, usize>,
}
