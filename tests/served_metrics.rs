//! The metric names both binaries serve, from their own registries: shared by
//! `docs_troubleshooting.rs` (every metric has a docs entry) and `alerts.rs` (every alert reads a
//! metric that exists). Included with `#[path]`; no control plane needed.

use std::collections::BTreeSet;

use aether_agent_reconciler::pod_events;
use aether_agent_reconciler::status::Status;
use aether_controller::status::Reason;
use aether_serve_policy::{Gate, ListenerKind};

/// The sample names a PromQL query uses for every metric family of an exposition: `<name>_total`
/// for a counter, `<name>_info` for an info metric, `<name>` otherwise (a histogram's `_bucket`,
/// `_sum` and `_count` are its family's).
pub fn metric_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| match kind.trim() {
            "counter" => format!("{name}_total"),
            "info" => format!("{name}_info"),
            _ => name.to_owned(),
        })
        .collect()
}

/// Every metric both binaries serve. A labelled family prints nothing until it has a series, so
/// this does what each binary does at start-up (build its listeners' gates, register its
/// watches) and counts one of each event-driven counter, as a running binary would.
pub fn code_metrics() -> BTreeSet<String> {
    let agent = aether_agent_reconciler::metrics::Metrics::new();
    for kind in [ListenerKind::Admin, ListenerKind::Xds] {
        let _ = Gate::new(kind.default_policy(), &agent.listeners);
    }
    aether_agent_reconciler::watch::register(
        &aether_agent_reconciler::watch::WatchBoard::new(agent.watches.clone()),
        true,
    );
    agent.pod_event(pod_events::DELIVERED_LABEL, "created");
    let controller = aether_controller::metrics::Metrics::default();
    for kind in [ListenerKind::Webhook, ListenerKind::Admin] {
        let _ = Gate::new(kind.default_policy(), &controller.listeners);
    }
    let _ = controller.watches.register("", "services");
    controller.count("EndpointPolicy", "allowed");
    controller.count_warning("conflict");
    controller.count_patch("applied", Reason::Accepted.label());
    let mut names = metric_names(&agent.encode(&Status::default()));
    names.extend(metric_names(&controller.encode()));
    names
}
