//! The watch metrics of one binary, named after its [`WatchOwner`]:
//! `<prefix>_watch_errors_total{resource,reason}` and `<prefix>_watches_failing`.

use std::marker::PhantomData;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The binary whose watches a board holds: it names the metrics and words the log lines. A
/// marker type per binary (the agent's `aether_agent`, the controller's `aether_controller`), so
/// the names are fixed at compile time and cannot drift between call sites.
pub trait WatchOwner: 'static {
    /// The metric-name prefix, e.g. `aether_agent`: `aether_agent_watch_errors_total`,
    /// `aether_agent_watches_failing`.
    const METRIC_PREFIX: &'static str;
    /// Whose watches, in the metrics' help texts, e.g. `agent's` ("Errors of the agent's
    /// watches ...", "The agent's watches failing now ...").
    const WHOSE: &'static str;
    /// The end of the `warn` line of an outage, after the cause and `; `: what happens meanwhile,
    /// e.g. `retrying with backoff, serving the last good state meanwhile`.
    const WHILE_FAILING: &'static str;
}

/// Labels of `<prefix>_watch_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchErrorLabels {
    /// The watch's [`crate::WatchHealth::label`], e.g. `pods` or `endpointpolicies`.
    pub resource: &'static str,
    /// A [`crate::WatchErrorReason::label`], e.g. `forbidden`.
    pub reason: &'static str,
}

/// The watch metrics: register them with [`WatchMetrics::register`], give them to
/// [`crate::WatchBoard::new`]. Clones share the same series.
pub struct WatchMetrics<O> {
    /// `<prefix>_watch_errors_total{resource,reason}`: every error a watch yielded.
    pub errors: Family<WatchErrorLabels, Counter>,
    /// `<prefix>_watches_failing`: watches failing now (at any age, grace period or not).
    pub failing: Gauge,
    owner: PhantomData<fn() -> O>,
}

impl<O> Clone for WatchMetrics<O> {
    fn clone(&self) -> Self {
        WatchMetrics { errors: self.errors.clone(), failing: self.failing.clone(), owner: PhantomData }
    }
}

impl<O> Default for WatchMetrics<O> {
    fn default() -> Self {
        WatchMetrics { errors: Family::default(), failing: Gauge::default(), owner: PhantomData }
    }
}

impl<O: WatchOwner> WatchMetrics<O> {
    /// Both metrics, at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `<prefix>_watch_errors` (a counter: `_total` in the exposition) and
    /// `<prefix>_watches_failing`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            format!("{}_watch_errors", O::METRIC_PREFIX),
            format!(
                "Errors of the {} watches (each failed list, watch start or watch stream), by resource and reason",
                O::WHOSE
            ),
            self.errors.clone(),
        );
        registry.register(
            format!("{}_watches_failing", O::METRIC_PREFIX),
            format!("The {} watches failing now (every attempt failed since the outage began)", O::WHOSE),
            self.failing.clone(),
        );
    }
}
