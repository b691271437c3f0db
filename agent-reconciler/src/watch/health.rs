//! Per-watch health: a failing watch must be visible (docs/troubleshooting.md "The agent's
//! `/readyz`").
//!
//! Each watch the agent runs registers on the [`WatchBoard`] and reports through its [`Watch`]
//! handle: [`Watch::failed`] for every error kube-runtime's watcher yields (each counted in
//! `aether_agent_watch_errors_total{resource,reason}`), [`Watch::ok`] for a complete list or an
//! event. The board, its log lines, the metrics and the client layer are the shared ones of
//! `aether-watch-health` (the controller uses the same), named here for the agent
//! ([`AgentWatches`]); the pure rules (phases, log transitions, the readiness rule) are in
//! [`aether_agent_core::status`]:
//!
//! - one `warn` line when a watch starts failing (or its reason changes), naming the resource,
//!   the reason and the API server's answer, e.g. `watch endpointpolicies.config.aether.io
//!   failing: forbidden: HTTP 403 Forbidden: endpointpolicies.config.aether.io is forbidden: User
//!   "system:serviceaccount:..." cannot watch resource ...`; retries are quiet (kube-runtime's
//!   watcher retries with its default backoff, 0.8 s doubling to 30 s);
//! - one `info` line when it recovers, with how long the outage lasted;
//! - `aether_agent_watches_failing`: how many watches are failing now.
//!
//! Recovery needs positive evidence. A watcher whose `watch` call failed after a good list
//! retries only the `watch` call, and a watch that starts again yields nothing until an object
//! changes, so events alone would leave a quiet cluster "failing" forever. [`WatchStartLayer`]
//! (a layer of the agent's Kubernetes client) therefore reports every watch request the API
//! server accepted (HTTP 2xx to `?watch=true`) to the board, which marks that resource's watch
//! ok at once.
//!
//! The board's rules are tested in `aether-watch-health`; the agent's metric names and `/readyz`
//! lines in [`crate::metrics`] and [`crate::admin`].

pub use aether_watch_health::WatchErrorLabels;

/// The agent as the owner of its watches: metrics `aether_agent_watch_errors_total` and
/// `aether_agent_watches_failing`; while a watch fails the node serves its last good state.
#[derive(Debug, Clone, Copy)]
pub struct AgentWatches;

impl aether_watch_health::WatchOwner for AgentWatches {
    const METRIC_PREFIX: &'static str = "aether_agent";
    const WHOSE: &'static str = "agent's";
    const WHILE_FAILING: &'static str = "retrying with backoff, serving the last good state meanwhile";
}

/// The agent's watch metrics: register them with [`WatchMetrics::register`], give them to
/// [`WatchBoard::new`].
pub type WatchMetrics = aether_watch_health::WatchMetrics<AgentWatches>;
/// Every watch the agent runs and its health (cheap to clone, shared by the watch tasks, the
/// client layer, `/readyz` and `/metrics`).
pub type WatchBoard = aether_watch_health::WatchBoard<AgentWatches>;
/// The handle through which one of the agent's watches reports.
pub type Watch = aether_watch_health::Watch<AgentWatches>;
/// The agent's client layer reporting each accepted watch request to its [`WatchBoard`].
pub type WatchStartLayer = aether_watch_health::WatchStartLayer<AgentWatches>;
/// The service of [`WatchStartLayer`].
pub type WatchStart<S> = aether_watch_health::WatchStart<S, AgentWatches>;
