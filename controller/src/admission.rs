//! AdmissionReview v1 in, AdmissionReview v1 out: the decision, dispatched by kind. Pure: no I/O.

use aether_crds::policy;
use aether_crds::udspath::{Budget, PodsDirError};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

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
}

/// Why a request body is not an AdmissionReview we can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    /// Not JSON, or not shaped like an AdmissionReview.
    #[error("request body is not an AdmissionReview v1: {0}")]
    Parse(String),
    /// An AdmissionReview without `request`.
    #[error("AdmissionReview has no request to answer: {0}")]
    NoRequest(String),
}

/// Parses a request body into an AdmissionRequest.
///
/// # Errors
/// [`BadReview`] saying what is wrong, for a 400 answer.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, BadReview> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(|e| BadReview::Parse(e.to_string()))?;
    review.try_into().map_err(|e: kube::core::admission::ConvertAdmissionReviewError| BadReview::NoRequest(e.to_string()))
}

/// Decides one request. EndpointPolicy CREATE/UPDATE go through [`aether_crds::review`] (the
/// same decision as `aether-controller validate` and the agent); DELETE and requests without an
/// object are allowed; other kinds are allowed (this webhook has no rules for them).
pub fn decide(req: &AdmissionRequest<DynamicObject>, budget: &Result<Budget, PodsDirError>) -> Decision {
    let object = format!("{}/{}", req.namespace.as_deref().unwrap_or(""), req.name);
    let kind = req.kind.kind.clone();
    let allowed = |r: AdmissionResponse| Decision { response: r, result: "allowed", object: object.clone(), kind: kind.clone() };
    let base = AdmissionResponse::from(req);
    let is_policy = req.kind.group == policy::GROUP && req.kind.kind == policy::KIND;
    let Some(obj) = req.object.as_ref().filter(|_| is_policy && req.operation != Operation::Delete) else {
        return allowed(base);
    };
    let verdict = match budget {
        Ok(budget) => match serde_json::to_value(obj) {
            Ok(json) => aether_crds::review(&json, budget),
            Err(e) => return deny(base, format!("object cannot be read as JSON: {e}"), object, kind),
        },
        Err(e) => return deny(base, format!("aether-controller is misconfigured, no policy can be admitted: {e}"), object, kind),
    };
    match verdict.message() {
        None => allowed(base),
        Some(message) => deny(base, message, object, kind),
    }
}

fn deny(base: AdmissionResponse, message: String, object: String, kind: String) -> Decision {
    Decision { response: base.deny(message), result: "denied", object, kind }
}
