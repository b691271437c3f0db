//! Validation of an EndpointPolicy, shared by the admission webhook, `aether-controller
//! validate` and the agent: one function decides, so "admitted" means "usable".
//!
//! [`review`] takes the object as JSON (what an AdmissionReview or a YAML file holds), checks its
//! shape the way the API server's schema and strict field validation would, then the spec rules
//! (garde, with the [`Budget`] as context: the pods dir and its
//! [`SocketLimit`](crate::udspath::SocketLimit); the rules are in [`crate::field_rules`]). Every
//! violation names the wire field and the rule.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

pub use crate::field_rules::is_dns1035_label;
use crate::policy::{EndpointPolicy, EndpointPolicySpec};
use crate::udspath::Budget;

/// One broken rule: the wire path of the field (e.g. `spec.targetRef.kind`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Wire path of the field, dot-separated, from the object root.
    pub field: String,
    /// The rule, as a sentence fragment that follows the field (and, where useful, the value).
    pub message: String,
}

impl fmt::Display for FieldViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.message)
    }
}

/// The decision for one object: allowed, or denied with every violation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The violations; empty means allowed.
    pub violations: Vec<FieldViolation>,
}

impl Verdict {
    /// True when no rule is broken.
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The denial message: all violations joined by `"; "`, or `None` when allowed.
    pub fn message(&self) -> Option<String> {
        (!self.violations.is_empty())
            .then(|| self.violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
    }
}

/// garde reports Rust field paths (`target_ref.name`); the wire uses camelCase.
fn wire_path(rust_path: &str) -> String {
    let mut out = String::from("spec.");
    let mut upper = false;
    for c in rust_path.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// Validates a typed spec against the budget.
///
/// # Errors
/// Every broken rule, each naming its wire field (`spec.udsSocket`, `spec.targetRef.kind`, ...).
pub fn validate_spec(spec: &EndpointPolicySpec, budget: &Budget) -> Result<(), Vec<FieldViolation>> {
    use garde::Validate;
    spec.validate_with(budget).map_err(|report| {
        report
            .iter()
            .map(|(path, err)| FieldViolation {
                field: wire_path(&path.to_string()),
                message: err.message().to_owned(),
            })
            .collect()
    })
}

/// The fields the schema declares, per object path; anything else is an unknown field, which the
/// API server rejects under strict field validation (kubectl's default) or prunes. We reject it:
/// a `namespace` in `targetRef` must never be read as a cross-namespace target.
const KNOWN_FIELDS: &[(&str, &[&str])] =
    &[("spec", &["targetRef", "udsSocket"]), ("spec.targetRef", &["group", "kind", "name"])];

fn unknown_fields(object: &Value) -> Vec<FieldViolation> {
    let mut out = Vec::new();
    for (path, known) in KNOWN_FIELDS {
        let node = path.split('.').try_fold(object, |v, k| v.get(k));
        if let Some(Value::Object(map)) = node {
            for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
                let hint = if *path == "spec.targetRef" && key == "namespace" {
                    ": a policy attaches only in its own namespace (the reference carries no namespace)"
                } else {
                    ""
                };
                out.push(FieldViolation {
                    field: format!("{path}.{key}"),
                    message: format!("is an unknown field; allowed fields are {}{hint}", known.join(", ")),
                });
            }
        }
    }
    out
}

/// Decides one EndpointPolicy given as JSON (`apiVersion`, `kind`, `metadata`, `spec`, ...).
///
/// Checks, in order: unknown fields under `spec`; that the object parses as an EndpointPolicy
/// (missing or mistyped fields name their path); then every spec rule against `budget`. This is
/// the single decision used by the webhook, `aether-controller validate` and the agent.
pub fn review(object: &Value, budget: &Budget) -> Verdict {
    let mut violations = unknown_fields(object);
    // The plain parse first: tracking the path costs as much again as the parse, and only a
    // failure's message needs it, so a failure is parsed a second time with the path.
    let parsed =
        EndpointPolicy::deserialize(object).or_else(|_| serde_path_to_error::deserialize::<_, EndpointPolicy>(object));
    match parsed {
        Err(e) => {
            let field = e.path().to_string();
            violations.push(FieldViolation {
                field: if field == "." { "object".to_owned() } else { field },
                message: format!("is malformed: {}", e.inner()),
            });
        }
        Ok(policy) => {
            if let Err(v) = validate_spec(&policy.spec, budget) {
                violations.extend(v);
            }
        }
    }
    Verdict { violations }
}
