//! Health of the controller's watches (issue 14 item 5: a failing watch must be visible): the
//! status writer's two reflectors, EndpointPolicies and Services ([`crate::cluster`]).
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
//!   admission warnings are left out, as before the first list ([`crate::cluster::ClusterView`]).
//!
//! The reasons are the agent's (`aether_agent_watch_errors_total`): a closed set derived from the
//! HTTP status, or from the lack of an answer. The two binaries share only `aether-crds`, which
//! does no I/O, so this is a copy of the agent's rules (aether-agent-core `status`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::http::{StatusCode, Uri};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why one attempt of a watch failed: the `reason` label of
/// `aether_controller_watch_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// HTTP 401, or the client could not produce credentials.
    Unauthorized,
    /// HTTP 403: RBAC does not grant the verb (`list` or `watch`).
    Forbidden,
    /// HTTP 404: the resource is not served (the CRD is not installed).
    NotFound,
    /// HTTP 410 Gone: a too-old resourceVersion; kube-runtime re-lists at once. Counted, never a
    /// failure.
    Expired,
    /// HTTP 429 or 5xx: the API server or etcd is overloaded or unavailable.
    ServerError,
    /// No HTTP answer: connection refused or reset, TLS failure, time-out, a broken stream.
    Connect,
    /// An answer that could not be read as the expected objects.
    Decode,
    /// Anything else (another 4xx).
    Other,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 8] = [
        Reason::Unauthorized,
        Reason::Forbidden,
        Reason::NotFound,
        Reason::Expired,
        Reason::ServerError,
        Reason::Connect,
        Reason::Decode,
        Reason::Other,
    ];

    /// The kebab-case metric label, e.g. `not-found`.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Unauthorized => "unauthorized",
            Reason::Forbidden => "forbidden",
            Reason::NotFound => "not-found",
            Reason::Expired => "expired",
            Reason::ServerError => "server-error",
            Reason::Connect => "connect",
            Reason::Decode => "decode",
            Reason::Other => "other",
        }
    }

    /// The reason of an HTTP status code the API server answered with.
    pub fn of_http(code: u16) -> Reason {
        match code {
            401 => Reason::Unauthorized,
            403 => Reason::Forbidden,
            404 => Reason::NotFound,
            410 => Reason::Expired,
            429 | 500..=599 => Reason::ServerError,
            _ => Reason::Other,
        }
    }
}

/// Where one watch stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// No complete list, running watch or error yet.
    Syncing,
    /// Listed, and the watch runs.
    Ok,
    /// Every attempt since `since` failed.
    Failing {
        /// The first failed attempt of this outage (monotonic).
        since: Instant,
        /// The same moment on the wall clock (shown in `/readyz`).
        since_wall: SystemTime,
        /// The last error's reason.
        reason: Reason,
        /// The last error: `HTTP <code> <reason>: <message>`, or the client error.
        cause: String,
    },
}

/// One watch and its health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchState {
    /// API group (`""`: core).
    pub group: &'static str,
    /// Plural, also the `resource` label: `endpointpolicies`, `services`.
    pub plural: &'static str,
    /// Where it stands.
    pub phase: Phase,
}

impl WatchState {
    /// `services`, `endpointpolicies.config.aether.io`.
    pub fn resource(&self) -> String {
        if self.group.is_empty() { self.plural.to_owned() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Whether every attempt failed since an outage began.
    pub fn is_failing(&self) -> bool {
        matches!(self.phase, Phase::Failing { .. })
    }

    /// One `/readyz` line, e.g. `watch services: failing for 42 s (since 2030-01-01T00:00:00Z):
    /// forbidden: HTTP 403 Forbidden: ...`.
    pub fn describe(&self, now: Instant) -> String {
        let state = match &self.phase {
            Phase::Syncing => "syncing (no complete list yet)".to_owned(),
            Phase::Ok => "ok".to_owned(),
            Phase::Failing { since, since_wall, reason, cause } => {
                let at = Timestamp::try_from(*since_wall).map(|t| format!("{t:.0}")).unwrap_or_else(|_| "?".into());
                let secs = now.saturating_duration_since(*since).as_secs();
                format!("failing for {secs} s (since {at}): {}: {cause}", reason.label())
            }
        };
        format!("watch {}: {state}", self.resource())
    }
}

/// Labels of `aether_controller_watch_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchErrorLabels {
    /// `endpointpolicies` or `services`.
    pub resource: &'static str,
    /// A [`Reason::label`].
    pub reason: &'static str,
}

/// Every watch of the controller, its health and its metrics (cheap to clone).
#[derive(Clone, Default)]
pub struct Watches {
    states: Arc<Mutex<Vec<WatchState>>>,
    /// `aether_controller_watch_errors_total{resource,reason}`.
    pub errors: Family<WatchErrorLabels, Counter>,
    /// `aether_controller_watches_failing`.
    pub failing: Gauge,
}

/// The handle through which one watch reports.
#[derive(Clone)]
pub struct WatchHandle {
    watches: Watches,
    index: usize,
}

impl Watches {
    /// Registers `aether_controller_watch_errors` (`_total` in the exposition) and
    /// `aether_controller_watches_failing` in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "aether_controller_watch_errors",
            "Errors of the status writer's watches (each failed list, watch start or watch stream), by resource and reason",
            self.errors.clone(),
        );
        registry.register(
            "aether_controller_watches_failing",
            "The status writer's watches failing now (every attempt failed since the outage began)",
            self.failing.clone(),
        );
    }

    /// Registers a watch of `plural` in `group`, syncing; its error series start at zero.
    pub fn register(&self, group: &'static str, plural: &'static str) -> WatchHandle {
        for reason in Reason::ALL {
            let _ = self.errors.get_or_create(&WatchErrorLabels { resource: plural, reason: reason.label() });
        }
        let mut states = self.states.lock().expect("watches lock");
        states.push(WatchState { group, plural, phase: Phase::Syncing });
        WatchHandle { watches: self.clone(), index: states.len() - 1 }
    }

    /// A copy of every watch's state, in registration order.
    pub fn snapshot(&self) -> Vec<WatchState> {
        self.states.lock().expect("watches lock").clone()
    }

    /// Whether the watch of `plural` is failing now.
    pub fn is_failing(&self, plural: &str) -> bool {
        self.states.lock().expect("watches lock").iter().any(|w| w.plural == plural && w.is_failing())
    }

    /// A response of the API server to the request for `uri`: a 2xx to a watch request
    /// ([`watched_resource`]) marks that resource's watches ok.
    pub fn observe(&self, uri: &Uri, status: StatusCode) {
        let Some((group, plural)) = watched_resource(uri).filter(|_| status.is_success()) else { return };
        let indexes: Vec<usize> = {
            let states = self.states.lock().expect("watches lock");
            (0..states.len()).filter(|&i| states[i].group == group && states[i].plural == plural).collect()
        };
        for index in indexes {
            WatchHandle { watches: self.clone(), index }.ok();
        }
    }

    /// Applies `f` to one watch; logs the outage's start (or a new reason) and its end.
    fn update(&self, index: usize, f: impl FnOnce(&mut WatchState, Instant)) {
        let now = Instant::now();
        let mut states = self.states.lock().expect("watches lock");
        let w = &mut states[index];
        let before = w.phase.clone();
        f(w, now);
        match (&before, &w.phase) {
            (Phase::Failing { reason: was, .. }, Phase::Failing { reason, .. }) if was == reason => {}
            (_, Phase::Failing { reason, cause, .. }) => tracing::warn!(
                watch = %w.resource(),
                reason = reason.label(),
                "watch {} failing: {}: {cause}; retrying with backoff (status writes and cluster-based warnings wait)",
                w.resource(),
                reason.label()
            ),
            (Phase::Failing { since, .. }, _) => {
                let after = now.saturating_duration_since(*since);
                tracing::info!(
                    watch = %w.resource(),
                    outage_seconds = after.as_secs(),
                    "watch {} recovered after {} s",
                    w.resource(),
                    after.as_secs()
                );
            }
            _ => {}
        }
        self.failing.set(states.iter().filter(|w| w.is_failing()).count() as i64);
    }
}

impl WatchHandle {
    /// Counts and records one error of kube-runtime's watcher (a 410 is only counted).
    pub fn failed(&self, error: &watcher::Error) {
        let (reason, cause) = classify(error);
        let plural = self.watches.states.lock().expect("watches lock")[self.index].plural;
        self.watches.errors.get_or_create(&WatchErrorLabels { resource: plural, reason: reason.label() }).inc();
        if reason == Reason::Expired {
            return;
        }
        self.watches.update(self.index, |w, now| match &mut w.phase {
            Phase::Failing { reason: r, cause: c, .. } => {
                *r = reason;
                *c = cause;
            }
            phase => *phase = Phase::Failing { since: now, since_wall: SystemTime::now(), reason, cause },
        });
    }

    /// Evidence the watch works: a complete list, an event, an accepted watch request.
    pub fn ok(&self) {
        self.watches.update(self.index, |w, _| w.phase = Phase::Ok);
    }

    /// How long it has been failing, if it is.
    pub fn failing_for(&self) -> Option<Duration> {
        match &self.watches.states.lock().expect("watches lock")[self.index].phase {
            Phase::Failing { since, .. } => Some(since.elapsed()),
            _ => None,
        }
    }
}

/// The reason and the cause of one watcher error.
pub fn classify(error: &watcher::Error) -> (Reason, String) {
    use kube::Error as E;
    let client = match error {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            e
        }
        watcher::Error::WatchError(status) => return (Reason::of_http(status.code), status_text(status)),
        watcher::Error::NoResourceVersion => return (Reason::Decode, error.to_string()),
    };
    let reason = match client {
        E::Api(status) => return (Reason::of_http(status.code), status_text(status)),
        E::Auth(_) => Reason::Unauthorized,
        E::Service(e) if e.downcast_ref::<kube::client::AuthError>().is_some() => Reason::Unauthorized,
        E::HyperError(_) | E::Service(_) | E::ReadEvents(_) => Reason::Connect,
        E::SerdeError(_) | E::FromUtf8(_) | E::LinesCodecMaxLineLengthExceeded => Reason::Decode,
        _ => Reason::Other,
    };
    let mut cause = client.to_string();
    let mut source = std::error::Error::source(client);
    while let Some(s) = source {
        let text = s.to_string();
        if !cause.contains(&text) {
            cause.push_str(": ");
            cause.push_str(&text);
        }
        source = s.source();
    }
    (reason, cause)
}

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

/// `(group, plural)` of a watch request (`watch=true` or `watch=1` in the query) on a collection:
/// `/api/v1/[namespaces/<ns>/]<plural>` or `/apis/<group>/<version>/[namespaces/<ns>/]<plural>`.
pub fn watched_resource(uri: &Uri) -> Option<(String, String)> {
    if !uri.query()?.split('&').any(|kv| kv == "watch=true" || kv == "watch=1") {
        return None;
    }
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    match rest {
        [plural] | ["namespaces", _, plural] => Some((group.to_owned(), (*plural).to_owned())),
        _ => None,
    }
}

/// A layer for the status writer's Kubernetes client: reports each API server response to
/// [`Watches::observe`] (only the request's URI and the response's status are read; bodies pass
/// untouched).
#[derive(Clone)]
pub struct WatchStartLayer {
    watches: Watches,
}

impl WatchStartLayer {
    /// A layer reporting to `watches`.
    pub fn new(watches: Watches) -> Self {
        WatchStartLayer { watches }
    }
}

impl<S> tower::Layer<S> for WatchStartLayer {
    type Service = WatchStart<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WatchStart { inner, watches: self.watches.clone() }
    }
}

/// The service of [`WatchStartLayer`].
#[derive(Clone)]
pub struct WatchStart<S> {
    inner: S,
    watches: Watches,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, Req, Res> tower::Service<axum::http::Request<Req>> for WatchStart<S>
where
    S: tower::Service<axum::http::Request<Req>, Response = axum::http::Response<Res>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    Res: 'static,
{
    type Response = axum::http::Response<Res>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<Req>) -> Self::Future {
        let uri = req.uri().clone();
        let response = self.inner.call(req);
        let watches = self.watches.clone();
        Box::pin(async move {
            let response = response.await?;
            watches.observe(&uri, response.status());
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
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
