//! aether's node reconciler, embedded in `aether-agent`: the node side (docs/reference.md
//! "`aether-agent`: the node side").
//!
//! Two layers, so the decisions can be tested without a runtime, a network or a cluster:
//! - the **pure core**, crate `aether-agent-core` (re-exported here under the same paths):
//!   [`record`], [`settings`](aether_agent_core::settings), [`fold`], [`index`] (which also keeps
//!   the per-pod node facts the shell gathers, e.g. the netns), [`names`], [`model`] (the xDS
//!   layer's input), [`render`], [`refusal`](aether_agent_core::refusal), [`fallback`],
//!   [`pod_events`], [`status`], and the pure half of [`plan`]. No tokio, hyper, tonic or kube
//!   client in its dependency tree (`make lint` checks it).
//! - this crate, the **I/O shell**, which feeds the core facts and serves what it returns.
//!
//! ```text
//! watch (Pods on this node, CRD-gated EndpointPolicies)   runtime / cni (pod netns)
//!   └─► event ─► driver ─► core Index (record ─► fold, + netns facts) ─► fscheck (lstat)
//!                          │ store (--state-dir)          core render_pod (changed pods only)
//!                          ▼                                                      ▼ pod_specs
//!                  replay at boot                  xds: encoder ─► ADS server ─► Envoy
//! ```
//!
//! I/O: [`fscheck`] (symlink refusal), [`pin`] (`--pin-dir`: the verified socket inode mounted
//! on an agent-owned path Envoy dials), [`pin_owner`] (one agent per pin dir: another release's
//! agent is refused), [`kernel`] (does this kernel have the calls pinning
//! needs), [`store`] (state dir), [`replay`] (what of it a restarted
//! agent may replay: is a pod's netns still there), [`cni`] (netns records, read on a
//! pod's events and the periodic re-check), [`runtime`] (pod netns from the container runtime over
//! CRI), [`watch`] (kube-runtime watchers), [`event`] (the loop's input), [`driver`] (the
//! reconcile loop), [`xds::encoder`] with [`xds::build`] and [`xds::resource_set`] (Envoy
//! protos, content-hash versions), [`xds::service`] and [`xds::server`] with [`xds::delta`],
//! [`xds::acks`], [`xds::metrics`], [`xds::publish`], [`xds::listen`] (ADS, ACK/NACK tracking,
//! connected streams; the layout: [`xds`]), [`xds::bind_failures`] (which inbound listener Envoy could not bind),
//! [`xds::readiness`] (is Envoy caught up: pure), [`recorder`] (the pod Event
//! task), [`metrics`] and [`admin`] (`/healthz`, `/readyz`, `/metrics`), [`shutdown`] (which
//! socket files to remove at exit: pure decisions, then `lstat`/unlink), [`agent`] (`run`),
//! [`decisions`] (the live per-pod decision board served at `/debug/pods`), [`startup`] (`run`
//! from its flags: the tokio runtime, the exit code), [`cli`] (the command line, and
//! [`cli::dispatch`] to the subcommand), [`plan`] (`aether-agent plan`: reads and prints),
//! [`logging`].

#![forbid(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod cli;
pub mod cni;
pub mod decisions;
pub mod driver;
pub mod event;
pub mod fscheck;
pub mod kernel;
pub mod logging;
pub mod metrics;
pub mod pin;
pub mod pin_owner;
pub mod plan;
pub mod recorder;
pub mod replay;
pub mod runtime;
pub mod shutdown;
pub mod socket_watch;
pub mod startup;
pub mod store;
pub mod watch;
pub mod xds;

// The pure core, re-exported under its old paths (`aether_agent_reconciler::fold::...`).
pub use aether_agent_core::{
    Change, Conflict, Delivery, DeliveryMap, Index, PodDelivery, PodKey, PodRecord, PolicyRecord, RecordError,
    Settings, Source, TcpReason, fallback, fold, index, model, names, pod_events, record, render, status,
};
