//! The admission webhook's HTTP surface: `POST /validate` (AdmissionReview v1 JSON in and out).
//!
//! - Bodies are capped at [`DEFAULT_MAX_BODY_BYTES`] (configurable): an UPDATE review carries the
//!   object and the old object. Larger bodies are answered 413 as soon as their Content-Length is
//!   seen, or once the cap is read.
//! - Reviews in flight are bounded together, not only one by one: each holds, from before its
//!   body is read until it is answered, a share of [`inflight_budget_bytes`] sized for the memory
//!   its parse may take ([`PARSE_BYTES_PER_BODY_BYTE`] per body byte); a review that does not fit
//!   waits for one to finish (within [`REQUEST_TIMEOUT`], else 408). Many connections of
//!   worst-case bodies therefore cost at most the budget, whatever their number.
//! - A body that is not JSON, not an AdmissionReview, has no `request`, or is not sent as
//!   `application/json` is answered 400 with the reason in plain text (`result="malformed"`).
//! - A review whose envelope is not `apiVersion: admission.k8s.io/v1`, `kind: AdmissionReview`
//!   (e.g. `admission.k8s.io/v1beta1`) is answered 400 naming the field, its value and the rule
//!   (`result="unsupported-envelope"`), never decided and echoed in another version.
//! - Everything else is answered 200 with an AdmissionReview whose `response.uid` echoes the
//!   request's.

use std::sync::Arc;
use std::time::Instant;

use aether_crds::Rules;
use axum::Router;
use axum::body::{Bytes, HttpBody};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tower_http::limit::RequestBodyLimitLayer;

use crate::admission::{self, ClusterFacts};
use crate::metrics::Metrics;
use crate::status_writer::ClusterView;

/// How long one request may take, body included, before it is answered 408: the API server's
/// webhook timeout is at most 30 s and the chart sets at most 10 s, so nothing useful is lost.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Default cap on a review body: 1 MiB. An EndpointPolicy review is a few KiB (its spec is a
/// Service name and a socket path); what a user can grow is the metadata, and the API server
/// caps an object's annotations at 256 KiB in all. An UPDATE carries the object and the old
/// object: two objects at that limit, with their labels and `managedFields`, stay well under
/// 1 MiB. A larger policy object is refused (413, `result="too-large"`), and a bigger cap costs
/// memory ([`inflight_budget_bytes`]).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// The most memory a review's parse takes per body byte, as this webhook bounds it: the
/// worst body is a long array of one-digit numbers (`[1,1,...]`, two bytes per element), each
/// parsed into a 32-byte JSON value in a vector that may hold twice its length, and copied once
/// for the decision (`tests/e2e/flood.rs` runs such bodies under the chart's memory limit).
pub const PARSE_BYTES_PER_BODY_BYTE: usize = 48;

/// The smallest budget of reviews in flight: 64 MiB of parse memory, which the chart's 128Mi
/// controller limit holds beside the process itself (~20 MiB) and its connections' TLS buffers.
pub const MIN_INFLIGHT_BUDGET_BYTES: usize = 64 * 1024 * 1024;

/// The budget of reviews in flight, in bytes of parse memory: [`MIN_INFLIGHT_BUDGET_BYTES`], or
/// one review at the cap (`max_body_bytes` × [`PARSE_BYTES_PER_BODY_BYTE`]) when that is more, so
/// that any review the cap admits can run. At the default cap: 64 MiB, one review at the cap
/// (48 MiB) at a time beside ordinary ones (a 4 KiB review takes 192 KiB: ~85 of them beside it,
/// ~340 alone).
pub fn inflight_budget_bytes(max_body_bytes: usize) -> usize {
    MIN_INFLIGHT_BUDGET_BYTES.max(max_body_bytes.saturating_mul(PARSE_BYTES_PER_BODY_BYTE))
}

/// Reviews in flight, by the parse memory each may take (permits are KiB).
#[derive(Clone)]
struct Inflight {
    kib: Arc<tokio::sync::Semaphore>,
    max_body_bytes: usize,
}

impl Inflight {
    fn new(max_body_bytes: usize) -> Self {
        let kib = inflight_budget_bytes(max_body_bytes).div_ceil(1024);
        Inflight { kib: Arc::new(tokio::sync::Semaphore::new(kib)), max_body_bytes }
    }

    /// The KiB a request whose body has this exact length holds (unknown: the cap's).
    fn share(&self, content_length: Option<usize>) -> u32 {
        let body = content_length.unwrap_or(self.max_body_bytes).min(self.max_body_bytes);
        u32::try_from(body.saturating_mul(PARSE_BYTES_PER_BODY_BYTE).div_ceil(1024).max(1)).unwrap_or(u32::MAX)
    }
}

/// Holds the request's share of the budget while the rest of the stack reads, parses and answers
/// it. Inside the body limit (a body over the cap was answered 413 from its Content-Length
/// without waiting) and the request timeout (a wait past it is answered 408).
async fn hold_share(State(inflight): State<Inflight>, request: Request, next: Next) -> Response {
    // The body's exact length: hyper's from Content-Length (the API server always sends one);
    // none for a chunked body, which then takes the cap's share.
    let length = request.body().size_hint().exact().and_then(|n| usize::try_from(n).ok());
    let share = inflight.share(length);
    // The semaphore is never closed.
    let Ok(_held) = inflight.kib.acquire_many(share).await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    next.run(request).await
}

/// Smallest cap `run --max-body-bytes` accepts: 64 KiB. A smaller cap would answer 413 to
/// ordinary reviews (an UPDATE carries the object and the old object, each with its
/// managedFields), and with `failurePolicy: Fail` that blocks policy changes. The binary has no
/// upper bound. The chart's `values.schema.json` states the same minimum for
/// `controller.maxBodyBytes` (tests/e2e/charts/schema.rs checks it against this constant).
pub const MIN_MAX_BODY_BYTES: usize = 64 * 1024;

/// What the handler needs.
#[derive(Clone)]
pub struct WebhookState {
    /// The rules of `--kubelet-pods-dir` (its budget, or the configuration error to deny with),
    /// built once at start-up.
    pub rules: Arc<Rules>,
    /// Metrics to count into.
    pub metrics: Metrics,
    /// The status writer's caches, for the warnings about other policies and missing Services;
    /// `None` with `--status-writer=false` (only the budget warning is given then).
    pub cluster: Option<ClusterView>,
}

/// The webhook router: `POST /validate`, with the body cap applied.
///
/// The state is shared behind one `Arc`: axum clones the state for every request (and the
/// 413-counting layer once more), and a [`WebhookState`] clone costs one atomic increment per
/// `Arc` inside [`Metrics`] and the caches — 2.4 % of the webhook's CPU under saturation
/// (measured with perf), against one increment here.
pub fn router(state: WebhookState, max_body_bytes: usize) -> Router {
    let state = Arc::new(state);
    Router::new()
        .route("/validate", post(validate))
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(Inflight::new(max_body_bytes), hold_share))
        .layer(RequestBodyLimitLayer::new(max_body_bytes))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        // Outside the limit layer, so that a 413 it answers from Content-Length alone (the usual
        // case: the API server always sends one) is counted too, not only one found while reading.
        .layer(axum::middleware::map_response_with_state(state.clone(), count_too_large))
        .with_state(state)
}

async fn count_too_large(State(state): State<Arc<WebhookState>>, response: Response) -> Response {
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        state.metrics.count("none", "too-large");
        tracing::warn!("answering 413 to an admission request over the body cap");
    }
    response
}

/// Answers 400 with `reason`, counted as `kind="none"` and `result=label`.
fn bad_request(state: &WebhookState, label: &'static str, reason: String) -> Response {
    tracing::warn!(%reason, result = label, "answering 400 to an admission request that cannot be decided");
    state.metrics.count("none", label);
    (StatusCode::BAD_REQUEST, reason).into_response()
}

/// The media type a review must be sent as (parameters such as `; charset=utf-8` may follow).
const JSON: &[u8] = b"application/json";

async fn validate(State(state): State<Arc<WebhookState>>, request: Request) -> Response {
    // The header alone, not a clone of the whole map (axum's `HeaderMap` extractor copies it).
    let content_type = request.headers().get(header::CONTENT_TYPE).cloned();
    let body = match Bytes::from_request(request, &state).await {
        Ok(b) => b,
        // A 413 is counted by `count_too_large`, whichever layer answers it.
        Err(rejection) => return (rejection.status(), rejection.body_text()).into_response(),
    };
    let content_type = content_type.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.as_bytes().get(..JSON.len()).is_some_and(|prefix| prefix.eq_ignore_ascii_case(JSON)) {
        return bad_request(
            &state,
            "malformed",
            format!("Content-Type must be application/json, got {content_type:?}"),
        );
    }
    let start = Instant::now();
    let request = match admission::parse(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&state, e.label(), e.to_string()),
    };
    let facts = state.cluster.as_ref().map(|c| c as &dyn ClusterFacts);
    let decision = admission::decide_with_warnings(&request, &state.rules, facts);
    state.metrics.duration.observe(start.elapsed().as_secs_f64());
    state.metrics.count(&decision.kind, decision.result);
    for w in &decision.warned {
        state.metrics.count_warning(w.label());
    }
    // Denials at info (what an operator looks for); every allow at debug, warned or not, so a
    // busy webhook does not write a line per request (the API server's audit log has those, and
    // `aether_admission_warnings_total{warning}` counts the warnings). The canonical example value is
    // exactly the default budget and always warns: logging warned allows at info cost ~19 % of
    // saturation throughput in `make bench`.
    let warnings = decision.response.warnings.as_deref().unwrap_or_default();
    macro_rules! decided {
        ($level:expr) => {
            tracing::event!(
                $level,
                kind = %decision.kind,
                object = %decision.object,
                uid = %request.uid,
                operation = ?request.operation,
                result = decision.result,
                reason = %decision.response.result.message,
                warnings = ?warnings,
                "admission review decided"
            )
        };
    }
    if decision.result == "allowed" {
        decided!(tracing::Level::DEBUG);
    } else {
        decided!(tracing::Level::INFO);
    }
    axum::Json(admission::Answer::from(&decision.response)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_one_review_at_the_cap_and_never_less_than_the_minimum() {
        assert_eq!(inflight_budget_bytes(DEFAULT_MAX_BODY_BYTES), MIN_INFLIGHT_BUDGET_BYTES);
        assert_eq!(inflight_budget_bytes(MIN_MAX_BODY_BYTES), MIN_INFLIGHT_BUDGET_BYTES);
        let seven_mib = 7 * 1024 * 1024;
        assert_eq!(inflight_budget_bytes(seven_mib), seven_mib * PARSE_BYTES_PER_BODY_BYTE);
        assert_eq!(inflight_budget_bytes(usize::MAX), usize::MAX);
    }

    #[test]
    fn a_request_holds_its_bodys_parse_memory_capped_at_the_bodys_cap() {
        let inflight = Inflight::new(DEFAULT_MAX_BODY_BYTES);
        // 4 KiB of body: 192 KiB of parse memory.
        assert_eq!(inflight.share(Some(4096)), 192);
        assert_eq!(inflight.share(Some(0)), 1);
        // No Content-Length, or one over the cap (answered 413 before it waits): the cap's share,
        // 48 MiB of the 64 MiB budget at the default cap.
        let cap = u32::try_from(DEFAULT_MAX_BODY_BYTES * PARSE_BYTES_PER_BODY_BYTE / 1024).unwrap();
        assert_eq!(inflight.share(None), cap);
        assert_eq!(inflight.share(Some(usize::MAX)), cap);
        assert_eq!(inflight.kib.available_permits(), MIN_INFLIGHT_BUDGET_BYTES / 1024);
    }
}
