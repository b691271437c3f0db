//! The rules one process decides with, built once at start-up from its configured pods dir and
//! socket limit.
//!
//! The webhook, `aether-controller validate`, the status writer and the agent all judge socket
//! values and policies against the budget of one pods dir under one [`SocketLimit`]
//! (docs/endpointpolicy.md, "The socket budget"; `--socket-limit`). A pods dir that leaves no
//! budget is a configuration error that each of them reports in its own words, so [`Rules`] keeps
//! either the [`Budget`] or that [`PodsDirError`], and every check hands the error back instead of
//! deciding.

use serde_json::Value;

use crate::policy::EndpointPolicySpec;
use crate::udspath::{Budget, PodsDirError, SocketLimit};
use crate::validate::{self, Verdict};

/// The budget of the configured pods dir, or why it has none. Cheap to clone; build it once with
/// [`Rules::new`] and share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    budget: Result<Budget, PodsDirError>,
    limit: SocketLimit,
}

impl Rules {
    /// The sun_path rules for `pods_dir`: [`Rules::with_limit`] under [`SocketLimit::SunPath`].
    pub fn new(pods_dir: &str) -> Self {
        Rules::with_limit(pods_dir, SocketLimit::SunPath)
    }

    /// The rules for `pods_dir`, the kubelet pods dir *as the proxy sees it*
    /// (`--kubelet-pods-dir`), under `limit` (`--socket-limit`). A pods dir without a usable
    /// budget is kept as its error (see [`Budget::with_limit`]): callers report it at start-up
    /// and refuse every socket with it.
    pub fn with_limit(pods_dir: &str, limit: SocketLimit) -> Self {
        Rules { budget: Budget::with_limit(pods_dir, limit), limit }
    }

    /// The socket limit the rules were built under (also when the pods dir has no budget).
    pub fn limit(&self) -> SocketLimit {
        self.limit
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
        assert_eq!(rules.limit(), SocketLimit::SunPath);
    }

    #[test]
    fn the_same_pods_dir_decides_under_the_file_system_limit_when_asked() {
        let rules = Rules::with_limit("/var/snap/microk8s/common/var/lib/kubelet/pods", SocketLimit::Filesystem);
        assert_eq!(rules.limit(), SocketLimit::Filesystem);
        assert_eq!(rules.budget().map(Budget::limit), Ok(SocketLimit::Filesystem));
        let forty = format!("sockets/{}.sock", "a".repeat(27));
        assert_eq!(forty.len(), 40);
        assert!(rules.review_spec(&policy(&forty).spec).unwrap().allowed());
        let verdict = Rules::new(DEFAULT_PODS_DIR).review_spec(&policy(&forty).spec).unwrap();
        assert!(!verdict.allowed(), "under sun-path 40 bytes exceed the 16-byte budget");
    }
}
