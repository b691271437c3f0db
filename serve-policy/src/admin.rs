//! The routes every binary's plain-HTTP admin port serves the same way (the agent's and the
//! controller's `--admin-addr`, served through [`crate::GatedListener`] under the admin
//! listener's [`crate::ConnectionPolicy`]): [`router`] answers
//! - `GET /healthz`: 200, `ok\n` (the process is serving);
//! - `GET /readyz`: what [`AdminPort::readyz`] says (a status and a plain-text body);
//! - `GET /metrics`: [`AdminPort::metrics`], as [`METRICS_CONTENT_TYPE`].
//!
//! What ready means and what the metrics are is each binary's own (`agent-reconciler/src/admin.rs`,
//! `controller/src/admin.rs`); a binary that serves more routes serves them on another router.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;

/// The `Content-Type` of `/metrics`: the OpenMetrics text format, version 1.0.0, that
/// `prometheus_client::encoding::text::encode` writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What one binary's admin port reads: the state handed to [`router`], cloned per request.
pub trait AdminPort: Clone + Send + Sync + 'static {
    /// `GET /readyz`: the status (200 when ready, else 503) and the body (`text/plain; charset=utf-8`,
    /// lines ending in `\n`).
    fn readyz(&self) -> (StatusCode, String);
    /// `GET /metrics`: the binary's registry in OpenMetrics text, served as [`METRICS_CONTENT_TYPE`].
    fn metrics(&self) -> String;
}

/// The admin router over `state`: `/healthz`, `/readyz` and `/metrics` (the module's list). Any
/// other path is 404; another method on these paths is 405 (axum's `get`, which also answers
/// `HEAD`).
pub fn router<A: AdminPort>(state: A) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|State(s): State<A>| async move { s.readyz() }))
        .route(
            "/metrics",
            get(|State(s): State<A>| async move { ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], s.metrics()) }),
        )
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    #[derive(Clone)]
    struct Port(bool);

    impl AdminPort for Port {
        fn readyz(&self) -> (StatusCode, String) {
            if self.0 { (StatusCode::OK, "ready\n".into()) } else { (StatusCode::SERVICE_UNAVAILABLE, "no\n".into()) }
        }
        fn metrics(&self) -> String {
            "# EOF\n".into()
        }
    }

    async fn get_path(port: Port, path: &str) -> (StatusCode, Option<String>, String) {
        let response = router(port).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let (code, kind) = (response.status(), response.headers().get(header::CONTENT_TYPE).cloned());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (code, kind.map(|k| k.to_str().unwrap().to_owned()), String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_three_routes_answer_what_the_port_says() {
        let text = Some("text/plain; charset=utf-8".to_owned());
        assert_eq!(get_path(Port(false), "/healthz").await, (StatusCode::OK, text.clone(), "ok\n".into()));
        assert_eq!(get_path(Port(true), "/readyz").await, (StatusCode::OK, text.clone(), "ready\n".into()));
        assert_eq!(get_path(Port(false), "/readyz").await, (StatusCode::SERVICE_UNAVAILABLE, text, "no\n".into()));
        let metrics = get_path(Port(true), "/metrics").await;
        assert_eq!(metrics, (StatusCode::OK, Some(METRICS_CONTENT_TYPE.to_owned()), "# EOF\n".into()));
        assert_eq!(get_path(Port(true), "/debug/pods").await.0, StatusCode::NOT_FOUND);
    }
}
