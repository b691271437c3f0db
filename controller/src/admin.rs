//! The plain-HTTP admin port: `/healthz` (the process is serving), `/readyz` (200 only once the
//! webhook's TLS listener is bound) and `/metrics` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// State of the admin endpoints.
#[derive(Clone)]
pub struct AdminState {
    /// Set once the webhook's TLS listener is bound.
    pub ready: Arc<AtomicBool>,
    /// Metrics to expose.
    pub metrics: Metrics,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "webhook TLS listener not bound yet\n")
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}
