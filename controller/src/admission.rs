//! AdmissionReview v1 in, AdmissionReview v1 out: the decision, dispatched by kind. Pure: no I/O.

use aether_crds::Rules;
use aether_crds::policy::{self, EndpointPolicySpec};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::Deserialize;

use crate::warnings::{self, Rival, WarningKind};

/// What the webhook decided, with the facts its log line and metrics need.
#[derive(Debug)]
pub struct Decision {
    /// The response to send (uid echoed).
    pub response: AdmissionResponse,
    /// `allowed`, `denied` (a rule broke) — the `result` label of the metric.
    pub result: &'static str,
    /// `namespace/name` of the object, for logs.
    pub object: String,
    /// The kind reviewed.
    pub kind: String,
    /// What each warning in the response is about (the `warning` label of the metric), in the
    /// order of `response.warnings`.
    pub warned: Vec<WarningKind>,
}

/// The only `apiVersion` of a review this webhook answers (the chart registers it with
/// `admissionReviewVersions: ["v1"]`).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// The only `kind` of a review this webhook answers.
pub const REVIEW_KIND: &str = "AdmissionReview";

/// What the envelope must be, appended to every [`BadReview::Envelope`] message.
const ENVELOPE_RULE: &str =
    "send admission.k8s.io/v1 AdmissionReview (the webhook's admissionReviewVersions is [\"v1\"])";

/// Why a request body is not an AdmissionReview we can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    /// Not JSON, or not shaped like an AdmissionReview.
    #[error("request body is not an AdmissionReview v1: {0}")]
    Parse(String),
    /// An AdmissionReview without `request`.
    #[error("AdmissionReview has no request to answer: {0}")]
    NoRequest(String),
    /// A JSON object whose `apiVersion` or `kind` is missing or is not [`REVIEW_API_VERSION`] /
    /// [`REVIEW_KIND`] (e.g. an API server sending `admission.k8s.io/v1beta1`). The message
    /// names each wrong field and its value, then the rule.
    #[error("{problems}: {ENVELOPE_RULE}")]
    Envelope {
        /// What is wrong, field by field: `apiVersion "admission.k8s.io/v1beta1" is not
        /// supported`, `kind is missing`, ... joined with `; `.
        problems: String,
    },
}

impl BadReview {
    /// The `result` label of `aether_admission_requests_total` for this 400: `malformed`, or
    /// `unsupported-envelope` for [`BadReview::Envelope`] (an API server or client speaking
    /// another AdmissionReview version: a configuration problem, not a garbled body).
    pub fn label(&self) -> &'static str {
        match self {
            BadReview::Parse(_) | BadReview::NoRequest(_) => "malformed",
            BadReview::Envelope { .. } => "unsupported-envelope",
        }
    }
}

/// The two envelope fields, read without the rest of the review (any JSON type, so that a wrong
/// type is reported as a wrong value rather than a parse error).
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "apiVersion")]
    api_version: Option<serde_json::Value>,
    kind: Option<serde_json::Value>,
}

/// `Err` naming each of `apiVersion` and `kind` that is missing or not the one answered.
fn check_envelope(api_version: Option<&serde_json::Value>, kind: Option<&serde_json::Value>) -> Result<(), BadReview> {
    let mut problems = Vec::new();
    for (field, value, want) in [("apiVersion", api_version, REVIEW_API_VERSION), ("kind", kind, REVIEW_KIND)] {
        match value {
            None | Some(serde_json::Value::Null) => problems.push(format!("{field} is missing")),
            Some(v) if v.as_str() == Some(want) => {}
            // `v` prints as JSON: a string quoted, any other type as itself.
            Some(v) => problems.push(format!("{field} {v} is not supported")),
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(BadReview::Envelope { problems: problems.join("; ") }) }
}

/// Parses a request body into an AdmissionRequest. The envelope must be `apiVersion:
/// admission.k8s.io/v1`, `kind: AdmissionReview`; a body that is a JSON object with another (or
/// no) envelope is refused with [`BadReview::Envelope`] whatever the rest of it holds, so that
/// the reason given is the version, not a field the other version shapes differently.
///
/// # Errors
/// [`BadReview`] saying what is wrong, for a 400 answer.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, BadReview> {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => {
            // Only on failure is the body read a second time, for the envelope alone: a wrong
            // or missing envelope is the better reason (e.g. `{}` lacks apiVersion first of all).
            if let Ok(envelope) = serde_json::from_slice::<Envelope>(body) {
                check_envelope(envelope.api_version.as_ref(), envelope.kind.as_ref())?;
            }
            return Err(BadReview::Parse(e.to_string()));
        }
    };
    let (api_version, kind) = (serde_json::json!(review.types.api_version), serde_json::json!(review.types.kind));
    check_envelope(Some(&api_version), Some(&kind))?;
    review
        .try_into()
        .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| BadReview::NoRequest(e.to_string()))
}

/// Decides one request. EndpointPolicy CREATE/UPDATE go through [`Rules::review`] (the same
/// decision as `aether-controller validate` and the agent); DELETE and requests without an
/// object are allowed; other kinds are allowed (this webhook has no rules for them). Rules
/// without a budget deny every policy, saying why.
///
/// An UPDATE that leaves `spec` exactly as it was is allowed even when that spec no longer passes
/// (e.g. after the pods dir changed), with the violations as a warning: otherwise metadata-only
/// updates, such as removing a finalizer, could never complete (the same ratcheting the API
/// server applies to CRD schema validation).
pub fn decide(req: &AdmissionRequest<DynamicObject>, rules: &Rules) -> Decision {
    let object = format!("{}/{}", req.namespace.as_deref().unwrap_or(""), req.name);
    let is_policy = req.kind.group == policy::GROUP && req.kind.kind == policy::KIND;
    // A fixed label set: the kind comes from the request, and metric labels must stay bounded.
    let kind = if is_policy { policy::KIND } else { "other" }.to_owned();
    let base = AdmissionResponse::from(req);
    let Some(obj) = req.object.as_ref().filter(|_| is_policy && req.operation != Operation::Delete) else {
        return Decision { response: base, result: "allowed", object, kind, warned: vec![] };
    };
    let verdict = match rules.review(&reviewed_value(obj)) {
        Ok(verdict) => verdict,
        Err(e) => {
            let message = format!("aether-controller is misconfigured, no policy can be admitted: {e}");
            return Decision { response: base.deny(message), result: "denied", object, kind, warned: vec![] };
        }
    };
    let Some(message) = verdict.message() else {
        return Decision { response: base, result: "allowed", object, kind, warned: vec![] };
    };
    if spec_unchanged(req, obj) {
        let mut response = base;
        response.warnings =
            Some(vec![format!("spec is unchanged and allowed to stay, but it no longer passes: {message}")]);
        return Decision { response, result: "allowed", object, kind, warned: vec![WarningKind::NoLongerValid] };
    }
    Decision { response: base.deny(message), result: "denied", object, kind, warned: vec![] }
}

/// The object as [`Rules::review`] reads it, without its metadata: `apiVersion`, `kind`,
/// `metadata: {}` and every other top-level field (`spec`, ...) as sent.
///
/// The review checks unknown fields under `spec` and parses the object as an EndpointPolicy.
/// `obj.metadata` was already parsed as an `ObjectMeta` with the review, so it would parse again
/// whatever it holds, and `{}` parses the same way: the verdict is [`serde_json::to_value`]'s of
/// the whole object, without copying `managedFields` and the last-applied annotation (most of a
/// review's bytes) into a `Value` and walking them again — ~12 % of the webhook's CPU under
/// saturation (issue 15 profile).
fn reviewed_value(obj: &DynamicObject) -> serde_json::Value {
    let serde_json::Value::Object(data) = &obj.data else {
        // Not reachable for a parsed review (its object is a JSON object); the whole object then.
        return serde_json::to_value(obj).unwrap_or_default();
    };
    let mut map = serde_json::Map::with_capacity(data.len() + 3);
    if let Some(types) = &obj.types {
        map.insert("apiVersion".into(), types.api_version.clone().into());
        map.insert("kind".into(), types.kind.clone().into());
    }
    map.insert("metadata".into(), serde_json::Value::Object(serde_json::Map::new()));
    map.extend(data.iter().map(|(k, v)| (k.clone(), v.clone())));
    serde_json::Value::Object(map)
}

/// An UPDATE whose `spec` is exactly the old object's.
fn spec_unchanged(req: &AdmissionRequest<DynamicObject>, obj: &DynamicObject) -> bool {
    req.operation == Operation::Update
        && req.old_object.as_ref().is_some_and(|old| old.data.get("spec") == obj.data.get("spec"))
}

/// What the webhook knows about the cluster from its caches, for warnings. Implemented by
/// [`crate::cluster::ClusterView`]; tests use plain data.
pub trait ClusterFacts {
    /// The other policies of `namespace` targeting Service `target` (excluding `name`), each
    /// with its name and whether it passes validation; `None` while the cache is not synced.
    fn rivals(&self, namespace: &str, target: &str, name: &str) -> Option<Vec<(String, bool)>>;
    /// Whether Service `name` exists in `namespace`; `None` while the cache is not synced.
    fn service_exists(&self, namespace: &str, name: &str) -> Option<bool>;
}

/// [`decide`], plus the warnings of [`warnings::for_allowed_policy`] for an allowed, valid
/// EndpointPolicy CREATE or UPDATE. Without `cluster` (status writer off) only the warnings that
/// need no cluster state are given (the socket value near the budget).
pub fn decide_with_warnings(
    req: &AdmissionRequest<DynamicObject>,
    rules: &Rules,
    cluster: Option<&dyn ClusterFacts>,
) -> Decision {
    let mut decision = decide(req, rules);
    let (Ok(budget), Some(obj)) = (rules.budget(), req.object.as_ref()) else { return decision };
    let creates_or_updates = matches!(req.operation, Operation::Create | Operation::Update);
    if decision.result != "allowed"
        || !decision.warned.is_empty()
        || !creates_or_updates
        || decision.kind != policy::KIND
    {
        return decision;
    }
    // A metadata-only UPDATE (labels, finalizers) changes nothing that was warned about at the
    // last spec change: no warnings, so `kubectl label` does not repeat them.
    if spec_unchanged(req, obj) {
        return decision;
    }
    // Only the spec is needed: no round trip of the whole object through JSON.
    let Some(spec) = obj.data.get("spec").and_then(|s| EndpointPolicySpec::deserialize(s).ok()) else {
        return decision;
    };
    let namespace = req.namespace.as_deref().unwrap_or_default();
    let name = if req.name.is_empty() { obj.metadata.name.as_deref().unwrap_or_default() } else { &req.name };
    let target = &spec.target_ref.name;
    let rivals = cluster.and_then(|c| c.rivals(namespace, target, name));
    let rivals: Option<Vec<Rival<'_>>> =
        rivals.as_ref().map(|r| r.iter().map(|(n, valid)| Rival { name: n, valid: *valid }).collect());
    let exists = cluster.and_then(|c| c.service_exists(namespace, target));
    let found = warnings::for_allowed_policy(name, namespace, &spec, rivals.as_deref(), exists, budget);
    if !found.is_empty() {
        decision.warned = found.iter().map(|w| w.kind).collect();
        decision.response.warnings = Some(found.into_iter().map(|w| w.text).collect());
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;
    use aether_crds::udspath::DEFAULT_PODS_DIR;

    fn fixture(name: &str) -> AdmissionRequest<DynamicObject> {
        let path = format!("{}/tests/fixtures/admission/{name}", env!("CARGO_MANIFEST_DIR"));
        parse(&std::fs::read(&path).unwrap()).unwrap()
    }

    /// The object of `create-valid.json` with `spec` replaced.
    fn with_spec(spec: serde_json::Value) -> DynamicObject {
        let mut obj = fixture("create-valid.json").object.unwrap();
        obj.data["spec"] = spec;
        obj
    }

    #[test]
    fn the_value_reviewed_without_metadata_gets_the_whole_objects_verdict() {
        let rules = Rules::new(DEFAULT_PODS_DIR);
        let mut objects: Vec<DynamicObject> =
            ["create-valid.json", "create-valid-nowarn.json", "create-over-budget.json", "create-traversal.json"]
                .into_iter()
                .map(|f| fixture(f).object.unwrap())
                .collect();
        objects.extend([
            with_spec(serde_json::json!({"targetRef": {"kind": "Service", "name": "echo", "namespace": "x"}, "udsSocket": "s/a", "extra": 1})),
            with_spec(serde_json::json!({"targetRef": {"kind": "Service"}, "udsSocket": 7})),
            with_spec(serde_json::Value::Null),
            with_spec(serde_json::json!("not an object")),
        ]);
        let mut no_spec = with_spec(serde_json::Value::Null);
        no_spec.data.as_object_mut().unwrap().remove("spec");
        let mut no_types = fixture("create-valid.json").object.unwrap();
        no_types.types = None;
        objects.extend([no_spec, no_types]);
        let mut messages = std::collections::BTreeSet::new();
        for obj in &objects {
            let whole = rules.review(&serde_json::to_value(obj).unwrap()).unwrap();
            let lean = rules.review(&reviewed_value(obj)).unwrap();
            assert_eq!(lean, whole, "{:?}", obj.data);
            messages.insert(whole.message());
        }
        assert!(messages.len() >= 5, "the objects exercise distinct verdicts: {messages:?}");
    }

    #[test]
    fn the_no_warning_fixture_is_allowed_without_warnings_and_the_canonical_one_warns() {
        let rules = Rules::new(DEFAULT_PODS_DIR);
        let plain = decide_with_warnings(&fixture("create-valid-nowarn.json"), &rules, None);
        assert_eq!((plain.result, plain.response.warnings.as_deref()), ("allowed", None), "{plain:?}");
        let warned = decide_with_warnings(&fixture("create-valid.json"), &rules, None);
        assert_eq!((warned.result, warned.warned.as_slice()), ("allowed", [WarningKind::NearBudget].as_slice()));
    }
}
