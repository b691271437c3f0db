//! AdmissionReview v1 in, AdmissionReview v1 out: the decision, dispatched by kind. Pure: no I/O.

use aether_crds::Rules;
use aether_crds::policy::{self, EndpointPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, GroupVersionKind, Status, TypeMeta};
use serde::{Deserialize, Serialize};

use crate::warnings::{self, Rival, WarningKind};

/// What the webhook decided, with the facts its log line and metrics need.
#[derive(Debug)]
pub struct Verdict {
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

/// The part of an AdmissionRequest (v1) the decision reads: everything else a review carries
/// (`resource`, `userInfo`, `options`, `dryRun`, the objects' metadata but their name, such as
/// `managedFields` and the last-applied annotation: most of a review's bytes) is skipped unread by
/// [`parse`].
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `request.uid`, echoed in the response.
    pub uid: String,
    /// `request.kind`: the kind of the object reviewed.
    pub kind: GroupVersionKind,
    /// `request.name` (empty when absent, e.g. a CREATE with `generateName`).
    pub name: String,
    /// `request.namespace`.
    pub namespace: Option<String>,
    /// `request.operation`.
    pub operation: Operation,
    /// `request.object` (`None` when absent or `null`, e.g. a DELETE), as `ReviewedObject` reads it.
    pub object: Option<DynamicObject>,
    /// `request.oldObject` (an UPDATE's object before it), as `ReviewedObject` reads it.
    pub old_object: Option<DynamicObject>,
}

impl From<AdmissionRequest<DynamicObject>> for Request {
    /// The fields the decision reads, from a request parsed whole (objects keep all metadata).
    fn from(req: AdmissionRequest<DynamicObject>) -> Self {
        Request {
            uid: req.uid,
            kind: req.kind,
            name: req.name,
            namespace: req.namespace,
            operation: req.operation,
            object: req.object,
            old_object: req.old_object,
        }
    }
}

/// The wire shape [`parse`] reads: the envelope (any JSON type, so that a wrong type is reported
/// as a wrong value rather than a parse error) and the request's fields the decision needs, with
/// the same types as [`AdmissionRequest`]'s, so that whatever it accepts this accepts too.
#[derive(Deserialize)]
struct WireReview {
    #[serde(rename = "apiVersion")]
    api_version: Option<serde_json::Value>,
    kind: Option<serde_json::Value>,
    request: Option<WireRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest {
    uid: String,
    kind: GroupVersionKind,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    object: Option<ReviewedObject>,
    old_object: Option<ReviewedObject>,
}

/// An object of a review read for the decision: its top-level fields but `metadata` as JSON
/// values, `apiVersion` and `kind` as its [`TypeMeta`] when both are strings (as
/// [`DynamicObject`]'s own parse keeps them), and of `metadata` the name alone (the rest, mostly
/// `managedFields`, is skipped without being built).
struct ReviewedObject(DynamicObject);

/// `metadata` as `ReviewedObject` reads it: an object (as `ObjectMeta` must be) whose `name`,
/// when present, is a string.
#[derive(Deserialize)]
struct WireMeta {
    #[serde(default)]
    name: Option<String>,
}

impl<'de> Deserialize<'de> for ReviewedObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ReviewedObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ReviewedObject, A::Error> {
                let mut data = serde_json::Map::new();
                let mut name = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "metadata" {
                        name = map.next_value::<WireMeta>()?.name;
                    } else {
                        data.insert(key, map.next_value()?);
                    }
                }
                let types = match (data.get("apiVersion"), data.get("kind")) {
                    (Some(serde_json::Value::String(_)), Some(serde_json::Value::String(_))) => {
                        let mut text = |k: &str| match data.remove(k) {
                            Some(serde_json::Value::String(s)) => s,
                            _ => String::new(),
                        };
                        Some(TypeMeta { api_version: text("apiVersion"), kind: text("kind") })
                    }
                    _ => None,
                };
                let metadata = ObjectMeta { name, ..ObjectMeta::default() };
                Ok(ReviewedObject(DynamicObject { types, metadata, data: serde_json::Value::Object(data) }))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// Parses a request body into the [`Request`] the decision reads. The envelope must be
/// `apiVersion: admission.k8s.io/v1`, `kind: AdmissionReview`; a body that is a JSON object with
/// another (or no) envelope is refused with [`BadReview::Envelope`] whatever the rest of it
/// holds, so that the reason given is the version, not a field the other version shapes
/// differently.
///
/// Only the fields of [`Request`] are read and type-checked, with [`AdmissionRequest`]'s types;
/// the rest must be well-formed JSON but is skipped unbuilt (the whole parse into kube's types,
/// `managedFields` included, was ~50 % of the webhook's CPU per review). So a body this refuses,
/// kube's parse refuses too, and it is answered with that parse's error (line, column, field),
/// as before; a review whose unread fields have the wrong types (`userInfo`, `options`,
/// `metadata.generation`, ...), which an API server never sends, is now decided rather than
/// answered 400.
///
/// # Errors
/// [`BadReview`] saying what is wrong, for a 400 answer.
pub fn parse(body: &[u8]) -> Result<Request, BadReview> {
    let review: WireReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        // The error of the whole review's parse: the same reason as ever (line, column, field).
        Err(lean) => return Err(parse_whole(body).err().unwrap_or_else(|| BadReview::Parse(lean.to_string()))),
    };
    check_envelope(review.api_version.as_ref(), review.kind.as_ref())?;
    let Some(req) = review.request else {
        return Err(BadReview::NoRequest(kube::core::admission::ConvertAdmissionReviewError.to_string()));
    };
    Ok(Request {
        uid: req.uid,
        kind: req.kind,
        name: req.name,
        namespace: req.namespace,
        operation: req.operation,
        object: req.object.map(|o| o.0),
        old_object: req.old_object.map(|o| o.0),
    })
}

/// The whole review parsed into kube's [`AdmissionRequest`], every field type-checked: the error
/// [`parse`] answers a body it cannot read with.
fn parse_whole(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, BadReview> {
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

/// The response allowing `req`, before any denial or warning: what kube's
/// `AdmissionResponse::from(&AdmissionRequest)` gives for the same review (its type meta is the
/// review's, which [`parse`] only accepts as [`REVIEW_API_VERSION`] [`REVIEW_KIND`]).
fn allowing(req: &Request) -> AdmissionResponse {
    // kube builds an AdmissionResponse only from its own request type or as `invalid`; this is
    // `invalid`'s turned into `from`'s (the unit tests compare the two).
    let mut response = AdmissionResponse::invalid("");
    response.types = TypeMeta { api_version: REVIEW_API_VERSION.to_owned(), kind: REVIEW_KIND.to_owned() };
    response.uid = req.uid.clone();
    response.allowed = true;
    response.result = Status::default();
    response
}

/// The AdmissionReview that carries `response`, serialized as kube's `response.into_review()`
/// is (the same fields in the same order) without cloning the response into a review first.
#[derive(Debug, Serialize)]
pub struct Answer<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    response: &'a AdmissionResponse,
}

impl<'a> From<&'a AdmissionResponse> for Answer<'a> {
    fn from(response: &'a AdmissionResponse) -> Self {
        Answer { api_version: &response.types.api_version, kind: &response.types.kind, response }
    }
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
pub fn decide(req: &Request, rules: &Rules) -> Verdict {
    let object = format!("{}/{}", req.namespace.as_deref().unwrap_or(""), req.name);
    let is_policy = req.kind.group == policy::GROUP && req.kind.kind == policy::KIND;
    // A fixed label set: the kind comes from the request, and metric labels must stay bounded.
    let kind = if is_policy { policy::KIND } else { "other" }.to_owned();
    let base = allowing(req);
    let Some(obj) = req.object.as_ref().filter(|_| is_policy && req.operation != Operation::Delete) else {
        return Verdict { response: base, result: "allowed", object, kind, warned: vec![] };
    };
    let verdict = match rules.review(&reviewed_value(obj)) {
        Ok(verdict) => verdict,
        Err(e) => {
            let message = format!("aether-controller is misconfigured, no policy can be admitted: {e}");
            return Verdict { response: base.deny(message), result: "denied", object, kind, warned: vec![] };
        }
    };
    let Some(message) = verdict.message() else {
        return Verdict { response: base, result: "allowed", object, kind, warned: vec![] };
    };
    if spec_unchanged(req, obj) {
        let mut response = base;
        response.warnings =
            Some(vec![format!("spec is unchanged and allowed to stay, but it no longer passes: {message}")]);
        return Verdict { response, result: "allowed", object, kind, warned: vec![WarningKind::NoLongerValid] };
    }
    Verdict { response: base.deny(message), result: "denied", object, kind, warned: vec![] }
}

/// The object as [`Rules::review`] reads it, without its metadata: `apiVersion`, `kind`,
/// `metadata: {}` and every other top-level field (`spec`, ...) as sent.
///
/// The review checks unknown fields under `spec` and parses the object as an EndpointPolicy.
/// `obj.metadata` was already parsed as an `ObjectMeta` with the review, so it would parse again
/// whatever it holds, and `{}` parses the same way: the verdict is [`serde_json::to_value`]'s of
/// the whole object, without copying `managedFields` and the last-applied annotation (most of a
/// review's bytes) into a `Value` and walking them again — ~12 % of the webhook's CPU under
/// saturation (measured with perf).
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
fn spec_unchanged(req: &Request, obj: &DynamicObject) -> bool {
    req.operation == Operation::Update
        && req.old_object.as_ref().is_some_and(|old| old.data.get("spec") == obj.data.get("spec"))
}

/// What the webhook knows about the cluster from its caches, for warnings. Implemented by
/// [`crate::status_writer::ClusterView`]; tests use plain data.
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
pub fn decide_with_warnings(req: &Request, rules: &Rules, cluster: Option<&dyn ClusterFacts>) -> Verdict {
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

    fn fixture(name: &str) -> Request {
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

    const FIXTURES: [&str; 12] = [
        "create-deployment-target.json",
        "create-over-budget.json",
        "create-traversal.json",
        "create-unknown-request-field-no-dryrun.json",
        "create-v1beta1.json",
        "create-valid-nowarn.json",
        "create-valid.json",
        "delete-null-object.json",
        "no-request.json",
        "pod-create.json",
        "update-over-budget.json",
        "update-valid.json",
    ];

    /// `request` with only the object metadata the lean parse keeps (its name) and, for an
    /// object whose type meta is not two strings, without `apiVersion` and `kind` (which of them
    /// serde's flattened `Option<TypeMeta>` leaves in `data` depends on their order; the review
    /// ignores both).
    fn lean(mut request: Request) -> Request {
        for obj in [&mut request.object, &mut request.old_object].into_iter().flatten() {
            obj.metadata = ObjectMeta { name: obj.metadata.name.take(), ..ObjectMeta::default() };
            if let (None, Some(data)) = (&obj.types, obj.data.as_object_mut()) {
                data.remove("apiVersion");
                data.remove("kind");
            }
        }
        request
    }

    /// Each fixture, and variants of a valid one that break it in different places.
    fn bodies() -> Vec<Vec<u8>> {
        let dir = format!("{}/tests/fixtures/admission", env!("CARGO_MANIFEST_DIR"));
        let mut bodies: Vec<Vec<u8>> = FIXTURES.iter().map(|f| std::fs::read(format!("{dir}/{f}")).unwrap()).collect();
        let valid: serde_json::Value = serde_json::from_slice(&bodies[6]).unwrap();
        let variants: [(&str, serde_json::Value); 10] = [
            ("/request/operation", serde_json::json!("PATCH")),
            ("/request/uid", serde_json::json!(7)),
            ("/request/kind", serde_json::json!("EndpointPolicy")),
            ("/request/object", serde_json::json!([])),
            ("/request/object/metadata", serde_json::Value::Null),
            ("/request/object/metadata/name", serde_json::json!(1)),
            ("/request/object/apiVersion", serde_json::json!(1)),
            ("/request/object/spec", serde_json::json!({"udsSocket": "s/a", "targetRef": {"kind": "Service"}})),
            ("/apiVersion", serde_json::json!("admission.k8s.io/v1beta1")),
            ("/request", serde_json::Value::Null),
        ];
        for (pointer, value) in variants {
            let mut v = valid.clone();
            *v.pointer_mut(pointer).unwrap() = value;
            bodies.push(serde_json::to_vec(&v).unwrap());
        }
        let mut no_metadata = valid.clone();
        no_metadata["request"]["object"].as_object_mut().unwrap().remove("metadata");
        bodies.push(serde_json::to_vec(&no_metadata).unwrap());
        bodies.extend([b"{}".to_vec(), b"[]".to_vec(), b"".to_vec(), b"{\"kind\": 1}".to_vec()]);
        bodies.push([bodies[6].as_slice(), b"x"].concat());
        bodies
    }

    #[test]
    fn the_lean_parse_reads_what_the_whole_parse_reads_and_fails_with_its_error() {
        let rules = Rules::new(DEFAULT_PODS_DIR);
        let mut decided = 0;
        for body in bodies() {
            let shown = String::from_utf8_lossy(&body);
            match (parse(&body), parse_whole(&body)) {
                (Ok(lean_req), Ok(whole)) => {
                    assert_eq!(allowing(&lean_req), AdmissionResponse::from(&whole), "{shown}");
                    let whole = Request::from(whole);
                    assert_eq!(lean(lean_req.clone()), lean(whole.clone()), "{shown}");
                    let (a, b) =
                        (decide_with_warnings(&lean_req, &rules, None), decide_with_warnings(&whole, &rules, None));
                    let answer = serde_json::to_vec(&Answer::from(&a.response)).unwrap();
                    assert_eq!(answer, serde_json::to_vec(&b.response.clone().into_review()).unwrap(), "{shown}");
                    assert_eq!(
                        (a.response, a.result, a.object, a.kind, a.warned),
                        (b.response, b.result, b.object, b.kind, b.warned)
                    );
                    decided += 1;
                }
                (Err(lean_err), Err(whole_err)) => {
                    assert_eq!((lean_err.label(), lean_err.to_string()), (whole_err.label(), whole_err.to_string()));
                }
                (lean_req, whole) => panic!("{shown}: lean {lean_req:?}, whole {whole:?}"),
            }
        }
        assert!(decided >= 11, "the valid bodies are decided ({decided})");
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
