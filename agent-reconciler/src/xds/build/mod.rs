//! Pure proto builders: the core's model ([`ClusterSpec`](aether_agent_core::model::ClusterSpec),
//! [`ListenerSpec`](aether_agent_core::model::ListenerSpec)) and the node's
//! [`BuildOptions`](super::options::BuildOptions) to Envoy protos. No caching, no packing, no
//! versions, no I/O: the [`Encoder`](super::encoder::Encoder) decides what to build and keeps it.
//!
//! Validation happens *before* building (`validate` of the spec): a spec Envoy would refuse (a
//! pipe path over 107 bytes, an empty name, ...) is an error and nothing is built, so the node's
//! update is never NACKed because of one pod.
//!
//! Determinism: prost encodes `map` fields in `HashMap` iteration order, which differs between
//! two maps with the same content. Every map these builders fill holds at most one entry, or is
//! encoded through a twin message with a `BTreeMap` (the gateway's checks), so the encoding, and
//! therefore the version, depends on the content only.
//!
//! - [`cluster`]: a delivery or health cluster (CDS) with its active health check;
//! - [`listener`]: a pod port's inbound listener (LDS) in the pod's netns;
//! - [`health_gateway`]: the gateway's listener (LDS) and its checks (ECDS);
//! - `parts` (private): addresses, durations and the connection-capped filter chain they share.

pub mod cluster;
pub mod health_gateway;
pub mod listener;
mod parts;

pub use cluster::{HEALTH_CHECK_HOST, build_cluster};
pub use health_gateway::{
    HEALTH_CHECKS_NAME, HEALTH_LISTENER_NAME, HEALTHZ_PREFIX, build_health_checks, build_health_listener,
};
pub use listener::build_inbound_listener;
