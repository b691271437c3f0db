//! The xDS layer: what the node's Envoy receives from the agent.
//!
//! Laid out along go-control-plane's seams (resource types, versioned resource sets, a cache
//! that builds them, one gRPC server whose state-of-the-world and delta streams share their
//! session machinery). Each module imports only from the modules listed above it here:
//!
//! - [`options`]: the node-wide settings of the builders ([`BuildOptions`], [`HealthTiming`]).
//! - [`resource_set`]: what is served: per type URL a [`TypedResources`] set with its
//!   content-hash version, the three sets together as a [`ResourceSet`], per-resource digests and
//!   delta versions ([`resource_version`]).
//! - [`acks`]: the [`AckTracker`]: what each node applied or rejected, which streams are open.
//! - [`metrics`]: Prometheus metrics ([`XdsMetrics`]), the change-to-ACK [`ChangeClock`].
//! - [`build`]: pure proto builders, the core's model to Envoy protos: [`build_cluster`],
//!   [`build_inbound_listener`], and the health gateway on `--health-socket`
//!   ([`build::health_gateway`]: a listener that never changes with the pods, and its per-cluster
//!   checks as one ECDS resource; why: `docs/design-notes.md`).
//! - [`encoder`]: the caching [`Encoder`]: the driver's per-pod specs (or a whole [`Snapshot`],
//!   for tests and tools) to the served [`ResourceSet`], driven one way ([`Encoder::update`]),
//!   building only what changed.
//! - [`publish`]: the channel from the driver ([`publish::pod_specs`]) and the encoder task
//!   ([`spawn_encoder`]) with its debounce.
//! - `session` (private): what both stream variants share: nonces, the stream's session (node,
//!   connection count, recording of sends, ACKs and NACKs), the serve loop.
//! - `sotw` (private): one state-of-the-world stream; [`delta`]: one incremental stream
//!   (per-resource versions, only what changed and the names removed, a reconnecting Envoy's
//!   `initial_resource_versions` honoured).
//! - [`service`]: the ADS gRPC service, [`XdsServer`] (CDS + LDS + ECDS, both variants).
//! - [`listen`]: where the server listens ([`XdsAddr`], [`XdsListener`], [`ServeError`]).
//! - [`server`]: [`serve`] / [`serve_listener`] and a shutdown that waits for Envoy to close its
//!   streams ([`Drained`]).
//! - [`bind_failures`]: after an LDS NACK, which inbound listeners Envoy could not bind (its
//!   config dump's `error_state`), read from Envoy's admin ([`envoy_admin`]: its Unix socket or
//!   a TCP address).
//! - [`stream_ends`]: when an ADS stream ends (an Envoy exited), so the loop offers withdrawn
//!   inbound listeners again.
//! - [`readiness`]: whether Envoy has applied what the server would send now (the `/readyz`
//!   line, [`EnvoyReadiness`]).
//!
//! Wiring: the driver's [`publish::pod_specs`] channel (only the pods whose rendering changed;
//! a whole `watch::Receiver<Arc<Snapshot>>` is still accepted, e.g. by tests) → [`spawn_encoder`]
//! → `watch::Receiver<Arc<ResourceSet>>` (persistent maps: a new version shares what did not
//! change) → [`XdsServer::new`] → [`serve`] on `unix://<path>` or `<ip>:<port>`.
//!
//! Envoy features used: `pipe` addresses (cluster endpoints and listeners), the `health_check`
//! HTTP filter with `cluster_min_healthy_percentages` behind the composite filter and an
//! `ExtensionWithMatcher` delivered over ECDS (`xds_matcher`: Envoy 1.21+), the `connection_limit`
//! network filter, typed `HttpProtocolOptions` for upstream HTTP/2, all long-standing;
//! `SocketAddress.network_namespace_filepath` is recent (the API field appeared in 2025;
//! `setns(2)` into the netns file needs `CAP_SYS_ADMIN`), so the netns variants (TCP delivery's
//! upstream bind, the inbound listeners) need a recent Envoy. Everything here is tested against
//! Envoy 1.40 (`tests/xds_envoy.rs`, `tests/health_gateway.rs`, `tests/xds_delta.rs`).

pub mod acks;
pub mod bind_failures;
pub mod build;
pub mod delta;
pub mod encoder;
pub mod envoy_admin;
pub mod listen;
pub mod metrics;
pub mod options;
pub mod publish;
pub mod readiness;
pub mod resource_set;
pub mod server;
pub mod service;
mod session;
mod sotw;
pub mod stream_ends;
#[cfg(test)]
mod test_specs;

pub use acks::{AckTracker, Nack, StreamState, TypeState};
pub use aether_agent_core::model::{ClusterSpec, Endpoint, HealthCheck, ListenerSpec, RenderError, Snapshot};
pub use build::{
    HEALTH_CHECK_HOST, HEALTH_CHECKS_NAME, HEALTH_LISTENER_NAME, HEALTHZ_PREFIX, build_cluster, build_health_checks,
    build_health_listener, build_inbound_listener,
};
pub use encoder::{Encoder, SpecChange, encode};
pub use listen::{ServeError, XdsAddr, XdsListener};
pub use metrics::{ChangeClock, MODE_DELTA, MODE_SOTW, XdsMetrics};
pub use options::{
    BuildOptions, DEFAULT_HEALTH_MAX_CONNECTIONS, DEFAULT_INBOUND_IDLE_TIMEOUT, DEFAULT_INBOUND_MAX_CONNECTIONS,
    HealthTiming,
};
pub use publish::{DEFAULT_DEBOUNCE, spawn_encoder, spawn_encoder_with_clock};
pub use readiness::{Connected, EnvoyReadiness, TypeProgress, assess};
pub use resource_set::{
    CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL, LISTENER_TYPE_URL, NamedResource, Rejected, ResourceSet,
    TypedResources, resource_version,
};
pub use server::{
    Drained, XDS_MAX_HEADER_BYTES, XDS_MAX_REQUEST_BYTES, XDS_MAX_STREAMS, XDS_WINDOW_BYTES, serve, serve_listener,
};
pub use service::XdsServer;
