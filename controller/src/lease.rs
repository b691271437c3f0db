//! One active status writer among the replicas: leader election on a `coordination.k8s.io/v1`
//! Lease (kube 5.0 has no built-in elector).
//!
//! The algorithm is client-go's `leaderelection` with a Lease lock, reduced to what we need:
//! - Every [`LeaseConfig::retry_every`] (plus up to as much again of random jitter,
//!   [`follower_wait`]) a follower reads the Lease. It takes it over only when
//!   the Lease has no holder, or when the Lease object has not changed (same `resourceVersion`)
//!   for a whole `leaseDurationSeconds` *as measured by this process's monotonic clock* since it
//!   first saw that version. Comparing local observation times, not `renewTime`, makes the
//!   election immune to clock skew between nodes.
//! - The leader renews every [`LeaseConfig::renew_every`]. Every write is an update carrying the
//!   `resourceVersion` that was read (optimistic concurrency): of two replicas racing for one
//!   Lease, the API server lets exactly one win (the other gets 409 Conflict and follows).
//! - A leader that could not renew for [`LeaseConfig::renew_deadline`] (shorter than the lease
//!   duration) steps down on its own before anyone can take over, so two writers never overlap
//!   as long as clocks *tick* at the same rate.
//! - On shutdown the leader releases the Lease (no holder, 1 s duration) so that a successor
//!   takes over at its next retry instead of waiting out the duration.
//!
//! RBAC: `create` on leases and `get`/`update` on the one named Lease (the chart's Role).

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ConstantBuilder};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// Default `leaseDurationSeconds`: how long a silent leader is trusted.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default interval between renewals by the leader.
pub const RENEW_EVERY: Duration = Duration::from_secs(5);
/// Default interval between attempts by a follower.
pub const RETRY_EVERY: Duration = Duration::from_secs(2);
/// Default time after the last successful renewal at which a leader steps down on its own.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// Where the Lease lives and who we are.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The Lease name (the chart's Role grants access to exactly this name).
    pub name: String,
    /// The Lease namespace.
    pub namespace: String,
    /// This replica's identity (`holderIdentity`): unique per replica, e.g. the pod name.
    pub holder: String,
    /// `leaseDurationSeconds` written when acquiring.
    pub duration: Duration,
    /// Renewal interval of the leader.
    pub renew_every: Duration,
    /// Attempt interval of a follower.
    pub retry_every: Duration,
    /// Step down when no renewal succeeded for this long.
    pub renew_deadline: Duration,
}

impl LeaseConfig {
    /// A configuration with the default timings.
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, holder: impl Into<String>) -> Self {
        LeaseConfig {
            name: name.into(),
            namespace: namespace.into(),
            holder: holder.into(),
            duration: LEASE_DURATION,
            renew_every: RENEW_EVERY,
            retry_every: RETRY_EVERY,
            renew_deadline: RENEW_DEADLINE,
        }
    }
}

/// What to do with the Lease as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is no Lease: create it with us as the holder.
    Create,
    /// We hold it: renew.
    Renew,
    /// It is free or expired: take it over (the previous holder, if any, is named for the log).
    TakeOver {
        /// The holder that let it expire.
        previous: Option<String>,
    },
    /// Someone else holds it and it has not expired: follow.
    Follow {
        /// The current holder.
        holder: String,
    },
}

/// Decides what to do with `lease` (as just read), given our identity `me` and how long the
/// Lease has stayed unchanged by our own clock (`unchanged_for`, zero when we see a version for
/// the first time). Pure.
pub fn step(lease: Option<&Lease>, me: &str, unchanged_for: Duration, default_duration: Duration) -> Step {
    let Some(lease) = lease else { return Step::Create };
    let spec = lease.spec.as_ref();
    let holder = spec.and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty());
    let Some(holder) = holder else { return Step::TakeOver { previous: None } };
    if holder == me {
        return Step::Renew;
    }
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .filter(|d| *d > 0)
        .map_or(default_duration, |d| Duration::from_secs(d as u64));
    if unchanged_for >= duration {
        Step::TakeOver { previous: Some(holder.to_owned()) }
    } else {
        Step::Follow { holder: holder.to_owned() }
    }
}

/// The Lease spec we write for `step` (acquire or renew), from the one read. Pure.
pub fn spec_for(step: &Step, read: Option<&LeaseSpec>, me: &str, duration: Duration, now: Timestamp) -> LeaseSpec {
    let mut spec = read.cloned().unwrap_or_default();
    let now = MicroTime(now);
    spec.holder_identity = Some(me.to_owned());
    spec.lease_duration_seconds = Some(duration.as_secs().max(1) as i32);
    spec.renew_time = Some(now.clone());
    match step {
        Step::Renew => {
            if spec.acquire_time.is_none() {
                spec.acquire_time = Some(now);
            }
        }
        Step::Create => {
            spec.acquire_time = Some(now);
            spec.lease_transitions = Some(0);
        }
        Step::TakeOver { .. } => {
            spec.acquire_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        Step::Follow { .. } => {}
    }
    spec
}

/// A follower's pause before its next attempt: `retry_every` plus a random part of up to
/// `retry_every` (backon's jitter on a constant delay), so between one and two periods.
pub fn follower_wait(retry_every: Duration) -> Duration {
    ConstantBuilder::default().with_delay(retry_every).with_jitter().build().next().unwrap_or(retry_every)
}

/// The elector: reads and writes the Lease; one per process.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The resourceVersion last read and when we first saw it.
    observed: Option<(String, Instant)>,
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl Elector {
    /// An elector for `cfg` using `client`.
    pub fn new(client: kube::Client, cfg: LeaseConfig) -> Self {
        Elector { api: Api::namespaced(client, &cfg.namespace), cfg, observed: None }
    }

    fn unchanged_for(&mut self, lease: Option<&Lease>) -> Duration {
        let rv = lease.and_then(|l| l.metadata.resource_version.clone()).unwrap_or_default();
        match &self.observed {
            Some((seen, since)) if *seen == rv => since.elapsed(),
            _ => {
                self.observed = Some((rv, Instant::now()));
                Duration::ZERO
            }
        }
    }

    /// One attempt: `Ok(true)` when we hold the Lease afterwards.
    ///
    /// # Errors
    /// When the API server cannot be reached or refuses for another reason than a lost race.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let read = self.api.get_opt(&self.cfg.name).await?;
        let unchanged_for = self.unchanged_for(read.as_ref());
        let step = step(read.as_ref(), &self.cfg.holder, unchanged_for, self.cfg.duration);
        if let Step::Follow { .. } = step {
            return Ok(false);
        }
        let spec = spec_for(
            &step,
            read.as_ref().and_then(|l| l.spec.as_ref()),
            &self.cfg.holder,
            self.cfg.duration,
            Timestamp::now(),
        );
        let written = match &read {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(old) => {
                // The read resourceVersion travels along: a concurrent writer makes this a 409.
                let lease = Lease { metadata: old.metadata.clone(), spec: Some(spec) };
                self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await
            }
        };
        match written {
            Ok(lease) => {
                if let Step::TakeOver { previous } = &step {
                    tracing::info!(lease = %format!("{}/{}", self.cfg.namespace, self.cfg.name), previous = previous.as_deref().unwrap_or("none"), "took over the status-writer lease");
                }
                self.observed = lease.metadata.resource_version.map(|rv| (rv, Instant::now()));
                Ok(true)
            }
            // Lost a race (created or updated by someone else first): follow for now.
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if we hold it (best effort, at shutdown).
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else { return };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.cfg.holder.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!("released the status-writer lease"),
            Err(e) => tracing::warn!(error = %e, "could not release the status-writer lease"),
        }
    }

    /// Runs the election until `shutdown` resolves, publishing leadership on `leader` (and the
    /// `aether_status_leader` gauge); releases the Lease at the end.
    pub async fn run(
        mut self,
        leader: watch::Sender<bool>,
        metrics: Metrics,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let lease = format!("{}/{}", self.cfg.namespace, self.cfg.name);
        let mut last_renewal: Option<Instant> = None;
        // Warn once per outage, not every retry.
        let mut failing = false;
        loop {
            let leading = *leader.borrow();
            let mut unreachable = false;
            let now_leading = match self.try_acquire_or_renew().await {
                Ok(held) => {
                    if held {
                        last_renewal = Some(Instant::now());
                    }
                    if std::mem::take(&mut failing) {
                        tracing::info!(%lease, "the status-writer lease is reachable again");
                    }
                    held
                }
                Err(e) => {
                    unreachable = true;
                    let within_deadline = last_renewal.is_some_and(|t| t.elapsed() < self.cfg.renew_deadline);
                    if std::mem::replace(&mut failing, true) {
                        tracing::debug!(%lease, error = %e, "still cannot reach the status-writer lease");
                    } else {
                        tracing::warn!(%lease, error = %e, still_leading = leading && within_deadline, "cannot reach the status-writer lease; retrying");
                    }
                    leading && within_deadline
                }
            };
            if now_leading != leading {
                if now_leading {
                    tracing::info!(%lease, holder = %self.cfg.holder, "leading: this replica writes EndpointPolicy status");
                } else if unreachable {
                    tracing::warn!(%lease, holder = %self.cfg.holder, deadline = ?self.cfg.renew_deadline, "stepping down: the lease could not be renewed within the deadline; no replica writes status until the API server answers");
                } else {
                    tracing::info!(%lease, holder = %self.cfg.holder, "not leading: another replica writes EndpointPolicy status");
                }
                leader.send_replace(now_leading);
                metrics.leader.set(i64::from(now_leading));
            }
            // The leader's renew period is a protocol period, not a backoff: it must renew (or
            // retry an unreachable API server) well within renew_deadline, so it stays fixed,
            // failures included, as in client-go. A follower's attempt is jittered instead
            // (client-go's JitterUntil): followers restarted together do not poll in lockstep.
            let wait = if now_leading { self.cfg.renew_every } else { follower_wait(self.cfg.retry_every) };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = &mut shutdown => break,
            }
        }
        if *leader.borrow() {
            leader.send_replace(false);
            metrics.leader.set(0);
            self.release().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_waits_between_one_and_two_retry_periods_at_random() {
        let waits: Vec<Duration> = (0..16).map(|_| follower_wait(RETRY_EVERY)).collect();
        assert!(waits.iter().all(|w| *w >= RETRY_EVERY && *w < 2 * RETRY_EVERY), "{waits:?}");
        assert!(waits.iter().any(|w| *w != waits[0]), "no jitter: {waits:?}");
    }

    fn lease(holder: Option<&str>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta { resource_version: Some("7".into()), ..ObjectMeta::default() },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: duration,
                ..LeaseSpec::default()
            }),
        }
    }

    const D: Duration = LEASE_DURATION;

    #[test]
    fn no_lease_is_created() {
        assert_eq!(step(None, "me", Duration::ZERO, D), Step::Create);
    }

    #[test]
    fn our_own_lease_is_renewed() {
        assert_eq!(step(Some(&lease(Some("me"), Some(15))), "me", Duration::from_secs(99), D), Step::Renew);
    }

    #[test]
    fn a_lease_without_holder_is_taken_at_once() {
        for l in [lease(None, Some(15)), lease(Some(""), Some(15))] {
            assert_eq!(step(Some(&l), "me", Duration::ZERO, D), Step::TakeOver { previous: None });
        }
    }

    #[test]
    fn a_held_lease_is_followed_until_it_stayed_unchanged_for_its_duration() {
        let l = lease(Some("other"), Some(15));
        assert_eq!(step(Some(&l), "me", Duration::from_secs(14), D), Step::Follow { holder: "other".into() });
        assert_eq!(step(Some(&l), "me", Duration::from_secs(15), D), Step::TakeOver { previous: Some("other".into()) });
    }

    #[test]
    fn the_lease_own_duration_wins_over_the_default() {
        let l = lease(Some("other"), Some(1));
        assert_eq!(step(Some(&l), "me", Duration::from_secs(1), D), Step::TakeOver { previous: Some("other".into()) });
        let l = lease(Some("other"), None);
        assert_eq!(step(Some(&l), "me", Duration::from_secs(5), D), Step::Follow { holder: "other".into() });
    }

    #[test]
    fn a_takeover_counts_a_transition_and_a_renewal_keeps_the_acquire_time() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_005).unwrap();
        let created = spec_for(&Step::Create, None, "me", D, t0);
        assert_eq!(created.holder_identity.as_deref(), Some("me"));
        assert_eq!((created.lease_transitions, created.lease_duration_seconds), (Some(0), Some(15)));
        let renewed = spec_for(&Step::Renew, Some(&created), "me", D, t1);
        assert_eq!(renewed.acquire_time, created.acquire_time);
        assert_eq!(renewed.renew_time, Some(MicroTime(t1)));
        let taken = spec_for(&Step::TakeOver { previous: Some("me".into()) }, Some(&renewed), "you", D, t1);
        assert_eq!((taken.holder_identity.as_deref(), taken.lease_transitions), (Some("you"), Some(1)));
        assert_eq!(taken.acquire_time, Some(MicroTime(t1)));
    }
}
