//! The node's configuration the fold depends on (`--kubelet-pods-dir` as [`Rules`],
//! `--uds-workloads`, `--pin-dir`, `--max-clusters`), fixed for the life of an index.

use aether_crds::Rules;
use aether_crds::udspath::{Budget, PodsDirError};

/// `--max-clusters` when not set: the most `app_`/`health_` clusters the agent gives the node's
/// Envoy (its static bootstrap clusters not counted). Chosen from `make bench` (section 5, "Envoy
/// memory per cluster", bench/src/proxy_memory.rs): Envoy 1.40 holds about
/// 62 KiB of RSS per cluster with 1-2 workers and 82 KiB with 8, over a 65 MiB base, so 2,000
/// clusters keep it under half the chart's 512 MiB limit (`proxy.resources.limits.memory`) up to
/// 8 workers, leaving the rest for heap growth under churn and for connection buffers. That is 1,000
/// one-port pods, or 110 pods (kubelet's default max) of 17 ports each. Raise it together with
/// that limit; docs/workload-requirements.md gives the figures.
pub const DEFAULT_MAX_CLUSTERS: usize = 2_000;

/// The node's configuration the fold depends on. Fixed for the life of an index: changing it
/// means building a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    uds_workloads: bool,
    rules: Rules,
    pin_dir: Option<String>,
    max_clusters: Option<usize>,
}

impl Settings {
    /// Settings for the kubelet pods dir *as the proxy sees it* (`--kubelet-pods-dir`) and the
    /// `--uds-workloads` switch: [`Settings::with_rules`] of [`Rules::new`]`(pods_dir)`.
    pub fn new(pods_dir: &str, uds_workloads: bool) -> Self {
        Settings::with_rules(Rules::new(pods_dir), uds_workloads)
    }

    /// Settings from the node's [`Rules`] (built once at start-up) and the `--uds-workloads`
    /// switch. Rules without a usable budget are kept as they are: every pod is then delivered over
    /// TCP with [`crate::TcpReason::BudgetConfig`] (docs/troubleshooting.md,
    /// "`UdsNoSocketBudget`"); the binary also reports it loudly at start-up.
    pub fn with_rules(rules: Rules, uds_workloads: bool) -> Self {
        Settings { uds_workloads, rules, pin_dir: None, max_clusters: None }
    }

    /// With a cap on the clusters the node's Envoy is given (`--max-clusters`): pods
    /// compete for it in the order of [`crate::admission`] and those past it are served no
    /// clusters ([`crate::TcpReason::NodeClusterCap`]). `None` (the default of
    /// [`Settings::new`], for tests, benches and the offline plan): no cap. The agent always
    /// sets one ([`DEFAULT_MAX_CLUSTERS`] unless told otherwise).
    pub fn with_max_clusters(mut self, max: Option<usize>) -> Self {
        self.max_clusters = max;
        self
    }

    /// The cap on served clusters, if any.
    pub fn max_clusters(&self) -> Option<usize> {
        self.max_clusters
    }

    /// With socket pinning (`--pin-dir`; docs/design-notes.md, "Agent"): Envoy dials
    /// `<pin_dir>/<uid>.sock` ([`crate::names::pin_path`]), on which the agent mounts the socket it
    /// verified, instead of the pod's own path.
    pub fn with_pin_dir(mut self, pin_dir: Option<String>) -> Self {
        self.pin_dir = pin_dir;
        self
    }

    /// The pin dir, when pinning is on.
    pub fn pin_dir(&self) -> Option<&str> {
        self.pin_dir.as_deref()
    }

    /// The rules policies and socket values are judged by.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Whether pipes may be rendered at all (`--uds-workloads`).
    pub fn uds_workloads(&self) -> bool {
        self.uds_workloads
    }

    /// The socket budget of the pods dir, or why there is none.
    ///
    /// # Errors
    /// The [`PodsDirError`] of [`Budget::new`] for the configured pods dir.
    pub fn budget(&self) -> Result<&Budget, &PodsDirError> {
        self.rules.budget()
    }
}
