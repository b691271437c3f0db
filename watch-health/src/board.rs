//! [`WatchBoard`]: every watch of one binary, with the clock, the log lines and the metrics; a
//! [`Watch`] is the handle through which one watch reports.
//!
//! - one `warn` line when a watch starts failing (or its reason changes), naming the resource,
//!   the reason and the API server's answer, e.g. `watch endpointpolicies.config.aether.io
//!   failing: forbidden: HTTP 403 Forbidden: ...; retrying with backoff, ...`; retries are quiet
//!   (kube-runtime's watcher retries with its default backoff, 0.8 s doubling to 30 s);
//! - one `info` line when it recovers, with how long the outage lasted (whole seconds);
//! - `<prefix>_watch_errors_total{resource,reason}` counts every error, `<prefix>_watches_failing`
//!   is the number of watches failing now.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kube::runtime::watcher;

use crate::{
    Transition, WatchErrorLabels, WatchErrorReason, WatchHealth, WatchMetrics, WatchOwner, WatchPhase, classify,
    classify_client, watched_resource,
};

/// Every watch one binary runs and its health (cheap to clone, shared by the watch tasks, the
/// client layer, `/readyz` and `/metrics`).
pub struct WatchBoard<O> {
    watches: Arc<Mutex<Vec<WatchHealth>>>,
    metrics: WatchMetrics<O>,
}

impl<O> Clone for WatchBoard<O> {
    fn clone(&self) -> Self {
        WatchBoard { watches: self.watches.clone(), metrics: self.metrics.clone() }
    }
}

/// The handle through which one watch reports.
pub struct Watch<O> {
    board: WatchBoard<O>,
    index: usize,
}

impl<O> Clone for Watch<O> {
    fn clone(&self) -> Self {
        Watch { board: self.board.clone(), index: self.index }
    }
}

impl<O: WatchOwner> WatchBoard<O> {
    /// An empty board updating `metrics`.
    pub fn new(metrics: WatchMetrics<O>) -> Self {
        WatchBoard { watches: Arc::new(Mutex::new(Vec::new())), metrics }
    }

    /// The metrics this board updates.
    pub fn metrics(&self) -> &WatchMetrics<O> {
        &self.metrics
    }

    /// Registers a watch of `plural` in `group` (`""`: core), [`WatchPhase::Syncing`];
    /// `required` says why `/readyz` depends on it (`None`: it never degrades readiness). Its
    /// error series start at zero.
    pub fn register(&self, group: &'static str, plural: &'static str, required: Option<&'static str>) -> Watch<O> {
        self.register_watch(WatchHealth::new(group, plural, required))
    }

    /// Registers `health` (e.g. a [`WatchHealth::reported`] one); its error series start at zero.
    pub fn register_watch(&self, health: WatchHealth) -> Watch<O> {
        for reason in WatchErrorReason::ALL {
            let _ =
                self.metrics.errors.get_or_create(&WatchErrorLabels { resource: health.label, reason: reason.label() });
        }
        let mut watches = self.watches.lock().expect("watch board lock");
        watches.push(health);
        Watch { board: self.clone(), index: watches.len() - 1 }
    }

    /// A copy of every watch's health, in registration order.
    pub fn snapshot(&self) -> Vec<WatchHealth> {
        self.watches.lock().expect("watch board lock").clone()
    }

    /// Whether a watch of `plural` is failing now.
    pub fn is_failing(&self, plural: &str) -> bool {
        self.watches.lock().expect("watch board lock").iter().any(|w| w.plural == plural && w.is_failing())
    }

    /// The API server accepted a watch of `plural` in `group`: those watches are ok.
    pub fn watch_started(&self, group: &str, plural: &str) {
        let indexes: Vec<usize> = {
            let watches = self.watches.lock().expect("watch board lock");
            (0..watches.len()).filter(|&i| watches[i].group == group && watches[i].plural == plural).collect()
        };
        for index in indexes {
            Watch { board: self.clone(), index }.ok();
        }
    }

    /// The API server answered `status` to the request for `uri`: a 2xx to a watch request
    /// ([`watched_resource`]) marks that resource's watches ok ([`Self::watch_started`]).
    pub fn observe(&self, uri: &http::Uri, status: http::StatusCode) {
        if let Some((group, plural)) = watched_resource(uri)
            && status.is_success()
        {
            self.watch_started(&group, &plural);
        }
    }

    /// Applies `f` to one watch, then logs its transition and updates the failing gauge.
    fn update(&self, index: usize, f: impl FnOnce(&mut WatchHealth) -> Transition) {
        let mut watches = self.watches.lock().expect("watch board lock");
        let w = &mut watches[index];
        let transition = f(w);
        match (&transition, &w.phase) {
            (Transition::Failing, WatchPhase::Failing { reason, cause, .. }) => tracing::warn!(
                watch = %w.resource(),
                reason = reason.label(),
                "watch {} failing: {}: {cause}; {}",
                w.resource(),
                reason.label(),
                O::WHILE_FAILING,
            ),
            (Transition::Recovered { after }, _) => tracing::info!(
                watch = %w.resource(),
                outage_seconds = after.as_secs(),
                "watch {} recovered after {} s",
                w.resource(),
                after.as_secs()
            ),
            _ => {}
        }
        if transition != Transition::Quiet {
            self.metrics.failing.set(watches.iter().filter(|w| w.is_failing()).count() as i64);
        }
    }
}

impl<O: WatchOwner> Watch<O> {
    /// Counts and records one error of kube-runtime's watcher (a 410 Gone is only counted).
    pub fn failed(&self, error: &watcher::Error) {
        let (reason, cause) = classify(error);
        self.failed_with(reason, cause);
    }

    /// Counts and records a failed request made for this watch (e.g. the CRD discovery call).
    pub fn failed_request(&self, error: &kube::Error) {
        let (reason, cause) = classify_client(error);
        self.failed_with(reason, cause);
    }

    /// Counts one watcher error without changing the watch's phase (an error that turned out to
    /// be the watch ending on purpose, e.g. the CRD was removed).
    pub fn counted(&self, error: &watcher::Error) {
        self.count(classify(error).0);
    }

    fn count(&self, reason: WatchErrorReason) {
        let label = self.board.watches.lock().expect("watch board lock")[self.index].label;
        self.board.metrics.errors.get_or_create(&WatchErrorLabels { resource: label, reason: reason.label() }).inc();
    }

    fn failed_with(&self, reason: WatchErrorReason, cause: String) {
        self.count(reason);
        self.board.update(self.index, |w| w.fail(reason, cause, Instant::now(), SystemTime::now()));
    }

    /// Evidence the watch works: a complete list, an event, an accepted watch request.
    pub fn ok(&self) {
        self.board.update(self.index, |w| w.ok(Instant::now()));
    }

    /// Not watched on purpose from now on, because `why` (never degrades readiness).
    pub fn off(&self, why: &str) {
        self.board.update(self.index, |w| w.off(why, Instant::now()));
    }

    /// Watched again after [`Watch::off`].
    pub fn on(&self) {
        self.board.update(self.index, |w| {
            w.on();
            Transition::Quiet
        });
    }

    /// How long it has been failing (monotonic clock), if it is.
    pub fn failing_for(&self) -> Option<Duration> {
        self.board.watches.lock().expect("watch board lock")[self.index].failing_for(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use prometheus_client::registry::Registry;

    struct Test;

    impl WatchOwner for Test {
        const METRIC_PREFIX: &'static str = "test";
        const WHOSE: &'static str = "test's";
        const WHILE_FAILING: &'static str = "retrying";
    }

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure(message, reason).with_code(code)))
    }

    #[test]
    fn the_board_counts_every_error_and_the_gauge_follows_the_outages() {
        let metrics = WatchMetrics::<Test>::new();
        let board = WatchBoard::new(metrics.clone());
        let pods = board.register("", "pods", Some("pods"));
        let policies = board.register("config.aether.io", "endpointpolicies", Some("policies"));
        let count = |resource, reason: WatchErrorReason| {
            metrics.errors.get_or_create(&WatchErrorLabels { resource, reason: reason.label() }).get()
        };
        assert_eq!(count("pods", WatchErrorReason::Forbidden), 0, "series exist at zero");
        let forbidden = || watcher::Error::WatchStartFailed(api_error(403, "Forbidden", "no"));
        for _ in 0..3 {
            policies.failed(&forbidden());
        }
        assert_eq!(count("endpointpolicies", WatchErrorReason::Forbidden), 3);
        assert_eq!(metrics.failing.get(), 1);
        assert!(board.is_failing("endpointpolicies") && !board.is_failing("pods"));
        pods.failed(&forbidden());
        assert_eq!(metrics.failing.get(), 2);
        // A refused watch or a list changes nothing; an accepted watch heals only its own resource.
        board.observe(&"/api/v1/pods?watch=true".parse().unwrap(), http::StatusCode::FORBIDDEN);
        board.observe(&"/api/v1/pods?limit=500".parse().unwrap(), http::StatusCode::OK);
        assert_eq!(metrics.failing.get(), 2);
        board.observe(&"/apis/config.aether.io/v1/endpointpolicies?watch=1".parse().unwrap(), http::StatusCode::OK);
        assert_eq!(metrics.failing.get(), 1);
        assert_eq!((policies.failing_for(), pods.failing_for().is_some()), (None, true));
        let phases: Vec<_> = board.snapshot().into_iter().map(|w| w.is_failing()).collect();
        assert_eq!(phases, [true, false]);
        pods.ok();
        assert_eq!(metrics.failing.get(), 0);
        // 410 is counted but does not fail the watch.
        pods.failed(&watcher::Error::WatchError(Box::new(
            kube::core::Status::failure("too old", "Expired").with_code(410),
        )));
        assert_eq!((count("pods", WatchErrorReason::Expired), metrics.failing.get()), (1, 0));
    }

    #[test]
    fn the_metrics_are_named_after_the_owner() {
        let metrics = WatchMetrics::<Test>::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        WatchBoard::new(metrics).register_watch(WatchHealth::reported("", "services"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# HELP test_watch_errors Errors of the test's watches ("), "{text}");
        assert!(text.contains("test_watch_errors_total{resource=\"services\",reason=\"not-found\"} 0"), "{text}");
        assert!(text.contains("# HELP test_watches_failing The test's watches failing now ("), "{text}");
        assert!(text.contains("test_watches_failing 0"), "{text}");
    }
}
