//! What the agent reports to the admin endpoints and metrics, kept here so neither imports the
//! driver or the watch tasks:
//!
//! - [`Status`]: plain counts, written by the reconcile loop, read by `/readyz` and `/metrics`.
//! - [`WatchHealth`]: one per watch the agent runs (this node's pods, the EndpointPolicies),
//!   written by the watch tasks: `syncing`, `ok`, `failing since <t>: <reason>: <cause>` or `off`;
//!   [`WatchErrorReason`] is the closed set of failure reasons (the metric label), [`Transition`]
//!   says when a change deserves a log line (once per outage and once per recovery, never per
//!   retry), and [`overdue`] is the readiness rule: `/readyz` is 503 while a *required* watch has
//!   been failing for at least the grace period (`--watch-grace-seconds`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

/// What the loop reports to the admin endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Managed pods by effective delivery: `pipe`, `tcp`, `waiting`.
    pub pods: HashMap<&'static str, usize>,
    /// `Some(true)` once policies are watched, `Some(false)` while the CRD is absent, `None`
    /// before the API server answered.
    pub crd_installed: Option<bool>,
    /// True once the first complete pod list arrived from the API server.
    pub pods_synced: bool,
    /// Open policy conflicts.
    pub conflicts: usize,
    /// Managed pods by `(delivery, source)`: delivery `pipe`/`tcp`/`waiting`, source
    /// `annotation`/`policy`/`none` (where the socket request came from).
    pub by_source: BTreeMap<(&'static str, &'static str), usize>,
    /// Pods that asked for a socket and are delivered over TCP, by cause label
    /// ([`crate::TcpReason::label`]); every cause listed.
    pub fallbacks: BTreeMap<&'static str, usize>,
}

// ------------------------------------------------------------------------------ watch health

/// Why one attempt of a watch failed: the `reason` label of `aether_agent_watch_errors_total`,
/// derived from the API server's answer (its HTTP status) or from the lack of one. A closed set,
/// so the metric's series stay bounded; every value is kebab-case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WatchErrorReason {
    /// HTTP 401, or the client could not produce credentials: the token is expired, revoked or
    /// unreadable.
    Unauthorized,
    /// HTTP 403: RBAC does not grant the verb (`list` or `watch`) on the resource.
    Forbidden,
    /// HTTP 404: the API server does not serve the resource (a CRD removed, an API disabled).
    NotFound,
    /// HTTP 410 Gone: the watch's resourceVersion is too old and kube-runtime re-lists at once.
    /// Counted, but it never makes a watch failing: it is part of normal operation.
    Expired,
    /// HTTP 429 or 5xx: the API server, or etcd behind it, is overloaded or unavailable.
    ServerError,
    /// No HTTP answer: connection refused or reset, TLS failure, time-out, a broken stream.
    Connect,
    /// An answer that could not be read as the expected objects.
    Decode,
    /// Anything else, e.g. another 4xx such as 400 for a selector the server refuses.
    Other,
}

impl WatchErrorReason {
    /// Every reason, in label order of the docs.
    pub const ALL: [WatchErrorReason; 8] = [
        WatchErrorReason::Unauthorized,
        WatchErrorReason::Forbidden,
        WatchErrorReason::NotFound,
        WatchErrorReason::Expired,
        WatchErrorReason::ServerError,
        WatchErrorReason::Connect,
        WatchErrorReason::Decode,
        WatchErrorReason::Other,
    ];

    /// The metric label, e.g. `not-found`.
    pub fn label(self) -> &'static str {
        match self {
            WatchErrorReason::Unauthorized => "unauthorized",
            WatchErrorReason::Forbidden => "forbidden",
            WatchErrorReason::NotFound => "not-found",
            WatchErrorReason::Expired => "expired",
            WatchErrorReason::ServerError => "server-error",
            WatchErrorReason::Connect => "connect",
            WatchErrorReason::Decode => "decode",
            WatchErrorReason::Other => "other",
        }
    }

    /// The reason of an HTTP status the API server answered with (a Kubernetes `Status` code).
    /// Source: the Kubernetes API conventions' status codes.
    pub fn of_http(code: u16) -> WatchErrorReason {
        match code {
            401 => WatchErrorReason::Unauthorized,
            403 => WatchErrorReason::Forbidden,
            404 => WatchErrorReason::NotFound,
            410 => WatchErrorReason::Expired,
            429 | 500..=599 => WatchErrorReason::ServerError,
            _ => WatchErrorReason::Other,
        }
    }

    /// Whether an error of this reason makes the watch failing (all but [`Self::Expired`]).
    pub fn is_failure(self) -> bool {
        self != WatchErrorReason::Expired
    }
}

/// Where one watch stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchPhase {
    /// Started; neither a complete list, a running watch nor an error yet.
    Syncing,
    /// Listed, and the watch runs (or ran without error since).
    Ok,
    /// Every attempt since `since` failed; `reason` and `cause` are the last error's.
    Failing {
        /// When the first failed attempt of this outage was seen (monotonic: the readiness rule).
        since: Instant,
        /// The same moment on the wall clock (shown in `/readyz`).
        since_wall: SystemTime,
        /// The last error's reason.
        reason: WatchErrorReason,
        /// The last error as the API server (or the connection) gave it, e.g. `HTTP 403
        /// Forbidden: endpointpolicies.config.aether.io is forbidden: User "..." cannot watch ...`.
        cause: String,
    },
    /// Not watched on purpose, with why (e.g. the EndpointPolicy CRD is not installed). Never
    /// degrades readiness.
    Off(String),
}

/// What a change of a watch's phase means for its log: the shell logs one line per
/// [`Transition::Failing`] (warn) and per [`Transition::Recovered`] (info), never one per retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing worth a line (another failed retry with the same reason, or still ok).
    Quiet,
    /// An outage started, or its reason changed (e.g. `connect` then `forbidden`).
    Failing,
    /// The outage that started `after` ago ended.
    Recovered {
        /// How long it lasted.
        after: Duration,
    },
}

/// One watch the agent (or the controller) runs, and its health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchHealth {
    /// API group of the watched resource (`""` for the core group).
    pub group: &'static str,
    /// Its plural, e.g. `pods`.
    pub plural: &'static str,
    /// The `resource` label of the metrics: the plural (kebab-case, unique among the watches).
    pub label: &'static str,
    /// Why the agent cannot do without it, when a failure of it for longer than the grace
    /// period makes `/readyz` 503; `None` for a watch that never degrades readiness.
    pub required: Option<&'static str>,
    /// Where it stands.
    pub phase: WatchPhase,
}

impl WatchHealth {
    /// A watch of `plural` in `group` that has just started ([`WatchPhase::Syncing`]).
    pub fn new(group: &'static str, plural: &'static str, required: Option<&'static str>) -> Self {
        WatchHealth { group, plural, label: plural, required, phase: WatchPhase::Syncing }
    }

    /// The resource as `kubectl` names it: `pods`, `endpointpolicies.config.aether.io`.
    pub fn resource(&self) -> String {
        if self.group.is_empty() { self.plural.to_owned() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Whether it is failing now.
    pub fn is_failing(&self) -> bool {
        matches!(self.phase, WatchPhase::Failing { .. })
    }

    /// A failed attempt at `now`. An [`WatchErrorReason::Expired`] answer changes nothing; any
    /// other starts an outage ([`Transition::Failing`]), or continues it: quietly with the same
    /// reason (the cause text is updated), loudly when the reason changed.
    pub fn fail(&mut self, reason: WatchErrorReason, cause: String, now: Instant, wall: SystemTime) -> Transition {
        if !reason.is_failure() {
            return Transition::Quiet;
        }
        match &mut self.phase {
            WatchPhase::Failing { reason: last, cause: last_cause, .. } => {
                let changed = *last != reason;
                *last = reason;
                *last_cause = cause;
                if changed { Transition::Failing } else { Transition::Quiet }
            }
            _ => {
                self.phase = WatchPhase::Failing { since: now, since_wall: wall, reason, cause };
                Transition::Failing
            }
        }
    }

    /// Evidence at `now` that the watch works: a complete list, an event, or a watch request the
    /// API server accepted.
    pub fn ok(&mut self, now: Instant) -> Transition {
        let was = std::mem::replace(&mut self.phase, WatchPhase::Ok);
        match was {
            WatchPhase::Failing { since, .. } => Transition::Recovered { after: now.saturating_duration_since(since) },
            _ => Transition::Quiet,
        }
    }

    /// Not watched on purpose from now on, because `why`; ends an outage ([`Transition::Recovered`]).
    pub fn off(&mut self, why: &str, now: Instant) -> Transition {
        let was = std::mem::replace(&mut self.phase, WatchPhase::Off(why.to_owned()));
        match was {
            WatchPhase::Failing { since, .. } => Transition::Recovered { after: now.saturating_duration_since(since) },
            _ => Transition::Quiet,
        }
    }

    /// Watched again after [`Self::off`]: back to [`WatchPhase::Syncing`] (an outage stays).
    pub fn on(&mut self) {
        if matches!(self.phase, WatchPhase::Off(_)) {
            self.phase = WatchPhase::Syncing;
        }
    }

    /// How long it has been failing at `now`, if it is.
    pub fn failing_for(&self, now: Instant) -> Option<Duration> {
        match &self.phase {
            WatchPhase::Failing { since, .. } => Some(now.saturating_duration_since(*since)),
            _ => None,
        }
    }

    /// The readiness rule: a *required* watch that has been failing for at least `grace`.
    pub fn is_overdue(&self, now: Instant, grace: Duration) -> bool {
        self.required.is_some() && self.failing_for(now).is_some_and(|d| d >= grace)
    }

    /// One line for `/readyz`, e.g. `watch pods (required: ...): failing for 42 s (since
    /// 2030-01-01T00:00:00Z): forbidden: HTTP 403 Forbidden: ...`.
    pub fn describe(&self, now: Instant) -> String {
        let role = match self.required {
            Some(why) => format!("required: {why}"),
            None => "not required".to_owned(),
        };
        let state = match &self.phase {
            WatchPhase::Syncing => "syncing (no complete list yet)".to_owned(),
            WatchPhase::Ok => "ok".to_owned(),
            WatchPhase::Off(why) => format!("off: {why}"),
            WatchPhase::Failing { since, since_wall, reason, cause } => {
                let at = k8s_openapi::jiff::Timestamp::try_from(*since_wall)
                    .map(|t| format!("{t:.0}"))
                    .unwrap_or_else(|_| "?".to_owned());
                let secs = now.saturating_duration_since(*since).as_secs();
                format!("failing for {secs} s (since {at}): {}: {cause}", reason.label())
            }
        };
        format!("watch {} ({role}): {state}", self.resource())
    }
}

/// The required watches that have been failing for at least `grace` at `now`: while there is
/// one, `/readyz` is 503 (the node keeps serving its last good state).
pub fn overdue(watches: &[WatchHealth], now: Instant, grace: Duration) -> Vec<&WatchHealth> {
    watches.iter().filter(|w| w.is_overdue(now, grace)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> (Instant, SystemTime) {
        (Instant::now(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000))
    }

    fn policies() -> WatchHealth {
        WatchHealth::new("config.aether.io", "endpointpolicies", Some("policy changes reach pods only through it"))
    }

    #[test]
    fn http_codes_map_to_the_documented_reasons() {
        let cases = [
            (401, "unauthorized"),
            (403, "forbidden"),
            (404, "not-found"),
            (410, "expired"),
            (429, "server-error"),
            (500, "server-error"),
            (503, "server-error"),
            (599, "server-error"),
            (400, "other"),
            (422, "other"),
        ];
        for (code, label) in cases {
            assert_eq!(WatchErrorReason::of_http(code).label(), label, "HTTP {code}");
        }
    }

    #[test]
    fn reason_labels_are_distinct_kebab_case_and_only_expired_is_not_a_failure() {
        let labels: std::collections::BTreeSet<_> = WatchErrorReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), WatchErrorReason::ALL.len());
        for l in labels {
            assert!(l.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') && !l.starts_with('-'), "{l}");
        }
        let not_failures: Vec<_> = WatchErrorReason::ALL.iter().filter(|r| !r.is_failure()).collect();
        assert_eq!(not_failures, [&WatchErrorReason::Expired]);
    }

    #[test]
    fn an_outage_logs_once_when_it_starts_and_once_when_it_ends_not_per_retry() {
        let (now, wall) = t0();
        let mut w = policies();
        let mut transitions = Vec::new();
        for i in 0..5 {
            transitions.push(w.fail(
                WatchErrorReason::Forbidden,
                format!("try {i}"),
                now + Duration::from_secs(i),
                wall,
            ));
        }
        assert_eq!(transitions[0], Transition::Failing);
        assert!(transitions[1..].iter().all(|t| *t == Transition::Quiet), "{transitions:?}");
        assert!(matches!(&w.phase, WatchPhase::Failing { since, cause, .. } if *since == now && cause == "try 4"));
        assert_eq!(w.ok(now + Duration::from_secs(42)), Transition::Recovered { after: Duration::from_secs(42) });
        assert_eq!(w.ok(now + Duration::from_secs(43)), Transition::Quiet);
        assert_eq!(w.phase, WatchPhase::Ok);
    }

    #[test]
    fn a_new_reason_during_an_outage_is_logged_but_keeps_the_outage_start() {
        let (now, wall) = t0();
        let mut w = policies();
        assert_eq!(w.fail(WatchErrorReason::Connect, "refused".into(), now, wall), Transition::Failing);
        let later = now + Duration::from_secs(10);
        assert_eq!(w.fail(WatchErrorReason::Forbidden, "rbac".into(), later, wall), Transition::Failing);
        assert_eq!(w.failing_for(later), Some(Duration::from_secs(10)));
    }

    #[test]
    fn gone_is_normal_operation_and_never_starts_an_outage() {
        let (now, wall) = t0();
        let mut w = policies();
        w.ok(now);
        assert_eq!(w.fail(WatchErrorReason::Expired, "410".into(), now, wall), Transition::Quiet);
        assert_eq!(w.phase, WatchPhase::Ok);
    }

    #[test]
    fn readiness_degrades_only_for_a_required_watch_failing_for_the_whole_grace_period() {
        let (now, wall) = t0();
        let grace = Duration::from_secs(30);
        let mut required = policies();
        let mut optional = WatchHealth::new("", "services", None);
        required.fail(WatchErrorReason::Forbidden, "rbac".into(), now, wall);
        optional.fail(WatchErrorReason::Forbidden, "rbac".into(), now, wall);
        let watches = [required.clone(), optional];
        assert!(overdue(&watches, now + Duration::from_secs(29), grace).is_empty(), "inside the grace period");
        let late = overdue(&watches, now + grace, grace);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].resource(), "endpointpolicies.config.aether.io");
        // Recovery ends it at once; a new outage starts a new grace period.
        required.ok(now + grace);
        assert!(!required.is_overdue(now + grace * 2, grace));
        required.fail(WatchErrorReason::Connect, "refused".into(), now + grace * 2, wall);
        assert!(!required.is_overdue(now + grace * 2 + Duration::from_secs(1), grace));
        assert!(required.is_overdue(now + grace * 3, grace));
    }

    #[test]
    fn syncing_and_off_watches_never_degrade_readiness() {
        let (now, _) = t0();
        let mut off = policies();
        off.off("the EndpointPolicy CRD is not installed", now);
        let watches = [WatchHealth::new("", "pods", Some("pods")), off];
        assert!(overdue(&watches, now + Duration::from_secs(3600), Duration::ZERO).is_empty());
    }

    #[test]
    fn off_ends_an_outage_and_on_resumes_syncing() {
        let (now, wall) = t0();
        let mut w = policies();
        w.fail(WatchErrorReason::NotFound, "404".into(), now, wall);
        assert!(matches!(w.off("CRD removed", now + Duration::from_secs(2)), Transition::Recovered { .. }));
        w.on();
        assert_eq!(w.phase, WatchPhase::Syncing);
    }

    #[test]
    fn the_readyz_line_names_the_resource_why_it_is_required_the_reason_the_cause_and_since_when() {
        let (now, wall) = t0();
        let mut w = policies();
        assert_eq!(
            w.describe(now),
            "watch endpointpolicies.config.aether.io (required: policy changes reach pods only through it): \
             syncing (no complete list yet)"
        );
        w.fail(WatchErrorReason::Forbidden, "HTTP 403 Forbidden: no watch for you".into(), now, wall);
        assert_eq!(
            w.describe(now + Duration::from_millis(42_500)),
            "watch endpointpolicies.config.aether.io (required: policy changes reach pods only through it): \
             failing for 42 s (since 2030-03-17T17:46:40Z): forbidden: HTTP 403 Forbidden: no watch for you"
        );
        assert!(WatchHealth::new("", "services", None).describe(now).starts_with("watch services (not required): "));
    }
}
