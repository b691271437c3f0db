//! The xDS layer: what the node's Envoy receives from the agent.
//!
//! - [`resources`]: the pure input model ([`Snapshot`] of [`ClusterSpec`]s, independent of
//!   Kubernetes), validation before rendering, rendering to Envoy `Cluster`s and the
//!   health-gateway `Listener`, content-hash versions.
//! - [`server`]: the ADS gRPC server (state of the world, CDS + LDS) with debounced pushes, an
//!   [`AckTracker`] of what each node applied or rejected and which streams are open now, and a
//!   shutdown that waits for Envoy to close its streams ([`Drained`]).
//! - [`readiness`]: whether Envoy has applied what the server would send now (the `/readyz`
//!   line, [`EnvoyReadiness`]).
//!
//! Wiring: `watch::Sender<Arc<Snapshot>>` → [`spawn_renderer`] → `watch::Receiver<Arc<Resources>>`
//! → [`XdsServer::new`] → [`serve`] on `unix://<path>` or `<ip>:<port>`.
//!
//! Envoy features used: `pipe` addresses (cluster endpoints and listeners), the `health_check`
//! HTTP filter with `cluster_min_healthy_percentages`, typed `HttpProtocolOptions` for upstream
//! HTTP/2, all long-standing; `SocketAddress.network_namespace_filepath` is recent (the API
//! field appeared in 2025; it needs `CAP_NET_ADMIN`), so the netns variant needs a recent
//! Envoy. Everything here is tested against Envoy 1.40 (`tests/xds_envoy.rs`).

pub mod bind_failures;
pub mod readiness;
pub mod resources;
pub mod server;

pub use readiness::{Connected, EnvoyReadiness, TypeProgress, assess};
pub use resources::{
    CLUSTER_TYPE_URL, ClusterSpec, DEFAULT_INBOUND_MAX_CONNECTIONS, Endpoint, HealthCheck, HealthTiming,
    LISTENER_TYPE_URL, ListenerSpec, NamedResource, Rejected, RenderError, RenderOptions, Renderer, Resources,
    Snapshot, TypedResources, render, render_cluster, render_health_listener, render_inbound_listener,
};
pub use server::{
    AckTracker, ChangeClock, Drained, Nack, ServeError, StreamState, TypeState, XdsAddr, XdsListener, XdsMetrics,
    XdsServer, serve, serve_listener, spawn_renderer, spawn_renderer_with_clock,
};
