//! [`RuntimeError`]: why a pod's network namespace could not be learned from the container
//! runtime, shared by the CRI client, the netns path rules and the lookup.

use std::time::Duration;

/// Why a pod's network namespace could not be learned from the runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// `--cri-endpoint` is not `unix:///<absolute path>`.
    #[error("--cri-endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The flag's value.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A netns dir flag is not an absolute, normal path.
    #[error("{flag} {dir:?}: {reason}")]
    Dir {
        /// `--netns-host-dir` or `--netns-proxy-dir`.
        flag: &'static str,
        /// The flag's value.
        dir: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The runtime's socket did not accept a connection.
    #[error("container runtime at {endpoint}: cannot connect: {detail}")]
    Connect {
        /// The CRI endpoint.
        endpoint: String,
        /// The connect error, with its causes.
        detail: String,
    },
    /// A CRI call did not answer within its timeout.
    #[error("container runtime at {endpoint}: {call} timed out after {after:?}")]
    Timeout {
        /// The CRI endpoint.
        endpoint: String,
        /// `ListPodSandbox`, `PodSandboxStatus` or `connect`.
        call: &'static str,
        /// The timeout that elapsed.
        after: Duration,
    },
    /// A CRI call failed.
    #[error("container runtime at {endpoint}: {call} failed: {code:?}: {detail}")]
    Call {
        /// The CRI endpoint.
        endpoint: String,
        /// `ListPodSandbox` or `PodSandboxStatus`.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message, with its causes.
        detail: String,
    },
    /// The sandbox's verbose info is not the shape this module reads (see the module docs).
    #[error("pod sandbox {sandbox}: verbose status: {detail}")]
    VerboseInfo {
        /// The sandbox ID.
        sandbox: String,
        /// What is missing or malformed.
        detail: String,
    },
    /// A netns path that is not a plain file directly inside `--netns-host-dir` (as the runtime
    /// or a CNI record reported it) or the proxy's netns dir (as the state dir replays it): it is
    /// not given to Envoy.
    #[error("netns path {path:?} refused: {rule}")]
    UnsafePath {
        /// The path as reported or replayed.
        path: String,
        /// The rule it breaks.
        rule: String,
    },
}

impl RuntimeError {
    /// A short, fixed label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            RuntimeError::Endpoint { .. } => "endpoint",
            RuntimeError::Dir { .. } => "dir",
            RuntimeError::Connect { .. } => "connect",
            RuntimeError::Timeout { .. } => "timeout",
            RuntimeError::Call { .. } => "call",
            RuntimeError::VerboseInfo { .. } => "verbose_info",
            RuntimeError::UnsafePath { .. } => "unsafe_path",
        }
    }

    /// Whether the runtime itself could not be reached (no connection, a connect timeout, or a
    /// call answered `UNAVAILABLE`, gRPC's code for a broken transport): every pod would fail
    /// alike, so lookups are paused to one probe ([`super::pod_netns`]).
    pub fn is_unreachable(&self) -> bool {
        match self {
            RuntimeError::Connect { .. } => true,
            RuntimeError::Timeout { call, .. } => *call == "connect",
            RuntimeError::Call { code, .. } => *code == tonic::Code::Unavailable,
            _ => false,
        }
    }
}
