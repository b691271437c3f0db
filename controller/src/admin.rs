//! The plain-HTTP admin port: `/healthz` (the process is serving), `/readyz` (200 only once the
//! webhook's TLS listener is bound) and `/metrics` (Prometheus text).
//!
//! Readiness deliberately does not wait for the status writer's caches or for the API server:
//! the API server calls this webhook (with `failurePolicy: Fail`), so a webhook that waited for
//! the API server could deadlock a cluster whose API server is itself waiting on admission, and a
//! slow cache sync would take the webhook out of its Service for nothing. Decisions never need
//! the caches; only the warnings do, and they are simply left out until the caches have synced.
//! The `/readyz` body reports the cache state and leadership for humans, and one line per watch of
//! the status writer ([`watches`]: `syncing`, `ok`, or `failing for <n> s (since <t>): <reason>:
//! <answer>`); a failing watch is reported and counted but, for the reason above, never makes
//! `/readyz` 503.

pub mod watches;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aether_serve_policy::admin::AdminPort;
use axum::Router;
use axum::http::StatusCode;

use crate::metrics::Metrics;
use crate::status_writer::ClusterView;

/// State of the admin endpoints.
#[derive(Clone)]
pub struct AdminState {
    /// Set once the webhook's TLS listener is bound.
    pub ready: Arc<AtomicBool>,
    /// Metrics to expose.
    pub metrics: Metrics,
    /// The status writer's caches, described in the `/readyz` body; `None` when it is off.
    pub cluster: Option<ClusterView>,
}

/// The admin router: `/healthz`, `/readyz`, `/metrics` ([`aether_serve_policy::admin::router`]
/// over this state).
pub fn router(state: AdminState) -> Router {
    aether_serve_policy::admin::router(state)
}

impl AdminPort for AdminState {
    fn readyz(&self) -> (StatusCode, String) {
        readyz(self)
    }

    fn metrics(&self) -> String {
        self.metrics.encode()
    }
}

/// `/readyz` (the module's rules): 200 once the webhook's TLS listener is bound, else 503; the
/// body describes the status writer and its watches either way.
fn readyz(s: &AdminState) -> (StatusCode, String) {
    let writer = match &s.cluster {
        None => "status writer: off (--status-writer=false)\n".to_owned(),
        Some(c) => {
            let leading = if s.metrics.leader.get() == 1 { "leading" } else { "following" };
            format!("status writer: {leading}; {}\n", c.describe())
        }
    };
    let now = std::time::Instant::now();
    let watches: String = s.metrics.watches.snapshot().iter().map(|w| format!("{}\n", w.describe(now))).collect();
    let writer = format!("{writer}{watches}");
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, format!("ready\n{writer}"))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("webhook TLS listener not bound yet\n{writer}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_failing_watch_is_listed_in_readyz_but_never_makes_the_webhook_unready() {
        let metrics = Metrics::default();
        let services = metrics.watches.register("", "services");
        metrics.watches.register(aether_crds::policy::GROUP, aether_crds::policy::PLURAL).ok();
        let status = kube::core::Status::failure("services is forbidden: no watch", "Forbidden").with_code(403);
        services.failed(&kube::runtime::watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status))));
        let state = AdminState { ready: Arc::new(AtomicBool::new(true)), metrics, cluster: None };
        let response = router(state).oneshot(Request::get("/readyz").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.starts_with("ready\nstatus writer: off"), "{body}");
        assert!(body.contains("\nwatch services: failing for 0 s (since "), "{body}");
        assert!(body.contains("): forbidden: HTTP 403 Forbidden: services is forbidden: no watch\n"), "{body}");
        assert!(body.contains("\nwatch endpointpolicies.config.aether.io: ok\n"), "{body}");
    }
}
