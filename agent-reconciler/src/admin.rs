//! The agent's plain-HTTP admin port: `/healthz`, `/readyz` and `/metrics`.
//!
//! `/readyz` is 200 once the xDS listener is bound: the node's Envoy can be served (from the state
//! dir if need be). Its body states what is degraded, e.g. "EndpointPolicy CRD not installed", so
//! a missing CRD is visible without making the agent unready (F07), and ends with one line on the
//! node's Envoy (see [`crate::xds::readiness`]), e.g.
//! `envoy: 1 stream(s) connected (node n1); CDS version <v> acked; LDS version <v> acked`,
//! `envoy: not connected`, or `... CDS version <v> not acked yet (acked <old>) ...`.
//!
//! With `--readyz-requires-envoy` ([`EnvoyView::required`]) `/readyz` is also 503 until an Envoy
//! stream is connected and has ACKed the CDS and LDS versions the server would send now, and
//! again whenever no Envoy is connected.

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
use crate::xds::readiness::{self, EnvoyReadiness};
use crate::xds::{AckTracker, Resources};

/// What `/readyz` reads about the node's Envoy.
#[derive(Clone)]
pub struct EnvoyView {
    /// The xDS server's tracker (open streams and what each ACKed).
    pub tracker: AckTracker,
    /// What the server would send now (the renderer's output).
    pub resources: watch::Receiver<Arc<Resources>>,
    /// `--readyz-requires-envoy`: not ready unless Envoy is caught up.
    pub required: bool,
}

impl EnvoyView {
    /// Where Envoy stands against the current CDS and LDS versions.
    pub fn readiness(&self) -> EnvoyReadiness {
        let (cds, lds) = {
            let current = self.resources.borrow();
            (current.clusters.version.clone(), current.listeners.version.clone())
        };
        readiness::assess(&self.tracker.streams(), &cds, &lds)
    }
}

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Set once the xDS listener is bound.
    pub xds_bound: Arc<AtomicBool>,
    /// The reconcile loop's status.
    pub status: watch::Receiver<Status>,
    metrics: Arc<Metrics>,
    envoy: Option<EnvoyView>,
}

impl AdminState {
    /// Admin state over the loop's `status`, with a fresh [`Metrics`] registry.
    pub fn new(xds_bound: Arc<AtomicBool>, status: watch::Receiver<Status>) -> Self {
        AdminState { xds_bound, status, metrics: Arc::new(Metrics::new()), envoy: None }
    }

    /// Same state, reporting the node's Envoy on `/readyz` (and requiring it to be caught up if
    /// `envoy.required`).
    pub fn with_envoy(mut self, envoy: EnvoyView) -> Self {
        self.envoy = Some(envoy);
        self
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
    let envoy = s.envoy.as_ref().map(|e| (e.readiness(), e.required));
    let (code, head) = if !s.xds_bound.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "xDS listener not bound yet")
    } else if envoy.as_ref().is_some_and(|(r, required)| *required && !r.caught_up()) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no Envoy has applied the current CDS and LDS (--readyz-requires-envoy)",
        )
    } else {
        (StatusCode::OK, "ready")
    };
    let mut body = format!("{head}\n");
    body.push_str(&status_lines(&s.status.borrow()));
    if let Some((r, _)) = envoy {
        body.push_str(&format!("{r}\n"));
    }
    (code, body)
}

/// The reconcile loop's degraded states, one line each.
fn status_lines(st: &Status) -> String {
    let mut out = String::new();
    match st.crd_installed {
        Some(true) => out.push_str("EndpointPolicy CRD installed\n"),
        Some(false) => out.push_str("EndpointPolicy CRD not installed: only pod annotations apply\n"),
        None => out.push_str("EndpointPolicy CRD: not known yet (API server not reached)\n"),
    }
    if !st.pods_synced {
        out.push_str("pods: serving the state dir; no complete pod list from the API server yet\n");
    }
    out
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    let st = s.status.borrow().clone();
    let out = s.metrics.encode(&st);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], out)
}
