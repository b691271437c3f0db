//! When an inbound listener Envoy could not bind is offered again (docs/design-notes.md,
//! "Agent": a withdrawn listener is offered again, never withdrawn for good).
//!
//! A listener fails to bind when something in the pod's network namespace already holds its
//! port: the app also listens on it, or another Envoy still does (an Envoy outside the hand-over,
//! during an upgrade). The index then stops offering it ([`crate::Index::mark_inbound_failed`]) so
//! the node's next LDS update is accepted. Neither cause is forever, so a withdrawal never is:
//!
//! - when one of Envoy's ADS streams ends (an Envoy exited, so its ports are free), every
//!   withdrawn listener is due at once ([`Reoffers::all_due`]);
//! - otherwise each pod's withdrawn listeners are due again after a back-off that starts at
//!   [`FIRST_DELAY`] and doubles per failed re-offer up to [`MAX_DELAY`], so a port the app keeps
//!   costs Envoy one failed bind per pod every half hour at most.
//!
//! A re-offer that fails again tells the pod nothing new: [`Reoffers::first_report`] is true once
//! per cause (pod, port and Envoy's reason). This module decides; the driver keeps the clock and
//! does the I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// The first re-offer of a pod's withdrawn listeners comes this long after the withdrawal.
pub const FIRST_DELAY: Duration = Duration::from_secs(120);

/// The longest wait between two re-offers of one pod's listeners (the back-off's cap).
pub const MAX_DELAY: Duration = Duration::from_secs(32 * 60);

/// One pod's re-offer schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Schedule {
    /// Withdrawals since the pod's last clean start (the back-off's exponent).
    failures: u32,
    /// When its withdrawn listeners are offered again; `None` while none is withdrawn.
    due: Option<Instant>,
}

/// The re-offer schedule of every pod with a withdrawn inbound listener, and the causes each pod
/// was already told about. Keyed by pod UID.
#[derive(Debug, Clone, Default)]
pub struct Reoffers {
    pods: HashMap<String, Schedule>,
    /// UID → port → the reason Envoy gave last time the pod was told.
    told: HashMap<String, BTreeMap<u16, String>>,
}

/// The back-off after `failures` withdrawals (1 = the first): [`FIRST_DELAY`] × 2^(failures−1),
/// at most [`MAX_DELAY`].
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

impl Reoffers {
    /// An empty schedule.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pod `uid` had a listener withdrawn at `now`: its listeners are due again after the next
    /// back-off step. A pod whose re-offer is already scheduled keeps that time (several ports
    /// failing in one LDS update count as one failure).
    pub fn withdrawn(&mut self, uid: &str, now: Instant) {
        let s = self.pods.entry(uid.to_owned()).or_insert(Schedule { failures: 0, due: None });
        if s.due.is_none() {
            s.failures = s.failures.saturating_add(1);
            s.due = Some(now + delay(s.failures));
        }
    }

    /// Whether Envoy's failure of `port` on pod `uid` with `details` is news to the pod (a
    /// Warning Event is due): true the first time, and when Envoy's reason changed; a re-offer
    /// failing again for the same reason is not.
    pub fn first_report(&mut self, uid: &str, port: u16, details: &str) -> bool {
        let told = self.told.entry(uid.to_owned()).or_default();
        if told.get(&port).is_some_and(|d| d == details) {
            return false;
        }
        told.insert(port, details.to_owned());
        true
    }

    /// The pods whose withdrawn listeners are due at `now`, sorted; each is taken off the schedule
    /// until it is withdrawn again (its back-off step is kept).
    pub fn take_due(&mut self, now: Instant) -> Vec<String> {
        self.take(|due| due <= now)
    }

    /// Every pod with a withdrawn listener, sorted, taken off the schedule: an Envoy went away,
    /// so whatever held their ports may have too.
    pub fn all_due(&mut self) -> Vec<String> {
        self.take(|_| true)
    }

    fn take(&mut self, pred: impl Fn(Instant) -> bool) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (uid, s) in &mut self.pods {
            if s.due.is_some_and(&pred) {
                s.due = None;
                out.insert(uid.clone());
            }
        }
        out.into_iter().collect()
    }

    /// The earliest scheduled re-offer, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.pods.values().filter_map(|s| s.due).min()
    }

    /// Forgets pod `uid`: it is gone, or has a new network namespace (a new sandbox, where its
    /// listeners start afresh).
    pub fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.told.remove(uid);
    }

    /// Whether no pod is on the schedule (with a re-offer due, or a back-off step kept).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_back_off_doubles_from_two_minutes_to_its_cap() {
        assert_eq!(delay(1), Duration::from_secs(120));
        assert_eq!(delay(2), Duration::from_secs(240));
        assert_eq!(delay(5), Duration::from_secs(1920));
        assert_eq!(delay(6), MAX_DELAY);
        assert_eq!(delay(u32::MAX), MAX_DELAY);
        assert_eq!(delay(0), FIRST_DELAY, "no failure counts as the first");
    }

    #[test]
    fn a_withdrawn_pod_is_due_after_its_back_off_and_backs_off_further_each_time() {
        let t0 = Instant::now();
        let mut r = Reoffers::new();
        r.withdrawn("u1", t0);
        assert!(r.take_due(t0 + Duration::from_secs(119)).is_empty());
        assert_eq!(r.next_due(), Some(t0 + FIRST_DELAY));
        let t1 = t0 + FIRST_DELAY;
        assert_eq!(r.take_due(t1), vec!["u1".to_owned()]);
        assert!(r.take_due(t1 + MAX_DELAY).is_empty(), "taken: not due again until withdrawn again");
        // The re-offer failed too: twice as long.
        r.withdrawn("u1", t1);
        assert!(r.take_due(t1 + Duration::from_secs(239)).is_empty());
        assert_eq!(r.take_due(t1 + Duration::from_secs(240)), vec!["u1".to_owned()]);
    }

    #[test]
    fn ports_failing_together_count_as_one_failure() {
        let t0 = Instant::now();
        let mut r = Reoffers::new();
        r.withdrawn("u1", t0);
        r.withdrawn("u1", t0 + Duration::from_secs(5));
        assert_eq!(r.next_due(), Some(t0 + FIRST_DELAY));
    }

    #[test]
    fn an_envoy_going_away_makes_every_withdrawn_pod_due_at_once() {
        let t0 = Instant::now();
        let mut r = Reoffers::new();
        r.withdrawn("u2", t0);
        r.withdrawn("u1", t0);
        assert_eq!(r.all_due(), vec!["u1".to_owned(), "u2".to_owned()]);
        assert_eq!(r.next_due(), None);
        assert!(r.all_due().is_empty());
    }

    #[test]
    fn a_pod_is_told_once_per_cause() {
        let mut r = Reoffers::new();
        let busy = "cannot bind '0.0.0.0:8080': Address already in use";
        assert!(r.first_report("u1", 8080, busy));
        assert!(!r.first_report("u1", 8080, busy), "the same failure after a re-offer");
        assert!(r.first_report("u1", 9090, busy), "another port is another cause");
        assert!(r.first_report("u1", 8080, "cannot bind: permission denied"), "another reason");
        r.forget("u1");
        assert!(r.first_report("u1", 8080, busy), "a forgotten pod is told again");
        assert!(r.is_empty());
    }
}
