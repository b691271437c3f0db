//! Prometheus metrics of aether-controller, served as text on the admin port's `/metrics`: the
//! fields of [`Metrics`], plus `aether_build_info{version,git_sha}` and the standard `process_*`
//! metrics (CPU seconds, resident and virtual memory, open and max fds, start time; read from
//! `/proc` at scrape time) of [`aether_process`].

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an admission request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `EndpointPolicy`, `other` (any other kind: a bounded label set), or `none` for a
    /// malformed or oversized request.
    pub kind: String,
    /// `allowed`, `denied`, `malformed` (400), `unsupported-envelope` (400: the review's
    /// `apiVersion` or `kind` is not `admission.k8s.io/v1` `AdmissionReview`) or `too-large` (413).
    pub result: String,
}

/// Labels of a status patch.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PatchLabels {
    /// `applied` or `failed`.
    pub result: String,
    /// The `Accepted` condition's reason written, as its kebab-case label
    /// ([`crate::status::Reason::label`]): `accepted`, `accepted-without-service`, `invalid` or
    /// `conflicted`.
    pub reason: String,
}

/// Labels of an admission warning.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WarningLabels {
    /// `conflict`, `accepted-without-service`, `near-budget` or `no-longer-valid`
    /// ([`crate::warnings::WarningKind::label`]).
    pub warning: String,
}

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// `aether_admission_requests_total{kind,result}`.
    pub requests: Family<AdmissionLabels, Counter>,
    /// `aether_admission_duration_seconds`: time to decide one review, in seconds.
    pub duration: Histogram,
    /// `aether_admission_warnings_total{warning}`: warnings sent with allowed reviews.
    pub warnings: Family<WarningLabels, Counter>,
    /// `aether_status_patches_total{result,reason}`: status writes of the status writer.
    pub status_patches: Family<PatchLabels, Counter>,
    /// `aether_status_leader`: 1 while this replica holds the status-writer Lease, else 0.
    pub leader: Gauge,
    /// `aether_listener_*{listener="webhook"|"admin"}`: open, refused and evicted connections
    /// ([`aether_serve_policy::ListenerMetrics`], docs/listeners.md).
    pub listeners: aether_serve_policy::ListenerMetrics,
    /// The status writer's watches and `aether_controller_watch_errors_total{resource,reason}`,
    /// `aether_controller_watches_failing` ([`crate::admin::watches`]).
    pub watches: crate::admin::watches::Watches,
    /// `aether_webhook_certificate_expiry_timestamp_seconds`: the `notAfter` of the serving leaf
    /// certificate, in seconds since the Unix epoch; 0 until the certificate is loaded. Set by
    /// [`Metrics::set_certificate`] at start-up and after every reload.
    pub certificate_expiry: Gauge,
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
        let warnings = Family::<WarningLabels, Counter>::default();
        registry.register(
            "aether_admission_warnings",
            "Warnings sent with allowed admission reviews, by warning",
            warnings.clone(),
        );
        let status_patches = Family::<PatchLabels, Counter>::default();
        registry.register(
            "aether_status_patches",
            "EndpointPolicy status writes (server-side apply of the Accepted condition), by result and reason",
            status_patches.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "aether_status_leader",
            "1 while this replica holds the status-writer Lease and writes EndpointPolicy status, else 0",
            leader.clone(),
        );
        let certificate_expiry = Gauge::default();
        registry.register(
            "aether_webhook_certificate_expiry_timestamp_seconds",
            "notAfter of the webhook's serving (leaf) certificate, in seconds since the Unix epoch; 0 until it is loaded",
            certificate_expiry.clone(),
        );
        let listeners = aether_serve_policy::ListenerMetrics::new();
        listeners.register(&mut registry);
        let watches = crate::admin::watches::Watches::default();
        watches.register_metrics(&mut registry);
        aether_process::register(&mut registry);
        Metrics {
            registry: Arc::new(registry),
            requests,
            duration,
            warnings,
            status_patches,
            leader,
            listeners,
            watches,
            certificate_expiry,
        }
    }
}

impl Metrics {
    /// Counts one answered request.
    pub fn count(&self, kind: &str, result: &str) {
        self.requests.get_or_create(&AdmissionLabels { kind: kind.to_owned(), result: result.to_owned() }).inc();
    }

    /// Counts one warning sent.
    pub fn count_warning(&self, warning: &str) {
        self.warnings.get_or_create(&WarningLabels { warning: warning.to_owned() }).inc();
    }

    /// Counts one status write.
    pub fn count_patch(&self, result: &str, reason: &str) {
        self.status_patches.get_or_create(&PatchLabels { result: result.to_owned(), reason: reason.to_owned() }).inc();
    }

    /// Sets `aether_webhook_certificate_expiry_timestamp_seconds` from the leaf certificate now
    /// served (DER). A certificate whose `notAfter` cannot be read (rustls served it, so this
    /// should not happen) is logged as a warning naming the reason, and the gauge keeps its value.
    pub fn set_certificate(&self, leaf_der: &[u8]) {
        match aether_webhook_certs::expiry::not_after_unix(leaf_der) {
            Ok(unix) => {
                self.certificate_expiry.set(unix);
                tracing::info!(not_after_unix = unix, "webhook serving certificate expiry");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the serving certificate's notAfter; aether_webhook_certificate_expiry_timestamp_seconds not updated")
            }
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Reason;
    use crate::warnings::WarningKind;

    fn is_kebab(s: &str) -> bool {
        !s.is_empty() && !s.starts_with('-') && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
    }

    #[test]
    fn warning_and_status_reason_labels_are_kebab_case_and_distinct() {
        let m = Metrics::default();
        let warnings = [
            WarningKind::Conflict,
            WarningKind::AcceptedWithoutService,
            WarningKind::NearBudget,
            WarningKind::NoLongerValid,
        ];
        for w in warnings {
            assert!(is_kebab(w.label()), "{w:?}: {:?}", w.label());
            m.count_warning(w.label());
        }
        let reasons = [Reason::Accepted, Reason::AcceptedWithoutService, Reason::Invalid, Reason::Conflicted];
        for r in reasons {
            assert!(is_kebab(r.label()), "{r:?}: {:?}", r.label());
            m.count_patch("applied", r.label());
        }
        let text = m.encode();
        assert!(text.contains("aether_admission_warnings_total{warning=\"accepted-without-service\"} 1"), "{text}");
        assert!(
            text.contains("aether_status_patches_total{result=\"applied\",reason=\"accepted-without-service\"} 1"),
            "{text}"
        );
        let series = text.lines().filter(|l| l.starts_with("aether_admission_warnings_total{")).count();
        assert_eq!(series, warnings.len(), "distinct warning labels: {text}");
        let series = text.lines().filter(|l| l.starts_with("aether_status_patches_total{")).count();
        assert_eq!(series, reasons.len(), "distinct reason labels: {text}");
    }

    #[test]
    fn the_build_and_the_process_are_exported() {
        let text = Metrics::default().encode();
        let build = format!(
            "aether_build_info{{version=\"{}\",git_sha=\"{}\"}} 1",
            aether_process::build_info::VERSION,
            aether_process::build_info::GIT_SHA
        );
        assert!(text.lines().any(|l| l == build), "missing {build:?} in\n{text}");
        let value = |name: &str| -> f64 {
            let prefix = format!("{name} ");
            let v = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
            v.unwrap_or_else(|| panic!("{name} missing in\n{text}")).parse().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_open_fds") > 0.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_start_time_seconds") > 1.6e9, "seconds since the epoch");
    }

    #[test]
    fn the_certificate_expiry_is_the_served_leaf_s_not_after() {
        let m = Metrics::default();
        let text = m.encode();
        assert!(text.contains("# TYPE aether_webhook_certificate_expiry_timestamp_seconds gauge"), "{text}");
        assert!(text.lines().any(|l| l == "aether_webhook_certificate_expiry_timestamp_seconds 0"), "{text}");
        // A real certificate with a known notAfter: 2031-05-04T03:02:01Z.
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 4) + std::time::Duration::from_secs(3 * 3600 + 2 * 60 + 1);
        let cert = params.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
        m.set_certificate(cert.der());
        let want = "aether_webhook_certificate_expiry_timestamp_seconds 1935630121";
        assert!(m.encode().lines().any(|l| l == want), "missing {want:?} in\n{}", m.encode());
        // Bytes that are no certificate leave the last value.
        m.set_certificate(b"junk");
        assert!(m.encode().lines().any(|l| l == want), "{}", m.encode());
    }

    #[test]
    fn the_watch_metrics_are_exported_with_every_reason_at_zero() {
        let m = Metrics::default();
        m.watches.register("", "services");
        let text = m.encode();
        assert!(text.contains("# TYPE aether_controller_watch_errors counter"), "{text}");
        assert!(text.contains("aether_controller_watch_errors_total{resource=\"services\",reason=\"forbidden\"} 0"));
        assert!(text.contains("aether_controller_watches_failing 0"), "{text}");
        let series = text.lines().filter(|l| l.starts_with("aether_controller_watch_errors_total{")).count();
        assert_eq!(series, crate::admin::watches::Reason::ALL.len(), "{text}");
    }
}
