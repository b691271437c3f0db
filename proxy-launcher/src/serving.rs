//! The serving rules: what the launcher does while no Envoy of its own is starting, as pure state
//! machines fed what the I/O loop of [`crate::supervise`] observed (docs/design-notes.md, "Handing
//! the node proxy over"). Each phase is a state with a `next(observed) -> action` step; the loop
//! polls, calls `next` until it answers a waiting action, and does each action. The start-phase
//! decision (which epoch) is [`crate::epoch::plan`].
//!
//! - [`Standby`]: an Envoy outside the hand-over still answers on the node's admin address and
//!   no epoch of ours runs, or the serving epoch belongs to another owner (`--owner`) whose
//!   Envoy runs or whose launchers still hold the node ([`LeaseWatch`]).
//! - [`Serving`]: this launcher's Envoy is LIVE at its epoch, then maybe handed over and draining,
//!   until it exits: superseded, asked to step down, SIGTERM (with the wait for a successor), and
//!   how its exit is read.
//! - [`Superseded`]: that Envoy handed over and exited; the pod waits to be deleted, unless no
//!   Envoy runs on the node any more (the successor died), and then it starts one again.

use std::time::{Duration, Instant};

use crate::state_dir::Lease;

/// What the launcher sees while it stands by (polled every 200 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbySeen {
    /// SIGTERM (or SIGINT) arrived.
    pub term: bool,
    /// Something answers `/server_info` on the node's admin address.
    pub foreign_admin: bool,
    /// An epoch of ours runs (an `alive.<epoch>` lock is held): the admin that answers may be ours.
    pub ours_alive: bool,
    /// The `live-epoch` record names another owner (another release's proxy DaemonSet) and that
    /// epoch still runs, or that owner's launchers still hold the node ([`LeaseWatch`]): its
    /// Envoy is not ours to take over, nor to start cold beside while it restarts.
    pub other_owner: bool,
}

/// What to do while standing by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyAction {
    /// Log once (at warn level) that this pod stands by, and write the readiness marker.
    Announce,
    /// Keep the marker fresh and poll again.
    Wait,
    /// The other Envoy is gone (or an epoch of ours, same owner, runs): remove the marker and pick
    /// an epoch now, which starts Envoy at once.
    Start,
    /// SIGTERM: remove the marker and exit 0.
    Stop,
}

/// Standing by beside an Envoy outside the hand-over (an older release's, or one with hot restart
/// disabled), or beside another owner's, instead of binding a cold Envoy beside it: every inbound
/// listener would fail to bind (EADDRINUSE). The pod is Ready meanwhile, so a surge-rolling DaemonSet deletes the old pod;
/// this is the one exception to "Ready means serving", and it lasts only while the other admin
/// answers (an Envoy outside the hand-over) or while another owner's serving epoch holds its
/// `alive` lock (another owner's Envoy, whatever its admin does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standby {
    announced: bool,
}

impl Standby {
    /// The next step.
    pub fn next(&mut self, seen: &StandbySeen) -> StandbyAction {
        if seen.term {
            StandbyAction::Stop
        } else if seen.other_owner {
            self.announce()
        } else if !seen.foreign_admin || seen.ours_alive {
            StandbyAction::Start
        } else {
            self.announce()
        }
    }

    /// `Announce` the first time, `Wait` after.
    fn announce(&mut self) -> StandbyAction {
        if !std::mem::replace(&mut self.announced, true) { StandbyAction::Announce } else { StandbyAction::Wait }
    }
}

/// What the launcher sees of its serving Envoy (polled every 100 ms) and the node's state dir. The
/// state-dir fields are refreshed every second, and at once when Envoy exits or SIGTERM arrives;
/// in between they keep their last value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingSeen {
    /// When this was seen.
    pub now: Instant,
    /// SIGTERM (or SIGINT) arrived.
    pub term: bool,
    /// Envoy exited.
    pub exited: bool,
    /// The `live-epoch` record names a later epoch: a successor took the listening sockets over.
    pub successor_serves: bool,
    /// The next epoch's `alive` lock is held: a successor's Envoy runs, attached to ours as its
    /// hot restart parent (it aborts if ours goes before it took over).
    pub successor_attached: bool,
    /// A step-down request for this epoch (reading it consumed it): its reason.
    pub step_down: Option<String>,
}

/// How the serving Envoy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Stopped on SIGTERM with no successor: if it was the node's last, the hand-over state goes.
    Stopped,
    /// Handed over (or stepped down) and exited: this pod waits to be deleted.
    Superseded,
    /// It exited on its own: a crash, started again in place.
    Failed,
}

/// What to do while Envoy serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingAction {
    /// Keep the marker fresh and poll again.
    Wait,
    /// A successor took the sockets over: log that this Envoy drains, then exits.
    NoteSuperseded,
    /// Asked to stop without a hand-over (the reason): SIGTERM Envoy.
    StepDown(String),
    /// SIGTERM arrived: log what happens next (`superseded`: Envoy drains and exits by itself;
    /// else it serves until a successor takes over, at most the successor wait).
    NoteTerm {
        /// Whether a successor already took over.
        superseded: bool,
    },
    /// No successor took over within the wait: SIGTERM Envoy (its listeners close).
    StopEnvoy,
    /// Envoy exited: remove the marker and end this Envoy's run.
    Ended(End),
}

/// Why Envoy is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM to the pod, no successor.
    Term,
    /// A successor's step-down request.
    StepDown,
}

/// The serving phase of one Envoy, from LIVE at its epoch until it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    successor_wait: Duration,
    superseded: bool,
    stop: Option<Stop>,
    term_at: Option<Instant>,
}

impl Serving {
    /// A serving Envoy; on SIGTERM it keeps serving up to `successor_wait` for a successor to take
    /// over (zero: stop at once, as with the hand-over off).
    pub fn new(successor_wait: Duration) -> Serving {
        Serving { successor_wait, superseded: false, stop: None, term_at: None }
    }

    /// Whether Envoy was signalled to stop (then step-down requests are left unread).
    pub fn stopping(&self) -> bool {
        self.stop.is_some()
    }

    /// The next step. Call it again with the same observation until it answers
    /// [`ServingAction::Wait`] or [`ServingAction::Ended`].
    pub fn next(&mut self, seen: &ServingSeen) -> ServingAction {
        if seen.exited {
            return ServingAction::Ended(if self.stop == Some(Stop::Term) {
                End::Stopped
            } else if self.superseded
                || self.stop == Some(Stop::StepDown)
                || seen.successor_serves
                || seen.successor_attached
            {
                End::Superseded
            } else {
                End::Failed
            });
        }
        if !self.superseded && seen.successor_serves {
            self.superseded = true;
            return ServingAction::NoteSuperseded;
        }
        if self.stop.is_none()
            && let Some(why) = &seen.step_down
        {
            self.stop = Some(Stop::StepDown);
            return ServingAction::StepDown(why.clone());
        }
        if seen.term && self.stop.is_none() {
            let Some(at) = self.term_at else {
                self.term_at = Some(seen.now);
                return ServingAction::NoteTerm { superseded: self.superseded };
            };
            // Never stop a parent whose child is starting: the child's messages to it would fail.
            if !self.superseded && !seen.successor_attached && seen.now.duration_since(at) >= self.successor_wait {
                self.stop = Some(Stop::Term);
                return ServingAction::StopEnvoy;
            }
        }
        ServingAction::Wait
    }
}

/// How long another owner's lease left unheld (its launchers died without releasing it) still
/// counts as held: past the kubelet's crash-loop back-off, which tops out at 5 minutes
/// (Kubernetes documentation, "Pod Lifecycle", container restart policy), so an owner whose
/// container is restarting is back within it.
pub const LEASE_UNHELD_GRACE: Duration = Duration::from_secs(600);

/// Whether another owner still holds the node, from its [`Lease`] as polled: held, or left unheld
/// for less than [`LEASE_UNHELD_GRACE`] since this launcher first saw it so. Absent (released by
/// its last launcher's clean exit) is gone at once.
#[derive(Debug, Default)]
pub struct LeaseWatch {
    /// The owner watched, and when its lease was first seen unheld.
    watched: Option<(String, Option<Instant>)>,
}

impl LeaseWatch {
    /// `owner`'s lease is `lease` at `now`: whether that owner still holds the node.
    pub fn present(&mut self, owner: &str, lease: Lease, now: Instant) -> bool {
        if self.watched.as_ref().is_none_or(|(o, _)| o != owner) {
            self.watched = Some((owner.to_owned(), None));
        }
        let unheld_since = self.watched.as_mut().map(|(_, since)| since).expect("set above");
        match lease {
            Lease::Absent => {
                *unheld_since = None;
                false
            }
            Lease::Held => {
                *unheld_since = None;
                true
            }
            Lease::Unheld => now.duration_since(*unheld_since.get_or_insert(now)) < LEASE_UNHELD_GRACE,
        }
    }
}

/// How long no Envoy must run on the node before a superseded launcher starts one again: longer
/// than a crashed successor's launcher takes to start its next Envoy (it holds the next `alive`
/// lock within milliseconds of the crash).
pub const NOTHING_RUNS_FOR: Duration = Duration::from_secs(3);

/// What a superseded launcher sees (polled every second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SupersededSeen {
    /// When this was seen.
    pub now: Instant,
    /// SIGTERM (or SIGINT) arrived.
    pub term: bool,
    /// An epoch's Envoy runs on the node (an `alive` lock is held: this launcher's Envoy has
    /// exited, so it is another launcher's, serving or starting).
    pub envoy_runs: bool,
}

/// What to do once superseded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupersededAction {
    /// Poll again: the pod is deleted once its successor is Ready.
    Wait,
    /// SIGTERM: exit 0 (exiting earlier would make the kubelet restart the container, which would
    /// start yet another Envoy).
    Exit,
    /// No Envoy has run on the node for [`NOTHING_RUNS_FOR`]: the successor is gone, start Envoy
    /// again instead of sitting NotReady.
    Restart,
}

/// A launcher whose Envoy handed over (or stepped down) and exited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Superseded {
    nothing_since: Option<Instant>,
}

impl Superseded {
    /// The next step.
    pub fn next(&mut self, seen: &SupersededSeen) -> SupersededAction {
        if seen.term {
            return SupersededAction::Exit;
        }
        if seen.envoy_runs {
            self.nothing_since = None;
            return SupersededAction::Wait;
        }
        let since = *self.nothing_since.get_or_insert(seen.now);
        if seen.now.duration_since(since) >= NOTHING_RUNS_FOR {
            SupersededAction::Restart
        } else {
            SupersededAction::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standby(term: bool, foreign_admin: bool, ours_alive: bool) -> StandbySeen {
        StandbySeen { term, foreign_admin, ours_alive, other_owner: false }
    }

    #[test]
    fn a_foreign_admin_is_stood_by_announced_once() {
        let mut s = Standby::default();
        assert_eq!(s.next(&standby(false, true, false)), StandbyAction::Announce);
        assert_eq!(s.next(&standby(false, true, false)), StandbyAction::Wait);
        assert_eq!(s.next(&standby(false, true, false)), StandbyAction::Wait);
    }

    #[test]
    fn standby_ends_the_moment_the_foreign_admin_stops_answering() {
        let mut s = Standby::default();
        s.next(&standby(false, true, false));
        assert_eq!(s.next(&standby(false, false, false)), StandbyAction::Start);
        // Never announced: nothing answered from the start.
        assert_eq!(Standby::default().next(&standby(false, false, false)), StandbyAction::Start);
    }

    #[test]
    fn an_admin_of_ours_is_not_foreign() {
        let mut s = Standby::default();
        s.next(&standby(false, true, false));
        assert_eq!(s.next(&standby(false, true, true)), StandbyAction::Start);
    }

    #[test]
    fn another_owners_epoch_is_stood_by_until_it_ends() {
        // Its epoch is alive and its admin answers on the node's address: not ours to take over.
        let theirs = StandbySeen { other_owner: true, ..standby(false, true, true) };
        let mut s = Standby::default();
        assert_eq!(s.next(&theirs), StandbyAction::Announce);
        assert_eq!(s.next(&theirs), StandbyAction::Wait);
        assert_eq!(s.next(&StandbySeen { term: true, ..theirs }), StandbyAction::Stop);
        // Its Envoy exited: nothing runs, start.
        assert_eq!(s.next(&standby(false, false, false)), StandbyAction::Start);
    }

    #[test]
    fn another_owners_lease_holds_the_node_until_released_or_long_unheld() {
        let mut w = LeaseWatch::default();
        let t0 = Instant::now();
        let b = "team-b/aether-proxy";
        assert!(w.present(b, Lease::Held, t0));
        // Its launchers died without releasing it: still theirs through a crash-loop back-off.
        assert!(w.present(b, Lease::Unheld, t0 + Duration::from_secs(1)));
        assert!(w.present(b, Lease::Unheld, t0 + LEASE_UNHELD_GRACE));
        assert!(!w.present(b, Lease::Unheld, t0 + LEASE_UNHELD_GRACE + Duration::from_secs(2)));
        // Held again (its container came back): the count starts over.
        assert!(w.present(b, Lease::Held, t0 + LEASE_UNHELD_GRACE + Duration::from_secs(3)));
        assert!(w.present(b, Lease::Unheld, t0 + LEASE_UNHELD_GRACE + Duration::from_secs(4)));
        // Released by a clean exit: gone at once.
        assert!(!w.present(b, Lease::Absent, t0 + LEASE_UNHELD_GRACE + Duration::from_secs(5)));
        // Another owner named in the record: watched afresh.
        let mut w = LeaseWatch::default();
        assert!(w.present(b, Lease::Unheld, t0));
        assert!(w.present("team-c/aether-proxy", Lease::Unheld, t0 + LEASE_UNHELD_GRACE * 2));
    }

    #[test]
    fn sigterm_in_standby_stops() {
        let mut s = Standby::default();
        s.next(&standby(false, true, false));
        assert_eq!(s.next(&standby(true, true, false)), StandbyAction::Stop);
        assert_eq!(Standby::default().next(&standby(true, false, false)), StandbyAction::Stop);
    }

    /// Runs `next` until it waits or ends; every action on the way.
    fn run(s: &mut Serving, seen: &ServingSeen) -> Vec<ServingAction> {
        let mut out = Vec::new();
        loop {
            let a = s.next(seen);
            let last = matches!(a, ServingAction::Wait | ServingAction::Ended(_));
            out.push(a);
            if last {
                return out;
            }
        }
    }

    fn at(t0: Instant, secs: u64) -> ServingSeen {
        ServingSeen {
            now: t0 + Duration::from_secs(secs),
            term: false,
            exited: false,
            successor_serves: false,
            successor_attached: false,
            step_down: None,
        }
    }

    #[test]
    fn a_crash_while_serving_is_a_failure_to_restart() {
        let t0 = Instant::now();
        let mut s = Serving::new(Duration::from_secs(30));
        assert_eq!(run(&mut s, &at(t0, 1)), [ServingAction::Wait]);
        assert_eq!(run(&mut s, &ServingSeen { exited: true, ..at(t0, 2) }), [ServingAction::Ended(End::Failed)]);
    }

    #[test]
    fn a_successor_taking_over_supersedes_and_the_exit_is_no_failure() {
        let t0 = Instant::now();
        let mut s = Serving::new(Duration::from_secs(30));
        let taken = ServingSeen { successor_serves: true, ..at(t0, 1) };
        assert_eq!(run(&mut s, &taken), [ServingAction::NoteSuperseded, ServingAction::Wait]);
        assert_eq!(run(&mut s, &taken), [ServingAction::Wait], "noted once");
        // Its drain time is up: Envoy exits, even if the record was seen only now.
        assert_eq!(run(&mut s, &ServingSeen { exited: true, ..at(t0, 61) }), [ServingAction::Ended(End::Superseded)]);
        let mut s = Serving::new(Duration::from_secs(30));
        let exit = ServingSeen { exited: true, successor_attached: true, ..at(t0, 1) };
        assert_eq!(run(&mut s, &exit), [ServingAction::Ended(End::Superseded)]);
    }

    #[test]
    fn a_step_down_request_stops_envoy_and_its_exit_is_superseded() {
        let t0 = Instant::now();
        let mut s = Serving::new(Duration::from_secs(30));
        let asked = ServingSeen { step_down: Some("base ids differ".into()), ..at(t0, 1) };
        assert_eq!(run(&mut s, &asked), [ServingAction::StepDown("base ids differ".into()), ServingAction::Wait]);
        assert!(s.stopping());
        // SIGTERM now changes nothing: Envoy is stopping already.
        assert_eq!(run(&mut s, &ServingSeen { term: true, ..at(t0, 40) }), [ServingAction::Wait]);
        assert_eq!(run(&mut s, &ServingSeen { exited: true, ..at(t0, 41) }), [ServingAction::Ended(End::Superseded)]);
    }

    #[test]
    fn sigterm_before_a_successor_serves_for_the_wait_then_stops() {
        let t0 = Instant::now();
        let mut s = Serving::new(Duration::from_secs(30));
        let term = |secs| ServingSeen { term: true, ..at(t0, secs) };
        assert_eq!(run(&mut s, &term(10)), [ServingAction::NoteTerm { superseded: false }, ServingAction::Wait]);
        assert_eq!(run(&mut s, &term(39)), [ServingAction::Wait]);
        assert_eq!(run(&mut s, &term(40)), [ServingAction::StopEnvoy, ServingAction::Wait]);
        assert_eq!(run(&mut s, &ServingSeen { exited: true, ..term(41) }), [ServingAction::Ended(End::Stopped)]);
        // With no hand-over (a zero wait), at once.
        let mut s = Serving::new(Duration::ZERO);
        assert_eq!(
            run(&mut s, &term(1)),
            [ServingAction::NoteTerm { superseded: false }, ServingAction::StopEnvoy, ServingAction::Wait]
        );
    }

    #[test]
    fn sigterm_after_a_successor_attached_never_stops_its_parent() {
        let t0 = Instant::now();
        let mut s = Serving::new(Duration::from_secs(30));
        let attached = |secs| ServingSeen { term: true, successor_attached: true, ..at(t0, secs) };
        assert_eq!(run(&mut s, &attached(1)), [ServingAction::NoteTerm { superseded: false }, ServingAction::Wait]);
        // Past the wait, the successor still initializing: Envoy keeps serving for it.
        assert_eq!(run(&mut s, &attached(300)), [ServingAction::Wait]);
        // It took over: this Envoy drains and exits by itself.
        let took = ServingSeen { successor_serves: true, ..attached(301) };
        assert_eq!(run(&mut s, &took), [ServingAction::NoteSuperseded, ServingAction::Wait]);
        assert_eq!(run(&mut s, &ServingSeen { exited: true, ..took }), [ServingAction::Ended(End::Superseded)]);
    }

    #[test]
    fn sigterm_after_the_hand_over_waits_for_the_drain() {
        let t0 = Instant::now();
        let mut s = Serving::new(Duration::from_secs(30));
        let took = ServingSeen { successor_serves: true, ..at(t0, 1) };
        run(&mut s, &took);
        let term = |secs| ServingSeen { term: true, ..took.clone() }.with_now(t0, secs);
        assert_eq!(run(&mut s, &term(2)), [ServingAction::NoteTerm { superseded: true }, ServingAction::Wait]);
        assert_eq!(run(&mut s, &term(100)), [ServingAction::Wait], "never stopped: it drains");
        assert!(!s.stopping());
    }

    impl ServingSeen {
        fn with_now(self, t0: Instant, secs: u64) -> ServingSeen {
            ServingSeen { now: t0 + Duration::from_secs(secs), ..self }
        }
    }

    #[test]
    fn superseded_waits_while_an_envoy_runs_and_exits_on_sigterm() {
        let t0 = Instant::now();
        let seen = |secs, term, envoy_runs| SupersededSeen { now: t0 + Duration::from_secs(secs), term, envoy_runs };
        let mut s = Superseded::default();
        for t in 0..100 {
            assert_eq!(s.next(&seen(t, false, true)), SupersededAction::Wait);
        }
        assert_eq!(s.next(&seen(100, true, true)), SupersededAction::Exit);
        assert_eq!(Superseded::default().next(&seen(0, true, false)), SupersededAction::Exit);
    }

    #[test]
    fn a_successor_that_died_while_superseded_is_replaced_by_starting_again() {
        let t0 = Instant::now();
        let seen = |secs, envoy_runs| SupersededSeen { now: t0 + Duration::from_secs(secs), term: false, envoy_runs };
        let mut s = Superseded::default();
        assert_eq!(s.next(&seen(0, true)), SupersededAction::Wait);
        // The successor crashed; its launcher started the next Envoy within the window.
        assert_eq!(s.next(&seen(1, false)), SupersededAction::Wait);
        assert_eq!(s.next(&seen(2, true)), SupersededAction::Wait);
        // Gone for good.
        assert_eq!(s.next(&seen(3, false)), SupersededAction::Wait);
        assert_eq!(s.next(&seen(5, false)), SupersededAction::Wait);
        assert_eq!(s.next(&seen(6, false)), SupersededAction::Restart);
    }
}
