//! The cap on concurrent connections of one listener: a [`Gate`] hands out a [`Slot`] per
//! admitted connection (a permit of a semaphore of `max_connections` permits, and a place in its
//! source address's share, [`ConnectionPolicy::max_connections_per_source`]) and counts the
//! connections it refuses.
//!
//! Over the cap a connection is *accepted and closed at once* rather than left in the kernel's
//! accept queue: the client learns at once (end of stream) instead of hanging until its own
//! timeout, the refusal is counted, and the queue never fills with stale connections that would
//! each take a freed slot for another first-byte timeout.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::metrics::ListenerMetrics;
use crate::policy::{ConnectionPolicy, Eviction};

/// How often, at most, a listener logs that it is refusing connections (seconds).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// One listener's cap and counters; clones share them.
#[derive(Clone, Debug)]
pub struct Gate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    policy: ConnectionPolicy,
    slots: Arc<Semaphore>,
    metrics: ListenerMetrics,
    /// Open connections per source address (only with a per-source share; no zero entries).
    sources: Mutex<HashMap<IpAddr, usize>>,
    last_refusal_log: Mutex<Option<Instant>>,
}

impl Gate {
    /// A gate enforcing `policy`, counting into `metrics` (its series are created at zero).
    ///
    /// # Panics
    /// When `policy.max_connections` is 0 or above tokio's semaphore limit (the flags allow
    /// 1..=65536).
    pub fn new(policy: ConnectionPolicy, metrics: &ListenerMetrics) -> Self {
        assert!(policy.max_connections >= 1, "{}: max_connections must be at least 1", policy.listener);
        metrics.init(policy.listener, policy.max_connections);
        Gate {
            inner: Arc::new(GateInner {
                policy,
                slots: Arc::new(Semaphore::new(policy.max_connections)),
                metrics: metrics.clone(),
                sources: Mutex::new(HashMap::new()),
                last_refusal_log: Mutex::new(None),
            }),
        }
    }

    /// The policy this gate enforces.
    pub fn policy(&self) -> &ConnectionPolicy {
        &self.inner.policy
    }

    /// The metrics it counts into.
    pub fn metrics(&self) -> &ListenerMetrics {
        &self.inner.metrics
    }

    /// A slot for a new connection from `source` (its peer's IP address; `None` for a Unix
    /// socket), or `None` over the cap or over the source's share (counted as refused, and as
    /// over the share; the caller closes the connection). [`GatedIo::new`](crate::GatedIo::new)
    /// wraps the admitted connection with its slot. Logs a warning at most once per
    /// [`REFUSAL_LOG_INTERVAL`].
    pub fn admit(&self, source: Option<IpAddr>) -> Option<Slot> {
        let p = &self.inner.policy;
        let source = source.map(|ip| ip.to_canonical()).filter(|_| p.max_connections_per_source.is_some());
        let mut sources = self.inner.sources.lock().unwrap_or_else(PoisonError::into_inner);
        if let (Some(ip), Some(share)) = (source, p.max_connections_per_source)
            && sources.get(&ip).copied().unwrap_or(0) >= share
        {
            drop(sources);
            let total = self.inner.metrics.refused_over_share(p.listener);
            self.log_refusal(total, source);
            return None;
        }
        match self.inner.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                if let Some(ip) = source {
                    *sources.entry(ip).or_insert(0) += 1;
                }
                drop(sources);
                self.inner.metrics.opened(p.listener);
                Some(Slot { _permit: permit, source, gate: self.clone() })
            }
            Err(_) => {
                drop(sources);
                let total = self.inner.metrics.refused(p.listener);
                self.log_refusal(total, None);
                None
            }
        }
    }

    /// Connections open now from `source` (0 without a per-source share).
    pub fn open_from(&self, source: IpAddr) -> usize {
        let sources = self.inner.sources.lock().unwrap_or_else(PoisonError::into_inner);
        sources.get(&source.to_canonical()).copied().unwrap_or(0)
    }

    pub(crate) fn count_eviction(&self, reason: Eviction) {
        let p = &self.inner.policy;
        self.inner.metrics.evicted(p.listener, reason);
        tracing::debug!(listener = p.listener.label(), reason = reason.label(), "closed a connection");
    }

    /// `over_share`: the source refused for its share (else the whole cap was full).
    fn log_refusal(&self, total: u64, over_share: Option<IpAddr>) {
        let now = Instant::now();
        let mut last = self.inner.last_refusal_log.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_INTERVAL) {
            return;
        }
        *last = Some(now);
        let p = &self.inner.policy;
        match over_share {
            None => tracing::warn!(
                listener = p.listener.label(),
                max_connections = p.max_connections,
                refused_total = total,
                "listener at its connection cap: closing new connections at once \
                 (aether_listener_connections_refused_total; logged at most once a minute)"
            ),
            Some(source) => tracing::warn!(
                listener = p.listener.label(),
                %source,
                max_connections_per_source = p.max_connections_per_source,
                refused_total = total,
                "a source holds its share of the listener's connections: closing its new connections at once \
                 (aether_listener_connections_over_source_share_total; logged at most once a minute)"
            ),
        }
    }
}

/// An admitted connection's place under the cap; dropping it frees the place and lowers
/// `aether_listener_connections`.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    /// The source whose share it counts in (only with a per-source share).
    source: Option<IpAddr>,
    gate: Gate,
}

impl Slot {
    /// The gate that admitted it.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(ip) = self.source {
            let mut sources = self.gate.inner.sources.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = sources.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    sources.remove(&ip);
                }
            }
        }
        self.gate.inner.metrics.closed(self.gate.inner.policy.listener);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ListenerKind;

    #[test]
    fn the_gate_admits_up_to_its_cap_refuses_and_counts_the_rest_and_frees_on_drop() {
        let metrics = ListenerMetrics::new();
        let policy = ConnectionPolicy { max_connections: 2, ..ListenerKind::Admin.default_policy() };
        let gate = Gate::new(policy, &metrics);
        let a = gate.admit(None).expect("first");
        let _b = gate.admit(None).expect("second");
        assert!(gate.admit(None).is_none());
        assert!(gate.admit(None).is_none());
        assert_eq!(metrics.refusals(ListenerKind::Admin), 2);
        assert_eq!(metrics.open(ListenerKind::Admin), 2);
        drop(a);
        assert_eq!(metrics.open(ListenerKind::Admin), 1);
        let _c = gate.admit(None).expect("a freed slot is reused");
        assert_eq!(metrics.refusals(ListenerKind::Admin), 2);
    }

    #[test]
    fn a_source_holding_its_share_is_refused_while_other_sources_and_unix_peers_are_admitted() {
        let metrics = ListenerMetrics::new();
        let policy = ConnectionPolicy {
            max_connections: 4,
            max_connections_per_source: Some(2),
            ..ListenerKind::Admin.default_policy()
        };
        let gate = Gate::new(policy, &metrics);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let a_mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let b: IpAddr = "fd00::2".parse().unwrap();
        let first = gate.admit(Some(a)).expect("a's first");
        let _second = gate.admit(Some(a_mapped)).expect("a's second, as an IPv4-mapped address");
        assert_eq!(gate.open_from(a), 2);
        assert!(gate.admit(Some(a)).is_none(), "a over its share");
        assert!(gate.admit(Some(a_mapped)).is_none(), "the same source, however written");
        assert_eq!((metrics.refusals(ListenerKind::Admin), metrics.over_share(ListenerKind::Admin)), (2, 2));
        let _b1 = gate.admit(Some(b)).expect("another source");
        let _unix = gate.admit(None).expect("a Unix peer has no share");
        drop(first);
        assert_eq!(gate.open_from(a), 1);
        let _again = gate.admit(Some(a)).expect("a freed place in the share is reused");
        assert!(gate.admit(Some(b)).is_none(), "the whole cap of 4 is full");
        assert_eq!((metrics.refusals(ListenerKind::Admin), metrics.over_share(ListenerKind::Admin)), (3, 2));
    }

    #[test]
    fn without_a_share_one_source_may_fill_the_cap() {
        let metrics = ListenerMetrics::new();
        let gate =
            Gate::new(ConnectionPolicy { max_connections: 3, ..ListenerKind::Webhook.default_policy() }, &metrics);
        let api_server: IpAddr = "172.16.0.1".parse().unwrap();
        let held: Vec<Slot> = (0..3).map(|_| gate.admit(Some(api_server)).expect("under the cap")).collect();
        assert_eq!(gate.open_from(api_server), 0, "not tracked without a share");
        assert!(gate.admit(Some(api_server)).is_none());
        assert_eq!(metrics.over_share(ListenerKind::Webhook), 0);
        drop(held);
    }

    #[test]
    fn gates_of_two_listeners_share_the_families_but_not_the_caps() {
        let metrics = ListenerMetrics::new();
        let one = ConnectionPolicy { max_connections: 1, ..ListenerKind::Admin.default_policy() };
        let admin = Gate::new(one, &metrics);
        let xds = Gate::new(ConnectionPolicy { max_connections: 1, ..ListenerKind::Xds.default_policy() }, &metrics);
        let _a = admin.admit(None).unwrap();
        let _x = xds.admit(None).expect("the admin port being full does not close the xDS listener");
        assert!(admin.admit(None).is_none());
        assert_eq!((metrics.refusals(ListenerKind::Admin), metrics.refusals(ListenerKind::Xds)), (1, 0));
    }
}
