//! The agent's plain-HTTP admin port (`/healthz`, `/readyz` and `/metrics`: [`router`]) and its
//! loopback-only debug port (`/debug/pods`, `/debug/envoy`: [`debug_router`]).
//!
//! `/readyz` is 200 once the xDS listener is bound: the node's Envoy can be served (from the state
//! dir if need be). Its body states what is degraded, e.g. "EndpointPolicy CRD not installed", so
//! a missing CRD is visible without making the agent unready (only pod annotations apply then: the
//! node is served all the same), and ends with one line on the node's Envoy (see
//! [`crate::xds::readiness`]), e.g.
//! `envoy: 1 stream(s) connected (node n1); CDS version <v> acked; LDS version <v> acked`,
//! `envoy: not connected`, or `... CDS version <v> not acked yet (acked <old>) ...`. A NACKed
//! current version shows as `... NACKed (acked <old>): Envoy's message: GET /debug/envoy on the
//! debug port`: Envoy's message names pods, listeners and paths, so it is served only there.
//!
//! With `--pin-dir` on a kernel without the calls socket pinning needs ([`crate::kernel`]),
//! `/readyz` is 503 for good, its first line naming the calls, the Linux release that has them
//! and the running kernel ([`AdminState::with_kernel_gaps`]).
//!
//! With `--readyz-requires-envoy` ([`EnvoyView::required`]) `/readyz` is also 503 until an Envoy
//! stream is connected and has ACKed the CDS and LDS versions the server would send now, and
//! again whenever no Envoy is connected.
//!
//! Watches ([`WatchView`], [`crate::watch::health`]): the body has one line per watch (`ok`,
//! `syncing`, `off: <why>` or `failing for <n> s (since <t>): <reason>: <cause>`, and whether it
//! is required and why), and `/readyz` is 503 while a *required* watch has been failing for at
//! least `--watch-grace-seconds` ([`aether_agent_core::status::overdue`]). The agent keeps serving
//! its last good state meanwhile: readiness reports, it withdraws nothing.
//!
//! Decisions ([`crate::decisions`], docs/kubectl-plugin.md): `GET /debug/pods/{namespace}/{name}` answers the
//! agent's live decision for one pod as JSON ([`aether_agent_core::decision`] documents the
//! shape), or 404 with `{"error", "namespace", "name", "node"}` when the agent does not know the
//! pod (not managed, not on this node, or not seen yet); `GET /debug/pods` lists them
//! ([`crate::decisions::Listing`], at most [`crate::decisions::LIST_CAP`], `truncated` says so).
//! They name every managed pod of the node with its socket, pin and netns paths, so they are
//! served only on the debug port, which binds a loopback address (`--debug-addr`, refused
//! otherwise): nothing off the node reaches it, and `kubectl aether why` reaches it through the
//! API server's `pods/portforward` (RBAC `get` and `create` on `pods/portforward` in the agent's namespace; the
//! container runtime dials `localhost:<port>` in the pod's network namespace, the node's for this
//! host-network pod). The admin port carries no per-pod detail (docs/install.md, "Debug data").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aether_agent_core::status::Status;
use aether_serve_policy::admin::AdminPort;
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;

use crate::decisions::Decisions;
use crate::metrics::Metrics;
use crate::status::overdue;
use crate::watch::WatchBoard;
use crate::xds::acks::AckTracker;
use crate::xds::readiness::{self, EnvoyReadiness};
use crate::xds::resource_set::ResourceSet;

/// What `/readyz` reads about the node's Envoy.
#[derive(Clone)]
pub struct EnvoyView {
    /// The xDS server's tracker (open streams and what each ACKed).
    pub tracker: AckTracker,
    /// What the server would send now (the encoder's output).
    pub resources: watch::Receiver<Arc<ResourceSet>>,
    /// `--readyz-requires-envoy`: not ready unless Envoy is caught up.
    pub required: bool,
}

impl EnvoyView {
    /// Where Envoy stands against the current CDS, LDS and (when served) ECDS versions;
    /// `reoffering`: withdrawn inbound listeners were offered again within the grace
    /// ([`readiness::assess`]).
    pub fn readiness(&self, reoffering: bool) -> EnvoyReadiness {
        let (cds, lds, ecds) = {
            let current = self.resources.borrow();
            let ecds = &current.extension_configs;
            (
                current.clusters.version.clone(),
                current.listeners.version.clone(),
                (!ecds.resources.is_empty()).then(|| ecds.version.clone()),
            )
        };
        readiness::assess(&self.tracker.streams(), &cds, &lds, ecds.as_deref(), reoffering)
    }
}

/// What `/readyz` reads about the watches.
#[derive(Clone)]
pub struct WatchView {
    /// Every watch and its health.
    pub board: WatchBoard,
    /// `--watch-grace-seconds`: how long a required watch may fail before `/readyz` is 503.
    pub grace: Duration,
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
    watches: Option<WatchView>,
    decisions: Option<Decisions>,
    kernel_gaps: Arc<[String]>,
}

impl AdminState {
    /// Admin state over the loop's `status`, with a fresh [`Metrics`] registry.
    pub fn new(xds_bound: Arc<AtomicBool>, status: watch::Receiver<Status>) -> Self {
        AdminState {
            xds_bound,
            status,
            metrics: Arc::new(Metrics::new()),
            envoy: None,
            watches: None,
            decisions: None,
            kernel_gaps: Arc::new([]),
        }
    }

    /// Same state, reporting the node's Envoy on `/readyz` (and requiring it to be caught up if
    /// `envoy.required`).
    pub fn with_envoy(mut self, envoy: EnvoyView) -> Self {
        self.envoy = Some(envoy);
        self
    }

    /// Same state, reporting the watches on `/readyz` and degrading it while a required one has
    /// failed for longer than `watches.grace`.
    pub fn with_watches(mut self, watches: WatchView) -> Self {
        self.watches = Some(watches);
        self
    }

    /// Same state, serving the reconcile loop's per-pod decisions on `/debug/pods` (without it,
    /// those routes answer 404).
    pub fn with_decisions(mut self, decisions: Decisions) -> Self {
        self.decisions = Some(decisions);
        self
    }

    /// Same state, not ready for good: each line says what the kernel lacks ([`crate::kernel`]).
    pub fn with_kernel_gaps(mut self, gaps: Vec<String>) -> Self {
        self.kernel_gaps = gaps.into();
        self
    }

    /// Same state, serving `metrics` (shared with the event task and the xDS server).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }
}

/// The admin router: `/healthz`, `/readyz`, `/metrics` ([`aether_serve_policy::admin::router`]
/// over this state). No per-pod detail (it listens on every node IP).
pub fn router(state: AdminState) -> Router {
    aether_serve_policy::admin::router(state)
}

/// The debug router: `/debug/pods` and `/debug/pods/{namespace}/{name}` (the reconcile loop's
/// per-pod decisions) and `/debug/envoy` (the `/readyz` line about Envoy with Envoy's NACK
/// messages), for the loopback-only `--debug-addr`.
pub fn debug_router(state: AdminState) -> Router {
    Router::new()
        .route("/debug/pods", get(list_decisions))
        .route("/debug/pods/{namespace}/{name}", get(decision))
        .route("/debug/envoy", get(envoy_detail))
        .with_state(state)
}

/// `GET /debug/envoy`: where the node's Envoy stands, as on `/readyz`, with the message of each
/// current version Envoy NACKed (it names pods, listeners and paths, so `/readyz`, on every node
/// IP, leaves it out); text, one line. 404 when this agent serves no Envoy.
async fn envoy_detail(State(s): State<AdminState>) -> Response {
    let Some(envoy) = &s.envoy else {
        return (StatusCode::NOT_FOUND, "this agent serves no Envoy\n").into_response();
    };
    let reoffering = s.status.borrow().reoffer_grace_until.is_some_and(|until| Instant::now() < until);
    format!("{:#}\n", envoy.readiness(reoffering)).into_response()
}

impl AdminPort for AdminState {
    fn readyz(&self) -> (StatusCode, String) {
        readyz(self)
    }

    fn metrics(&self) -> String {
        let st = self.status.borrow().clone();
        self.metrics.encode(&st)
    }
}

/// `/readyz` (the module's rules): 503 with why while the kernel lacks a feature the agent needs
/// ([`crate::kernel`]; it does not change while the agent runs), until the xDS listener is bound, while Envoy's
/// streams are held, while a required watch is overdue, or (`--readyz-requires-envoy`) while no
/// Envoy is caught up; else 200. The body lists the degraded states, the watches and Envoy.
fn readyz(s: &AdminState) -> (StatusCode, String) {
    let now = Instant::now();
    let reoffering = s.status.borrow().reoffer_grace_until.is_some_and(|until| now < until);
    let envoy = s.envoy.as_ref().map(|e| (e.readiness(reoffering), e.required));
    let (watches, grace) = match &s.watches {
        Some(w) => (w.board.snapshot(), w.grace),
        None => (Vec::new(), Duration::ZERO),
    };
    let late: Vec<String> = overdue(&watches, now, grace).iter().map(|w| w.resource()).collect();
    let holding = s.status.borrow().holding_xds;
    let (code, head) = if !s.kernel_gaps.is_empty() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}", s.kernel_gaps.join("; ")))
    } else if !s.xds_bound.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "xDS listener not bound yet".to_owned())
    } else if holding {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: not serving Envoy yet (nothing complete to serve)".to_owned())
    } else if !late.is_empty() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: required watch {} failing for longer than --watch-grace-seconds={}; serving the last \
                 good state meanwhile",
                late.join(", "),
                grace.as_secs()
            ),
        )
    } else if envoy.as_ref().is_some_and(|(r, required)| *required && !r.caught_up()) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no Envoy has applied the current CDS and LDS (--readyz-requires-envoy)".to_owned(),
        )
    } else {
        (StatusCode::OK, "ready".to_owned())
    };
    let mut body = format!("{head}\n");
    body.push_str(&status_lines(&s.status.borrow()));
    for w in &watches {
        body.push_str(&w.describe(now));
        body.push('\n');
    }
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
    if st.holding_xds {
        out.push_str(
            "xDS: holding Envoy's streams until the agent has a complete state (state dir, or the first pod list \
             and the socket pods' network namespaces); Envoy keeps its last config meanwhile\n",
        );
    }
    if !st.pods_synced {
        out.push_str("pods: serving the state dir; no complete pod list from the API server yet\n");
    }
    out
}

/// `GET /debug/pods/{namespace}/{name}`: the pod's decision, or 404 with a JSON error.
async fn decision(State(s): State<AdminState>, Path((namespace, name)): Path<(String, String)>) -> Response {
    let Some(board) = &s.decisions else {
        return (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "this agent serves no decisions"})))
            .into_response();
    };
    match board.get(&namespace, &name) {
        // Fields in the documented order (aether_agent_core::decision).
        Some(d) => Json(d).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({
                "error": format!(
                    "the agent on node {} knows no managed pod {namespace}/{name} (not labelled aether.io/managed=true, \
                     not on this node, or not seen yet)",
                    board.node()
                ),
                "namespace": namespace,
                "name": name,
                "node": board.node(),
            })),
        )
            .into_response(),
    }
}

/// `GET /debug/pods`: every decision (capped), or 404 with a JSON error.
async fn list_decisions(State(s): State<AdminState>) -> Response {
    match &s.decisions {
        Some(board) => Json(board.list()).into_response(),
        None => (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "this agent serves no decisions"})))
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use crate::watch::{self as watchers, WatchBoard, WatchMetrics};

    async fn get_readyz(state: AdminState) -> (StatusCode, String) {
        let response =
            router(state).oneshot(Request::get("/readyz").body(Body::empty()).unwrap()).await.expect("readyz answers");
        let code = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (code, String::from_utf8(bytes.to_vec()).expect("utf-8"))
    }

    fn state(board: &WatchBoard, grace: Duration) -> AdminState {
        let (_tx, status) = watch::channel(Status { crd_installed: Some(true), ..Status::default() });
        AdminState::new(Arc::new(AtomicBool::new(true)), status).with_watches(WatchView { board: board.clone(), grace })
    }

    fn forbidden() -> kube::runtime::watcher::Error {
        let status = kube::core::Status::failure(
            "endpointpolicies.config.aether.io is forbidden: User \"system:serviceaccount:wh:agent\" cannot watch \
             resource \"endpointpolicies\" in API group \"config.aether.io\" at the cluster scope",
            "Forbidden",
        )
        .with_code(403);
        kube::runtime::watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status)))
    }

    async fn get_json(state: AdminState, path: &str) -> (StatusCode, serde_json::Value) {
        let response =
            debug_router(state).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.expect("answers");
        let code = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (code, serde_json::from_slice(&bytes).expect("a JSON body"))
    }

    #[tokio::test]
    async fn debug_pods_serves_the_decision_of_a_known_pod_and_a_json_404_otherwise() {
        let mut index = crate::index::Index::new(crate::fold::Settings::new("/var/lib/kubelet/pods", true));
        let pod = aether_fixtures::pod("shop", "cart-1").uid(aether_fixtures::UID).sa("cart").emptydir("s");
        let rec = crate::record::PodRecord::from_pod(&pod.annotation_socket("s/app.sock").ip("10.1.2.3").build());
        let change = index.apply_pod(rec.unwrap().unwrap());
        let board = Decisions::new("node-a");
        board.changed(&index.snapshot(), &change, &std::collections::HashMap::new());
        let (_tx, status) = watch::channel(Status::default());
        let state = AdminState::new(Arc::new(AtomicBool::new(true)), status).with_decisions(board);
        let (code, body) = get_json(state.clone(), "/debug/pods/shop/cart-1").await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!((body["delivery"].as_str(), body["source"].as_str()), (Some("pipe"), Some("annotation")), "{body}");
        assert_eq!(body["uid"], aether_fixtures::UID);
        let (code, body) = get_json(state.clone(), "/debug/pods/shop/nope").await;
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert!(body["error"].as_str().is_some_and(|e| e.contains("node-a") && e.contains("shop/nope")), "{body}");
        let (code, body) = get_json(state, "/debug/pods").await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            (body["node"].as_str(), body["total"].as_u64(), body["truncated"].as_bool()),
            (Some("node-a"), Some(1), Some(false))
        );
        assert_eq!(body["pods"][0]["name"], "cart-1");
    }

    #[tokio::test]
    async fn debug_envoy_reports_the_node_envoy_or_a_404() {
        let get = |state: AdminState| async move {
            let response = debug_router(state)
                .oneshot(Request::builder().uri("/debug/envoy").body(Body::empty()).unwrap())
                .await
                .unwrap();
            let code = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
            (code, String::from_utf8(body.to_vec()).unwrap())
        };
        let (_tx, status) = watch::channel(Status::default());
        let bare = AdminState::new(Arc::new(AtomicBool::new(true)), status);
        let (code, body) = get(bare.clone()).await;
        assert_eq!((code, body.as_str()), (StatusCode::NOT_FOUND, "this agent serves no Envoy\n"));
        let (_resources_tx, resources) = watch::channel(Arc::new(ResourceSet::default()));
        let envoy = EnvoyView { tracker: AckTracker::new(), resources, required: false };
        let (code, body) = get(bare.with_envoy(envoy)).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "envoy: not connected\n"));
    }

    #[tokio::test]
    async fn the_admin_port_serves_no_per_pod_detail() {
        let (_tx, status) = watch::channel(Status::default());
        let state = AdminState::new(Arc::new(AtomicBool::new(true)), status).with_decisions(Decisions::new("node-a"));
        for path in ["/debug/pods", "/debug/pods/shop/cart-1"] {
            let response =
                router(state.clone()).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path} on the admin port");
        }
    }

    #[tokio::test]
    async fn a_kernel_gap_makes_readyz_503_naming_it_whatever_else_is_ready() {
        let board = WatchBoard::new(WatchMetrics::new());
        let (code, _) = get_readyz(state(&board, Duration::from_secs(30))).await;
        assert_eq!(code, StatusCode::OK);
        let gap = crate::kernel::Gap {
            feature: &crate::kernel::OPENAT2,
            kernel: "5.4.0-200-generic".into(),
            error: rustix::io::Errno::NOSYS,
        };
        let state = state(&board, Duration::from_secs(30)).with_kernel_gaps(vec![gap.to_string()]);
        let (code, body) = get_readyz(state).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let first = body.lines().next().unwrap_or_default();
        assert!(first.starts_with("not ready: kernel 5.4.0-200-generic lacks openat2(2)"), "{body}");
        assert!(first.contains("Linux 5.6 and later"), "{body}");
    }

    #[tokio::test]
    async fn readyz_lists_every_watch_and_why_it_is_required() {
        let board = WatchBoard::new(WatchMetrics::new());
        let (pods, _policies) = watchers::register(&board, true);
        pods.ok();
        let (code, body) = get_readyz(state(&board, Duration::from_secs(30))).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.starts_with("ready\nEndpointPolicy CRD installed\n"), "{body}");
        assert!(body.contains(&format!("watch pods (required: {}): ok\n", watchers::PODS_REQUIRED)), "{body}");
        assert!(
            body.contains(&format!(
                "watch endpointpolicies.config.aether.io (required: {}): syncing",
                watchers::POLICIES_REQUIRED
            )),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_required_watch_failing_within_the_grace_period_is_reported_but_ready() {
        let board = WatchBoard::new(WatchMetrics::new());
        let (_pods, policies) = watchers::register(&board, true);
        policies.failed(&forbidden());
        let (code, body) = get_readyz(state(&board, Duration::from_secs(3600))).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.contains("watch endpointpolicies.config.aether.io (required: "), "{body}");
        assert!(body.contains("): failing for 0 s (since "), "{body}");
        assert!(
            body.contains("forbidden: HTTP 403 Forbidden: endpointpolicies.config.aether.io is forbidden"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_required_watch_failing_past_the_grace_period_makes_readyz_503_until_it_recovers() {
        let board = WatchBoard::new(WatchMetrics::new());
        let (_pods, policies) = watchers::register(&board, true);
        policies.failed(&forbidden());
        let (code, body) = get_readyz(state(&board, Duration::ZERO)).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            body.starts_with(
                "not ready: required watch endpointpolicies.config.aether.io failing for longer than \
                 --watch-grace-seconds=0; serving the last good state meanwhile\n"
            ),
            "{body}"
        );
        // The API server accepts the watch again: ready at once.
        board.watch_started("config.aether.io", "endpointpolicies");
        let (code, body) = get_readyz(state(&board, Duration::ZERO)).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.contains("watch endpointpolicies.config.aether.io (required: "), "{body}");
    }

    #[tokio::test]
    async fn an_off_policy_watch_never_degrades_readiness() {
        let board = WatchBoard::new(WatchMetrics::new());
        let (_pods, policies) = watchers::register(&board, false);
        let (code, body) = get_readyz(state(&board, Duration::ZERO)).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.contains("): off: --uds-workloads=false"), "{body}");
        policies.off(watchers::CRD_ABSENT);
        let (code, body) = get_readyz(state(&board, Duration::ZERO)).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.contains(&format!("): off: {}", watchers::CRD_ABSENT)), "{body}");
    }
}
