//! Health of a binary's Kubernetes watches (a failing watch must be visible),
//! shared by the agent and the controller.
//!
//! Always built (pure, no I/O; the agent's core uses only this part):
//! - [`WatchErrorReason`]: the closed set of failure reasons, the `reason` label of
//!   `<prefix>_watch_errors_total`;
//! - [`WatchHealth`] / [`WatchPhase`] / [`Transition`]: one watch's state machine (`syncing`, `ok`,
//!   `failing since <t>: <reason>: <cause>`, `off`), which says when a change deserves a log line
//!   (once per outage and once per recovery, never per retry), and its `/readyz` line;
//! - [`overdue`]: the readiness rule (a *required* watch failing for at least a grace period).
//!
//! Feature `client` (default): what needs kube's client types, tower and prometheus-client:
//! - [`classify`] / [`classify_client`]: the reason and cause of a `kube_runtime::watcher::Error`
//!   or a `kube::Error`;
//! - [`WatchBoard`] / [`Watch`]: every watch of a binary, the clock, the log lines and the metrics
//!   ([`WatchMetrics`]: `<prefix>_watch_errors_total{resource,reason}`,
//!   `<prefix>_watches_failing`), named after the binary's [`WatchOwner`];
//! - [`WatchStartLayer`]: the client layer that reports each watch request the API server
//!   accepted, the positive evidence a watch recovered; [`watched_resource`] reads which resource
//!   a request watches.

mod health;
mod reason;

#[cfg(feature = "client")]
mod board;
#[cfg(feature = "client")]
mod classify;
#[cfg(feature = "client")]
mod layer;
#[cfg(feature = "client")]
mod metrics;
#[cfg(feature = "client")]
mod watch_request;

pub use health::{Transition, WatchHealth, WatchPhase, overdue};
pub use reason::WatchErrorReason;

#[cfg(feature = "client")]
pub use board::{Watch, WatchBoard};
#[cfg(feature = "client")]
pub use classify::{classify, classify_client};
#[cfg(feature = "client")]
pub use layer::{WatchStart, WatchStartLayer};
#[cfg(feature = "client")]
pub use metrics::{WatchErrorLabels, WatchMetrics, WatchOwner};
#[cfg(feature = "client")]
pub use watch_request::watched_resource;
