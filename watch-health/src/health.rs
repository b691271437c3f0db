//! One watch's state machine ([`WatchHealth`]) and its `/readyz` line. Pure: the caller passes
//! the clock.

use std::time::{Duration, Instant, SystemTime};

use crate::WatchErrorReason;

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

/// One watch a binary runs, and its health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchHealth {
    /// API group of the watched resource (`""` for the core group).
    pub group: &'static str,
    /// Its plural, e.g. `pods`.
    pub plural: &'static str,
    /// The `resource` label of the metrics: the plural (kebab-case, unique among the watches).
    pub label: &'static str,
    /// Why the binary cannot do without it, when a failure of it for longer than the grace
    /// period makes `/readyz` 503; `None` for a watch that never degrades readiness.
    pub required: Option<&'static str>,
    /// Whether the binary's `/readyz` applies a readiness rule to its watches at all (the agent:
    /// yes, and [`Self::describe`] says whether this one is required; the controller: no, its
    /// `/readyz` never turns 503 for a watch, and the line says nothing about it).
    pub gates_readiness: bool,
    /// Where it stands.
    pub phase: WatchPhase,
}

impl WatchHealth {
    /// A watch of `plural` in `group` that has just started ([`WatchPhase::Syncing`]), required
    /// for readiness because of `required` (`None`: not required).
    pub fn new(group: &'static str, plural: &'static str, required: Option<&'static str>) -> Self {
        WatchHealth { group, plural, label: plural, required, gates_readiness: true, phase: WatchPhase::Syncing }
    }

    /// A watch of a binary whose readiness never depends on its watches: reported and counted
    /// only ([`WatchPhase::Syncing`]; its `/readyz` line has no `(required: ...)` part).
    pub fn reported(group: &'static str, plural: &'static str) -> Self {
        WatchHealth { gates_readiness: false, ..WatchHealth::new(group, plural, None) }
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
    /// 2030-01-01T00:00:00Z): forbidden: HTTP 403 Forbidden: ...` (seconds rounded down, the
    /// wall-clock start in RFC 3339 UTC); without the `(...)` part when the binary's readiness
    /// never depends on its watches ([`Self::reported`]).
    pub fn describe(&self, now: Instant) -> String {
        let role = match (self.gates_readiness, self.required) {
            (false, _) => String::new(),
            (true, Some(why)) => format!(" (required: {why})"),
            (true, None) => " (not required)".to_owned(),
        };
        let state = match &self.phase {
            WatchPhase::Syncing => "syncing (no complete list yet)".to_owned(),
            WatchPhase::Ok => "ok".to_owned(),
            WatchPhase::Off(why) => format!("off: {why}"),
            WatchPhase::Failing { since, since_wall, reason, cause } => {
                let at = jiff::Timestamp::try_from(*since_wall)
                    .map(|t| format!("{t:.0}"))
                    .unwrap_or_else(|_| "?".to_owned());
                let secs = now.saturating_duration_since(*since).as_secs();
                format!("failing for {secs} s (since {at}): {}: {cause}", reason.label())
            }
        };
        format!("watch {}{role}: {state}", self.resource())
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

    #[test]
    fn a_reported_only_watch_never_gates_readiness_and_its_line_has_no_role() {
        let (now, wall) = t0();
        let mut w = WatchHealth::reported("", "services");
        assert_eq!(w.describe(now), "watch services: syncing (no complete list yet)");
        w.fail(WatchErrorReason::Forbidden, "HTTP 403 Forbidden: no".into(), now, wall);
        assert!(!w.is_overdue(now + Duration::from_secs(3600), Duration::ZERO));
        assert_eq!(
            w.describe(now + Duration::from_secs(7)),
            "watch services: failing for 7 s (since 2030-03-17T17:46:40Z): forbidden: HTTP 403 Forbidden: no"
        );
        w.ok(now);
        assert_eq!(w.describe(now), "watch services: ok");
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
}
