//! Validation of an EndpointPolicy, shared by the admission webhook, `aether-controller
//! validate` and the agent: one function decides, so "admitted" means "usable".
//!
//! [`review`] takes the object as JSON (what an AdmissionReview or a YAML file holds), checks its
//! shape the way the API server's schema and strict field validation would, then the spec rules
//! (garde, with the [`Budget`] as context: the pods dir and its [`udspath::SocketLimit`]). Every
//! violation names the wire field and the rule.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::policy::{EndpointPolicy, EndpointPolicySpec};
use crate::udspath::{self, Budget, SocketLimit};

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

/// Longest value quoted in full in a message; longer ones are cut (a denial or log line must not
/// echo megabytes back).
const SHOWN_BYTES: usize = 64;

/// `value` quoted for a message, cut at [`SHOWN_BYTES`] with its full length stated.
fn shown(value: &str) -> String {
    if value.len() <= SHOWN_BYTES {
        return format!("{value:?}");
    }
    let mut end = SHOWN_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

pub(crate) fn socket_rule(value: &str, budget: &Budget) -> garde::Result {
    let longest = budget.limit().longest_value();
    if value.len() > longest.max(SHOWN_BYTES) {
        let why = match budget.limit() {
            SocketLimit::SunPath => {
                format!("the budget here is {} bytes with pods dir {}", budget.bytes(), budget.pods_dir())
            }
            SocketLimit::Filesystem => format!(
                "a {}-byte volume, '/' and a {}-byte file: the file system's limits; --socket-limit filesystem",
                udspath::VOLUME_NAME_MAX,
                udspath::NAME_MAX
            ),
        };
        return Err(garde::Error::new(format!(
            "{} is too long: no socket value can exceed {longest} bytes ({why})",
            shown(value)
        )));
    }
    budget.check(value).map(|_| ()).map_err(|e| garde::Error::new(format!("{} {e}", shown(value))))
}

pub(crate) fn group_rule(value: &str, _: &Budget) -> garde::Result {
    match value {
        "" | "core" => Ok(()),
        _ => Err(garde::Error::new(format!(
            "{} is not allowed: the target must be in the core group, written \"\" or \"core\"",
            shown(value)
        ))),
    }
}

pub(crate) fn kind_rule(value: &str, _: &Budget) -> garde::Result {
    if value == "Service" {
        Ok(())
    } else {
        Err(garde::Error::new(format!(
            "{} is not allowed: an EndpointPolicy attaches to kind \"Service\" only (case-sensitive)",
            shown(value)
        )))
    }
}

/// True when `s` is a DNS-1035 label (Service names): 1–63 bytes of `[a-z0-9-]`, starting with
/// a letter and ending with a letter or digit (Kubernetes API conventions).
pub fn is_dns1035_label(s: &str) -> bool {
    udspath::is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

pub(crate) fn service_name_rule(value: &str, _: &Budget) -> garde::Result {
    if is_dns1035_label(value) {
        Ok(())
    } else {
        Err(garde::Error::new(format!(
            "{} is not a valid Service name: a DNS-1035 label is 1-63 of lowercase a-z, 0-9 and '-', starting with a letter and ending with a letter or digit",
            shown(value)
        )))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_value_is_cut_in_the_message_with_its_length() {
        let budget = Budget::new(udspath::DEFAULT_PODS_DIR).unwrap();
        let huge = "a".repeat(2_500_000);
        let msg = socket_rule(&huge, &budget).unwrap_err().to_string();
        assert!(msg.len() < 300, "{} bytes", msg.len());
        assert!(msg.contains("(2500000 bytes)") && msg.contains("36 bytes"), "{msg}");
        let msg = kind_rule(&"é".repeat(100), &budget).unwrap_err().to_string();
        assert!(msg.contains("(200 bytes)"), "{msg}");
    }

    #[test]
    fn under_the_file_system_limit_a_huge_value_is_cut_and_names_the_319_byte_limit() {
        let budget = Budget::with_limit(udspath::DEFAULT_PODS_DIR, SocketLimit::Filesystem).unwrap();
        let msg = socket_rule(&"a".repeat(2_500_000), &budget).unwrap_err().to_string();
        assert!(msg.len() < 300, "{} bytes", msg.len());
        assert!(msg.contains("(2500000 bytes)") && msg.contains("exceed 319 bytes"), "{msg}");
        assert!(msg.contains("--socket-limit filesystem"), "{msg}");
        // 320 bytes of good grammar: over the longest value, refused before the file's check.
        let value = format!("{}/{}", "v".repeat(63), "f".repeat(256));
        assert_eq!(value.len(), 320);
        assert!(socket_rule(&value, &budget).unwrap_err().to_string().contains("exceed 319 bytes"));
    }
}
