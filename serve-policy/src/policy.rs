//! What a listener allows ([`ConnectionPolicy`]), its production defaults per [`ListenerKind`],
//! and the pure rule deciding when a connection is evicted ([`Liveness::deadline`]).
//!
//! The written policy, one row per listener with the reasons for each number, is
//! `docs/listeners.md`.

use std::time::Duration;

use tokio::time::Instant;

/// The listeners aether's binaries open. Its [`label`](ListenerKind::label) is the `listener`
/// label of the `aether_listener_*` metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListenerKind {
    /// The controller's admission webhook (HTTPS, kube-apiserver calls it).
    Webhook,
    /// The plain-HTTP admin port of the controller and of the agent (`/healthz`, `/readyz`,
    /// `/metrics`: kubelet probes and Prometheus).
    Admin,
    /// The agent's ADS gRPC server (the node's Envoy holds one long-lived HTTP/2 connection).
    Xds,
    /// The pod-local probe socket of both binaries (`--probe-socket`, a Unix socket in an
    /// emptyDir): the kubelet's exec probes (`<binary> probe`) ask `/healthz` and `/readyz`
    /// there, out of reach of the clients that can fill the admin port ([`crate::probe`]).
    Probe,
}

impl ListenerKind {
    /// Every kind, in the order of `docs/listeners.md`.
    pub const ALL: [ListenerKind; 4] =
        [ListenerKind::Webhook, ListenerKind::Admin, ListenerKind::Xds, ListenerKind::Probe];

    /// The metric label: `webhook`, `admin`, `xds` or `probe`.
    pub fn label(self) -> &'static str {
        match self {
            ListenerKind::Webhook => "webhook",
            ListenerKind::Admin => "admin",
            ListenerKind::Xds => "xds",
            ListenerKind::Probe => "probe",
        }
    }

    /// The production default of this listener (the constants below; `docs/listeners.md`).
    pub fn default_policy(self) -> ConnectionPolicy {
        match self {
            ListenerKind::Webhook => ConnectionPolicy {
                listener: self,
                max_connections: WEBHOOK_MAX_CONNECTIONS,
                max_connections_per_source: None,
                first_byte_timeout: WEBHOOK_HANDSHAKE_TIMEOUT,
                quiet: Quiet::IdleTimeout(WEBHOOK_IDLE_TIMEOUT),
            },
            ListenerKind::Admin => ConnectionPolicy {
                listener: self,
                max_connections: ADMIN_MAX_CONNECTIONS,
                max_connections_per_source: Some(ADMIN_MAX_CONNECTIONS_PER_SOURCE),
                first_byte_timeout: ADMIN_FIRST_BYTE_TIMEOUT,
                quiet: Quiet::IdleTimeout(ADMIN_IDLE_TIMEOUT),
            },
            ListenerKind::Xds => ConnectionPolicy {
                listener: self,
                max_connections: XDS_MAX_CONNECTIONS,
                max_connections_per_source: None,
                first_byte_timeout: XDS_FIRST_BYTE_TIMEOUT,
                quiet: Quiet::KeepAlive(KeepAlive { interval: XDS_KEEPALIVE_INTERVAL, timeout: XDS_KEEPALIVE_TIMEOUT }),
            },
            ListenerKind::Probe => ConnectionPolicy {
                listener: self,
                max_connections: PROBE_MAX_CONNECTIONS,
                max_connections_per_source: None,
                first_byte_timeout: PROBE_FIRST_BYTE_TIMEOUT,
                quiet: Quiet::IdleTimeout(PROBE_IDLE_TIMEOUT),
            },
        }
    }
}

impl std::fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Webhook: most connections open at once. kube-apiserver multiplexes reviews over a few
/// HTTP/2 connections per API server replica; 256 leaves room for several replicas (and a
/// rollout's overlap) and stays well below a typical `ulimit -n` of 1024.
pub const WEBHOOK_MAX_CONNECTIONS: usize = 256;
/// Webhook: from accept to a finished TLS handshake and the first request byte. kube-apiserver
/// writes its review right after the handshake; 10 s is axum-server's own handshake default and
/// the API server's default webhook `timeoutSeconds`.
pub const WEBHOOK_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Webhook: a connection with no byte in either direction for this long is closed. Longer than
/// the 90 s `IdleConnTimeout` client-go gives the API server's transport, so the client closes
/// an idle keep-alive connection first (no request races our close), and longer than the
/// webhook's 15 s request timeout (`webhook::REQUEST_TIMEOUT` in the controller), so no request in flight is cut.
pub const WEBHOOK_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Admin port: most connections open at once. Its users are one or two Prometheus scrapers,
/// `kubectl aether why`, and the kubelet's probes where they are httpGet probes (the chart's
/// are exec probes over the probe socket, [`crate::probe`]).
pub const ADMIN_MAX_CONNECTIONS: usize = 32;
/// Admin port: most connections from one source address at once (its share of
/// [`ADMIN_MAX_CONNECTIONS`]). A scraper holds one or two, so one client holding its share
/// leaves three quarters of the port to the others. The kubelet's own source is shared with
/// every process on the host network, so the probes cannot count on it: they go through the
/// probe socket ([`crate::probe`]).
pub const ADMIN_MAX_CONNECTIONS_PER_SOURCE: usize = 8;
/// Admin port: from accept to the first request byte. Probes and scrapers send their request
/// at once; a probe's own timeout is 1 s by default.
pub const ADMIN_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin port: a connection with no byte in either direction for this long is closed (longer
/// than a 60 s scrape interval, so a scraper's keep-alive connection survives between scrapes).
pub const ADMIN_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// xDS: most connections open at once. Only the node's Envoy connects (one ADS connection; two
/// for a moment during an Envoy hot restart), plus room for a debugging client.
pub const XDS_MAX_CONNECTIONS: usize = 8;
/// xDS: from accept to the first byte. Envoy's HTTP/2 client writes the connection preface at
/// once.
pub const XDS_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(5);
/// xDS: HTTP/2 PING interval on a connection (the ADS stream is legitimately quiet between
/// pushes, so it gets a keepalive, not an idle timeout).
pub const XDS_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// xDS: a PING unanswered for this long closes the connection (a dead or hung peer).
pub const XDS_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Probe socket: most connections open at once. Its only clients are the kubelet's exec probes
/// (one liveness and one readiness probe, each a new connection that closes after its answer),
/// run inside the container; 4 leaves room for a slow one overlapping the next.
pub const PROBE_MAX_CONNECTIONS: usize = 4;
/// Probe socket: from accept to the first request byte (the probe writes its request at once).
pub const PROBE_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);
/// Probe socket: a connection with no byte either way for this long is closed (a probe closes
/// its connection after one answer; this only bounds a hung one).
pub const PROBE_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one listener allows. Build it from [`ListenerKind::default_policy`] or from the flags
/// ([`crate::cli`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionPolicy {
    /// Which listener (the metrics' `listener` label).
    pub listener: ListenerKind,
    /// Most connections open at once (at least 1). One more is accepted and closed at once,
    /// and counted as refused.
    pub max_connections: usize,
    /// Most connections from one source IP address at once (IPv4-mapped IPv6 addresses count as
    /// their IPv4 address); one more from that source is accepted and closed at once, and
    /// counted as refused and as over its share. `None`: no share (the webhook, whose one client,
    /// the API server, may arrive from one address through konnectivity or NAT; the xDS port,
    /// whose one client is the node's Envoy). Connections without an IP address (Unix sockets)
    /// have no share.
    pub max_connections_per_source: Option<usize>,
    /// From accept to the first byte the client sends; on the TLS webhook also the bound on the
    /// TLS handshake (the handshake and the first request byte must both arrive within it).
    pub first_byte_timeout: Duration,
    /// What keeps a connection that has spoken from being held forever.
    pub quiet: Quiet,
}

/// What happens to a connection after its first byte, while nothing is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quiet {
    /// Request/response ports: closed after this long with no byte in either direction, or with
    /// no request in flight when the connection's requests are counted
    /// ([`crate::CountRequests`]): an HTTP/2 PING, or any frame outside a stream, does not keep
    /// a connection open. The longest request must be shorter.
    IdleTimeout(Duration),
    /// Streaming ports (xDS): never closed for being quiet; HTTP/2 PINGs find a dead peer.
    KeepAlive(KeepAlive),
}

/// HTTP/2 keepalive of a streaming port (given to tonic's server builder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive {
    /// Time between PINGs on a connection.
    pub interval: Duration,
    /// A PING unanswered for this long closes the connection.
    pub timeout: Duration,
}

impl ConnectionPolicy {
    /// The idle timeout, if this is a request/response listener.
    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.quiet {
            Quiet::IdleTimeout(d) => Some(d),
            Quiet::KeepAlive(_) => None,
        }
    }

    /// The HTTP/2 keepalive, if this is a streaming listener.
    pub fn keepalive(&self) -> Option<KeepAlive> {
        match self.quiet {
            Quiet::IdleTimeout(_) => None,
            Quiet::KeepAlive(k) => Some(k),
        }
    }
}

/// Why a connection was closed by its listener: the `reason` label of
/// `aether_listener_connections_evicted_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Eviction {
    /// The TLS handshake did not finish within the first-byte timeout (webhook only).
    HandshakeTimeout,
    /// No byte from the client within the first-byte timeout of accept.
    FirstByteTimeout,
    /// No byte in either direction, or no request in flight, for the idle timeout
    /// (request/response listeners only).
    IdleTimeout,
}

impl Eviction {
    /// Every reason.
    pub const ALL: [Eviction; 3] = [Eviction::HandshakeTimeout, Eviction::FirstByteTimeout, Eviction::IdleTimeout];

    /// The metric label: `handshake-timeout`, `first-byte-timeout` or `idle-timeout`.
    pub fn label(self) -> &'static str {
        match self {
            Eviction::HandshakeTimeout => "handshake-timeout",
            Eviction::FirstByteTimeout => "first-byte-timeout",
            Eviction::IdleTimeout => "idle-timeout",
        }
    }
}

/// What a connection's requests have done: how many are in flight now, and when the last one
/// ended (its response head was ready). Pure data for [`crate::Liveness::deadline`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestsState {
    /// Requests whose response is not ready yet.
    pub in_flight: usize,
    /// When the last request ended; `None` before the first.
    pub last_end: Option<Instant>,
}

/// What a connection has done so far: when it was accepted, when the client sent its first
/// byte, and when a byte last moved in either direction. Pure: the caller passes the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    accepted: Instant,
    heard: bool,
    first_heard: Instant,
    last_io: Instant,
}

impl Liveness {
    /// A connection accepted at `accepted` that has sent nothing yet.
    pub fn new(accepted: Instant) -> Self {
        Liveness { accepted, heard: false, first_heard: accepted, last_io: accepted }
    }

    /// `n` bytes were read from the client at `now` (0: nothing, e.g. end of stream).
    pub fn read(&mut self, now: Instant, n: usize) {
        if n > 0 {
            if !self.heard {
                self.first_heard = now;
            }
            self.heard = true;
            self.last_io = now;
        }
    }

    /// `n` bytes were written to the client at `now`. Writing does not count as the client
    /// speaking, but it is activity for the idle timeout.
    pub fn wrote(&mut self, now: Instant, n: usize) {
        if n > 0 && self.heard {
            self.last_io = now;
        }
    }

    /// Whether the client has sent at least one byte.
    pub fn heard(&self) -> bool {
        self.heard
    }

    /// When the connection is to be evicted if nothing more happens, and why; `None` when it
    /// may stay quiet forever (a streaming listener's connection that has spoken). `requests`
    /// is the connection's [`RequestsState`] when its requests are counted.
    ///
    /// Before the first byte: accept + `first_byte_timeout` ([`Eviction::FirstByteTimeout`]).
    /// After it, under [`Quiet::IdleTimeout`] ([`Eviction::IdleTimeout`]), the earlier of the last
    /// byte in either direction + the idle timeout and, while no request is in flight, the end
    /// of the last request (or the first byte, before any request) + the idle timeout: bytes
    /// that open no request (HTTP/2 PINGs) do not postpone it. Never under [`Quiet::KeepAlive`].
    pub fn deadline(&self, policy: &ConnectionPolicy, requests: Option<RequestsState>) -> Option<(Instant, Eviction)> {
        if !self.heard {
            return Some((self.accepted + policy.first_byte_timeout, Eviction::FirstByteTimeout));
        }
        let idle = policy.idle_timeout()?;
        let by_bytes = self.last_io + idle;
        let by_requests = requests
            .filter(|r| r.in_flight == 0)
            .map(|r| r.last_end.map_or(self.first_heard, |end| end.max(self.first_heard)) + idle);
        Some((by_requests.map_or(by_bytes, |r| r.min(by_bytes)), Eviction::IdleTimeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_silent_connection_is_due_at_the_first_byte_timeout_whatever_the_server_wrote() {
        let t0 = Instant::now();
        let p = ListenerKind::Admin.default_policy();
        let mut l = Liveness::new(t0);
        l.wrote(t0 + secs(1), 100);
        assert_eq!(l.deadline(&p, None), Some((t0 + ADMIN_FIRST_BYTE_TIMEOUT, Eviction::FirstByteTimeout)));
        l.read(t0 + secs(2), 0);
        assert!(!l.heard(), "end of stream is not a byte");
        assert_eq!(l.deadline(&p, None), Some((t0 + ADMIN_FIRST_BYTE_TIMEOUT, Eviction::FirstByteTimeout)));
    }

    #[test]
    fn after_the_first_byte_a_request_port_counts_idleness_from_the_last_byte_either_way() {
        let t0 = Instant::now();
        let p = ListenerKind::Webhook.default_policy();
        let mut l = Liveness::new(t0);
        l.read(t0 + secs(1), 1);
        assert_eq!(l.deadline(&p, None), Some((t0 + secs(1) + WEBHOOK_IDLE_TIMEOUT, Eviction::IdleTimeout)));
        l.wrote(t0 + secs(3), 10);
        assert_eq!(l.deadline(&p, None), Some((t0 + secs(3) + WEBHOOK_IDLE_TIMEOUT, Eviction::IdleTimeout)));
        l.wrote(t0 + secs(4), 0);
        assert_eq!(l.deadline(&p, None), Some((t0 + secs(3) + WEBHOOK_IDLE_TIMEOUT, Eviction::IdleTimeout)));
    }

    #[test]
    fn with_counted_requests_only_a_request_postpones_a_request_ports_idle_timeout() {
        let t0 = Instant::now();
        let p = ListenerKind::Admin.default_policy();
        let idle = ADMIN_IDLE_TIMEOUT;
        let mut l = Liveness::new(t0);
        l.read(t0 + secs(1), 24); // an HTTP/2 preface, no request yet
        let none = RequestsState { in_flight: 0, last_end: None };
        assert_eq!(l.deadline(&p, Some(none)), Some((t0 + secs(1) + idle, Eviction::IdleTimeout)));
        // PINGs every 10 s (bytes both ways) do not move it.
        for n in 1..=5 {
            l.read(t0 + secs(1 + 10 * n), 17);
            l.wrote(t0 + secs(1 + 10 * n), 17);
        }
        assert_eq!(l.deadline(&p, Some(none)), Some((t0 + secs(1) + idle, Eviction::IdleTimeout)));
        // A request in flight: only the byte rule holds.
        let busy = RequestsState { in_flight: 1, last_end: None };
        assert_eq!(l.deadline(&p, Some(busy)), Some((t0 + secs(51) + idle, Eviction::IdleTimeout)));
        // It ended at 60 s: idle from then.
        let ended = RequestsState { in_flight: 0, last_end: Some(t0 + secs(60)) };
        l.wrote(t0 + secs(60), 200);
        assert_eq!(l.deadline(&p, Some(ended)), Some((t0 + secs(60) + idle, Eviction::IdleTimeout)));
        // Not counted (no CountRequests): the byte rule alone, as before.
        assert_eq!(l.deadline(&p, None), Some((t0 + secs(60) + idle, Eviction::IdleTimeout)));
        // A streaming port ignores requests.
        assert_eq!(l.deadline(&ListenerKind::Xds.default_policy(), Some(none)), None);
    }

    #[test]
    fn a_streaming_port_that_has_spoken_is_never_due() {
        let t0 = Instant::now();
        let p = ListenerKind::Xds.default_policy();
        let mut l = Liveness::new(t0);
        assert_eq!(l.deadline(&p, None), Some((t0 + XDS_FIRST_BYTE_TIMEOUT, Eviction::FirstByteTimeout)));
        l.read(t0 + secs(1), 24);
        assert_eq!(l.deadline(&p, None), None);
        assert_eq!(p.keepalive(), Some(KeepAlive { interval: XDS_KEEPALIVE_INTERVAL, timeout: XDS_KEEPALIVE_TIMEOUT }));
        assert_eq!(p.idle_timeout(), None);
    }

    #[test]
    fn defaults_keep_every_cap_well_below_a_1024_open_files_limit() {
        let total: usize = ListenerKind::ALL.iter().map(|k| k.default_policy().max_connections).sum();
        assert!(total <= 1024 / 3, "{total}");
        for k in ListenerKind::ALL {
            let p = k.default_policy();
            assert!(p.max_connections >= 1, "{k}");
            if let Some(idle) = p.idle_timeout() {
                assert!(idle > p.first_byte_timeout, "{k}: idle {idle:?} must exceed the first-byte timeout");
            }
        }
        assert!(WEBHOOK_IDLE_TIMEOUT > Duration::from_secs(90), "longer than client-go's IdleConnTimeout");
    }

    #[test]
    fn labels_are_distinct_kebab_case() {
        let labels: Vec<&str> =
            ListenerKind::ALL.iter().map(|k| k.label()).chain(Eviction::ALL.iter().map(|e| e.label())).collect();
        for l in &labels {
            assert!(l.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') && !l.starts_with('-'), "{l}");
        }
        let mut unique = labels.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), labels.len());
    }
}
