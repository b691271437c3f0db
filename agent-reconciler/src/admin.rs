//! The agent's plain-HTTP admin port: `/healthz`, `/readyz` and `/metrics`.
//!
//! `/readyz` is 200 once the xDS listener is bound: the node's Envoy can be served (from the state
//! dir if need be). Its body states what is degraded, e.g. "EndpointPolicy CRD not installed", so
//! a missing CRD is visible without making the agent unready (F07).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::driver::Status;
use crate::metrics::Metrics;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Set once the xDS listener is bound.
    pub xds_bound: Arc<AtomicBool>,
    /// The reconcile loop's status.
    pub status: watch::Receiver<Status>,
    metrics: Arc<Metrics>,
}

impl AdminState {
    /// Admin state over the loop's `status`, with a fresh [`Metrics`] registry.
    pub fn new(xds_bound: Arc<AtomicBool>, status: watch::Receiver<Status>) -> Self {
        AdminState { xds_bound, status, metrics: Arc::new(Metrics::new()) }
    }

    /// Same state, serving `metrics` (shared with the event task and the xDS server).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }
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
    if !s.xds_bound.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "xDS listener not bound yet\n".to_owned());
    }
    let st = s.status.borrow().clone();
    let mut body = String::from("ready\n");
    match st.crd_installed {
        Some(true) => body.push_str("EndpointPolicy CRD installed\n"),
        Some(false) => body.push_str("EndpointPolicy CRD not installed: only pod annotations apply\n"),
        None => body.push_str("EndpointPolicy CRD: not known yet (API server not reached)\n"),
    }
    if !st.pods_synced {
        body.push_str("pods: serving the state dir; no complete pod list from the API server yet\n");
    }
    (StatusCode::OK, body)
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    let st = s.status.borrow().clone();
    let out = s.metrics.encode(&st);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], out)
}
