//! Prometheus metrics of aether-controller, served as text on the admin port's `/metrics`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an admission request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `EndpointPolicy`, `other` (any other kind: a bounded label set), or `none` for a
    /// malformed or oversized request.
    pub kind: String,
    /// `allowed`, `denied`, `malformed` (400) or `too_large` (413).
    pub result: String,
}

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// `aether_admission_requests_total{kind,result}`.
    pub requests: Family<AdmissionLabels, Counter>,
    /// `aether_admission_duration_seconds`: time to decide one review, in seconds.
    pub duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<AdmissionLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "aether_admission_requests",
            "Admission requests answered, by kind and result",
            requests.clone(),
        );
        registry.register(
            "aether_admission_duration_seconds",
            "Time to decide one admission review, in seconds",
            duration.clone(),
        );
        Metrics { registry: Arc::new(registry), requests, duration }
    }
}

impl Metrics {
    /// Counts one answered request.
    pub fn count(&self, kind: &str, result: &str) {
        self.requests.get_or_create(&AdmissionLabels { kind: kind.to_owned(), result: result.to_owned() }).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
