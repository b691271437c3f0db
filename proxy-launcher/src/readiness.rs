//! Ready means serving: while this pod's Envoy is the newest on the node (no successor took
//! over), the launcher refreshes the readiness marker only while Envoy's admin says it serves:
//! LIVE at its epoch, with no listener stopped. A pure rule fed what the admin answered each
//! second; [`crate::supervise`] does the asking and the writing.
//!
//! Why: a child that only runs is not a proxy that serves. `POST /drain_listeners` on the admin
//! stops every listener of the node while Envoy keeps running, LIVE; before this rule the pod
//! stayed Ready through it, and nothing told anyone the node refused every connection. Stopped
//! listeners do not come back, so the pod stays NotReady until it is replaced (docs/design-notes.md,
//! "Readiness is the launcher's marker").

use std::time::{Duration, Instant};

/// How long the marker is still refreshed while the admin gives no answer at all (Envoy's main
/// thread busy, e.g. with a large xDS update), counted from the last answer that said "serving".
/// Past it the pod turns NotReady: an Envoy whose admin never answers is wedged. Seconds, above
/// the probe's marker age limit (5 s) so that a short stall does not flap the pod.
pub const NO_ANSWER_GRACE: Duration = Duration::from_secs(10);

/// What Envoy's admin said this second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// This Envoy is LIVE at its epoch and no listener was stopped (or a newer epoch answers: a
    /// successor is taking over, and the state dir decides).
    Serving,
    /// It answered, and it does not serve: what it said, for the log.
    NotServing(String),
    /// No answer within the admin client's timeout.
    NoAnswer,
}

/// A change worth one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The marker is no longer refreshed: why.
    Withheld(String),
    /// Serving again after [`Note::Withheld`].
    Restored,
}

/// The marker rule of one serving Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// When the admin last said "serving"; `None` once it said "not serving" since.
    last_serving: Option<Instant>,
    withheld: Option<String>,
}

impl Readiness {
    /// An Envoy that was just seen LIVE at its epoch, at `now`.
    pub fn new(now: Instant) -> Readiness {
        Readiness { last_serving: Some(now), withheld: None }
    }

    /// Whether to refresh the marker now, given what the admin `said` at `now`, and the change to
    /// log, if any (each change once).
    pub fn next(&mut self, now: Instant, said: &Said) -> (bool, Option<Note>) {
        let why = match said {
            Said::Serving => {
                self.last_serving = Some(now);
                return (true, self.withheld.take().map(|_| Note::Restored));
            }
            Said::NoAnswer if self.last_serving.is_some_and(|t| now.duration_since(t) <= NO_ANSWER_GRACE) => {
                return (true, None);
            }
            Said::NoAnswer if self.withheld.is_some() => return (false, None),
            Said::NoAnswer => format!(
                "Envoy's admin has not answered for over {} s (a wedged main thread)",
                NO_ANSWER_GRACE.as_secs()
            ),
            Said::NotServing(why) => {
                self.last_serving = None;
                why.clone()
            }
        };
        if self.withheld.as_ref() == Some(&why) {
            return (false, None);
        }
        self.withheld = Some(why.clone());
        (false, Some(Note::Withheld(why)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_refreshes_the_marker() {
        let t0 = Instant::now();
        let mut r = Readiness::new(t0);
        assert_eq!(r.next(t0 + Duration::from_secs(1), &Said::Serving), (true, None));
        assert_eq!(r.next(t0 + Duration::from_secs(2), &Said::Serving), (true, None));
    }

    #[test]
    fn stopped_listeners_withhold_the_marker_logged_once_and_a_recovery_once() {
        let t0 = Instant::now();
        let mut r = Readiness::new(t0);
        let stopped = Said::NotServing("2 listeners stopped".into());
        assert_eq!(r.next(t0, &stopped), (false, Some(Note::Withheld("2 listeners stopped".into()))));
        assert_eq!(r.next(t0 + Duration::from_secs(1), &stopped), (false, None));
        let other = Said::NotServing("state DRAINING".into());
        assert_eq!(r.next(t0 + Duration::from_secs(2), &other), (false, Some(Note::Withheld("state DRAINING".into()))));
        assert_eq!(r.next(t0 + Duration::from_secs(3), &Said::Serving), (true, Some(Note::Restored)));
        assert_eq!(r.next(t0 + Duration::from_secs(4), &Said::Serving), (true, None));
    }

    #[test]
    fn no_answer_keeps_the_marker_for_the_grace_then_withholds_it() {
        let t0 = Instant::now();
        let mut r = Readiness::new(t0);
        assert_eq!(r.next(t0 + Duration::from_secs(1), &Said::Serving), (true, None));
        assert_eq!(r.next(t0 + Duration::from_secs(5), &Said::NoAnswer), (true, None));
        assert_eq!(r.next(t0 + Duration::from_secs(1) + NO_ANSWER_GRACE, &Said::NoAnswer), (true, None));
        let (touch, note) = r.next(t0 + Duration::from_secs(2) + NO_ANSWER_GRACE, &Said::NoAnswer);
        assert!(!touch);
        assert!(matches!(note, Some(Note::Withheld(w)) if w.contains("has not answered")));
        assert_eq!(r.next(t0 + Duration::from_secs(3) + NO_ANSWER_GRACE, &Said::NoAnswer), (false, None));
        // An answer restarts the grace.
        assert_eq!(r.next(t0 + Duration::from_secs(4) + NO_ANSWER_GRACE, &Said::Serving), (true, Some(Note::Restored)));
        assert_eq!(r.next(t0 + Duration::from_secs(5) + NO_ANSWER_GRACE, &Said::NoAnswer), (true, None));
    }

    #[test]
    fn a_stopped_listener_is_not_forgiven_by_the_no_answer_grace() {
        let t0 = Instant::now();
        let mut r = Readiness::new(t0);
        assert!(!r.next(t0, &Said::NotServing("1 listener stopped".into())).0);
        // A busy admin right after does not bring the marker back, nor logs anything new.
        assert_eq!(r.next(t0 + Duration::from_secs(1), &Said::NoAnswer), (false, None));
        assert_eq!(r.next(t0 + Duration::from_secs(2), &Said::Serving), (true, Some(Note::Restored)));
    }
}
