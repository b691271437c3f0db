//! The admission webhook's HTTP surface: `POST /validate` (AdmissionReview v1 JSON in and out).
//!
//! - Bodies are capped at [`DEFAULT_MAX_BODY_BYTES`] (configurable): an UPDATE review carries the
//!   object and the old object, each up to the API server's ~3 MiB request limit. Larger bodies are
//!   answered 413 as soon as their Content-Length is seen, or once the cap is read.
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
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tower_http::limit::RequestBodyLimitLayer;

use crate::admission::{self, ClusterFacts};
use crate::metrics::Metrics;
use crate::status_writer::ClusterView;

/// How long one request may take, body included, before it is answered 408: the API server's
/// webhook timeout is at most 30 s and the chart sets at most 10 s, so nothing useful is lost.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Default cap on a review body: 7 MiB, room for two ~3 MiB objects (UPDATE) plus the envelope.
pub const DEFAULT_MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

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
