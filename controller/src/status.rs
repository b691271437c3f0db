//! The status of an EndpointPolicy: what its `Accepted` condition should say. Pure: no I/O.
//!
//! Follows the Gateway API policy status conventions (GEP-713): one condition of type `Accepted`,
//! `True` with reason `Accepted` when the policy is in effect, else `False` with reason `Invalid`
//! or `Conflicted`; plus `True` with reason `AcceptedWithoutService` (below). Two deliberate
//! differences from GEP-713:
//! - The tie-break between policies targeting one Service: the lexicographically smallest name
//!   wins ([`aether_crds::tiebreak::resolve`]), not the oldest.
//! - A missing target Service is not `False`/`TargetNotFound` (GEP-713's reason for it) but
//!   `True`/`AcceptedWithoutService`: the node agents match a policy to pods by ServiceAccount
//!   (the mesh service key `<namespace>/<spec.targetRef.name>`), never by the Service, which they
//!   do not watch (that would cost every node RBAC on Services and the memory of their cache). So
//!   a policy whose Service does not exist *is* applied to the pods running as that
//!   ServiceAccount, and a `False` condition would say the opposite of what the data plane does
//!   (docs/design-notes.md, "Operator feedback"; docs/troubleshooting.md, "EndpointPolicy
//!   reasons").
//!
//! Precedence, first match wins:
//! 1. `Invalid` (False): the spec fails the webhook's own decision ([`aether_crds::review`] with
//!    the configured budget), e.g. admitted while the webhook was down or before the pods dir
//!    changed. Invalid policies never win a tie-break.
//! 2. `Conflicted` (False): another *valid* policy of the namespace targets the same Service name
//!    and has a smaller name; the message names it. The agent resolves this tie per service key,
//!    whether or not the Service exists, so a conflict matters without the Service too.
//! 3. `AcceptedWithoutService` (True): no Service named `spec.targetRef.name` exists in the
//!    policy's namespace; the policy is in effect for the pods running as the ServiceAccount of
//!    that name, and stays so when the Service is created.
//! 4. `Accepted` (True).

use aether_crds::Rules;
use aether_crds::policy::EndpointPolicy;
use aether_crds::tiebreak::{self, ServiceKey};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use aether_crds::EndpointPolicyStatus;

/// The condition type written by the status writer.
pub const ACCEPTED: &str = "Accepted";

/// Why a policy is or is not in effect: the `reason` of the `Accepted` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// In effect, and its Service exists (`status: "True"`).
    Accepted,
    /// In effect although no Service of that name exists in the namespace (`status: "True"`):
    /// the agents match pods by ServiceAccount, not by Service (the module doc).
    AcceptedWithoutService,
    /// The spec does not pass the webhook's validation.
    Invalid,
    /// Another valid policy targeting the same Service (name) wins.
    Conflicted,
}

impl Reason {
    /// The reason as written in the condition (PascalCase, Kubernetes API conventions).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Accepted => "Accepted",
            Reason::AcceptedWithoutService => "AcceptedWithoutService",
            Reason::Invalid => "Invalid",
            Reason::Conflicted => "Conflicted",
        }
    }

    /// The kebab-case metric label (`reason` of `aether_status_patches_total`), e.g.
    /// `accepted-without-service`.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Accepted => "accepted",
            Reason::AcceptedWithoutService => "accepted-without-service",
            Reason::Invalid => "invalid",
            Reason::Conflicted => "conflicted",
        }
    }

    /// True when the policy is in effect: the condition's `status` is `"True"` ([`Reason::Accepted`]
    /// and [`Reason::AcceptedWithoutService`]).
    pub fn in_effect(self) -> bool {
        match self {
            Reason::Accepted | Reason::AcceptedWithoutService => true,
            Reason::Invalid | Reason::Conflicted => false,
        }
    }
}

/// What the `Accepted` condition of one policy should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// `True` for [`Reason::Accepted`] and [`Reason::AcceptedWithoutService`]
    /// ([`Reason::in_effect`]).
    pub accepted: bool,
    /// The reason.
    pub reason: Reason,
    /// A sentence naming the Service, the winning policy or the broken rule.
    pub message: String,
    /// The `metadata.generation` the condition was computed from.
    pub observed_generation: Option<i64>,
}

impl Desired {
    /// The condition's `status` field: `"True"` or `"False"`.
    pub fn status(&self) -> &'static str {
        if self.accepted { "True" } else { "False" }
    }
}

fn name_of(p: &EndpointPolicy) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

fn namespace_of(p: &EndpointPolicy) -> &str {
    p.metadata.namespace.as_deref().unwrap_or_default()
}

/// The webhook's decision for a stored policy ([`Rules::review`]): `None` when valid, else the
/// denial message (or the configuration error, when the rules have no budget).
pub fn invalid_because(policy: &EndpointPolicy, rules: &Rules) -> Option<String> {
    match rules.review(&serde_json::to_value(policy).unwrap_or_default()) {
        Err(e) => Some(format!("aether-controller is misconfigured, no policy can be accepted: {e}")),
        Ok(verdict) => verdict.message(),
    }
}

/// The `Accepted` condition `policy` should carry.
///
/// `others` are the other policies of the cluster (any namespace, any target; `policy` itself is
/// skipped by name and namespace if present); `service_exists` says whether a Service named
/// `spec.targetRef.name` exists in the policy's namespace. Those of `others` that target the same
/// Service name compete with `policy` ([`tiebreak::resolve`], validity by [`invalid_because`]),
/// whether or not the Service exists: the agent resolves the tie per service key, never looking
/// at Services, so the status reports the same winner.
pub fn desired(policy: &EndpointPolicy, others: &[&EndpointPolicy], service_exists: bool, rules: &Rules) -> Desired {
    let (name, namespace) = (name_of(policy), namespace_of(policy));
    let target = policy.spec.target_ref.name.as_str();
    let observed_generation = policy.metadata.generation;
    let make = |reason: Reason, message| Desired { accepted: reason.in_effect(), reason, message, observed_generation };
    if let Some(why) = invalid_because(policy, rules) {
        return make(Reason::Invalid, format!("the spec does not pass validation, so it is not applied: {why}"));
    }
    let key = ServiceKey::of_policy(policy);
    let rivals = others.iter().copied().filter(|o| key.is_targeted_by(o) && name_of(o) != name);
    let resolution = tiebreak::resolve(
        std::iter::once(policy).chain(rivals),
        |p| name_of(p),
        |p| invalid_because(p, rules).is_none(),
    );
    if let Some(winner) = resolution.winner.filter(|w| name_of(w) != name) {
        let winner = name_of(winner);
        return make(
            Reason::Conflicted,
            if service_exists {
                format!(
                    "EndpointPolicy {winner:?} is in effect for Service {target:?} (the smallest name wins); this policy is not applied"
                )
            } else {
                format!(
                    "EndpointPolicy {winner:?} is in effect for pods running as ServiceAccount {target:?} (the smallest name wins; Service {target:?} does not exist in namespace {namespace:?}, aether matches pods by ServiceAccount); this policy is not applied"
                )
            },
        );
    }
    if !service_exists {
        return make(
            Reason::AcceptedWithoutService,
            format!(
                "Service {target:?} does not exist in namespace {namespace:?}; the policy is in effect for pods running as ServiceAccount {target:?} (aether matches pods by ServiceAccount) and stays so when the Service is created"
            ),
        );
    }
    make(Reason::Accepted, format!("the policy is in effect for Service {target:?}"))
}

/// The current `Accepted` condition of a status, if any.
pub fn current(status: Option<&EndpointPolicyStatus>) -> Option<&Condition> {
    status?.conditions.iter().find(|c| c.type_ == ACCEPTED)
}

/// True when `status` already says exactly `desired` (status, reason, message, both observed
/// generations), ignoring `lastTransitionTime`: then nothing is written.
pub fn is_current(status: Option<&EndpointPolicyStatus>, desired: &Desired) -> bool {
    let Some(c) = current(status) else { return false };
    c.status == desired.status()
        && c.reason == desired.reason.as_str()
        && c.message == desired.message
        && c.observed_generation == desired.observed_generation
        && status.and_then(|s| s.observed_generation) == desired.observed_generation
}

/// The status to write for `desired`: `lastTransitionTime` is kept from the current condition
/// when its `status` value does not change, else it is `now`.
pub fn status_for(current_status: Option<&EndpointPolicyStatus>, desired: &Desired, now: Time) -> EndpointPolicyStatus {
    let last_transition_time = match current(current_status) {
        Some(c) if c.status == desired.status() => c.last_transition_time.clone(),
        _ => now,
    };
    EndpointPolicyStatus {
        conditions: vec![Condition {
            type_: ACCEPTED.to_owned(),
            status: desired.status().to_owned(),
            reason: desired.reason.as_str().to_owned(),
            message: desired.message.clone(),
            observed_generation: desired.observed_generation,
            last_transition_time,
        }],
        observed_generation: desired.observed_generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aether_crds::udspath::DEFAULT_PODS_DIR;
    use k8s_openapi::jiff::Timestamp;

    fn budget() -> Rules {
        Rules::new(DEFAULT_PODS_DIR)
    }

    /// Policy `ns/name` on Service `target` over `socket`, at generation 3.
    fn pol(ns: &str, name: &str, target: &str, socket: &str) -> EndpointPolicy {
        aether_fixtures::policy(ns, name).target(target).socket(socket).generation(3).build()
    }

    fn ts(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn a_lone_valid_policy_with_its_service_is_accepted_with_its_generation() {
        let d = desired(&pol("shop", "a-pol", "echo", "s/app.sock"), &[], true, &budget());
        assert_eq!((d.accepted, d.reason, d.observed_generation), (true, Reason::Accepted, Some(3)));
        assert_eq!(d.status(), "True");
        assert!(d.message.contains("\"echo\""), "{}", d.message);
    }

    #[test]
    fn the_smallest_name_wins_and_the_loser_names_the_winner() {
        let a = pol("shop", "a-pol", "echo", "s/app.sock");
        let b = pol("shop", "b-pol", "echo", "s/app.sock");
        assert_eq!(desired(&a, &[&b], true, &budget()).reason, Reason::Accepted);
        let d = desired(&b, &[&a], true, &budget());
        assert_eq!((d.accepted, d.reason), (false, Reason::Conflicted));
        assert_eq!(
            d.message,
            "EndpointPolicy \"a-pol\" is in effect for Service \"echo\" (the smallest name wins); this policy is not applied"
        );
    }

    #[test]
    fn the_winner_is_the_smallest_among_several_rivals_and_order_does_not_matter() {
        let [a, b, c] = ["c-pol", "a-pol", "b-pol"].map(|n| pol("shop", n, "echo", "s/app.sock"));
        let d1 = desired(&a, &[&b, &c], true, &budget());
        let d2 = desired(&a, &[&c, &b], true, &budget());
        assert_eq!(d1, d2);
        assert!(d1.message.contains("\"a-pol\""), "{}", d1.message);
    }

    #[test]
    fn an_invalid_rival_never_wins() {
        let a = pol("shop", "a-pol", "echo", "sockets/too-long-app.sock");
        let b = pol("shop", "b-pol", "echo", "s/app.sock");
        assert_eq!(desired(&b, &[&a], true, &budget()).reason, Reason::Accepted);
        let d = desired(&a, &[&b], true, &budget());
        assert_eq!(d.reason, Reason::Invalid);
        assert!(d.message.contains("spec.udsSocket") && d.message.contains("16 bytes"), "{}", d.message);
    }

    #[test]
    fn invalid_takes_precedence_over_a_missing_service() {
        let a = pol("shop", "a-pol", "echo", "sockets/too-long-app.sock");
        let d = desired(&a, &[], false, &budget());
        assert_eq!((d.accepted, d.reason), (false, Reason::Invalid));
    }

    #[test]
    fn a_lone_valid_policy_without_its_service_is_in_effect_for_the_service_account() {
        let d = desired(&pol("shop", "grpc-api-uds", "grpc-api", "grpc/api.sock"), &[], false, &budget());
        assert_eq!((d.accepted, d.reason, d.observed_generation), (true, Reason::AcceptedWithoutService, Some(3)));
        assert_eq!(d.status(), "True");
        assert_eq!(
            d.message,
            "Service \"grpc-api\" does not exist in namespace \"shop\"; the policy is in effect for pods running as ServiceAccount \"grpc-api\" (aether matches pods by ServiceAccount) and stays so when the Service is created"
        );
    }

    #[test]
    fn a_conflict_takes_precedence_over_a_missing_service_as_the_agent_resolves_it() {
        let a = pol("shop", "a-pol", "echo", "s/app.sock");
        let b = pol("shop", "b-pol", "echo", "s/app.sock");
        // The winner is in effect without its Service; the loser is Conflicted all the same.
        assert_eq!(desired(&a, &[&b], false, &budget()).reason, Reason::AcceptedWithoutService);
        let d = desired(&b, &[&a], false, &budget());
        assert_eq!((d.accepted, d.reason), (false, Reason::Conflicted));
        assert_eq!(
            d.message,
            "EndpointPolicy \"a-pol\" is in effect for pods running as ServiceAccount \"echo\" (the smallest name wins; Service \"echo\" does not exist in namespace \"shop\", aether matches pods by ServiceAccount); this policy is not applied"
        );
        // An invalid rival still never wins, with or without the Service.
        let invalid = pol("shop", "0-pol", "echo", "sockets/too-long-app.sock");
        assert_eq!(desired(&b, &[&invalid], false, &budget()).reason, Reason::AcceptedWithoutService);
        assert_eq!(desired(&invalid, &[&b], false, &budget()).reason, Reason::Invalid);
    }

    #[test]
    fn only_the_two_accepted_reasons_are_in_effect() {
        let all = [Reason::Accepted, Reason::AcceptedWithoutService, Reason::Invalid, Reason::Conflicted];
        let in_effect: Vec<Reason> = all.into_iter().filter(|r| r.in_effect()).collect();
        assert_eq!(in_effect, [Reason::Accepted, Reason::AcceptedWithoutService]);
    }

    #[test]
    fn policies_of_other_namespaces_or_targets_are_not_rivals() {
        let b = pol("shop", "b-pol", "echo", "s/app.sock");
        let other_ns = pol("bank", "a-pol", "echo", "s/app.sock");
        let other_target = pol("shop", "a-pol", "cart", "s/app.sock");
        assert_eq!(desired(&b, &[&other_ns, &other_target], true, &budget()).reason, Reason::Accepted);
    }

    #[test]
    fn the_policy_itself_among_the_others_is_ignored() {
        let b = pol("shop", "b-pol", "echo", "s/app.sock");
        assert_eq!(desired(&b, &[&b.clone()], true, &budget()).reason, Reason::Accepted);
    }

    #[test]
    fn a_misconfigured_budget_makes_every_policy_invalid() {
        let d = desired(&pol("shop", "a-pol", "echo", "s/a"), &[], true, &Rules::new(&"/x".repeat(30)));
        assert_eq!(d.reason, Reason::Invalid);
        assert!(d.message.contains("misconfigured"), "{}", d.message);
    }

    #[test]
    fn an_equal_status_is_current_whatever_its_transition_time() {
        let d = desired(&pol("shop", "a-pol", "echo", "s/app.sock"), &[], true, &budget());
        let s = status_for(None, &d, ts(100));
        assert!(is_current(Some(&s), &d));
        let mut older = s.clone();
        older.conditions[0].last_transition_time = ts(1);
        assert!(is_current(Some(&older), &d));
    }

    #[test]
    fn a_new_generation_reason_or_message_is_not_current() {
        let d = desired(&pol("shop", "a-pol", "echo", "s/app.sock"), &[], true, &budget());
        let s = status_for(None, &d, ts(100));
        let mut newer = d.clone();
        newer.observed_generation = Some(4);
        assert!(!is_current(Some(&s), &newer));
        let mut other = d.clone();
        other.message.push('!');
        assert!(!is_current(Some(&s), &other));
        assert!(!is_current(None, &d));
        assert!(!is_current(Some(&EndpointPolicyStatus::default()), &d));
    }

    #[test]
    fn the_transition_time_is_kept_while_the_status_value_stays() {
        let a = pol("shop", "a-pol", "echo", "s/app.sock");
        let b = pol("shop", "b-pol", "echo", "s/app.sock");
        let cell = |s: &EndpointPolicyStatus| {
            let c = &s.conditions[0];
            (c.status.clone(), c.reason.clone(), c.last_transition_time.clone())
        };
        let missing = desired(&b, &[&a], false, &budget());
        let first = status_for(None, &missing, ts(100));
        assert_eq!(cell(&first), ("False".into(), "Conflicted".into(), ts(100)));
        // Conflicted without the Service -> with it: another message, still False, the time stays.
        let conflicted = desired(&b, &[&a], true, &budget());
        assert_ne!(conflicted.message, missing.message);
        let second = status_for(Some(&first), &conflicted, ts(200));
        assert_eq!(cell(&second), ("False".into(), "Conflicted".into(), ts(100)));
        // Conflicted -> Accepted: False -> True, the time moves.
        let accepted = desired(&b, &[], true, &budget());
        let third = status_for(Some(&second), &accepted, ts(300));
        assert_eq!(cell(&third), ("True".into(), "Accepted".into(), ts(300)));
        assert_eq!(third.observed_generation, Some(3));
        // Accepted -> AcceptedWithoutService (the Service deleted) and back: True all along.
        let without = desired(&b, &[], false, &budget());
        let fourth = status_for(Some(&third), &without, ts(400));
        assert_eq!(cell(&fourth), ("True".into(), "AcceptedWithoutService".into(), ts(300)));
        let fifth = status_for(Some(&fourth), &accepted, ts(500));
        assert_eq!(cell(&fifth), ("True".into(), "Accepted".into(), ts(300)));
    }
}
