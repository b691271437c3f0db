//! The caps against the process's open-files limit (`RLIMIT_NOFILE`, `ulimit -n`): every open
//! connection is a file descriptor, so the caps of a process's listeners plus what the process
//! itself keeps open must fit under its soft limit, or a flood of connections can still exhaust
//! descriptors (`EMFILE`) and starve the other listeners and the process's own files.
//!
//! [`fits`] is the pure rule; [`check`] reads the limit (getrlimit(2)) and logs the outcome at
//! start-up. A misfit is a warning, not a refusal to start: the caps still bound each listener.

use crate::policy::ConnectionPolicy;

/// Descriptors kept for the process itself: its listening sockets, the Kubernetes API client's
/// connections, the runtime's epoll and event fds, log and state files, the xDS/CRI sockets,
/// and one connection per listener being accepted and closed over the cap. The controller (with
/// its status writer) and the agent (with its watches) hold 16 each at rest (`ls /proc/<pid>/fd`,
/// tests/e2e/flood.rs); 64 leaves room for reconnects, certificate reloads and the CRI client.
pub const RESERVED_DESCRIPTORS: u64 = 64;

/// The listeners' caps do not fit under the open-files limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the listeners' caps ({detail}: {caps} connections) plus {reserve} descriptors for the process itself exceed \
     the open-files limit (RLIMIT_NOFILE soft limit {limit}): a flood of connections can still exhaust file \
     descriptors; lower the --*-max-connections flags or raise the limit (ulimit -n)"
)]
pub struct DoesNotFit {
    /// The sum of the caps.
    pub caps: u64,
    /// [`RESERVED_DESCRIPTORS`].
    pub reserve: u64,
    /// The soft limit.
    pub limit: u64,
    /// Each listener's cap, e.g. `webhook 256 + admin 32`.
    pub detail: String,
}

/// Whether `policies` fit under a soft open-files limit of `limit` (`None`: unlimited) with
/// [`RESERVED_DESCRIPTORS`] to spare. `Ok` holds the descriptors left over (`u64::MAX` when
/// unlimited).
///
/// # Errors
/// [`DoesNotFit`], naming each listener's cap.
pub fn fits(policies: &[ConnectionPolicy], limit: Option<u64>) -> Result<u64, DoesNotFit> {
    let caps: u64 = policies.iter().map(|p| p.max_connections as u64).sum();
    let Some(limit) = limit else {
        return Ok(u64::MAX);
    };
    let needed = caps + RESERVED_DESCRIPTORS;
    if needed <= limit {
        return Ok(limit - needed);
    }
    let detail =
        policies.iter().map(|p| format!("{} {}", p.listener, p.max_connections)).collect::<Vec<_>>().join(" + ");
    Err(DoesNotFit { caps, reserve: RESERVED_DESCRIPTORS, limit, detail })
}

/// The soft `RLIMIT_NOFILE` of this process (`None`: unlimited).
pub fn limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// [`fits`] against this process's limit, logged: a warning when the caps do not fit, else one
/// info line with the headroom.
///
/// # Errors
/// [`DoesNotFit`] (already logged).
pub fn check(policies: &[ConnectionPolicy]) -> Result<u64, DoesNotFit> {
    let limit = limit();
    match fits(policies, limit) {
        Ok(spare) => {
            let caps: u64 = policies.iter().map(|p| p.max_connections as u64).sum();
            tracing::info!(
                open_files_limit = limit.map_or_else(|| "unlimited".to_owned(), |l| l.to_string()),
                listener_caps = caps,
                reserved = RESERVED_DESCRIPTORS,
                "listener connection caps fit under the open-files limit"
            );
            Ok(spare)
        }
        Err(e) => {
            tracing::warn!("{e}");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ListenerKind;

    #[test]
    fn the_default_caps_fit_a_1024_limit_and_not_a_128_one_and_the_error_names_each_cap() {
        let controller = [ListenerKind::Webhook.default_policy(), ListenerKind::Admin.default_policy()];
        assert_eq!(fits(&controller, Some(1024)), Ok(1024 - 256 - 32 - RESERVED_DESCRIPTORS));
        assert_eq!(fits(&controller, None), Ok(u64::MAX));
        let e = fits(&controller, Some(128)).unwrap_err();
        assert_eq!((e.caps, e.limit), (288, 128));
        assert!(
            e.to_string().starts_with(
                "the listeners' caps (webhook 256 + admin 32: 288 connections) plus 64 descriptors for the process itself \
                 exceed the open-files limit (RLIMIT_NOFILE soft limit 128)"
            ),
            "{e}"
        );
        let agent = [ListenerKind::Admin.default_policy(), ListenerKind::Xds.default_policy()];
        assert_eq!(fits(&agent, Some(128)), Ok(128 - 40 - RESERVED_DESCRIPTORS));
    }

    #[test]
    fn exactly_full_fits() {
        let p = [ListenerKind::Admin.default_policy()];
        assert_eq!(fits(&p, Some(32 + RESERVED_DESCRIPTORS)), Ok(0));
        assert!(fits(&p, Some(32 + RESERVED_DESCRIPTORS - 1)).is_err());
    }
}
