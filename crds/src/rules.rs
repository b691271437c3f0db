//! The rules one process decides with, built once at start-up from its configured pods dir.
//!
//! The webhook, `aether-controller validate`, the status writer and the agent all judge socket
//! values and policies against the sun_path budget of one pods dir (DESIGN.md "Socket value and
//! path"). A pods dir that leaves no budget is a configuration error that each of them reports
//! in its own words, so [`Rules`] keeps either the [`Budget`] or that [`PodsDirError`], and every
//! check hands the error back instead of deciding.

use serde_json::Value;

use crate::policy::EndpointPolicySpec;
use crate::udspath::{Budget, PodsDirError};
use crate::validate::{self, Verdict};

/// The budget of the configured pods dir, or why it has none. Cheap to clone; build it once with
/// [`Rules::new`] and share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    budget: Result<Budget, PodsDirError>,
}

impl Rules {
    /// The rules for `pods_dir`, the kubelet pods dir *as the proxy sees it*
    /// (`--kubelet-pods-dir`). A pods dir without a usable budget is kept as its error (see
    /// [`Budget::new`]): callers report it at start-up and refuse every socket with it.
    pub fn new(pods_dir: &str) -> Self {
        Rules { budget: Budget::new(pods_dir) }
    }

    /// The socket budget.
    ///
    /// # Errors
    /// The [`PodsDirError`] of [`Budget::new`] for the configured pods dir.
    pub fn budget(&self) -> Result<&Budget, &PodsDirError> {
        self.budget.as_ref()
    }

    /// [`validate::review`] of one object given as JSON against the budget: the webhook's
    /// decision.
    ///
    /// # Errors
    /// The configuration error, when there is no budget to decide with.
    pub fn review(&self, object: &Value) -> Result<Verdict, &PodsDirError> {
        Ok(validate::review(object, self.budget()?))
    }

    /// [`validate::validate_spec`] of a typed spec against the budget, as a [`Verdict`].
    ///
    /// # Errors
    /// The configuration error, when there is no budget to decide with.
    pub fn review_spec(&self, spec: &EndpointPolicySpec) -> Result<Verdict, &PodsDirError> {
        let violations = validate::validate_spec(spec, self.budget()?).err().unwrap_or_default();
        Ok(Verdict { violations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{EndpointPolicy, TargetRef};
    use crate::udspath::DEFAULT_PODS_DIR;

    // Not aether_fixtures::policy: fixtures depends on this crate, so here its EndpointPolicy would be another type.
    fn policy(socket: &str) -> EndpointPolicy {
        let target_ref = TargetRef { group: String::new(), kind: "Service".into(), name: "echo".into() };
        EndpointPolicy::new("p", EndpointPolicySpec { target_ref, uds_socket: socket.into() })
    }

    #[test]
    fn review_and_review_spec_give_the_same_verdict_for_a_typed_policy() {
        let rules = Rules::new(DEFAULT_PODS_DIR);
        for socket in ["s/app.sock", "sockets/too-long-app.sock", "a/b/c"] {
            let p = policy(socket);
            let object = serde_json::to_value(&p).unwrap();
            assert_eq!(rules.review(&object), rules.review_spec(&p.spec), "{socket}");
        }
        assert!(rules.review_spec(&policy("s/app.sock").spec).unwrap().allowed());
    }

    #[test]
    fn rules_without_a_budget_hand_back_the_configuration_error_instead_of_deciding() {
        let rules = Rules::new("/var/snap/microk8s/common/var/lib/kubelet/pods");
        let err = rules.budget().unwrap_err().clone();
        assert!(matches!(err, PodsDirError::BudgetTooSmall { budget: -9, .. }), "{err}");
        assert_eq!(rules.review_spec(&policy("s/a").spec), Err(&err));
        assert_eq!(rules.review(&serde_json::to_value(policy("s/a")).unwrap()), Err(&err));
    }
}
