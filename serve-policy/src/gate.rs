//! The cap on concurrent connections of one listener: a [`Gate`] hands out a [`Slot`] per
//! admitted connection (a permit of a semaphore of `max_connections` permits) and counts the
//! connections it refuses.
//!
//! Over the cap a connection is *accepted and closed at once* rather than left in the kernel's
//! accept queue: the client learns at once (end of stream) instead of hanging until its own
//! timeout, the refusal is counted, and the queue never fills with stale connections that would
//! each take a freed slot for another first-byte timeout.

use std::sync::{Arc, Mutex};
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

    /// A slot for a new connection, or `None` over the cap (counted as refused; the caller
    /// closes the connection). [`GatedIo::new`](crate::GatedIo::new) wraps the admitted
    /// connection with its slot. Logs a warning at most once per [`REFUSAL_LOG_INTERVAL`].
    pub fn admit(&self) -> Option<Slot> {
        match self.inner.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                self.inner.metrics.opened(self.inner.policy.listener);
                Some(Slot { _permit: permit, gate: self.clone() })
            }
            Err(_) => {
                let total = self.inner.metrics.refused(self.inner.policy.listener);
                self.log_refusal(total);
                None
            }
        }
    }

    pub(crate) fn count_eviction(&self, reason: Eviction) {
        let p = &self.inner.policy;
        self.inner.metrics.evicted(p.listener, reason);
        tracing::debug!(listener = p.listener.label(), reason = reason.label(), "closed a connection");
    }

    fn log_refusal(&self, total: u64) {
        let now = Instant::now();
        let mut last = self.inner.last_refusal_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_INTERVAL) {
            return;
        }
        *last = Some(now);
        let p = &self.inner.policy;
        tracing::warn!(
            listener = p.listener.label(),
            max_connections = p.max_connections,
            refused_total = total,
            "listener at its connection cap: closing new connections at once \
             (aether_listener_connections_refused_total; logged at most once a minute)"
        );
    }
}

/// An admitted connection's place under the cap; dropping it frees the place and lowers
/// `aether_listener_connections`.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
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
        let a = gate.admit().expect("first");
        let _b = gate.admit().expect("second");
        assert!(gate.admit().is_none());
        assert!(gate.admit().is_none());
        assert_eq!(metrics.refusals(ListenerKind::Admin), 2);
        assert_eq!(metrics.open(ListenerKind::Admin), 2);
        drop(a);
        assert_eq!(metrics.open(ListenerKind::Admin), 1);
        let _c = gate.admit().expect("a freed slot is reused");
        assert_eq!(metrics.refusals(ListenerKind::Admin), 2);
    }

    #[test]
    fn gates_of_two_listeners_share_the_families_but_not_the_caps() {
        let metrics = ListenerMetrics::new();
        let one = ConnectionPolicy { max_connections: 1, ..ListenerKind::Admin.default_policy() };
        let admin = Gate::new(one, &metrics);
        let xds = Gate::new(ConnectionPolicy { max_connections: 1, ..ListenerKind::Xds.default_policy() }, &metrics);
        let _a = admin.admit().unwrap();
        let _x = xds.admit().expect("the admin port being full does not close the xDS listener");
        assert!(admin.admit().is_none());
        assert_eq!((metrics.refusals(ListenerKind::Admin), metrics.refusals(ListenerKind::Xds)), (1, 0));
    }
}
