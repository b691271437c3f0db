//! The listeners' Prometheus metrics (prometheus-client), registered once per process into the
//! binary's registry ([`ListenerMetrics::register`]) and shared by every [`crate::Gate`]:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `aether_listener_connections` | gauge | `listener` | connections open now (admitted, not yet closed) |
//! | `aether_listener_max_connections` | gauge | `listener` | the cap ([`crate::ConnectionPolicy::max_connections`]) |
//! | `aether_listener_connections_refused_total` | counter | `listener` | connections over the cap or over their source's share: accepted and closed at once |
//! | `aether_listener_connections_over_source_share_total` | counter | `listener` | of those, the ones refused because their source address already held its share ([`crate::ConnectionPolicy::max_connections_per_source`]) |
//! | `aether_listener_connections_evicted_total` | counter | `listener`, `reason` | connections closed by the policy: `handshake-timeout`, `first-byte-timeout`, `idle-timeout` |
//!
//! `listener` is a [`ListenerKind::label`]: `webhook`, `admin` or `xds`. Every series of a
//! listener exists (at zero) from the moment its gate is built.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::policy::{Eviction, ListenerKind};

/// Labels of the per-listener series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// [`ListenerKind::label`].
    pub listener: &'static str,
}

/// Labels of `aether_listener_connections_evicted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// [`ListenerKind::label`].
    pub listener: &'static str,
    /// [`Eviction::label`].
    pub reason: &'static str,
}

/// The listener metric families; clones share the same series.
#[derive(Clone, Debug, Default)]
pub struct ListenerMetrics {
    connections: Family<ListenerLabel, Gauge>,
    max_connections: Family<ListenerLabel, Gauge>,
    refused: Family<ListenerLabel, Counter>,
    over_share: Family<ListenerLabel, Counter>,
    evicted: Family<EvictionLabels, Counter>,
}

impl ListenerMetrics {
    /// Fresh families, not registered anywhere (tests; a server nobody scrapes).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the five families into `registry` (call once per registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "aether_listener_connections",
            "Connections open now on each listener (admitted by its cap, not yet closed)",
            self.connections.clone(),
        );
        registry.register(
            "aether_listener_max_connections",
            "The cap on concurrent connections of each listener",
            self.max_connections.clone(),
        );
        registry.register(
            "aether_listener_connections_refused",
            "Connections accepted over a listener's cap, or over their source address's share of it, and closed at once",
            self.refused.clone(),
        );
        registry.register(
            "aether_listener_connections_over_source_share",
            "Connections refused because their source address already held its share of a listener's cap (also in aether_listener_connections_refused_total)",
            self.over_share.clone(),
        );
        registry.register(
            "aether_listener_connections_evicted",
            "Connections a listener closed for its policy, by reason (handshake-timeout, first-byte-timeout, idle-timeout)",
            self.evicted.clone(),
        );
    }

    /// Creates every series of `listener` at zero (`handshake-timeout` only with
    /// [`ListenerMetrics::init_handshake`]: a plain listener has no handshake) and sets its cap
    /// gauge.
    pub(crate) fn init(&self, listener: ListenerKind, max_connections: usize) {
        let l = ListenerLabel { listener: listener.label() };
        let _ = self.connections.get_or_create(&l);
        self.max_connections.get_or_create(&l).set(i64::try_from(max_connections).unwrap_or(i64::MAX));
        let _ = self.refused.get_or_create(&l);
        let _ = self.over_share.get_or_create(&l);
        for reason in Eviction::ALL.into_iter().filter(|r| *r != Eviction::HandshakeTimeout) {
            let _ = self.evicted.get_or_create(&EvictionLabels { listener: listener.label(), reason: reason.label() });
        }
    }

    /// Creates the `handshake-timeout` series of a TLS `listener` at zero.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn init_handshake(&self, listener: ListenerKind) {
        let reason = Eviction::HandshakeTimeout.label();
        let _ = self.evicted.get_or_create(&EvictionLabels { listener: listener.label(), reason });
    }

    pub(crate) fn opened(&self, listener: ListenerKind) {
        self.connections.get_or_create(&ListenerLabel { listener: listener.label() }).inc();
    }

    pub(crate) fn closed(&self, listener: ListenerKind) {
        self.connections.get_or_create(&ListenerLabel { listener: listener.label() }).dec();
    }

    /// Counts one refusal; returns the listener's refusals so far.
    pub(crate) fn refused(&self, listener: ListenerKind) -> u64 {
        let c = self.refused.get_or_create(&ListenerLabel { listener: listener.label() });
        c.inc() + 1
    }

    /// Counts one refusal for a source's share (also a refusal); returns the listener's
    /// refusals so far.
    pub(crate) fn refused_over_share(&self, listener: ListenerKind) -> u64 {
        self.over_share.get_or_create(&ListenerLabel { listener: listener.label() }).inc();
        self.refused(listener)
    }

    pub(crate) fn evicted(&self, listener: ListenerKind, reason: Eviction) {
        self.evicted.get_or_create(&EvictionLabels { listener: listener.label(), reason: reason.label() }).inc();
    }

    /// Connections of `listener` open now.
    pub fn open(&self, listener: ListenerKind) -> i64 {
        self.connections.get_or_create(&ListenerLabel { listener: listener.label() }).get()
    }

    /// Refusals of `listener` so far.
    pub fn refusals(&self, listener: ListenerKind) -> u64 {
        self.refused.get_or_create(&ListenerLabel { listener: listener.label() }).get()
    }

    /// Refusals of `listener` for a source's share so far.
    pub fn over_share(&self, listener: ListenerKind) -> u64 {
        self.over_share.get_or_create(&ListenerLabel { listener: listener.label() }).get()
    }

    /// Evictions of `listener` for `reason` so far.
    pub fn evictions(&self, listener: ListenerKind, reason: Eviction) -> u64 {
        self.evicted.get_or_create(&EvictionLabels { listener: listener.label(), reason: reason.label() }).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_series_of_a_listener_at_zero_and_its_cap() {
        let m = ListenerMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.init(ListenerKind::Admin, 32);
        m.refused(ListenerKind::Admin);
        m.evicted(ListenerKind::Admin, Eviction::IdleTimeout);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for want in [
            "aether_listener_connections{listener=\"admin\"} 0",
            "aether_listener_max_connections{listener=\"admin\"} 32",
            "aether_listener_connections_refused_total{listener=\"admin\"} 1",
            "aether_listener_connections_over_source_share_total{listener=\"admin\"} 0",
            "aether_listener_connections_evicted_total{listener=\"admin\",reason=\"idle-timeout\"} 1",
            "aether_listener_connections_evicted_total{listener=\"admin\",reason=\"first-byte-timeout\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("reason=\"handshake-timeout\""), "a plain listener has no handshake:\n{text}");
        m.init_handshake(ListenerKind::Webhook);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("{listener=\"webhook\",reason=\"handshake-timeout\"} 0"), "{text}");
        assert!(!text.contains("listener=\"xds\""), "only initialised listeners appear:\n{text}");
    }
}
