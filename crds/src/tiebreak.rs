//! One policy per Service: the deterministic tie-break (spec Phase 1b "Precedence").
//!
//! Two EndpointPolicies targeting one Service are a configuration error, not a merge: among the
//! *valid* ones the lexicographically smallest `metadata.name` wins (byte order, as Go's string
//! comparison in the spec's `serviceScopedFilter`). Determinism keeps the winner from flipping
//! with map iteration order and churning the snapshot. This deliberately differs from GEP-713's
//! oldest-wins.

use std::fmt;

/// The mesh service key `<namespace>/<name>` (DESIGN.md "Contracts"): for a pod, its namespace and
/// ServiceAccount; for a policy, its namespace and `spec.targetRef.name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The namespace.
    pub namespace: String,
    /// The Service (= ServiceAccount) name.
    pub name: String,
}

impl ServiceKey {
    /// Builds a key from its two parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ServiceKey { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Picks the winning policy among the valid candidates for one Service: the one whose name
/// (as returned by `name`) is smallest in byte order. `None` when there is no candidate.
pub fn winner<'n, T>(candidates: impl IntoIterator<Item = T>, name: impl Fn(&T) -> &'n str) -> Option<T> {
    candidates.into_iter().min_by(|a, b| name(a).cmp(name(b)))
}
