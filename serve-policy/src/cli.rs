//! The listener flags, shared by both binaries so they are named and explained the same way
//! (`#[command(flatten)]` them into a `run` subcommand): `--<listener>-max-connections` (a count
//! of connections), `--<listener>-first-byte-timeout-seconds` (the webhook's is
//! `--webhook-handshake-timeout-seconds`), `--<listener>-idle-timeout-seconds` on
//! request/response ports and `--xds-keepalive-{interval,timeout}-seconds` on the xDS port.
//! Every flag also reads the environment variable named in its help. The defaults are
//! [`ListenerKind::default_policy`]'s (`docs/listeners.md`).
//!
//! The flags' doc comments are their `--help` text (clap), where placeholders such as
//! `<pod uid>` are meant literally, so rustdoc's HTML-tag check is off for this module.
#![allow(rustdoc::invalid_html_tags)]

use std::time::Duration;

use clap::Args;

use crate::policy::{
    ADMIN_FIRST_BYTE_TIMEOUT, ADMIN_IDLE_TIMEOUT, ADMIN_MAX_CONNECTIONS, ADMIN_MAX_CONNECTIONS_PER_SOURCE,
    ConnectionPolicy, KeepAlive, ListenerKind, Quiet, WEBHOOK_HANDSHAKE_TIMEOUT, WEBHOOK_IDLE_TIMEOUT,
    WEBHOOK_MAX_CONNECTIONS, XDS_FIRST_BYTE_TIMEOUT, XDS_KEEPALIVE_INTERVAL, XDS_KEEPALIVE_TIMEOUT,
    XDS_MAX_CONNECTIONS,
};

/// The largest cap a flag accepts (connections).
pub const MAX_CAP: u32 = 65_536;
/// The longest timeout a flag accepts (seconds: one hour).
pub const MAX_SECONDS: u64 = 3600;
/// The `--help` section these flags are listed under.
pub const HELP_HEADING: &str = "Listener connection policy (connections, seconds; docs/listeners.md)";

/// The webhook listener's flags (aether-controller).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = HELP_HEADING)]
pub struct WebhookListenerArgs {
    /// Most connections the HTTPS webhook holds open at once, TLS handshakes in progress
    /// included. One more is accepted and closed at once, and counted in
    /// aether_listener_connections_refused_total{listener="webhook"}. kube-apiserver needs a few
    /// per API server replica. Keep the sum of this process's caps well below its open-files
    /// limit (ulimit -n); start-up warns when it is not.
    #[arg(long, default_value_t = WEBHOOK_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..=MAX_CAP as i64), env = "AETHER_WEBHOOK_MAX_CONNECTIONS")]
    pub webhook_max_connections: u32,
    /// Seconds from accept within which a webhook connection must finish its TLS handshake and
    /// send its first request byte; else it is closed and counted in
    /// aether_listener_connections_evicted_total{listener="webhook"} with reason
    /// handshake-timeout or first-byte-timeout.
    #[arg(long, default_value_t = WEBHOOK_HANDSHAKE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_WEBHOOK_HANDSHAKE_TIMEOUT_SECONDS")]
    pub webhook_handshake_timeout_seconds: u64,
    /// Seconds a webhook connection may pass with no review in flight, or with no byte in
    /// either direction, before it is closed (reason idle-timeout; an HTTP/2 PING is not a
    /// review). Keep it above the API server's 90 s idle-connection timeout
    /// (it then closes first, and no review races our close) and above the 15 s request timeout.
    #[arg(long, default_value_t = WEBHOOK_IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_WEBHOOK_IDLE_TIMEOUT_SECONDS")]
    pub webhook_idle_timeout_seconds: u64,
}

impl WebhookListenerArgs {
    /// The webhook's policy from these flags.
    pub fn policy(&self) -> ConnectionPolicy {
        ConnectionPolicy {
            listener: ListenerKind::Webhook,
            max_connections: self.webhook_max_connections as usize,
            max_connections_per_source: None,
            first_byte_timeout: Duration::from_secs(self.webhook_handshake_timeout_seconds),
            quiet: Quiet::IdleTimeout(Duration::from_secs(self.webhook_idle_timeout_seconds)),
        }
    }
}

/// The plain-HTTP admin port's flags (both binaries).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = HELP_HEADING)]
pub struct AdminListenerArgs {
    /// Most connections the admin port (/healthz, /readyz, /metrics) holds open at once. One
    /// more is accepted and closed at once, and counted in
    /// aether_listener_connections_refused_total{listener="admin"}. Its users are the kubelet's
    /// probes and a Prometheus scraper or two.
    #[arg(long, default_value_t = ADMIN_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..=MAX_CAP as i64), env = "AETHER_ADMIN_MAX_CONNECTIONS")]
    pub admin_max_connections: u32,
    /// Most connections one source IP address holds open on the admin port at once (its share
    /// of --admin-max-connections). One more from that address is accepted and closed at once,
    /// and counted in aether_listener_connections_over_source_share_total{listener="admin"} (and
    /// in ..._refused_total). A scraper holds one or two; at or above --admin-max-connections
    /// it changes nothing. The kubelet shares its address with every process on the node's
    /// network: probe through --probe-socket (the chart does), not this port, so no share or
    /// cap here can fail a probe.
    #[arg(long, default_value_t = ADMIN_MAX_CONNECTIONS_PER_SOURCE as u32, value_parser = clap::value_parser!(u32).range(1..=MAX_CAP as i64), env = "AETHER_ADMIN_MAX_CONNECTIONS_PER_SOURCE")]
    pub admin_max_connections_per_source: u32,
    /// Seconds from accept within which an admin connection must send its first request byte;
    /// else it is closed and counted in
    /// aether_listener_connections_evicted_total{listener="admin",reason="first-byte-timeout"}.
    #[arg(long, default_value_t = ADMIN_FIRST_BYTE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_ADMIN_FIRST_BYTE_TIMEOUT_SECONDS")]
    pub admin_first_byte_timeout_seconds: u64,
    /// Seconds an admin connection may pass with no request in flight, or with no byte in
    /// either direction, before it is closed (reason idle-timeout; an HTTP/2 PING is not a
    /// request). Keep it above the scrape interval, so a scraper's keep-alive connection lasts
    /// from one scrape to the next.
    #[arg(long, default_value_t = ADMIN_IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_ADMIN_IDLE_TIMEOUT_SECONDS")]
    pub admin_idle_timeout_seconds: u64,
}

impl AdminListenerArgs {
    /// The admin port's policy from these flags.
    pub fn policy(&self) -> ConnectionPolicy {
        ConnectionPolicy {
            listener: ListenerKind::Admin,
            max_connections: self.admin_max_connections as usize,
            max_connections_per_source: Some(self.admin_max_connections_per_source as usize),
            first_byte_timeout: Duration::from_secs(self.admin_first_byte_timeout_seconds),
            quiet: Quiet::IdleTimeout(Duration::from_secs(self.admin_idle_timeout_seconds)),
        }
    }
}

/// The xDS (ADS gRPC) listener's flags (aether-agent).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = HELP_HEADING)]
pub struct XdsListenerArgs {
    /// Most connections the xDS server holds open at once (at least 2). One more is accepted and
    /// closed at once, and counted in aether_listener_connections_refused_total{listener="xds"}.
    /// Only the node's Envoy connects: one connection, two while a replaced proxy pod hands over
    /// (the old Envoy keeps its stream while it drains, and the new one needs its own to serve).
    #[arg(long, default_value_t = XDS_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(2..=MAX_CAP as i64), env = "AETHER_XDS_MAX_CONNECTIONS")]
    pub xds_max_connections: u32,
    /// Seconds from accept within which an xDS connection must send its first byte (Envoy
    /// sends the HTTP/2 preface at once); else it is closed and counted in
    /// aether_listener_connections_evicted_total{listener="xds",reason="first-byte-timeout"}.
    #[arg(long, default_value_t = XDS_FIRST_BYTE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_XDS_FIRST_BYTE_TIMEOUT_SECONDS")]
    pub xds_first_byte_timeout_seconds: u64,
    /// Seconds between HTTP/2 PINGs on an xDS connection. The ADS stream is quiet between
    /// pushes, so it has no idle timeout: PINGs find a dead Envoy instead.
    #[arg(long, default_value_t = XDS_KEEPALIVE_INTERVAL.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_XDS_KEEPALIVE_INTERVAL_SECONDS")]
    pub xds_keepalive_interval_seconds: u64,
    /// Seconds an HTTP/2 PING may go unanswered before the xDS connection is closed.
    #[arg(long, default_value_t = XDS_KEEPALIVE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS), env = "AETHER_XDS_KEEPALIVE_TIMEOUT_SECONDS")]
    pub xds_keepalive_timeout_seconds: u64,
}

impl XdsListenerArgs {
    /// The xDS listener's policy from these flags.
    pub fn policy(&self) -> ConnectionPolicy {
        ConnectionPolicy {
            listener: ListenerKind::Xds,
            max_connections: self.xds_max_connections as usize,
            max_connections_per_source: None,
            first_byte_timeout: Duration::from_secs(self.xds_first_byte_timeout_seconds),
            quiet: Quiet::KeepAlive(KeepAlive {
                interval: Duration::from_secs(self.xds_keepalive_interval_seconds),
                timeout: Duration::from_secs(self.xds_keepalive_timeout_seconds),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookListenerArgs,
        #[command(flatten)]
        admin: AdminListenerArgs,
        #[command(flatten)]
        xds: XdsListenerArgs,
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
    }

    #[test]
    fn without_flags_every_listener_gets_its_default_policy() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.webhook.policy(), ListenerKind::Webhook.default_policy());
        assert_eq!(cli.admin.policy(), ListenerKind::Admin.default_policy());
        assert_eq!(cli.xds.policy(), ListenerKind::Xds.default_policy());
    }

    #[test]
    fn flags_set_each_field_in_their_unit() {
        let cli = parse(&[
            "--webhook-max-connections=8",
            "--webhook-handshake-timeout-seconds=2",
            "--webhook-idle-timeout-seconds=30",
            "--admin-max-connections=4",
            "--admin-max-connections-per-source=2",
            "--admin-first-byte-timeout-seconds=3",
            "--admin-idle-timeout-seconds=40",
            "--xds-max-connections=2",
            "--xds-first-byte-timeout-seconds=1",
            "--xds-keepalive-interval-seconds=15",
            "--xds-keepalive-timeout-seconds=5",
        ])
        .unwrap();
        let w = cli.webhook.policy();
        assert_eq!(
            (w.max_connections, w.first_byte_timeout, w.idle_timeout()),
            (8, Duration::from_secs(2), Some(Duration::from_secs(30)))
        );
        let a = cli.admin.policy();
        assert_eq!(
            (a.max_connections, a.first_byte_timeout, a.idle_timeout()),
            (4, Duration::from_secs(3), Some(Duration::from_secs(40)))
        );
        assert_eq!(a.max_connections_per_source, Some(2));
        let x = cli.xds.policy();
        assert_eq!((x.max_connections, x.first_byte_timeout), (2, Duration::from_secs(1)));
        assert_eq!(
            x.keepalive(),
            Some(KeepAlive { interval: Duration::from_secs(15), timeout: Duration::from_secs(5) })
        );
    }

    #[test]
    fn zero_and_out_of_range_values_are_refused_naming_the_flag() {
        for bad in [
            "--webhook-max-connections=0",
            "--admin-max-connections=65537",
            "--admin-max-connections-per-source=0",
            "--xds-first-byte-timeout-seconds=0",
            "--admin-idle-timeout-seconds=3601",
        ] {
            let e = parse(&[bad]).unwrap_err().to_string();
            let flag = bad.split('=').next().unwrap();
            assert!(e.contains(flag), "{bad}: {e}");
        }
    }
}
