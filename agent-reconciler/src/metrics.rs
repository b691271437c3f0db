//! The agent's Prometheus metrics, served on `/metrics` of the admin port ([`crate::admin`]).
//!
//! Every label has a bounded set of values (no pod or policy names):
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `aether_agent_pods` | gauge | `delivery` = `pipe`/`tcp`/`waiting`/`refused`, `source` = `annotation`/`policy`/`none` | managed pods on this node by effective delivery (`refused`: served no clusters, see the next rows) and by where their socket request came from |
//! | `aether_agent_tcp_fallbacks` | gauge | `reason` = a [`TcpReason::label`] that is not a cap (every one listed, also at zero) | pods that asked for a socket and are delivered over TCP, by cause |
//! | `aether_agent_pods_refused` | gauge | `reason` = `too-many-ports`/`node-cluster-cap` (both listed, also at zero) | pods served no clusters at all: over the per-pod port cap, or past `--max-clusters` ([`ClusterMetrics`]) |
//! | `aether_agent_clusters` | gauge | | `app_`/`health_` clusters the node's Envoy is given now (the last published snapshot) |
//! | `aether_agent_clusters_max` | gauge | | the cap on them, `--max-clusters` (-1: no cap) |
//! | `aether_agent_pod_events_total` | counter | `reason` = a [`TcpReason::label`] or `socket-delivered`, `result` = `created`/`failed`/`dropped` | pod Events the agent tried to publish |
//! | `aether_agent_socket_watch_events_total` | counter | `outcome` = `socket`/`other-name`/`overflow` (every one listed, also at zero) | inotify events from the watched pods' volume dirs: on the socket's name or the dir (its pod is re-checked), on another name (dropped after one comparison), or a full kernel queue (every watched pod re-checked); see [`crate::socket_watch`] |
//! | `aether_agent_policy_crd_installed` | gauge | | 1 served, 0 not, -1 not known yet |
//! | `aether_agent_policy_conflicts` | gauge | | services targeted by more than one valid EndpointPolicy |
//! | `aether_agent_watch_errors_total` | counter | `resource` = `pods`/`endpointpolicies`, `reason` = a [`WatchErrorReason::label`](aether_agent_core::status::WatchErrorReason::label) (every one listed, also at zero) | errors of the agent's watches (failed list, watch start or watch stream); see [`crate::watch::health`] |
//! | `aether_agent_watches_failing` | gauge | | watches failing now (every attempt failed since the outage began), grace period or not |
//! | `aether_xds_pushes_total`, `aether_xds_acks_total`, `aether_xds_nacks_total` | counter | `type` = `cluster`/`listener`/`extension-config` | see [`XdsMetrics`] |
//! | `aether_xds_last_nack_timestamp_seconds` | gauge (seconds since the epoch) | `type` | when Envoy last NACKed that type (0: never); Envoy's message is on the debug port's `/debug/envoy` and in the log, never a label ([`crate::xds::metrics::NackMetrics`]) |
//! | `aether_xds_change_to_ack_seconds` | histogram (seconds) | | from a watch event to Envoy's ACK of the version it produced |
//! | `aether_xds_connected_streams` | gauge | | ADS streams from Envoy open now (from the first request that names a node to the stream's end) |
//! | `aether_build_info` | info | `version`, `git_sha` | the build ([`aether_process`]) |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_start_time_seconds` | counter, gauges | | the process's resources, read from `/proc` at scrape time ([`aether_process::process`]) |
//!
//! The `aether_agent_*` gauges are set from the reconcile loop's [`Status`] at scrape time;
//! counters, the histogram and `aether_xds_connected_streams` move as things happen. Every label
//! value is kebab-case, except `aether_build_info`'s (a version, a commit).

use std::collections::BTreeMap;

use aether_agent_core::status::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::fallback::TcpReason;
use crate::watch::WatchMetrics;
use crate::xds::metrics::XdsMetrics;

/// The `delivery` label values of `aether_agent_pods`.
pub const DELIVERIES: [&str; 4] = ["pipe", "tcp", "waiting", "refused"];
/// The `source` label values of `aether_agent_pods`.
pub const SOURCES: [&str; 3] = ["annotation", "policy", "none"];

/// Labels of `aether_agent_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    /// `pipe`, `tcp`, `waiting` (TCP without an address yet) or `refused` (no clusters: a cap).
    pub delivery: &'static str,
    /// Where the pod's socket request came from: `annotation`, `policy`, or `none`.
    pub source: &'static str,
}

/// Labels of `aether_agent_tcp_fallbacks`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A [`TcpReason::label`], e.g. `path-too-long`.
    pub reason: &'static str,
}

/// Labels of `aether_agent_pod_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The Event's metric label ([`crate::pod_events::Notice::label`]): a [`TcpReason::label`],
    /// e.g. `path-too-long`, or `socket-delivered`.
    pub reason: &'static str,
    /// `created` (the API server accepted it), `failed` (it did not, after retries), `dropped`
    /// (the event queue was full).
    pub result: &'static str,
}

/// The node's cluster cap (docs/workload-requirements.md "Ports per pod and clusters per node"):
/// `aether_agent_clusters` (served now), `aether_agent_clusters_max` (`--max-clusters`) and
/// `aether_agent_pods_refused{reason}`. Set by the reconcile loop on every publish (give a clone
/// to the driver: [`crate::driver::Collaborators::cluster_metrics`]); clones share the values.
#[derive(Clone, Debug, Default)]
pub struct ClusterMetrics {
    served: Gauge,
    max: Gauge,
    refused: Family<ReasonLabel, Gauge>,
}

impl ClusterMetrics {
    /// Every series at zero (the cap at -1 until it is set).
    pub fn new() -> Self {
        let m = ClusterMetrics::default();
        m.max.set(-1);
        for cause in TcpReason::ALL.iter().filter(|c| c.serves_nothing()) {
            m.refused.get_or_create(&ReasonLabel { reason: cause.label() }).set(0);
        }
        m
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "aether_agent_clusters",
            "app_ and health_ clusters the node's Envoy is given now",
            self.served.clone(),
        );
        registry.register(
            "aether_agent_clusters_max",
            "The cap on those clusters (--max-clusters); -1 without a cap",
            self.max.clone(),
        );
        registry.register(
            "aether_agent_pods_refused",
            "Pods served no clusters at all: over the per-pod port cap (too-many-ports) or past --max-clusters (node-cluster-cap)",
            self.refused.clone(),
        );
    }

    /// Sets every value: `served` clusters in the published snapshot, the cap, and the pods
    /// refused by each cap reason (a reason left out is zero).
    pub fn set(&self, served: usize, max: Option<usize>, refused: &BTreeMap<TcpReason, usize>) {
        self.served.set(served as i64);
        self.max.set(max.map_or(-1, |m| m as i64));
        for cause in TcpReason::ALL.iter().filter(|c| c.serves_nothing()) {
            let n = refused.get(cause).copied().unwrap_or(0);
            self.refused.get_or_create(&ReasonLabel { reason: cause.label() }).set(n as i64);
        }
    }
}

/// The registry and every metric; share it in an `Arc`.
pub struct Metrics {
    registry: Registry,
    pods: Family<PodLabels, Gauge>,
    fallbacks: Family<ReasonLabel, Gauge>,
    crd: Gauge,
    conflicts: Gauge,
    /// `aether_agent_pod_events_total{reason,result}`.
    pub pod_events: Family<EventLabels, Counter>,
    /// The xDS server's metrics (give them to `XdsServer::with_metrics`, their clock to the
    /// driver and the encoder task).
    pub xds: XdsMetrics,
    /// The cluster-cap metrics (give a clone to the driver).
    pub clusters: ClusterMetrics,
    /// The watch metrics (give them to [`crate::watch::WatchBoard::new`]).
    pub watches: WatchMetrics,
    /// `aether_agent_socket_watch_events_total` (give a clone to
    /// [`crate::socket_watch::SocketWatch::spawn`]).
    pub socket_watch: crate::socket_watch::SocketWatchMetrics,
    /// `aether_listener_*{listener="admin"|"xds"}`: open, refused and evicted connections of the
    /// admin port and the xDS server (docs/listeners.md; give them to their `Gate`s).
    pub listeners: aether_serve_policy::ListenerMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let pods = Family::<PodLabels, Gauge>::default();
        let fallbacks = Family::<ReasonLabel, Gauge>::default();
        let crd = Gauge::default();
        let conflicts = Gauge::default();
        let pod_events = Family::<EventLabels, Counter>::default();
        let xds = XdsMetrics::new();
        registry.register(
            "aether_agent_pods",
            "Managed pods on this node by effective delivery (pipe, tcp, waiting) and socket source (annotation, policy, none)",
            pods.clone(),
        );
        registry.register(
            "aether_agent_tcp_fallbacks",
            "Pods that asked for a Unix socket and are delivered over TCP, by cause",
            fallbacks.clone(),
        );
        registry.register(
            "aether_agent_pod_events",
            "Pod Events the agent published (created), could not publish (failed) or dropped on a full queue",
            pod_events.clone(),
        );
        registry.register(
            "aether_agent_policy_crd_installed",
            "1 when the EndpointPolicy CRD is served, 0 when not, -1 before the API server answered",
            crd.clone(),
        );
        registry.register(
            "aether_agent_policy_conflicts",
            "Services targeted by more than one valid EndpointPolicy",
            conflicts.clone(),
        );
        xds.register(&mut registry);
        let clusters = ClusterMetrics::new();
        clusters.register(&mut registry);
        let watches = WatchMetrics::new();
        watches.register(&mut registry);
        let socket_watch = crate::socket_watch::SocketWatchMetrics::default();
        socket_watch.register(&mut registry);
        let listeners = aether_serve_policy::ListenerMetrics::new();
        listeners.register(&mut registry);
        aether_process::register(&mut registry);
        Metrics {
            registry,
            pods,
            fallbacks,
            crd,
            conflicts,
            pod_events,
            xds,
            watches,
            socket_watch,
            clusters,
            listeners,
        }
    }

    /// Counts one pod Event outcome; `label` is the Event's [`crate::pod_events::Notice::label`].
    pub fn pod_event(&self, label: &'static str, result: &'static str) {
        self.pod_events.get_or_create(&EventLabels { reason: label, result }).inc();
    }

    /// Sets the gauges from `status` and encodes everything as OpenMetrics text.
    pub fn encode(&self, status: &Status) -> String {
        for delivery in DELIVERIES {
            for source in SOURCES {
                let n = status.by_source.get(&(delivery, source)).copied().unwrap_or(0);
                self.pods.get_or_create(&PodLabels { delivery, source }).set(n as i64);
            }
        }
        // The caps are not fallbacks: their pods are counted by `aether_agent_pods_refused`.
        for cause in TcpReason::ALL.iter().filter(|c| !c.serves_nothing()) {
            let n = status.fallbacks.get(cause.label()).copied().unwrap_or(0);
            self.fallbacks.get_or_create(&ReasonLabel { reason: cause.label() }).set(n as i64);
        }
        self.crd.set(match status.crd_installed {
            Some(true) => 1,
            Some(false) => 0,
            None => -1,
        });
        self.conflicts.set(status.conflicts as i64);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_with_bounded_labels() {
        let m = Metrics::new();
        let mut status = Status::default();
        status.by_source.insert(("tcp", "annotation"), 2);
        status.fallbacks.insert("path-too-long", 2);
        m.pod_event("path-too-long", "created");
        crate::watch::register(&crate::watch::WatchBoard::new(m.watches.clone()), true);
        let text = m.encode(&status);
        for want in [
            "aether_agent_pods{delivery=\"tcp\",source=\"annotation\"} 2",
            "aether_agent_pods{delivery=\"pipe\",source=\"policy\"} 0",
            "aether_agent_tcp_fallbacks{reason=\"path-too-long\"} 2",
            "aether_agent_tcp_fallbacks{reason=\"symlink\"} 0",
            "aether_agent_pod_events_total{reason=\"path-too-long\",result=\"created\"} 1",
            "aether_agent_policy_crd_installed -1",
            "# TYPE aether_xds_pushes counter",
            "aether_xds_nacks_total{type=\"cluster\"} 0",
            "# TYPE aether_xds_change_to_ack_seconds histogram",
            "aether_xds_change_to_ack_seconds_count 0",
            "# TYPE aether_xds_connected_streams gauge",
            "aether_xds_connected_streams 0",
            "# TYPE aether_agent_watch_errors counter",
            "aether_agent_watch_errors_total{resource=\"pods\",reason=\"forbidden\"} 0",
            "# TYPE aether_agent_watches_failing gauge",
            "aether_agent_watches_failing 0",
            "aether_xds_last_nack_timestamp_seconds{type=\"cluster\"} 0.0",
            "# TYPE aether_build info",
            "# TYPE process_cpu_seconds counter",
            "# TYPE process_open_fds gauge",
            "# TYPE process_start_time_seconds gauge",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let build = format!(
            "aether_build_info{{version=\"{}\",git_sha=\"{}\"}} 1",
            aether_process::build_info::VERSION,
            aether_process::build_info::GIT_SHA
        );
        assert!(text.lines().any(|l| l == build), "missing {build:?} in\n{text}");
    }

    #[test]
    fn every_label_value_is_kebab_case() {
        let m = Metrics::new();
        let mut status = Status::default();
        status.by_source.insert(("waiting", "none"), 1);
        for cause in TcpReason::ALL {
            m.pod_event(cause.label(), "created");
        }
        m.pod_event(crate::pod_events::DELIVERED_LABEL, "dropped");
        crate::watch::register(&crate::watch::WatchBoard::new(m.watches.clone()), true);
        let text = m.encode(&status);
        assert!(text.contains("aether_agent_watch_errors_total{resource=\"endpointpolicies\",reason=\"not-found\"} 0"));
        let mut seen = 0;
        // aether_build_info's values are a version and a commit, not a vocabulary.
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("aether_build_info")) {
            let Some((_, labels)) = line.split_once('{') else { continue };
            let labels = labels.split_once('}').map_or(labels, |(l, _)| l);
            for pair in labels.split(',') {
                let (name, value) = pair.split_once('=').unwrap();
                let value = value.trim_matches('"');
                if name == "le" {
                    continue; // histogram bucket bounds are numbers
                }
                seen += 1;
                assert!(
                    !value.is_empty()
                        && !value.starts_with('-')
                        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                    "{name}={value:?} is not kebab-case in {line:?}"
                );
            }
        }
        assert!(seen > TcpReason::ALL.len() * 2, "{text}");
    }

    #[test]
    fn every_fallback_reason_is_exported_as_a_label_of_the_fallback_gauge() {
        let m = Metrics::new();
        let mut status = Status::default();
        for (i, cause) in TcpReason::ALL.iter().enumerate() {
            status.fallbacks.insert(cause.label(), i + 1);
        }
        let text = m.encode(&status);
        let exported: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("aether_agent_tcp_fallbacks{reason=\""))
            .filter_map(|l| l.split_once('"').map(|(label, _)| label))
            .collect();
        let fallbacks: Vec<(usize, &TcpReason)> =
            TcpReason::ALL.iter().enumerate().filter(|(_, c)| !c.serves_nothing()).collect();
        assert_eq!(exported.len(), fallbacks.len(), "one series per fallback reason, no other:\n{text}");
        for (i, cause) in fallbacks {
            let want = format!("aether_agent_tcp_fallbacks{{reason=\"{}\"}} {}", cause.label(), i + 1);
            assert!(text.lines().any(|l| l == want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn served_clusters_the_cap_and_the_refused_pods_are_exported_and_shared_by_clones() {
        let m = Metrics::new();
        let text = m.encode(&Status::default());
        for want in [
            "aether_agent_clusters 0",
            "aether_agent_clusters_max -1",
            "aether_agent_pods_refused{reason=\"too-many-ports\"} 0",
            "aether_agent_pods_refused{reason=\"node-cluster-cap\"} 0",
        ] {
            assert!(text.lines().any(|l| l == want), "missing {want:?} in\n{text}");
        }
        let driver_side = m.clusters.clone();
        driver_side.set(3_998, Some(4_000), &BTreeMap::from([(TcpReason::NodeClusterCap, 2)]));
        let text = m.encode(&Status::default());
        for want in [
            "aether_agent_clusters 3998",
            "aether_agent_clusters_max 4000",
            "aether_agent_pods_refused{reason=\"node-cluster-cap\"} 2",
            "aether_agent_pods_refused{reason=\"too-many-ports\"} 0",
        ] {
            assert!(text.lines().any(|l| l == want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("aether_agent_tcp_fallbacks{reason=\"node-cluster-cap\"}"), "a cap is not a fallback");
    }
}
