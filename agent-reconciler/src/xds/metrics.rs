//! The xDS server's Prometheus metrics ([`XdsMetrics`]) and the [`ChangeClock`] behind its
//! change-to-ACK histogram.
//!
//! Counted: responses sent, ACKs and NACKs per resource type ([`type_label`]: CDS, LDS, ECDS),
//! resources and bytes sent per type and stream mode (state of the world or delta), the streams
//! open now, and the time from a change (stamped on a [`ChangeClock`] by whoever publishes) to
//! Envoy's ACK of the version that change produced.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::resource_set::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL, LISTENER_TYPE_URL, ResourceSet};

/// The metric label of a type URL: `cluster`, `listener`, `extension-config`, or `other`
/// (bounded).
pub fn type_label(type_url: &str) -> &'static str {
    match type_url {
        CLUSTER_TYPE_URL => "cluster",
        LISTENER_TYPE_URL => "listener",
        EXTENSION_CONFIG_TYPE_URL => "extension-config",
        _ => "other",
    }
}

/// The type URLs the server serves, in push order (each has its counters from the start).
const SERVED: [&str; 3] = [CLUSTER_TYPE_URL, LISTENER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL];

/// Label set `{type}` of the xDS counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// `cluster` (CDS), `listener` (LDS), `extension-config` (ECDS: the health gateway's
    /// checks), `other`.
    pub r#type: &'static str,
}

/// The `mode` label of an xDS stream: state of the world (`StreamAggregatedResources`).
pub const MODE_SOTW: &str = "sotw";
/// The `mode` label of an xDS stream: incremental (`DeltaAggregatedResources`).
pub const MODE_DELTA: &str = "delta";

/// Label set `{type, mode}` of the volume counters ([`XdsMetrics::resources_sent`],
/// [`XdsMetrics::bytes_sent`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeModeLabel {
    /// As [`TypeLabel::type`].
    pub r#type: &'static str,
    /// [`MODE_SOTW`] or [`MODE_DELTA`].
    pub mode: &'static str,
}

/// What `XdsMetrics::inc` counts one event of a resource type on.
pub(super) trait PerType {
    /// One more event of the type `label`.
    fn count(&self, label: TypeLabel);
}

impl PerType for Family<TypeLabel, Counter> {
    fn count(&self, label: TypeLabel) {
        self.get_or_create(&label).inc();
    }
}

/// The NACK metrics, moved together by one `XdsMetrics::inc` (state-of-the-world and delta
/// streams alike): `aether_xds_nacks_total{type}` and
/// `aether_xds_last_nack_timestamp_seconds{type}` (seconds since the Unix epoch; 0 until the
/// first NACK of that type). Envoy's message is not a label (unbounded text): the debug port's
/// `/debug/envoy` and the agent's WARN log show it. Alert on, e.g., `increase(aether_xds_nacks_total[10m]) > 0` or
/// `time() - aether_xds_last_nack_timestamp_seconds < 600`.
#[derive(Clone, Debug, Default)]
pub struct NackMetrics {
    /// `aether_xds_nacks_total{type}`: NACKs received (a request with `error_detail`).
    pub total: Family<TypeLabel, Counter>,
    /// `aether_xds_last_nack_timestamp_seconds{type}`: when the last NACK arrived.
    pub last: Family<TypeLabel, Gauge<f64, AtomicU64>>,
}

impl PerType for NackMetrics {
    fn count(&self, label: TypeLabel) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.total.get_or_create(&label).inc();
        self.last.get_or_create(&label).set(now);
    }
}

/// Carries the time of the earliest change not yet acknowledged from the publisher (the
/// reconcile loop) through the debounced encoder task to the ACK of the version it produced.
///
/// - [`ChangeClock::changed`]: a publication differs; keeps the earliest such instant
///   until the encoder task takes it.
/// - the encoder task ([`spawn_encoder_with_clock`]) stamps each type whose version changed with
///   that instant, or with the instant already pending on that type if it is earlier (a version
///   superseded before its ACK hands its start on: Envoy may never ACK it).
/// - [`ChangeClock::acked`]: the first ACK of a stamped version ends it.
///
/// Memory is bounded: one pending instant, and one stamped version per type URL.
///
/// [`spawn_encoder_with_clock`]: super::publish::spawn_encoder_with_clock
#[derive(Clone, Debug, Default)]
pub struct ChangeClock {
    state: Arc<Mutex<ClockState>>,
}

#[derive(Debug, Default)]
struct ClockState {
    unrendered: Option<Instant>,
    stamped: HashMap<String, (String, Instant)>,
}

impl ChangeClock {
    /// A clock with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Something that differs from the last publication was published; `at` is when the change that
    /// caused it was seen (a watch event's arrival). The earliest unrendered instant is kept.
    pub fn changed(&self, at: Instant) {
        let mut s = self.lock();
        s.unrendered = Some(s.unrendered.map_or(at, |t| t.min(at)));
    }

    /// The encoder task published new resources: stamp every type whose version differs from
    /// `previous` with the earliest pending change. Types with an unchanged version keep what
    /// they had; a change that produced no new version is dropped.
    pub fn rendered(&self, previous: &ResourceSet, next: &ResourceSet) {
        let mut s = self.lock();
        let since = s.unrendered.take();
        for type_url in next.type_urls() {
            let (Some(new), old) = (next.get(type_url), previous.get(type_url)) else { continue };
            if old.is_some_and(|o| o.version == new.version) {
                continue;
            }
            let carried = s.stamped.get(type_url).map(|(_, t)| *t);
            let start = match (since, carried) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(start) = start {
                s.stamped.insert(type_url.to_owned(), (new.version.clone(), start));
            }
        }
    }

    /// Forgets an unrendered change without stamping anything (the initial render: its versions
    /// are what a restarted agent serves anyway, not the effect of a change).
    pub fn discard_unrendered(&self) {
        self.lock().unrendered = None;
    }

    /// Envoy ACKed `version` of `type_url`: the time since the change that produced it, once
    /// per stamped version (later ACKs of it, from other streams or re-subscriptions, get `None`).
    pub fn acked(&self, type_url: &str, version: &str) -> Option<Duration> {
        let mut s = self.lock();
        match s.stamped.get(type_url) {
            Some((v, at)) if v == version => {
                let elapsed = at.elapsed();
                s.stamped.remove(type_url);
                Some(elapsed)
            }
            _ => None,
        }
    }

    /// Number of versions waiting for their ACK (at most one per type URL).
    pub fn pending(&self) -> usize {
        self.lock().stamped.len()
    }
}

/// The xDS server's Prometheus metrics; cheap to clone (the metrics are shared).
#[derive(Clone, Debug)]
pub struct XdsMetrics {
    /// `aether_xds_pushes_total{type}`: DiscoveryResponses sent (one per subscription plus one
    /// per version change, per stream).
    pub pushes: Family<TypeLabel, Counter>,
    /// `aether_xds_acks_total{type}`: ACKs received (a request acknowledging the last response).
    pub acks: Family<TypeLabel, Counter>,
    /// `aether_xds_nacks_total{type}` and `aether_xds_last_nack_timestamp_seconds{type}`
    /// ([`NackMetrics`]).
    pub nacks: NackMetrics,
    /// `aether_xds_change_to_ack_seconds`: seconds from the watch event whose effect produced a
    /// new resource version to Envoy's first ACK of that version (see [`ChangeClock`]).
    pub change_to_ack: Histogram,
    /// `aether_xds_connected_streams`: ADS streams open now, all nodes together (a stream counts
    /// from its first request that carries a node until it ends).
    pub connected: Gauge,
    /// `aether_xds_resources_sent_total{type,mode}`: resources carried by the responses sent
    /// (state of the world: the whole set per response; delta: the added or changed ones; the
    /// names a delta response removes are not counted).
    pub resources_sent: Family<TypeModeLabel, Counter>,
    /// `aether_xds_bytes_sent_total{type,mode}`: encoded size of the responses sent, in bytes
    /// (the protobuf message, without gRPC framing).
    pub bytes_sent: Family<TypeModeLabel, Counter>,
    /// The clock the publisher, the encoder task and the server share.
    pub clock: ChangeClock,
}

impl Default for XdsMetrics {
    fn default() -> Self {
        XdsMetrics {
            pushes: Family::default(),
            acks: Family::default(),
            nacks: NackMetrics::default(),
            // 5 ms .. ~41 s: a debounce (20 ms) plus Envoy applying a config is tens of ms.
            change_to_ack: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            connected: Gauge::default(),
            resources_sent: Family::default(),
            bytes_sent: Family::default(),
            clock: ChangeClock::new(),
        }
    }
}

impl XdsMetrics {
    /// Fresh metrics with their own clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the metrics (names in the field docs; counters get `_total` on encoding). The
    /// counters of every served type exist from the start, at zero.
    pub fn register(&self, registry: &mut Registry) {
        for type_url in SERVED {
            let label = TypeLabel { r#type: type_label(type_url) };
            self.nacks.last.get_or_create(&label).set(0.0);
            for family in [&self.pushes, &self.acks, &self.nacks.total] {
                family.get_or_create(&label).inc_by(0);
            }
        }
        registry.register("aether_xds_pushes", "xDS responses sent to Envoy, by resource type", self.pushes.clone());
        registry.register("aether_xds_acks", "xDS ACKs received from Envoy, by resource type", self.acks.clone());
        registry.register(
            "aether_xds_nacks",
            "xDS NACKs received from Envoy, by resource type",
            self.nacks.total.clone(),
        );
        registry.register(
            "aether_xds_last_nack_timestamp_seconds",
            "When Envoy last NACKed an xDS response of each resource type, in seconds since the Unix epoch (0: never)",
            self.nacks.last.clone(),
        );
        registry.register(
            "aether_xds_change_to_ack_seconds",
            "Seconds from a pod or policy change to Envoy's ACK of the xDS version it produced",
            self.change_to_ack.clone(),
        );
        registry.register(
            "aether_xds_connected_streams",
            "ADS streams from Envoy open now (counted from the first request that names a node)",
            self.connected.clone(),
        );
        for type_url in SERVED {
            for mode in [MODE_SOTW, MODE_DELTA] {
                let label = TypeModeLabel { r#type: type_label(type_url), mode };
                self.resources_sent.get_or_create(&label).inc_by(0);
                self.bytes_sent.get_or_create(&label).inc_by(0);
            }
        }
        registry.register(
            "aether_xds_resources_sent",
            "Resources carried by the xDS responses sent to Envoy, by resource type and stream mode (sotw, delta)",
            self.resources_sent.clone(),
        );
        registry.register(
            "aether_xds_bytes_sent",
            "Encoded bytes of the xDS responses sent to Envoy, by resource type and stream mode (sotw, delta)",
            self.bytes_sent.clone(),
        );
    }

    pub(super) fn inc<F: PerType>(family: &F, type_url: &str) {
        family.count(TypeLabel { r#type: type_label(type_url) });
    }

    /// Counts one response of `type_url` sent on a stream of `mode` ([`MODE_SOTW`] or
    /// [`MODE_DELTA`]): `resources` resources, `bytes` encoded bytes.
    pub(super) fn sent(&self, type_url: &str, mode: &'static str, resources: u64, bytes: u64) {
        let label = TypeModeLabel { r#type: type_label(type_url), mode };
        self.resources_sent.get_or_create(&label).inc_by(resources);
        self.bytes_sent.get_or_create(&label).inc_by(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(cds: &str, lds: &str) -> ResourceSet {
        let mut r = ResourceSet::default();
        r.clusters.version = cds.to_owned();
        r.listeners.version = lds.to_owned();
        r
    }

    #[test]
    fn every_served_type_has_its_counters_from_the_start_under_a_bounded_label() {
        let m = XdsMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for label in ["cluster", "listener", "extension-config"] {
            for name in ["pushes", "acks", "nacks"] {
                let line = format!("aether_xds_{name}_total{{type=\"{label}\"}} 0");
                assert!(text.contains(&line), "{line} missing in:\n{text}");
            }
            for name in ["resources_sent", "bytes_sent"] {
                for mode in [MODE_SOTW, MODE_DELTA] {
                    let line = format!("aether_xds_{name}_total{{type=\"{label}\",mode=\"{mode}\"}} 0");
                    assert!(text.contains(&line), "{line} missing in:\n{text}");
                }
            }
        }
        assert_eq!(type_label(EXTENSION_CONFIG_TYPE_URL), "extension-config");
        assert_eq!(type_label("type.googleapis.com/envoy.config.route.v3.RouteConfiguration"), "other");
    }

    #[test]
    fn a_nack_counts_and_stamps_its_type_only() {
        let m = XdsMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let encode = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
            text
        };
        let text = encode(&registry);
        for label in ["cluster", "listener", "extension-config"] {
            let line = format!("aether_xds_last_nack_timestamp_seconds{{type=\"{label}\"}} 0.0");
            assert!(text.lines().any(|l| l == line), "{line} missing in:\n{text}");
        }
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        XdsMetrics::inc(&m.nacks, LISTENER_TYPE_URL);
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        let text = encode(&registry);
        assert!(text.contains("aether_xds_nacks_total{type=\"listener\"} 1"), "{text}");
        assert!(text.contains("aether_xds_nacks_total{type=\"cluster\"} 0"), "{text}");
        assert!(text.contains("aether_xds_last_nack_timestamp_seconds{type=\"cluster\"} 0.0"), "{text}");
        let stamped: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("aether_xds_last_nack_timestamp_seconds{type=\"listener\"} "))
            .expect("the listener series")
            .parse()
            .unwrap();
        assert!((before..=after).contains(&stamped), "{before} <= {stamped} <= {after}");
        assert_eq!(text.matches("aether_xds_last_nack_timestamp_seconds{").count(), 3, "one series per type");
    }

    #[test]
    fn the_clock_measures_from_the_earliest_unacknowledged_change_once_per_version() {
        let clock = ChangeClock::new();
        let t0 = Instant::now() - Duration::from_secs(3);
        clock.changed(t0 + Duration::from_secs(1));
        clock.changed(t0);
        // Only CDS changed: LDS gets no stamp, and the unrendered instant is consumed.
        clock.rendered(&resources("c1", "l1"), &resources("c2", "l1"));
        assert_eq!(clock.pending(), 1);
        assert_eq!(clock.acked(LISTENER_TYPE_URL, "l1"), None);
        // c2 is superseded by c3 before its ACK: c3 inherits the earlier start.
        clock.changed(Instant::now());
        clock.rendered(&resources("c2", "l1"), &resources("c3", "l1"));
        assert_eq!(clock.acked(CLUSTER_TYPE_URL, "c2"), None, "an ACK of a superseded version is not observed");
        let took = clock.acked(CLUSTER_TYPE_URL, "c3").expect("c3 was stamped");
        assert!(took >= Duration::from_secs(3), "{took:?}");
        assert_eq!(clock.acked(CLUSTER_TYPE_URL, "c3"), None, "observed once per version");
        assert_eq!(clock.pending(), 0);
        // A change that renders to the same versions leaves nothing behind.
        clock.changed(Instant::now());
        clock.rendered(&resources("c3", "l1"), &resources("c3", "l1"));
        clock.rendered(&resources("c3", "l1"), &resources("c4", "l1"));
        assert_eq!(clock.pending(), 0);
    }
}
