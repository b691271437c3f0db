//! Per-watch health (issue 14 item 5): a failing watch must be visible.
//!
//! Each watch the agent runs registers on the [`WatchBoard`] and reports through its [`Watch`]
//! handle: [`Watch::failed`] for every error kube-runtime's watcher yields (each counted in
//! `aether_agent_watch_errors_total{resource,reason}`), [`Watch::ok`] for a complete list or an
//! event. The pure rules (phases, log transitions, the readiness rule) are in
//! [`aether_agent_core::status`]; this module adds the clock, the log lines and the metrics:
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

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use aether_agent_core::status::{Transition, WatchErrorReason, WatchHealth, WatchPhase};
use axum::http::{Request, Response, Uri};
use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `aether_agent_watch_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchErrorLabels {
    /// The watch's [`WatchHealth::label`]: `pods` or `endpointpolicies`.
    pub resource: &'static str,
    /// A [`WatchErrorReason::label`], e.g. `forbidden`.
    pub reason: &'static str,
}

/// The watch metrics: register them with [`WatchMetrics::register`], give them to
/// [`WatchBoard::new`].
#[derive(Clone, Default)]
pub struct WatchMetrics {
    /// `aether_agent_watch_errors_total{resource,reason}`: every error a watch yielded.
    pub errors: Family<WatchErrorLabels, Counter>,
    /// `aether_agent_watches_failing`: watches failing now (at any age, grace period or not).
    pub failing: Gauge,
}

impl WatchMetrics {
    /// Both metrics, at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `aether_agent_watch_errors` (a counter: `_total` in the exposition) and
    /// `aether_agent_watches_failing`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "aether_agent_watch_errors",
            "Errors of the agent's watches (each failed list, watch start or watch stream), by resource and reason",
            self.errors.clone(),
        );
        registry.register(
            "aether_agent_watches_failing",
            "The agent's watches failing now (every attempt failed since the outage began)",
            self.failing.clone(),
        );
    }
}

/// Every watch the agent runs and its health (cheap to clone, shared by the watch tasks, the
/// client layer, `/readyz` and `/metrics`).
#[derive(Clone)]
pub struct WatchBoard {
    watches: Arc<Mutex<Vec<WatchHealth>>>,
    metrics: WatchMetrics,
}

/// The handle through which one watch reports.
#[derive(Clone)]
pub struct Watch {
    board: WatchBoard,
    index: usize,
}

impl WatchBoard {
    /// An empty board updating `metrics`.
    pub fn new(metrics: WatchMetrics) -> Self {
        WatchBoard { watches: Arc::new(Mutex::new(Vec::new())), metrics }
    }

    /// Registers a watch of `plural` in `group` (`""`: core), [`WatchPhase::Syncing`];
    /// `required` says why `/readyz` depends on it (`None`: it never degrades readiness). Its
    /// error series start at zero.
    pub fn register(&self, group: &'static str, plural: &'static str, required: Option<&'static str>) -> Watch {
        let health = WatchHealth::new(group, plural, required);
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

    /// Applies `f` to one watch, then logs its transition and updates the failing gauge.
    fn update(&self, index: usize, f: impl FnOnce(&mut WatchHealth) -> Transition) {
        let mut watches = self.watches.lock().expect("watch board lock");
        let w = &mut watches[index];
        let transition = f(w);
        match (&transition, &w.phase) {
            (Transition::Failing, WatchPhase::Failing { reason, cause, .. }) => tracing::warn!(
                watch = %w.resource(),
                reason = reason.label(),
                "watch {} failing: {}: {cause}; retrying with backoff, serving the last good state meanwhile",
                w.resource(),
                reason.label(),
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

impl Watch {
    /// Counts and records one error of kube-runtime's watcher.
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
}

/// The reason and the cause of one watcher error. The cause is what the API server answered
/// (`HTTP <code> <reason>: <message>`) or the client error with its sources.
pub fn classify(error: &watcher::Error) -> (WatchErrorReason, String) {
    match error {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            classify_client(e)
        }
        watcher::Error::WatchError(status) => (WatchErrorReason::of_http(status.code), status_text(status)),
        watcher::Error::NoResourceVersion => (WatchErrorReason::Decode, error.to_string()),
    }
}

/// The reason and the cause of one client error; see [`WatchErrorReason`] for the rules.
pub fn classify_client(error: &kube::Error) -> (WatchErrorReason, String) {
    use kube::Error as E;
    let reason = match error {
        E::Api(status) => return (WatchErrorReason::of_http(status.code), status_text(status)),
        E::Auth(_) => WatchErrorReason::Unauthorized,
        E::Service(e) if e.downcast_ref::<kube::client::AuthError>().is_some() => WatchErrorReason::Unauthorized,
        E::HyperError(_) | E::Service(_) | E::ReadEvents(_) => WatchErrorReason::Connect,
        E::SerdeError(_) | E::FromUtf8(_) | E::LinesCodecMaxLineLengthExceeded => WatchErrorReason::Decode,
        _ => WatchErrorReason::Other,
    };
    (reason, chain(error))
}

/// `HTTP 403 Forbidden: <message>` from a Kubernetes `Status`.
fn status_text(status: &kube::core::Status) -> String {
    let mut out = format!("HTTP {}", status.code);
    if !status.reason.is_empty() {
        out.push(' ');
        out.push_str(&status.reason);
    }
    if !status.message.is_empty() {
        out.push_str(": ");
        out.push_str(&status.message);
    }
    out
}

/// An error and its sources, `: `-separated, each source once (kube's messages often repeat
/// their source's text).
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// `(group, plural)` of a watch request: a path `/api/v1/[namespaces/<ns>/]<plural>` (group
/// `""`) or `/apis/<group>/<version>/[namespaces/<ns>/]<plural>` with `watch=true` (or `1`) in
/// its query. `None` for anything else (lists, gets, a watch of one named object's
/// subresource).
pub fn watched_resource(uri: &Uri) -> Option<(String, String)> {
    let watching = uri.query()?.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    if !watching {
        return None;
    }
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let plural = match rest {
        [plural] | ["namespaces", _, plural] => *plural,
        _ => return None,
    };
    Some((group.to_owned(), plural.to_owned()))
}

/// A layer for the agent's Kubernetes client: reports each watch request the API server
/// accepted to the [`WatchBoard`] ([`WatchBoard::watch_started`]). It only reads the request's
/// URI and the response's status; bodies pass untouched.
#[derive(Clone)]
pub struct WatchStartLayer {
    board: WatchBoard,
}

impl WatchStartLayer {
    /// A layer reporting to `board`.
    pub fn new(board: WatchBoard) -> Self {
        WatchStartLayer { board }
    }
}

impl<S> tower::Layer<S> for WatchStartLayer {
    type Service = WatchStart<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WatchStart { inner, board: self.board.clone() }
    }
}

/// The service of [`WatchStartLayer`].
#[derive(Clone)]
pub struct WatchStart<S> {
    inner: S,
    board: WatchBoard,
}

impl<S, Req, Res> tower::Service<Request<Req>> for WatchStart<S>
where
    S: tower::Service<Request<Req>, Response = Response<Res>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    Res: 'static,
{
    type Response = Response<Res>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Res>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Req>) -> Self::Future {
        let watched = watched_resource(req.uri());
        let response = self.inner.call(req);
        let board = self.board.clone();
        Box::pin(async move {
            let response = response.await?;
            if let Some((group, plural)) = watched
                && response.status().is_success()
            {
                board.watch_started(&group, &plural);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure(message, reason).with_code(code)))
    }

    #[test]
    fn watch_requests_name_their_resource_and_lists_do_not() {
        let cases = [
            ("/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1&watch=true&timeoutSeconds=290", Some(("", "pods"))),
            ("/api/v1/namespaces/shop/pods?watch=1", Some(("", "pods"))),
            (
                "/apis/config.aether.io/v1/endpointpolicies?&watch=true&resourceVersion=12",
                Some(("config.aether.io", "endpointpolicies")),
            ),
            (
                "/apis/config.aether.io/v1/namespaces/shop/endpointpolicies?watch=true",
                Some(("config.aether.io", "endpointpolicies")),
            ),
            ("/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1", None),
            ("/api/v1/pods?watch=false", None),
            ("/api/v1/pods", None),
            ("/apis/config.aether.io/v1", None),
            ("/api/v1/namespaces/shop/pods/web/log?watch=true", None),
            ("/version?watch=true", None),
        ];
        for (u, want) in cases {
            let got = watched_resource(&uri(u));
            assert_eq!(got.as_ref().map(|(g, p)| (g.as_str(), p.as_str())), want, "{u}");
        }
    }

    #[test]
    fn api_answers_are_classified_by_status_code_with_the_servers_message_as_cause() {
        let msg = "endpointpolicies.config.aether.io is forbidden: User \"system:serviceaccount:wh:agent\" cannot \
                   watch resource \"endpointpolicies\" in API group \"config.aether.io\" at the cluster scope";
        let (reason, cause) = classify(&watcher::Error::WatchStartFailed(api_error(403, "Forbidden", msg)));
        assert_eq!(reason, WatchErrorReason::Forbidden);
        assert_eq!(cause, format!("HTTP 403 Forbidden: {msg}"));
        for (code, want) in [
            (401, WatchErrorReason::Unauthorized),
            (404, WatchErrorReason::NotFound),
            (410, WatchErrorReason::Expired),
            (429, WatchErrorReason::ServerError),
            (503, WatchErrorReason::ServerError),
            (400, WatchErrorReason::Other),
        ] {
            assert_eq!(classify(&watcher::Error::InitialListFailed(api_error(code, "X", "m"))).0, want, "{code}");
        }
        // An error event inside a running watch stream carries the same Status.
        let gone = kube::core::Status::failure("too old resource version", "Expired").with_code(410);
        assert_eq!(classify(&watcher::Error::WatchError(Box::new(gone))).0, WatchErrorReason::Expired);
    }

    #[test]
    fn errors_without_an_http_answer_are_connect_or_decode() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let (reason, cause) = classify(&watcher::Error::WatchFailed(kube::Error::Service(Box::new(io))));
        assert_eq!(reason, WatchErrorReason::Connect);
        assert!(cause.contains("Connection refused"), "{cause}");
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(classify(&watcher::Error::WatchFailed(kube::Error::ReadEvents(reset))).0, WatchErrorReason::Connect);
        let serde = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(classify(&watcher::Error::WatchFailed(kube::Error::SerdeError(serde))).0, WatchErrorReason::Decode);
        assert_eq!(classify(&watcher::Error::NoResourceVersion).0, WatchErrorReason::Decode);
        assert_eq!(classify_client(&kube::Error::TlsRequired).0, WatchErrorReason::Other);
    }

    #[test]
    fn the_board_counts_every_error_and_the_gauge_follows_the_outages() {
        let metrics = WatchMetrics::new();
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
        pods.failed(&forbidden());
        assert_eq!(metrics.failing.get(), 2);
        // An accepted watch request heals only its own resource.
        board.watch_started("config.aether.io", "endpointpolicies");
        assert_eq!(metrics.failing.get(), 1);
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
}
