//! Health of the controller's watches (a failing watch must be visible): the
//! status writer's two reflectors, EndpointPolicies and Services ([`crate::status_writer`]).
//!
//! The status writer registers each watch on [`Watches`] (held by [`crate::metrics::Metrics`], so
//! every part of the controller reaches it) and reports through its [`WatchHandle`]: every error
//! the watcher yields ([`WatchHandle::failed`]: counted in
//! `aether_controller_watch_errors_total{resource,reason}`), and every sign of life: a complete
//! list, an event ([`WatchHandle::ok`]), or a watch request the API server accepted
//! ([`Watches::observe`], fed by the client's layer: after a refused `watch` kube-runtime retries
//! only the `watch` call, and a watch that starts again yields nothing until an object changes).
//!
//! - One `warn` line when a watch starts failing (or its reason changes) with the API server's
//!   answer, one `info` line when it recovers; retries are quiet.
//! - `aether_controller_watches_failing`: watches failing now.
//! - `/readyz` lists each watch (`syncing`, `ok`, or `failing for <n> s (since <t>): <reason>:
//!   <answer>`) but never turns 503 for it: the webhook's decisions need no cache, and a webhook
//!   taken out of its Service for a watch failure would block every EndpointPolicy write
//!   (`failurePolicy: Fail`). While a watch fails, the status writer pauses and the cluster-based
//!   admission warnings are left out, as before the first list ([`crate::status_writer::ClusterView`]).
//!
//! The reasons, the state machine, the log lines, the metrics and the client layer are the
//! agent's (crate `aether-watch-health`, shared by both binaries), named here for the controller
//! ([`ControllerWatches`]).

use aether_watch_health::{WatchBoard, WatchHealth, WatchMetrics, WatchOwner};
use axum::http::{StatusCode, Uri};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use aether_watch_health::{WatchErrorLabels, classify, watched_resource};

/// Why one attempt of a watch failed: the `reason` label of
/// `aether_controller_watch_errors_total` (the agent's closed set).
pub type Reason = aether_watch_health::WatchErrorReason;
/// Where one watch stands.
pub type Phase = aether_watch_health::WatchPhase;
/// One watch and its health; its `/readyz` line has no `(required: ...)` part
/// ([`WatchHealth::reported`]): the controller's readiness never depends on a watch.
pub type WatchState = WatchHealth;
/// The handle through which one watch reports.
pub type WatchHandle = aether_watch_health::Watch<ControllerWatches>;
/// A layer for the status writer's Kubernetes client: reports each watch request the API server
/// accepted to [`Watches`] (only the request's URI and the response's status are read; bodies
/// pass untouched).
pub type WatchStartLayer = aether_watch_health::WatchStartLayer<ControllerWatches>;
/// The service of [`WatchStartLayer`].
pub type WatchStart<S> = aether_watch_health::WatchStart<S, ControllerWatches>;

/// The controller as the owner of its watches: metrics `aether_controller_watch_errors_total`
/// and `aether_controller_watches_failing`; while a watch fails, status writes and the
/// cluster-based admission warnings wait.
#[derive(Debug, Clone, Copy)]
pub struct ControllerWatches;

impl WatchOwner for ControllerWatches {
    const METRIC_PREFIX: &'static str = "aether_controller";
    const WHOSE: &'static str = "status writer's";
    const WHILE_FAILING: &'static str = "retrying with backoff (status writes and cluster-based warnings wait)";
}

/// Every watch of the controller, its health and its metrics (cheap to clone).
#[derive(Clone)]
pub struct Watches {
    board: WatchBoard<ControllerWatches>,
    /// `aether_controller_watch_errors_total{resource,reason}`.
    pub errors: Family<WatchErrorLabels, Counter>,
    /// `aether_controller_watches_failing`.
    pub failing: Gauge,
}

impl Default for Watches {
    fn default() -> Self {
        let metrics = WatchMetrics::new();
        Watches { errors: metrics.errors.clone(), failing: metrics.failing.clone(), board: WatchBoard::new(metrics) }
    }
}

impl Watches {
    /// Registers `aether_controller_watch_errors` (`_total` in the exposition) and
    /// `aether_controller_watches_failing` in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.board.metrics().register(registry);
    }

    /// Registers a watch of `plural` in `group`, syncing; its error series start at zero.
    pub fn register(&self, group: &'static str, plural: &'static str) -> WatchHandle {
        self.board.register_watch(WatchHealth::reported(group, plural))
    }

    /// A copy of every watch's state, in registration order.
    pub fn snapshot(&self) -> Vec<WatchState> {
        self.board.snapshot()
    }

    /// Whether the watch of `plural` is failing now.
    pub fn is_failing(&self, plural: &str) -> bool {
        self.board.is_failing(plural)
    }

    /// A response of the API server to the request for `uri`: a 2xx to a watch request
    /// ([`watched_resource`]) marks that resource's watches ok.
    pub fn observe(&self, uri: &Uri, status: StatusCode) {
        self.board.observe(uri, status);
    }

    /// The client layer reporting accepted watch requests to these watches.
    pub fn layer(&self) -> WatchStartLayer {
        WatchStartLayer::new(self.board.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kube::runtime::watcher;

    use super::*;

    fn forbidden() -> watcher::Error {
        let status = kube::core::Status::failure(
            "services is forbidden: User \"system:serviceaccount:x:ctl\" cannot watch resource \"services\"",
            "Forbidden",
        )
        .with_code(403);
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn http_codes_map_to_the_agents_reasons_and_labels_are_distinct_kebab_case() {
        for (code, label) in [
            (401, "unauthorized"),
            (403, "forbidden"),
            (404, "not-found"),
            (410, "expired"),
            (429, "server-error"),
            (502, "server-error"),
            (400, "other"),
        ] {
            assert_eq!(Reason::of_http(code).label(), label, "HTTP {code}");
        }
        let labels: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
        assert!(labels.iter().all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')));
    }

    #[test]
    fn errors_are_classified_with_the_api_servers_answer_as_cause() {
        let (reason, cause) = classify(&forbidden());
        assert_eq!(reason, Reason::Forbidden);
        assert!(cause.starts_with("HTTP 403 Forbidden: services is forbidden: User "), "{cause}");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let (reason, cause) = classify(&watcher::Error::WatchFailed(kube::Error::Service(Box::new(io))));
        assert_eq!(reason, Reason::Connect);
        assert!(cause.contains("Connection refused"), "{cause}");
        assert_eq!(classify(&watcher::Error::NoResourceVersion).0, Reason::Decode);
    }

    #[test]
    fn an_outage_is_counted_per_attempt_and_ends_with_an_accepted_watch_request_of_its_resource() {
        let watches = Watches::default();
        let policies = watches.register("config.aether.io", "endpointpolicies");
        let services = watches.register("", "services");
        let count = |resource, reason: Reason| {
            watches.errors.get_or_create(&WatchErrorLabels { resource, reason: reason.label() }).get()
        };
        assert_eq!(count("endpointpolicies", Reason::Forbidden), 0, "series exist at zero");
        for _ in 0..3 {
            services.failed(&forbidden());
        }
        assert_eq!((count("services", Reason::Forbidden), watches.failing.get()), (3, 1));
        assert!(watches.is_failing("services") && !watches.is_failing("endpointpolicies"));
        let line = watches.snapshot()[1].describe(Instant::now());
        assert!(line.starts_with("watch services: failing for 0 s (since "), "{line}");
        assert!(line.contains("): forbidden: HTTP 403 Forbidden: services is forbidden"), "{line}");
        // A list (not a watch) or a refused watch changes nothing; an accepted watch of another
        // resource neither.
        watches.observe(&"/api/v1/services?limit=500".parse().unwrap(), StatusCode::OK);
        watches.observe(&"/api/v1/services?watch=true".parse().unwrap(), StatusCode::FORBIDDEN);
        watches.observe(&"/apis/config.aether.io/v1/endpointpolicies?watch=true".parse().unwrap(), StatusCode::OK);
        assert!(services.failing_for().is_some());
        watches.observe(&"/api/v1/services?&watch=true&resourceVersion=7".parse().unwrap(), StatusCode::OK);
        assert_eq!((services.failing_for(), watches.failing.get()), (None, 0));
        assert_eq!(watches.snapshot()[1].describe(Instant::now()), "watch services: ok");
        // 410 is counted, never a failure.
        let gone = kube::core::Status::failure("too old", "Expired").with_code(410);
        policies.failed(&watcher::Error::WatchError(Box::new(gone)));
        assert_eq!((count("endpointpolicies", Reason::Expired), watches.failing.get()), (1, 0));
    }

    #[test]
    fn watch_requests_name_their_collection() {
        let got = |u: &str| watched_resource(&u.parse().unwrap());
        assert_eq!(got("/api/v1/services?watch=1"), Some((String::new(), "services".into())));
        assert_eq!(
            got("/apis/config.aether.io/v1/namespaces/a/endpointpolicies?watch=true"),
            Some(("config.aether.io".into(), "endpointpolicies".into()))
        );
        assert_eq!(got("/api/v1/services"), None);
        assert_eq!(got("/api/v1/namespaces/a/services/b/proxy?watch=true"), None);
    }
}
