//! The node-wide settings of the proto builders ([`super::build`]): agent flags, the same for
//! every pod, never part of the model the driver publishes.

use std::time::Duration;

/// Default cap on concurrent connections per inbound listener (one pod port):
/// `--inbound-max-connections`, 4,096 (16,384 before 0.11.0). A fifth of the chart's global cap
/// (`proxy.overload.maxConnections`, 20,000), so one pod's clients take at most that share of the
/// node's connections, and 4,096 idle ones hold ~31 MiB of Envoy's heap (~7.7 KiB each,
/// docs/listeners.md, "Memory"). A pod serving more clients at once through one node raises it
/// (the chart's `agent.inbound.maxConnections`). A change re-renders every pod's inbound listener:
/// Envoy closes the replaced listener's TCP-relayed connections after its drain time, as a proxy
/// replacement does.
pub const DEFAULT_INBOUND_MAX_CONNECTIONS: u64 = 4_096;

/// Default idle timeout of inbound connections (`--inbound-idle-timeout-seconds`): 1 h, Envoy's
/// own default for the TCP relay, kept explicitly.
pub const DEFAULT_INBOUND_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Default cap on concurrent connections to the health gateway. Its callers are the node's
/// health prober(s) and operators (a handful of keep-alive connections); 1,024 leaves them ample
/// room while bounding what a local process that floods the socket can hold: measured on Envoy
/// 1.40, an open HTTP/1.1 keep-alive connection costs ~24 KiB of Envoy's RSS, so 1,024 of them
/// add ~24 MiB (the chart gives Envoy 512 MiB).
pub const DEFAULT_HEALTH_MAX_CONNECTIONS: u64 = 1_024;

/// Timing of active health checks (Envoy `HealthCheck` fields of the same names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthTiming {
    /// Time between two checks; also used as `no_traffic_interval` (whose Envoy default of 60 s
    /// would apply to health clusters, which never carry traffic).
    pub interval: Duration,
    /// Time to wait for a check's answer.
    pub timeout: Duration,
    /// Consecutive failures before a host is marked unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes before an unhealthy host is marked healthy again.
    pub healthy_threshold: u32,
    /// Envoy's `interval_jitter_percent`: each wait is `interval` plus a random 0 to this
    /// percent of it. Envoy runs every active health check on its main thread, which also applies
    /// xDS updates; clusters created by one CDS response check in lockstep, and without jitter
    /// their checks stay one burst per interval that delays any update arriving during it (at
    /// 10k pods a ~250 ms burst every 2 s: write → ACK p99 ~500 ms). A wide jitter spreads them
    /// over the interval within a few checks. It does not delay a cluster's first check
    /// (`initial_jitter` would, and Envoy holds a changed cluster warming until then).
    pub jitter_percent: u32,
}

impl Default for HealthTiming {
    /// 2 s interval plus up to 50 % jitter (a check every 2–3 s), 1 s timeout, unhealthy after 2
    /// failures, healthy after 1 success.
    fn default() -> Self {
        HealthTiming {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 2,
            healthy_threshold: 1,
            jitter_percent: 50,
        }
    }
}

/// Node-wide settings of the proto builders (agent flags, not per-pod data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// `connect_timeout` of every cluster.
    pub connect_timeout: Duration,
    /// Active health-check timing.
    pub health: HealthTiming,
    /// `--health-socket`: path of the health-gateway pipe listener; `None` = no listener (LDS
    /// then serves an empty set).
    pub health_socket: Option<String>,
    /// File mode of the health-gateway socket (e.g. `0o666`).
    pub health_socket_mode: u32,
    /// Cap on concurrent connections to the health gateway (Envoy's `connection_limit` network
    /// filter; see [`DEFAULT_HEALTH_MAX_CONNECTIONS`]).
    pub health_max_connections: u64,
    /// Cap on concurrent connections of each inbound listener (Envoy's `connection_limit`
    /// network filter: a connection past it is closed at once and counted in the filter's
    /// `limited_connections` stat).
    pub inbound_max_connections: u64,
    /// TCP proxy idle timeout of inbound connections: closed after this long with no bytes
    /// either way (Envoy's default is 1 h; the same value is kept, explicitly).
    pub inbound_idle_timeout: Duration,
}

impl Default for BuildOptions {
    /// 1 s connect timeout, default health timing, health socket `/run/aether/health.sock`
    /// with mode `0o666` capped at [`DEFAULT_HEALTH_MAX_CONNECTIONS`], inbound listeners capped at
    /// [`DEFAULT_INBOUND_MAX_CONNECTIONS`] with a 1 h idle timeout.
    fn default() -> Self {
        BuildOptions {
            connect_timeout: Duration::from_secs(1),
            health: HealthTiming::default(),
            health_socket: Some("/run/aether/health.sock".to_owned()),
            health_socket_mode: 0o666,
            health_max_connections: DEFAULT_HEALTH_MAX_CONNECTIONS,
            inbound_max_connections: DEFAULT_INBOUND_MAX_CONNECTIONS,
            inbound_idle_timeout: DEFAULT_INBOUND_IDLE_TIMEOUT,
        }
    }
}
