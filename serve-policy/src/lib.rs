//! The connection policy of every listener aether's binaries open — the controller's webhook
//! (TLS) and admin port, the agent's admin port and xDS server — so that connections that never
//! speak cannot exhaust the process's file descriptors (docs/listeners.md).
//!
//! A listener's [`ConnectionPolicy`] has
//! - a cap on concurrent connections ([`Gate`]), and on request/response ports a share of it per
//!   source address: over either a connection is accepted and closed at once, and counted;
//! - a first-byte timeout, from accept to the client's first byte (on the webhook: the TLS
//!   handshake and the first request byte), that evicts connections that never speak;
//! - after that, an idle timeout on request/response ports, counted from the last byte and from
//!   the last request ([`CountRequests`]: an HTTP/2 PING opens no request), or HTTP/2 keepalive
//!   (PINGs, no idle timeout) on the xDS port, whose stream is legitimately quiet between pushes;
//! - metrics ([`ListenerMetrics`]): `aether_listener_connections{listener}`,
//!   `aether_listener_max_connections{listener}`,
//!   `aether_listener_connections_refused_total{listener}`,
//!   `aether_listener_connections_over_source_share_total{listener}`,
//!   `aether_listener_connections_evicted_total{listener,reason}`.
//!
//! Serving through it:
//! - plain HTTP (an axum router): `http::serve(GatedListener::new(tcp, gate), router, shutdown)`
//!   ([`http`]: also the HTTP/1 and HTTP/2 limits that bound a connection's memory);
//! - TLS (axum-server, feature `tls`): `axum_server::from_tcp(l)?.acceptor(gate.tls_acceptor(cfg))`;
//! - gRPC (tonic, feature `grpc`): `serve_with_incoming_shutdown(GatedListener::new(l, gate).incoming(), ..)`
//!   with the tonic builder's `http2_keepalive_*` from [`ConnectionPolicy::keepalive`].
//!
//! Timeouts are enforced on the bytes ([`GatedIo`]), below HTTP, so they hold in every state
//! (protocol detection, an HTTP/2 connection without streams, keep-alive between requests).
//! [`open_files::check`] compares the caps with `RLIMIT_NOFILE` at start-up. Flags:
//! [`cli`]. The written policy: `docs/listeners.md`. The routes both binaries' admin ports serve
//! alike (`/healthz`, `/readyz`, `/metrics`): [`admin`].
//!
//! [`probe`]: the pod-local Unix socket the kubelet's exec probes ask (`<binary> probe`), so a
//! client filling the admin port cannot fail a liveness or readiness probe.
//!
//! [`bind::bind_tcp`] binds a listener's socket: `[::]:<port>` as one dual-stack socket, so every
//! listener serves IPv4 and IPv6 clients.
//!
//! This crate depends on neither binary.

#![forbid(unsafe_code)]

pub mod admin;
pub mod bind;
pub mod cli;
mod gate;
#[cfg(feature = "grpc")]
mod grpc;
pub mod http;
mod io;
mod listener;
mod metrics;
pub mod open_files;
mod policy;
pub mod probe;
mod requests;
#[cfg(feature = "tls")]
mod tls;

pub use bind::bind_tcp;
pub use gate::{Gate, REFUSAL_LOG_INTERVAL, Slot};
pub use io::GatedIo;
pub use listener::{GatedListener, PeerSource};
pub use metrics::{EvictionLabels, ListenerLabel, ListenerMetrics};
pub use policy::{
    ADMIN_FIRST_BYTE_TIMEOUT, ADMIN_IDLE_TIMEOUT, ADMIN_MAX_CONNECTIONS, ADMIN_MAX_CONNECTIONS_PER_SOURCE,
    ConnectionPolicy, Eviction, KeepAlive, ListenerKind, Liveness, PROBE_FIRST_BYTE_TIMEOUT, PROBE_IDLE_TIMEOUT,
    PROBE_MAX_CONNECTIONS, Quiet, RequestsState, WEBHOOK_HANDSHAKE_TIMEOUT, WEBHOOK_IDLE_TIMEOUT,
    WEBHOOK_MAX_CONNECTIONS, XDS_FIRST_BYTE_TIMEOUT, XDS_KEEPALIVE_INTERVAL, XDS_KEEPALIVE_TIMEOUT,
    XDS_MAX_CONNECTIONS,
};
pub use requests::{CountRequests, Requests};
#[cfg(feature = "tls")]
pub use tls::GatedAcceptor;
