//! Helpers shared by the controller's integration tests: AdmissionReview fixtures (shaped as
//! kube-apiserver sends them) and small builders on top of them.

#![allow(dead_code)] // each test crate uses a different subset

use std::path::PathBuf;

use serde_json::{Value, json};

/// `controller/tests/fixtures/<rel>`.
pub fn fixture_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

/// An AdmissionReview fixture from `tests/fixtures/admission/<name>`, as JSON.
pub fn review(name: &str) -> Value {
    let path = fixture_path(&format!("admission/{name}"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The same fixture as the bytes sent on the wire.
pub fn review_bytes(name: &str) -> Vec<u8> {
    serde_json::to_vec(&review(name)).expect("JSON serializes")
}

/// `request.uid` of a review.
pub fn uid_of(review: &Value) -> String {
    review["request"]["uid"].as_str().expect("fixture has request.uid").to_owned()
}

/// `review` with a `example.com/blob` annotation of `pad` bytes added to the metadata of both
/// `object` and `oldObject` (as the API server sends an UPDATE of a large object).
pub fn padded(mut review: Value, pad: usize) -> Value {
    let blob = "x".repeat(pad);
    for key in ["object", "oldObject"] {
        if let Some(annotations) = review["request"][key]["metadata"]["annotations"].as_object_mut() {
            annotations.insert("example.com/blob".to_owned(), json!(blob));
        }
    }
    review
}

/// The `response` of an AdmissionReview answer, after checking the envelope the API server
/// requires (`apiVersion: admission.k8s.io/v1`, `kind: AdmissionReview`) and that `response.uid`
/// echoes `uid`.
pub fn response_for<'a>(answer: &'a Value, uid: &str) -> &'a Value {
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "answer: {answer}");
    assert_eq!(answer["kind"], "AdmissionReview", "answer: {answer}");
    assert!(answer.get("request").is_none(), "the answer must not carry a request: {answer}");
    let response = &answer["response"];
    assert_eq!(response["uid"], uid, "response.uid must echo request.uid: {answer}");
    assert!(response["allowed"].is_boolean(), "response.allowed must be a bool: {answer}");
    response
}

/// The denial message of a response (`response.status.message`), asserting it was denied.
pub fn denial(response: &Value) -> String {
    assert_eq!(response["allowed"], false, "expected a denial: {response}");
    response["status"]["message"].as_str().expect("a denial carries status.message").to_owned()
}

/// Asserts the response allows the request.
pub fn assert_allowed(response: &Value) {
    assert_eq!(response["allowed"], true, "expected allowed: {response}");
}
