//! The xDS layer: what the node's Envoy receives from the agent.
//!
//! - [`resources`]: the encoder: the core's model ([`Snapshot`] of [`ClusterSpec`]s and
//!   [`ListenerSpec`]s, re-exported) rendered to Envoy `Cluster`s, the health-gateway and inbound
//!   `Listener`s and the gateway's checks (ECDS), content-hash versions.
//! - [`health_gateway`]: the gateway on `--health-socket`: a listener that never changes with the
//!   pods, and its per-cluster checks as one ECDS resource (why: `docs/design-notes.md`).
//! - [`server`]: the ADS gRPC server (CDS + LDS + ECDS, state of the world and delta), [`serve`]
//!   and a shutdown that waits for Envoy to close its streams ([`Drained`]); re-exports the parts
//!   below.
//! - `stream` (private): one state-of-the-world ADS stream's request/response loop, nonces,
//!   a push per rendered version.
//! - [`delta`]: one incremental (delta) ADS stream: per-resource versions, only what changed and
//!   the names removed, a reconnecting Envoy's `initial_resource_versions` honoured.
//! - [`acks`]: the [`AckTracker`]: what each node applied or rejected, which streams are open.
//! - [`metrics`]: Prometheus metrics ([`XdsMetrics`]), the change-to-ACK [`ChangeClock`].
//! - [`publish`]: [`spawn_renderer`], snapshots to rendered resources with a debounce.
//! - [`listen`]: where the server listens ([`XdsAddr`], [`XdsListener`], [`ServeError`]).
//! - [`bind_failures`]: after an LDS NACK, which inbound listeners Envoy could not bind (its
//!   config dump's `error_state`).
//! - [`readiness`]: whether Envoy has applied what the server would send now (the `/readyz`
//!   line, [`EnvoyReadiness`]).
//!
//! Wiring: the driver's [`publish::pod_specs`] channel (only the pods whose rendering changed;
//! a whole `watch::Receiver<Arc<Snapshot>>` is still accepted, e.g. by tests) → [`spawn_renderer`]
//! → `watch::Receiver<Arc<Resources>>` (persistent maps: a new version shares what did not
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
pub mod delta;
pub mod health_gateway;
pub mod listen;
pub mod metrics;
pub mod publish;
pub mod readiness;
pub mod resources;
pub mod server;
mod stream;

pub use acks::{AckTracker, Nack, StreamState, TypeState};
pub use health_gateway::{
    DEFAULT_HEALTH_MAX_CONNECTIONS, EXTENSION_CONFIG_TYPE_URL, HEALTH_CHECKS_NAME, HEALTH_LISTENER_NAME,
    HEALTHZ_PREFIX, render_health_checks, render_health_listener,
};
pub use listen::{ServeError, XdsAddr, XdsListener};
pub use metrics::{ChangeClock, MODE_DELTA, MODE_SOTW, XdsMetrics};
pub use publish::{spawn_renderer, spawn_renderer_with_clock};
pub use readiness::{Connected, EnvoyReadiness, TypeProgress, assess};
pub use resources::{
    CLUSTER_TYPE_URL, ClusterSpec, DEFAULT_INBOUND_MAX_CONNECTIONS, Endpoint, HealthCheck, HealthTiming,
    LISTENER_TYPE_URL, ListenerSpec, NamedResource, Rejected, RenderError, RenderOptions, Renderer, Resources,
    Snapshot, TypedResources, render, render_cluster, render_inbound_listener,
};
pub use server::{Drained, XdsServer, serve, serve_listener};
