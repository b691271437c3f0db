//! `POST /validate` at the router level (no sockets): AdmissionReview v1 fixtures shaped as
//! kube-apiserver sends them, sent through `webhook::router` with `tower::ServiceExt::oneshot`.
//! Covers the decision (allowed / denied naming the field), DELETE with `object: null`, bodies
//! (malformed → 400, oversized → 413, a 2.5 MiB UPDATE decided normally) and the response shape
//! (unknown request fields tolerated).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aether_controller::admin::{self, AdminState};
use aether_controller::metrics::Metrics;
use aether_controller::webhook::{self, DEFAULT_MAX_BODY_BYTES, WebhookState};
use aether_crds::Rules;
use aether_crds::udspath::{DEFAULT_PODS_DIR, SocketLimit};
use axum::Router;
use axum::body::{Body, Bytes};
use common::{assert_allowed, denial, padded, response_for, review, review_bytes, uid_of};
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const MIB: usize = 1024 * 1024;

fn state(rules: Rules) -> WebhookState {
    WebhookState { rules: Arc::new(rules), metrics: Metrics::default(), cluster: None }
}

fn default_state() -> WebhookState {
    state(Rules::new(DEFAULT_PODS_DIR))
}

fn app(state: WebhookState) -> Router {
    webhook::router(state, DEFAULT_MAX_BODY_BYTES)
}

/// Answer to one request: status and body.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn send(app: Router, req: Request<Body>) -> Answer {
    let res = app.oneshot(req).await.expect("the router is infallible");
    let status = res.status();
    let body = res.into_body().collect().await.expect("response body").to_bytes();
    Answer { status, body }
}

fn post(content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut b = Request::builder().method(Method::POST).uri("/validate");
    if let Some(ct) = content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    b.body(body.into()).expect("request builds")
}

/// POSTs `review` as kube-apiserver does (`Content-Type: application/json`, Content-Length set).
async fn post_review(state: WebhookState, review: &Value) -> Answer {
    let bytes = serde_json::to_vec(review).expect("JSON serializes");
    let req = Request::builder()
        .method(Method::POST)
        .uri("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, bytes.len())
        .body(Body::from(bytes))
        .expect("request builds");
    send(app(state), req).await
}

/// POSTs a review and returns its `response`, checking status 200 and the envelope.
async fn decide(state: WebhookState, review: &Value) -> Value {
    let answer = post_review(state, review).await;
    assert_eq!(answer.status, StatusCode::OK, "body: {}", answer.text());
    let json = answer.json();
    response_for(&json, &uid_of(review)).clone()
}

fn metric(metrics: &Metrics, kind: &str, result: &str) -> u64 {
    let want = format!("aether_admission_requests_total{{kind=\"{kind}\",result=\"{result}\"}} ");
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .map(|v| v.trim().parse().expect("counter value is an integer"))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Decisions
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn valid_create_is_allowed_and_echoes_the_uid() {
    let r = review("create-valid.json");
    let response = decide(default_state(), &r).await;
    assert_allowed(&response);
    assert!(
        response.get("patch").is_none() && response.get("patchType").is_none(),
        "a validating webhook sends no patch: {response}"
    );
}

#[tokio::test]
async fn socket_one_byte_over_the_budget_is_denied_with_the_arithmetic() {
    // One over: "sockets/app1.sock" is 17 bytes; with /var/lib/kubelet/pods the path would be 108.
    let r = review("create-over-budget.json");
    let message = denial(&decide(default_state(), &r).await);
    for want in ["spec.udsSocket", "\"sockets/app1.sock\"", "17 bytes", "16 bytes", "/var/lib/kubelet/pods"] {
        assert!(message.contains(want), "denial lacks {want:?}: {message}");
    }
}

#[tokio::test]
async fn sixteen_byte_socket_fits_the_default_budget_exactly() {
    // The valid fixture's "sockets/app.sock" is exactly 16 bytes: path 107, the sun_path maximum.
    let r = review("create-valid.json");
    assert_eq!(r["request"]["object"]["spec"]["udsSocket"].as_str().map(str::len), Some(16));
    assert_allowed(&decide(default_state(), &r).await);
}

#[tokio::test]
async fn traversal_socket_value_is_denied_naming_the_field() {
    let r = review("create-traversal.json");
    let message = denial(&decide(default_state(), &r).await);
    assert!(message.contains("spec.udsSocket"), "{message}");
    assert!(message.contains("\"../app.sock\""), "the denial quotes the value: {message}");
}

#[tokio::test]
async fn every_injection_shaped_socket_value_is_denied_naming_the_field() {
    // Injection-shaped values over the webhook: each reaches the same decision as the agent and is
    // denied.
    let values = [
        "sockets/app.sock\n",
        "../app.sock",
        "sockets/..",
        "./app.sock",
        "sockets//app.sock",
        "/sockets/app.sock",
        "sockets/app.sock/",
        "Sockets/app.sock",
        "sockets\\app.sock",
        "%2e%2e/app.sock",
        "sockets\u{FF0F}app.sock",
        "sockets/a\0pp.sock",
        "sockets/app.sock ",
        "",
    ];
    for value in values {
        let mut r = review("create-valid.json");
        r["request"]["object"]["spec"]["udsSocket"] = json!(value);
        let message = denial(&decide(default_state(), &r).await);
        assert!(message.contains("spec.udsSocket"), "{value:?}: {message}");
    }
}

#[tokio::test]
async fn non_service_target_is_denied_naming_spec_target_ref_kind() {
    let r = review("create-deployment-target.json");
    let message = denial(&decide(default_state(), &r).await);
    assert!(message.contains("spec.targetRef.kind"), "{message}");
    assert!(message.contains("\"Deployment\""), "{message}");
    assert!(message.contains("\"Service\""), "the denial says what is allowed: {message}");
    // The fixture's group "apps" is wrong too: every violation is reported, not just the first.
    assert!(message.contains("spec.targetRef.group"), "{message}");
}

#[tokio::test]
async fn target_namespace_field_is_denied_never_read_as_a_cross_namespace_target() {
    // An unknown `namespace` in targetRef must not take effect.
    let mut r = review("create-valid.json");
    r["request"]["object"]["spec"]["targetRef"]["namespace"] = json!("payments");
    let message = denial(&decide(default_state(), &r).await);
    assert!(message.contains("spec.targetRef.namespace"), "{message}");
}

#[tokio::test]
async fn core_group_written_either_way_is_allowed() {
    for group in ["", "core"] {
        let mut r = review("create-valid.json");
        r["request"]["object"]["spec"]["targetRef"]["group"] = json!(group);
        assert_allowed(&decide(default_state(), &r).await);
    }
}

#[tokio::test]
async fn policy_without_a_socket_is_denied_as_malformed_not_a_400() {
    // A schema failure is a decision (200, denied), not a malformed review.
    let mut r = review("create-valid.json");
    r["request"]["object"]["spec"].as_object_mut().expect("spec is an object").remove("udsSocket");
    let message = denial(&decide(default_state(), &r).await);
    assert!(message.contains("udsSocket"), "{message}");
}

#[tokio::test]
async fn update_is_validated_like_create() {
    assert_allowed(&decide(default_state(), &review("update-valid.json")).await);
    let message = denial(&decide(default_state(), &review("update-over-budget.json")).await);
    assert!(message.contains("spec.udsSocket") && message.contains("17 bytes"), "{message}");
}

#[tokio::test]
async fn update_is_decided_on_the_new_object_not_the_old_one() {
    // Fixing an invalid policy must be possible: an over-budget oldObject does not block a valid
    // object.
    let mut r = review("update-valid.json");
    r["request"]["oldObject"]["spec"]["udsSocket"] = json!("sockets/app1.sock");
    assert_allowed(&decide(default_state(), &r).await);
}

#[tokio::test]
async fn metadata_only_update_of_a_spec_that_no_longer_fits_is_allowed_with_a_warning() {
    // Ratcheting: a policy admitted under a wider budget must still accept metadata changes
    // (e.g. a finalizer being removed), or it could never be deleted.
    let mut r = review("update-valid.json");
    r["request"]["oldObject"]["spec"]["udsSocket"] = json!("sockets/app1.sock");
    r["request"]["object"]["spec"]["udsSocket"] = json!("sockets/app1.sock");
    r["request"]["object"]["metadata"]["labels"] = json!({"team": "shop"});
    let answer = decide(default_state(), &r).await;
    assert_allowed(&answer);
    let warnings = answer["warnings"].as_array().expect("a warning explains the ratchet");
    assert!(warnings[0].as_str().unwrap().contains("17 bytes"), "{warnings:?}");
}

#[tokio::test]
async fn update_that_changes_an_invalid_spec_to_another_invalid_one_is_denied() {
    let mut r = review("update-valid.json");
    r["request"]["oldObject"]["spec"]["udsSocket"] = json!("sockets/app1.sock");
    r["request"]["object"]["spec"]["udsSocket"] = json!("sockets/app12.sock");
    let answer = decide(default_state(), &r).await;
    assert!(denial(&answer).contains("18 bytes"), "{answer}");
}

#[tokio::test]
async fn delete_with_null_object_is_allowed_and_echoes_the_uid() {
    // DELETE reviews carry `object: null` and the old object (here one that would be denied
    // today: deleting it must still work).
    let r = review("delete-null-object.json");
    assert!(r["request"]["object"].is_null() && r["request"]["oldObject"].is_object());
    assert_allowed(&decide(default_state(), &r).await);
}

#[tokio::test]
async fn delete_without_object_key_at_all_is_allowed() {
    let mut r = review("delete-null-object.json");
    r["request"].as_object_mut().expect("request is an object").remove("object");
    assert_allowed(&decide(default_state(), &r).await);
}

#[tokio::test]
async fn reviews_of_other_kinds_are_allowed() {
    // This webhook has no rules for pods (and must never sit in the pod admission path): even a
    // pod with a hostile annotation is not its business (the agent degrades it to TCP).
    let r = review("pod-create.json");
    assert_allowed(&decide(default_state(), &r).await);
}

#[tokio::test]
async fn a_same_named_kind_of_another_group_is_allowed() {
    let mut r = review("create-over-budget.json");
    r["request"]["kind"]["group"] = json!("example.com");
    assert_allowed(&decide(default_state(), &r).await);
}

#[tokio::test]
async fn misconfigured_budget_denies_every_policy_create_saying_so() {
    let pods_dir = "/var/snap/microk8s/common/var/lib/kubelet/pods";
    assert!(Rules::new(pods_dir).budget().is_err(), "microk8s' pods dir leaves no budget");
    for fixture in ["create-valid.json", "create-over-budget.json", "update-valid.json"] {
        let r = review(fixture);
        let message = denial(&decide(state(Rules::new(pods_dir)), &r).await);
        assert!(message.contains("misconfigured"), "{fixture}: {message}");
        assert!(message.contains(pods_dir), "{fixture}: the denial names the pods dir: {message}");
    }
    // Nothing else is blocked by the misconfiguration.
    assert_allowed(&decide(state(Rules::new(pods_dir)), &review("delete-null-object.json")).await);
    assert_allowed(&decide(state(Rules::new(pods_dir)), &review("pod-create.json")).await);
}

#[tokio::test]
async fn a_shorter_pods_dir_widens_the_budget() {
    // Mounting the pods dir at /k gives 35 bytes.
    let mut r = review("create-valid.json");
    let sock = "sockets/application-server-012.sock";
    assert_eq!(sock.len(), 35);
    r["request"]["object"]["spec"]["udsSocket"] = json!(sock);
    assert_allowed(&decide(state(Rules::new("/k")), &r).await);
    let message = denial(&decide(default_state(), &r).await);
    assert!(message.contains("35 bytes") && message.contains("16 bytes"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// Response shape
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn unknown_request_field_and_missing_dry_run_are_tolerated() {
    let r = review("create-unknown-request-field-no-dryrun.json");
    assert!(r["request"].get("dryRun").is_none() && r["request"].get("someFutureField").is_some());
    let answer = post_review(default_state(), &r).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let json = answer.json();
    // response_for checks apiVersion admission.k8s.io/v1, kind AdmissionReview, and the uid.
    assert_allowed(response_for(&json, &uid_of(&r)));
}

#[tokio::test]
async fn answers_are_json_admission_reviews() {
    let req = post(Some("application/json"), review_bytes("create-over-budget.json"));
    let res = app(default_state()).oneshot(req).await.expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    let ct = res.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(ct.starts_with("application/json"), "Content-Type {ct:?}");
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let json: Value = serde_json::from_slice(&body).expect("JSON");
    let response = response_for(&json, "b0a1c2d3-0002-4000-8000-000000000002");
    // The API server reads the reason from status.message and requires a failure code >= 400 or 0.
    let code = response["status"].get("code").and_then(Value::as_u64).unwrap_or(0);
    assert!(code == 0 || code >= 400, "status.code {code}: {response}");
}

#[tokio::test]
async fn content_type_with_a_charset_is_accepted() {
    let answer =
        send(app(default_state()), post(Some("application/json; charset=utf-8"), review_bytes("create-valid.json")))
            .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
}

// ---------------------------------------------------------------------------------------------
// Malformed and oversized bodies
// ---------------------------------------------------------------------------------------------

async fn assert_400(body: impl Into<Body>, content_type: Option<&str>, reason: &[&str]) {
    assert_400_counted(body, content_type, reason, "malformed").await;
}

/// A JSON review with a wrong envelope: 400 whose body holds `want`, counted
/// `result="unsupported-envelope"`.
async fn assert_unsupported_envelope(review: &serde_json::Value, want: &str) {
    let body = serde_json::to_vec(review).expect("JSON");
    assert_400_counted(body, Some("application/json"), &[want], "unsupported-envelope").await;
}

/// A 400 whose reason holds each of `reason`, counted once as `{kind="none",result=label}`.
async fn assert_400_counted(body: impl Into<Body>, content_type: Option<&str>, reason: &[&str], label: &str) {
    let st = default_state();
    let metrics = st.metrics.clone();
    let answer = send(app(st), post(content_type, body)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.text());
    let text = answer.text();
    assert!(!text.trim().is_empty(), "a 400 carries its reason");
    for want in reason {
        assert!(text.contains(want), "400 reason lacks {want:?}: {text}");
    }
    assert_eq!(metric(&metrics, "none", label), 1, "{}", metrics.encode());
    assert_eq!(metrics.encode().matches("aether_admission_requests_total{").count(), 1, "{}", metrics.encode());
}

#[tokio::test]
async fn empty_body_is_400_with_a_reason() {
    assert_400(Body::empty(), Some("application/json"), &["not an AdmissionReview"]).await;
}

#[tokio::test]
async fn empty_json_object_is_400_naming_the_missing_envelope() {
    assert_400_counted(
        "{}",
        Some("application/json"),
        &["apiVersion is missing; kind is missing: send admission.k8s.io/v1 AdmissionReview"],
        "unsupported-envelope",
    )
    .await;
}

#[tokio::test]
async fn review_without_request_is_400_with_a_reason() {
    assert_400(review_bytes("no-request.json"), Some("application/json"), &["no request"]).await;
}

#[tokio::test]
async fn non_json_body_is_400_with_a_reason() {
    assert_400("apiVersion: admission.k8s.io/v1\n", Some("application/json"), &["not an AdmissionReview"]).await;
}

#[tokio::test]
async fn wrong_content_type_is_400_with_a_reason() {
    // Even a perfectly good review is refused when not sent as JSON.
    assert_400(
        review_bytes("create-valid.json"),
        Some("text/plain"),
        &["Content-Type", "application/json", "text/plain"],
    )
    .await;
}

#[tokio::test]
async fn missing_content_type_is_400_with_a_reason() {
    assert_400(review_bytes("create-valid.json"), None, &["Content-Type"]).await;
}

// Envelope: only `apiVersion: admission.k8s.io/v1`, `kind: AdmissionReview` is decided.

/// The rule every envelope 400 ends with.
const ENVELOPE_RULE: &str =
    "send admission.k8s.io/v1 AdmissionReview (the webhook's admissionReviewVersions is [\"v1\"])";

#[tokio::test]
async fn v1beta1_review_is_400_naming_the_api_version_and_the_rule() {
    // Answered 200 before, echoing v1beta1: an API server registered with another
    // admissionReviewVersions would have got a decision in a version it did not ask the chart for.
    let r = review("create-v1beta1.json");
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1beta1");
    let want = format!("apiVersion \"admission.k8s.io/v1beta1\" is not supported: {ENVELOPE_RULE}");
    assert_unsupported_envelope(&r, &want).await;
    let answer = post_review(default_state(), &r).await;
    assert_eq!(answer.text(), want, "the whole reason is the envelope's");
}

#[tokio::test]
async fn wrong_kind_is_400_naming_the_kind_and_the_rule() {
    let mut r = review("create-valid.json");
    r["kind"] = json!("AdmissionRequest");
    let want = format!("kind \"AdmissionRequest\" is not supported: {ENVELOPE_RULE}");
    assert_unsupported_envelope(&r, &want).await;
}

#[tokio::test]
async fn missing_api_version_and_kind_is_400_naming_both() {
    let mut r = review("create-valid.json");
    let top = r.as_object_mut().expect("a review is an object");
    top.remove("apiVersion");
    top.remove("kind");
    let want = format!("apiVersion is missing; kind is missing: {ENVELOPE_RULE}");
    assert_unsupported_envelope(&r, &want).await;
}

#[tokio::test]
async fn every_wrong_envelope_field_is_named_even_when_the_request_does_not_parse() {
    // The envelope is the reason even when the rest is shaped for another version; a non-string
    // value is quoted as JSON.
    let body = json!({"apiVersion": 1, "kind": "AdmissionReview/v1", "request": {"operation": "PATCH"}});
    let want = format!("apiVersion 1 is not supported; kind \"AdmissionReview/v1\" is not supported: {ENVELOPE_RULE}");
    assert_unsupported_envelope(&body, &want).await;
}

#[tokio::test]
async fn valid_v1_envelope_is_decided_and_answered_in_v1() {
    let st = default_state();
    let m = st.metrics.clone();
    let r = review("create-valid.json");
    assert_eq!((&r["apiVersion"], &r["kind"]), (&json!("admission.k8s.io/v1"), &json!("AdmissionReview")));
    // response_for checks the answer's envelope is v1 AdmissionReview too.
    assert_allowed(&decide(st, &r).await);
    assert_eq!(metric(&m, "EndpointPolicy", "allowed"), 1, "{}", m.encode());
    assert_eq!(metric(&m, "none", "unsupported-envelope"), 0, "{}", m.encode());
}

#[tokio::test]
async fn request_with_an_unknown_operation_is_400() {
    let mut r = review("create-valid.json");
    r["request"]["operation"] = json!("PATCH");
    assert_400(serde_json::to_vec(&r).expect("JSON"), Some("application/json"), &["not an AdmissionReview"]).await;
}

#[tokio::test]
async fn valid_update_near_the_body_cap_is_decided_normally() {
    // An UPDATE carries two objects; each here has 448 KiB of annotations (the API server allows
    // 256 KiB): the review is just under the default 1 MiB cap.
    let allowed = padded(review("update-valid.json"), 7 * MIB / 16);
    let size = serde_json::to_vec(&allowed).expect("JSON").len();
    assert!(size > 7 * MIB / 8 && size < MIB, "review is {size} bytes");
    assert_allowed(&decide(default_state(), &allowed).await);

    let denied = padded(review("update-over-budget.json"), 7 * MIB / 16);
    let message = denial(&decide(default_state(), &denied).await);
    assert!(message.contains("spec.udsSocket"), "{message}");
}

#[tokio::test]
async fn body_of_8_mib_is_413() {
    let st = default_state();
    let metrics = st.metrics.clone();
    let body = padded(review("update-valid.json"), 4 * MIB);
    let bytes = serde_json::to_vec(&body).expect("JSON");
    assert!(bytes.len() >= 8 * MIB, "{}", bytes.len());
    let req = Request::builder()
        .method(Method::POST)
        .uri("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, bytes.len())
        .body(Body::from(bytes))
        .expect("request builds");
    let answer = send(app(st), req).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", answer.text());
    assert_eq!(metric(&metrics, "none", "too-large"), 1, "a 413 is counted: {}", metrics.encode());
}

#[tokio::test]
async fn body_of_8_mib_without_content_length_is_413() {
    // Chunked transfer: the cap is enforced while reading, not only from Content-Length.
    let st = default_state();
    let metrics = st.metrics.clone();
    let bytes = vec![b' '; 8 * MIB];
    let answer = send(app(st), post(Some("application/json"), Body::from_stream_chunks(bytes))).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", answer.text());
    assert_eq!(metric(&metrics, "none", "too-large"), 1, "{}", metrics.encode());
}

/// `Body::from` a Vec gives the body an exact size hint; this wraps it as an unsized stream of
/// 64 KiB chunks (like `Transfer-Encoding: chunked`).
trait FromStreamChunks {
    fn from_stream_chunks(bytes: Vec<u8>) -> Body;
}

impl FromStreamChunks for Body {
    fn from_stream_chunks(bytes: Vec<u8>) -> Body {
        let (mut tx, rx) = http_body_util::channel::Channel::<Bytes>::new(4);
        tokio::spawn(async move {
            for chunk in bytes.chunks(64 * 1024) {
                if tx.send_data(Bytes::copy_from_slice(chunk)).await.is_err() {
                    return;
                }
            }
        });
        Body::new(rx)
    }
}

#[tokio::test]
async fn oversized_content_length_is_answered_without_reading_the_body() {
    // "above the cap → 413 without buffering it all": the body sends one chunk and then stalls
    // forever; the answer must not wait for it.
    let (mut tx, rx) = http_body_util::channel::Channel::<Bytes>::new(1);
    tx.send_data(Bytes::from_static(b"{\"kind\":")).await.expect("buffered");
    let req = Request::builder()
        .method(Method::POST)
        .uri("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, 8 * MIB)
        .body(Body::new(rx))
        .expect("request builds");
    let answer = tokio::time::timeout(Duration::from_secs(10), send(app(default_state()), req))
        .await
        .expect("413 is answered without waiting for the body");
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    drop(tx);
}

#[tokio::test]
async fn oversized_chunked_body_is_not_read_much_past_the_cap() {
    // An endless chunked body: reading stops once the cap is passed.
    let sent = Arc::new(AtomicUsize::new(0));
    let (mut tx, rx) = http_body_util::channel::Channel::<Bytes>::new(1);
    let counter = sent.clone();
    let producer = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b' '; MIB]);
        while tx.send_data(chunk.clone()).await.is_ok() {
            counter.fetch_add(MIB, Ordering::SeqCst);
        }
    });
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        send(app(default_state()), post(Some("application/json"), Body::new(rx))),
    )
    .await
    .expect("413 is answered while the client is still sending");
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    producer.await.expect("producer stops once the body is dropped");
    let read = sent.load(Ordering::SeqCst);
    assert!(read <= DEFAULT_MAX_BODY_BYTES + 2 * MIB, "read {read} bytes of an endless body");
}

#[tokio::test]
async fn reviews_in_flight_wait_for_their_share_of_the_budget() {
    // A request declaring a body at the cap holds its share of the budget (48 of 64 MiB at the
    // default cap) from before its body is read until it is answered: a small review still fits
    // beside it and is decided; a second review near the cap does not fit and waits until the
    // first is answered, then is decided.
    let app = app(default_state());
    let (tx, rx) = http_body_util::channel::Channel::<Bytes>::new(1);
    let big = Request::builder()
        .method(Method::POST)
        .uri("/validate")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, DEFAULT_MAX_BODY_BYTES)
        .body(Body::new(rx))
        .expect("request builds");
    let holder = tokio::spawn(send(app.clone(), big));
    // One thread: the holder runs while this task sleeps, takes its share at once (the budget is
    // free) and waits for its body.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!holder.is_finished(), "the big request is waiting for its body");
    let small = send(app.clone(), post(Some("application/json"), review_bytes("create-valid.json")));
    let small = tokio::time::timeout(Duration::from_secs(10), small).await.expect("a small review fits beside it");
    assert_eq!(small.status, StatusCode::OK, "{}", small.text());
    let near = serde_json::to_vec(&padded(review("update-valid.json"), 7 * MIB / 16)).expect("JSON");
    let waiting = tokio::spawn(send(app, post(Some("application/json"), near)));
    // Not decided while the first holds its share (waiting longer only makes this surer).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "a review near the cap was decided beside another at the cap");
    drop(tx); // the first body ends short of its length: 400, and its share is released
    let big = holder.await.expect("the big request");
    assert_eq!(big.status, StatusCode::BAD_REQUEST, "{}", big.text());
    let near = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("answered").expect("task");
    assert_eq!(near.status, StatusCode::OK, "{}", near.text());
}

#[tokio::test]
async fn the_body_cap_is_configurable() {
    let small = webhook::router(default_state(), 1024);
    let answer = send(small, post(Some("application/json"), review_bytes("create-valid.json"))).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
}

// ---------------------------------------------------------------------------------------------
// Routes and metrics
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn only_post_validate_is_served() {
    let get = Request::builder().method(Method::GET).uri("/validate").body(Body::empty()).expect("builds");
    assert_eq!(send(app(default_state()), get).await.status, StatusCode::METHOD_NOT_ALLOWED);
    let mut other = post(Some("application/json"), review_bytes("create-valid.json"));
    *other.uri_mut() = "/mutate".parse().expect("uri");
    assert_eq!(send(app(default_state()), other).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn decisions_are_counted_by_kind_and_result() {
    let st = default_state();
    let m = st.metrics.clone();
    decide(st.clone(), &review("create-valid.json")).await;
    decide(st.clone(), &review("update-valid.json")).await;
    decide(st.clone(), &review("create-over-budget.json")).await;
    decide(st.clone(), &review("pod-create.json")).await;
    send(app(st.clone()), post(Some("application/json"), "{}")).await;
    assert_eq!(metric(&m, "EndpointPolicy", "allowed"), 2, "{}", m.encode());
    assert_eq!(metric(&m, "EndpointPolicy", "denied"), 1);
    assert_eq!(metric(&m, "other", "allowed"), 1, "kinds other than EndpointPolicy share one label value");
    assert_eq!(metric(&m, "none", "unsupported-envelope"), 1, "`{{}}` has no envelope");
    send(app(st.clone()), post(Some("application/json"), "[]")).await;
    assert_eq!(metric(&m, "none", "malformed"), 1);
    assert!(m.encode().contains("aether_admission_duration_seconds_count 4"), "{}", m.encode());
}

// ---------------------------------------------------------------------------------------------
// Admin router
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn readyz_is_503_until_the_tls_listener_is_bound() {
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admin = admin::router(AdminState { ready: ready.clone(), metrics: Metrics::default(), cluster: None });
    let get = |path: &str| Request::builder().uri(path).body(Body::empty()).expect("builds");
    let before = send(admin.clone(), get("/readyz")).await;
    assert_eq!(before.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(before.text().contains("not bound"), "{}", before.text());
    assert_eq!(send(admin.clone(), get("/healthz")).await.status, StatusCode::OK, "healthz does not wait for TLS");
    ready.store(true, Ordering::Release);
    assert_eq!(send(admin.clone(), get("/readyz")).await.status, StatusCode::OK);
}

// Warnings

struct Facts {
    rivals: Option<Vec<(String, bool)>>,
    service: Option<bool>,
}

impl aether_controller::admission::ClusterFacts for Facts {
    fn rivals(&self, namespace: &str, target: &str, name: &str) -> Option<Vec<(String, bool)>> {
        assert_eq!((namespace, target, name), ("shop", "echo", "echo-uds"), "asked about the reviewed policy");
        self.rivals.clone()
    }
    fn service_exists(&self, namespace: &str, name: &str) -> Option<bool> {
        assert_eq!((namespace, name), ("shop", "echo"));
        self.service
    }
}

/// `create-valid.json` with a socket value well inside the budget (its `sockets/app.sock` is
/// exactly 16 bytes, which the near-budget warning reports).
fn short_create() -> Value {
    let mut r = review("create-valid.json");
    r["request"]["object"]["spec"]["udsSocket"] = json!("s/app.sock");
    r
}

fn warnings_for(review_json: &Value, facts: Option<&Facts>) -> (bool, Vec<String>) {
    let req = aether_controller::admission::parse(&serde_json::to_vec(review_json).unwrap()).unwrap();
    let facts = facts.map(|f| f as &dyn aether_controller::admission::ClusterFacts);
    let d = aether_controller::admission::decide_with_warnings(&req, &Rules::new(DEFAULT_PODS_DIR), facts);
    assert_eq!(d.warned.len(), d.response.warnings.as_ref().map_or(0, Vec::len), "one label per warning");
    (d.response.allowed, d.response.warnings.unwrap_or_default())
}

#[test]
fn an_allowed_duplicate_is_warned_naming_the_winner() {
    let facts = Facts { rivals: Some(vec![("a-pol".into(), true)]), service: Some(true) };
    let (allowed, w) = warnings_for(&short_create(), Some(&facts));
    assert!(allowed);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("EndpointPolicy \"a-pol\"") && w[0].contains("\"a-pol\" wins"), "{w:?}");
}

#[test]
fn a_missing_service_is_warned_but_not_while_the_cache_is_unsynced() {
    let missing = Facts { rivals: Some(vec![]), service: Some(false) };
    let (_, w) = warnings_for(&short_create(), Some(&missing));
    assert!(w.len() == 1 && w[0].contains("Service \"echo\" does not exist in namespace \"shop\""), "{w:?}");
    let unsynced = Facts { rivals: None, service: None };
    assert!(warnings_for(&short_create(), Some(&unsynced)).1.is_empty());
    assert!(warnings_for(&short_create(), None).1.is_empty(), "no cluster: no cluster warnings");
}

#[test]
fn a_denied_policy_gets_no_warnings_about_other_policies() {
    let facts = Facts { rivals: Some(vec![("a-pol".into(), true)]), service: Some(false) };
    let (allowed, w) = warnings_for(&review("create-over-budget.json"), Some(&facts));
    assert!(!allowed);
    assert!(w.is_empty(), "{w:?}");
}

#[tokio::test]
async fn a_value_near_the_budget_is_warned_even_without_a_cluster_and_counted() {
    let state = default_state();
    let metrics = state.metrics.clone();
    let mut r = review("create-valid.json");
    r["request"]["object"]["spec"]["udsSocket"] = json!("sockets/app1.so"); // 15 of 16 bytes
    let answer = decide(state, &r).await;
    assert_allowed(&answer);
    let warnings = answer["warnings"].as_array().expect("a near-budget warning");
    assert!(
        warnings[0].as_str().unwrap().starts_with("spec.udsSocket: \"sockets/app1.so\" is 15 bytes"),
        "{warnings:?}"
    );
    assert!(
        metrics.encode().contains("aether_admission_warnings_total{warning=\"near-budget\"} 1"),
        "{}",
        metrics.encode()
    );
}

// ---------------------------------------------------------------------------------------------
// --socket-limit filesystem: with pinning on every node, the file system's limits replace the
// sun_path budget; the grammar and the default are unchanged.
// ---------------------------------------------------------------------------------------------

fn filesystem_state(pods_dir: &str) -> WebhookState {
    state(Rules::with_limit(pods_dir, SocketLimit::Filesystem))
}

fn with_socket(socket: &str) -> Value {
    let mut r = review("create-valid.json");
    r["request"]["object"]["spec"]["udsSocket"] = json!(socket);
    r
}

#[tokio::test]
async fn under_the_file_system_limit_a_40_byte_socket_is_allowed_without_a_warning() {
    let socket = format!("sockets/{}.sock", "a".repeat(27));
    assert_eq!(socket.len(), 40);
    let answer = decide(filesystem_state(DEFAULT_PODS_DIR), &with_socket(&socket)).await;
    assert_allowed(&answer);
    assert!(answer.get("warnings").is_none_or(Value::is_null), "no near-budget warning: {answer}");
    // The default limit denies the same value with the sun_path arithmetic, as before.
    let message = denial(&decide(default_state(), &with_socket(&socket)).await);
    assert_eq!(
        message,
        format!(
            "spec.udsSocket {socket:?} is 40 bytes; the budget is 16 bytes with pods dir /var/lib/kubelet/pods \
             (sun_path holds 107)"
        )
    );
}

#[tokio::test]
async fn under_the_file_system_limit_a_256_byte_file_is_denied_naming_the_rule() {
    let socket = format!("s/{}", "f".repeat(256));
    let message = denial(&decide(filesystem_state(DEFAULT_PODS_DIR), &with_socket(&socket)).await);
    assert_eq!(
        message,
        format!(
            "spec.udsSocket {:?}... (258 bytes) names a file of 256 bytes, over the 255-byte limit of a file name \
             (NAME_MAX, the file system's name limit; --socket-limit filesystem)",
            &socket[..64]
        )
    );
    // 319 bytes (a 63-byte volume, '/', a 255-byte file) is the longest value allowed.
    let longest = format!("{}/{}", "v".repeat(63), "f".repeat(255));
    assert_allowed(&decide(filesystem_state(DEFAULT_PODS_DIR), &with_socket(&longest)).await);
    // The grammar is the same: a traversal is denied under either limit.
    let message = denial(&decide(filesystem_state(DEFAULT_PODS_DIR), &review("create-traversal.json")).await);
    assert!(message.contains("spec.udsSocket") && message.contains("\"../app.sock\""), "{message}");
}

#[tokio::test]
async fn under_the_file_system_limit_a_pods_dir_without_a_sun_path_budget_admits_policies() {
    let microk8s = "/var/snap/microk8s/common/var/lib/kubelet/pods";
    let message = denial(&decide(state(Rules::new(microk8s)), &review("create-valid.json")).await);
    assert!(message.contains("misconfigured") && message.contains("--socket-limit filesystem"), "{message}");
    assert_allowed(&decide(filesystem_state(microk8s), &review("create-valid.json")).await);
    assert_allowed(&decide(filesystem_state(microk8s), &review("create-over-budget.json")).await);
}
