//! Admission warnings for an EndpointPolicy the webhook allows (AdmissionResponse `warnings`,
//! printed by kubectl as `Warning: ...`). Pure: the caller supplies what the caches know.
//!
//! Warnings never change the decision; they name the field, the other policy and the outcome, so
//! that a user sees at apply time what the status writer will report a moment later.

use aether_crds::udspath::{Budget, SocketLimit};
use aether_crds::{EndpointPolicySpec, tiebreak};

/// A socket value that leaves this many bytes of the budget or fewer is warned about.
pub const NEAR_BUDGET_BYTES: usize = 2;

/// What a warning is about: the bounded label of `aether_admission_warnings_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarningKind {
    /// Another policy of the namespace targets the same Service.
    Conflict,
    /// No Service of that name exists (yet) in the namespace, and the policy does not lose a
    /// tie-break: it is in effect for the pods running as the ServiceAccount of that name
    /// (status `AcceptedWithoutService`, [`crate::status::Reason::AcceptedWithoutService`]).
    AcceptedWithoutService,
    /// The socket value is within [`NEAR_BUDGET_BYTES`] of the budget.
    NearBudget,
    /// An UPDATE kept a spec that no longer passes (see [`crate::admission::decide`]).
    NoLongerValid,
}

impl WarningKind {
    /// The kebab-case metric label, e.g. `accepted-without-service`.
    pub fn label(self) -> &'static str {
        match self {
            WarningKind::Conflict => "conflict",
            WarningKind::AcceptedWithoutService => "accepted-without-service",
            WarningKind::NearBudget => "near-budget",
            WarningKind::NoLongerValid => "no-longer-valid",
        }
    }
}

/// One warning: its kind (for the metric) and its text (for the user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// What it is about.
    pub kind: WarningKind,
    /// The sentence kubectl prints.
    pub text: String,
}

/// Another policy of the same namespace targeting the same Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rival<'a> {
    /// Its `metadata.name`.
    pub name: &'a str,
    /// Whether it passes validation (an invalid policy never wins).
    pub valid: bool,
}

fn quoted(names: &[&str]) -> String {
    let kind = if names.len() == 1 { "EndpointPolicy" } else { "EndpointPolicies" };
    let list: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    format!("{kind} {}", list.join(", "))
}

/// The warnings for an allowed CREATE or UPDATE of policy `name` in `namespace` with `spec`.
///
/// - `rivals`: the other policies of the namespace whose `spec.targetRef.name` is the same (the
///   policy itself, if present, is skipped by name); `None` when the policy cache has not synced
///   yet, which gives no conflict warning rather than a wrong one. The winner among them and this
///   policy is [`tiebreak::resolve`]'s; the warning names the others in the order given.
/// - `service_exists`: whether a Service named `spec.targetRef.name` exists in the namespace;
///   `None` (cache not synced, or no API access) gives no missing-Service warning. A missing
///   Service does not keep the policy from applying (the agents match pods by ServiceAccount;
///   [`crate::status`] has the rule), so the warning says it is in effect for the pods running as
///   that ServiceAccount; it is not given to a policy that loses the tie-break, whose conflict
///   warning already says it is not applied.
/// - Near the budget: under [`SocketLimit::SunPath`] only, a warning when
///   `budget.bytes() - len(spec.udsSocket) <= NEAR_BUDGET_BYTES`, i.e. the value fits but with at
///   most 2 bytes to spare (14, 15 or 16 bytes with the default 16-byte budget), since a node
///   whose pods dir is slightly longer could not deliver it. Under [`SocketLimit::Filesystem`]
///   the limits do not depend on the pods dir, so there is nothing to warn about.
pub fn for_allowed_policy(
    name: &str,
    namespace: &str,
    spec: &EndpointPolicySpec,
    rivals: Option<&[Rival<'_>]>,
    service_exists: Option<bool>,
    budget: &Budget,
) -> Vec<Warning> {
    let target = spec.target_ref.name.as_str();
    let mut out = Vec::new();
    // Whether this policy wins its tie-break: `None` while the rivals are unknown.
    let mut wins = None;
    if let Some(rivals) = rivals {
        let others: Vec<&Rival<'_>> = rivals.iter().filter(|r| r.name != name).collect();
        let this = Rival { name, valid: true };
        let resolution = tiebreak::resolve(others.iter().copied().chain([&this]), |r| r.name, |r| r.valid);
        let winner = resolution.winner.map_or(name, |w| w.name);
        wins = Some(winner == name);
        // Named in the order given: the webhook's cache gives tie-break order, `validate` file order.
        let named = |valid: bool| -> Vec<&str> { others.iter().filter(|r| r.valid == valid).map(|r| r.name).collect() };
        let (valid, invalid) = (named(true), named(false));
        let invalid_note = if invalid.is_empty() {
            String::new()
        } else {
            let (verb, fail, win) =
                if invalid.len() == 1 { ("targets", "fails", "wins") } else { ("target", "fail", "win") };
            format!("; {} also {verb} it but {fail} validation and never {win}", quoted(&invalid))
        };
        if !valid.is_empty() {
            let text = if winner == name {
                format!(
                    "spec.targetRef.name: Service {target:?} is also targeted by {}; only one policy applies per Service and this policy {name:?} wins (the smallest name wins), the others become Conflicted{invalid_note}",
                    quoted(&valid)
                )
            } else {
                format!(
                    "spec.targetRef.name: Service {target:?} is already targeted by {}; only one policy applies per Service and {winner:?} wins (the smallest name wins), so this policy {name:?} will be Conflicted and not applied{invalid_note}",
                    quoted(&valid)
                )
            };
            out.push(Warning { kind: WarningKind::Conflict, text });
        } else if !invalid.is_empty() {
            out.push(Warning {
                kind: WarningKind::Conflict,
                text: format!(
                    "spec.targetRef.name: Service {target:?} is also targeted by {}, which {} validation and never {}; this policy {name:?} is the only valid one",
                    quoted(&invalid),
                    if invalid.len() == 1 { "fails" } else { "fail" },
                    if invalid.len() == 1 { "wins" } else { "win" }
                ),
            });
        }
    }
    if service_exists == Some(false) && wins != Some(false) {
        let unless = if wins.is_none() { " unless another policy for that Service has a smaller name," } else { "" };
        out.push(Warning {
            kind: WarningKind::AcceptedWithoutService,
            text: format!(
                "spec.targetRef.name: Service {target:?} does not exist in namespace {namespace:?} yet; the policy is in effect now for pods running as ServiceAccount {target:?} (aether matches pods by ServiceAccount){unless} and stays so when the Service is created (status AcceptedWithoutService)"
            ),
        });
    }
    let len = spec.uds_socket.len();
    // Only the sun_path budget depends on the node's pods dir; the file system's limits do not.
    let sun_path = budget.limit() == SocketLimit::SunPath;
    if sun_path && len <= budget.bytes() && budget.bytes() - len <= NEAR_BUDGET_BYTES {
        out.push(Warning {
            kind: WarningKind::NearBudget,
            text: format!(
                "spec.udsSocket: {:?} is {len} bytes, within {NEAR_BUDGET_BYTES} bytes of the {}-byte budget for pods dir {} ({} to spare); a node whose kubelet pods dir is longer cannot deliver it, so prefer a shorter value",
                spec.uds_socket,
                budget.bytes(),
                budget.pods_dir(),
                budget.bytes() - len
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use aether_crds::udspath::DEFAULT_PODS_DIR;

    /// The spec of a policy on Service `target` over `socket`.
    fn spec(target: &str, socket: &str) -> EndpointPolicySpec {
        aether_fixtures::policy("shop", "p").target(target).socket(socket).build().spec
    }

    fn budget() -> Budget {
        Budget::new(DEFAULT_PODS_DIR).unwrap()
    }

    fn kinds(w: &[Warning]) -> Vec<WarningKind> {
        w.iter().map(|w| w.kind).collect()
    }

    #[test]
    fn a_lone_short_policy_with_its_service_gets_no_warning() {
        let w = for_allowed_policy("a-pol", "shop", &spec("echo", "s/app.sock"), Some(&[]), Some(true), &budget());
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_duplicate_that_loses_names_the_winner_and_the_field() {
        let rivals = [Rival { name: "a-pol", valid: true }];
        let w = for_allowed_policy("b-pol", "shop", &spec("echo", "s/app.sock"), Some(&rivals), Some(true), &budget());
        assert_eq!(kinds(&w), [WarningKind::Conflict]);
        assert_eq!(
            w[0].text,
            "spec.targetRef.name: Service \"echo\" is already targeted by EndpointPolicy \"a-pol\"; only one policy applies per Service and \"a-pol\" wins (the smallest name wins), so this policy \"b-pol\" will be Conflicted and not applied"
        );
    }

    #[test]
    fn a_duplicate_that_wins_says_so_and_names_the_losers() {
        let rivals = [Rival { name: "b-pol", valid: true }, Rival { name: "c-pol", valid: true }];
        let w = for_allowed_policy("a-pol", "shop", &spec("echo", "s/app.sock"), Some(&rivals), Some(true), &budget());
        assert_eq!(kinds(&w), [WarningKind::Conflict]);
        assert!(w[0].text.contains("EndpointPolicies \"b-pol\", \"c-pol\""), "{}", w[0].text);
        assert!(w[0].text.contains("this policy \"a-pol\" wins"), "{}", w[0].text);
    }

    #[test]
    fn an_invalid_rival_never_wins_and_is_named() {
        let rivals = [Rival { name: "a-pol", valid: false }];
        let w = for_allowed_policy("b-pol", "shop", &spec("echo", "s/app.sock"), Some(&rivals), Some(true), &budget());
        assert_eq!(kinds(&w), [WarningKind::Conflict]);
        let t = &w[0].text;
        assert!(t.contains("EndpointPolicy \"a-pol\", which fails validation and never wins"), "{t}");
        assert!(t.contains("this policy \"b-pol\" is the only valid one"), "{t}");
    }

    #[test]
    fn the_policy_itself_is_not_its_own_rival() {
        let rivals = [Rival { name: "a-pol", valid: true }];
        let w = for_allowed_policy("a-pol", "shop", &spec("echo", "s/app.sock"), Some(&rivals), Some(true), &budget());
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn unsynced_caches_give_no_conflict_or_missing_service_warning() {
        let w = for_allowed_policy("b-pol", "shop", &spec("echo", "s/app.sock"), None, None, &budget());
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_missing_service_is_named_with_its_namespace_and_the_policy_is_in_effect_by_service_account() {
        let w = for_allowed_policy("a-pol", "shop", &spec("echo", "s/app.sock"), Some(&[]), Some(false), &budget());
        assert_eq!(kinds(&w), [WarningKind::AcceptedWithoutService]);
        assert_eq!(
            w[0].text,
            "spec.targetRef.name: Service \"echo\" does not exist in namespace \"shop\" yet; the policy is in effect now for pods running as ServiceAccount \"echo\" (aether matches pods by ServiceAccount) and stays so when the Service is created (status AcceptedWithoutService)"
        );
    }

    #[test]
    fn a_missing_service_with_unknown_rivals_says_a_smaller_name_would_win() {
        let w = for_allowed_policy("a-pol", "shop", &spec("echo", "s/app.sock"), None, Some(false), &budget());
        assert_eq!(kinds(&w), [WarningKind::AcceptedWithoutService]);
        assert!(w[0].text.contains("unless another policy for that Service has a smaller name,"), "{}", w[0].text);
    }

    #[test]
    fn a_loser_is_not_told_it_is_in_effect_without_its_service() {
        let rivals = [Rival { name: "a-pol", valid: true }];
        let w = for_allowed_policy("b-pol", "shop", &spec("echo", "s/app.sock"), Some(&rivals), Some(false), &budget());
        assert_eq!(kinds(&w), [WarningKind::Conflict]);
        assert!(w[0].text.contains("this policy \"b-pol\" will be Conflicted and not applied"), "{}", w[0].text);
        // An invalid rival does not make it lose.
        let rivals = [Rival { name: "a-pol", valid: false }];
        let w = for_allowed_policy("b-pol", "shop", &spec("echo", "s/app.sock"), Some(&rivals), Some(false), &budget());
        assert_eq!(kinds(&w), [WarningKind::Conflict, WarningKind::AcceptedWithoutService]);
    }

    #[test]
    fn values_within_two_bytes_of_the_budget_are_warned_and_shorter_ones_are_not() {
        // The default budget is 16 bytes.
        for (value, warned) in
            [("s/abcdefghijk", false), ("s/abcdefghijkl", true), ("s/abcdefghijklm", true), ("s/abcdefghijklmn", true)]
        {
            let w = for_allowed_policy("a", "ns", &spec("echo", value), Some(&[]), Some(true), &budget());
            assert_eq!(w.iter().any(|w| w.kind == WarningKind::NearBudget), warned, "{value} ({} bytes)", value.len());
        }
        let w = for_allowed_policy("a", "ns", &spec("echo", "s/abcdefghijklm"), Some(&[]), Some(true), &budget());
        assert_eq!(
            w[0].text,
            "spec.udsSocket: \"s/abcdefghijklm\" is 15 bytes, within 2 bytes of the 16-byte budget for pods dir /var/lib/kubelet/pods (1 to spare); a node whose kubelet pods dir is longer cannot deliver it, so prefer a shorter value"
        );
    }

    #[test]
    fn under_the_file_system_limit_no_value_is_near_a_budget() {
        let budget = Budget::with_limit(DEFAULT_PODS_DIR, SocketLimit::Filesystem).unwrap();
        let longest = format!("{}/{}", "v".repeat(63), "f".repeat(255));
        for value in ["s/abcdefghijklmn", "s/abcdefghijklm", longest.as_str(), &longest[..318]] {
            let w = for_allowed_policy("a", "ns", &spec("echo", value), Some(&[]), Some(true), &budget);
            assert!(w.is_empty(), "{} bytes: {w:?}", value.len());
        }
    }

    #[test]
    fn several_warnings_come_in_a_fixed_order() {
        let rivals = [Rival { name: "b-pol", valid: true }];
        let w = for_allowed_policy(
            "a-pol",
            "shop",
            &spec("echo", "s/abcdefghijklmn"),
            Some(&rivals),
            Some(false),
            &budget(),
        );
        assert_eq!(kinds(&w), [WarningKind::Conflict, WarningKind::AcceptedWithoutService, WarningKind::NearBudget]);
    }
}
