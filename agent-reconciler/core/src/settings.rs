//! The node's configuration the fold depends on (`--kubelet-pods-dir` as [`Rules`],
//! `--uds-workloads`), fixed for the life of an index.

use aether_crds::Rules;
use aether_crds::udspath::{Budget, PodsDirError};

/// The node's configuration the fold depends on. Fixed for the life of an index: changing it
/// means building a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    uds_workloads: bool,
    rules: Rules,
    pin_dir: Option<String>,
}

impl Settings {
    /// Settings for the kubelet pods dir *as the proxy sees it* (`--kubelet-pods-dir`) and the
    /// `--uds-workloads` switch: [`Settings::with_rules`] of [`Rules::new`]`(pods_dir)`.
    pub fn new(pods_dir: &str, uds_workloads: bool) -> Self {
        Settings::with_rules(Rules::new(pods_dir), uds_workloads)
    }

    /// Settings from the node's [`Rules`] (built once at start-up) and the `--uds-workloads`
    /// switch. Rules without a usable budget are kept as they are: every pod is then delivered
    /// over TCP with [`TcpReason::BudgetConfig`] (field report F02); the binary also reports it
    /// loudly at start-up.
    pub fn with_rules(rules: Rules, uds_workloads: bool) -> Self {
        Settings { uds_workloads, rules, pin_dir: None }
    }

    /// With socket pinning (`--pin-dir`, issue 13): Envoy dials `<pin_dir>/<uid>.sock`
    /// ([`crate::names::pin_path`]), on which the agent mounts the socket it verified, instead of
    /// the pod's own path.
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
