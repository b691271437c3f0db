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
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::driver::Status;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabel {
    delivery: String,
}

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Set once the xDS listener is bound.
    pub xds_bound: Arc<AtomicBool>,
    /// The reconcile loop's status.
    pub status: watch::Receiver<Status>,
    metrics: Arc<Metrics>,
}

struct Metrics {
    registry: Registry,
    pods: Family<DeliveryLabel, Gauge>,
    crd: Gauge,
    conflicts: Gauge,
}

impl AdminState {
    /// Admin state over the loop's `status`.
    pub fn new(xds_bound: Arc<AtomicBool>, status: watch::Receiver<Status>) -> Self {
        let mut registry = Registry::default();
        let pods = Family::<DeliveryLabel, Gauge>::default();
        let crd = Gauge::default();
        let conflicts = Gauge::default();
        registry.register(
            "aether_agent_pods",
            "Managed pods on this node by effective delivery (pipe, tcp, waiting)",
            pods.clone(),
        );
        registry.register(
            "aether_agent_policy_crd_installed",
            "1 when the EndpointPolicy CRD is served, 0 when not, -1 before the API server answered",
            crd.clone(),
        );
        registry.register(
            "aether_agent_policy_conflicts",
            "Services targeted by more than one valid EndpointPolicy",
            conflicts.clone(),
        );
        AdminState { xds_bound, status, metrics: Arc::new(Metrics { registry, pods, crd, conflicts }) }
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
    for k in ["pipe", "tcp", "waiting"] {
        s.metrics
            .pods
            .get_or_create(&DeliveryLabel { delivery: k.to_owned() })
            .set(*st.pods.get(k).unwrap_or(&0) as i64);
    }
    s.metrics.crd.set(match st.crd_installed {
        Some(true) => 1,
        Some(false) => 0,
        None => -1,
    });
    s.metrics.conflicts.set(st.conflicts as i64);
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &s.metrics.registry);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], out)
}
