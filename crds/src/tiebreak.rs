//! One policy per Service: the deterministic tie-break (docs/endpointpolicy.md, "Which pods a
//! policy reaches").
//!
//! Two EndpointPolicies targeting one Service are a configuration error, not a merge: among the
//! *valid* ones the lexicographically smallest `metadata.name` wins (byte order, as Go's string
//! comparison in the spec's `serviceScopedFilter`). Invalid policies never win and never shadow a
//! valid one. Determinism keeps the winner from flipping with map iteration order and churning
//! the snapshot. This deliberately differs from GEP-713's oldest-wins.
//!
//! [`resolve`] is the one place this rule is written: the agent's fold and index, the status
//! writer, the webhook's and `aether-controller validate`'s warnings all call it. The competition
//! is per [`ServiceKey`], whether or not a Service of that name exists (the agent matches pods by
//! ServiceAccount and never looks at Services), so the status writer reports a loser
//! `Conflicted` with or without the Service.

use std::fmt;

use crate::policy::EndpointPolicy;

/// The mesh service key `<namespace>/<name>` (docs/endpointpolicy.md, "Which pods a policy
/// reaches"): for a pod, its namespace and ServiceAccount; for a policy, its namespace and
/// `spec.targetRef.name`.
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

    /// The key a policy competes for: `<metadata.namespace>/<spec.targetRef.name>` (a missing
    /// namespace reads as `""`).
    pub fn of_policy(policy: &EndpointPolicy) -> Self {
        ServiceKey::new(policy.metadata.namespace.as_deref().unwrap_or_default(), &policy.spec.target_ref.name)
    }

    /// True when `policy` competes for this key ([`ServiceKey::of_policy`] equals it), without
    /// building its key.
    pub fn is_targeted_by(&self, policy: &EndpointPolicy) -> bool {
        policy.metadata.namespace.as_deref().unwrap_or_default() == self.namespace
            && policy.spec.target_ref.name == self.name
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The outcome of the competition for one service key, over candidates of type `T` (a policy, a
/// reference to one, or just its name).
///
/// Every candidate lands in exactly one place: the winner, `conflicted` or `invalid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution<T> {
    /// The valid candidate with the smallest name in byte order; `None` when no candidate is
    /// valid (invalid ones never win).
    pub winner: Option<T>,
    /// The other valid candidates (they lose to the winner and are reported as Conflicted), in
    /// name order.
    pub conflicted: Vec<T>,
    /// The invalid candidates (they never take part), in name order.
    pub invalid: Vec<T>,
}

impl<T> Resolution<T> {
    /// True when two or more valid candidates compete: a configuration error to report.
    pub fn is_conflict(&self) -> bool {
        !self.conflicted.is_empty()
    }
}

/// Resolves the competition among the candidates for **one** service key (the caller selects
/// them: same namespace, same `spec.targetRef.name`). The rule: among
/// the candidates for which `valid` holds, the one whose `name` is lexicographically smallest in
/// byte order wins; the other valid ones are conflicted; invalid ones never win.
///
/// Deterministic whatever the input order. Candidates with equal names keep their input order
/// (the first one wins), which only matters for callers that pass duplicates.
pub fn resolve<T>(
    candidates: impl IntoIterator<Item = T>,
    name: impl Fn(&T) -> &str,
    valid: impl Fn(&T) -> bool,
) -> Resolution<T> {
    let (mut valid, mut invalid): (Vec<T>, Vec<T>) = candidates.into_iter().partition(|c| valid(c));
    valid.sort_by(|a, b| name(a).cmp(name(b)));
    invalid.sort_by(|a, b| name(a).cmp(name(b)));
    let mut valid = valid.into_iter();
    let winner = valid.next();
    Resolution { winner, conflicted: valid.collect(), invalid }
}
