//! aether's node reconciler, embedded in `aether-agent` (proposal 034 Phases 1 and 1b, agent
//! side; DESIGN.md "What runs where").
//!
//! ```text
//! watch (Pods on this node, CRD-gated EndpointPolicies)
//!   └─► driver: Event ─► Index (record ─► fold) ─► fscheck (lstat) ─► render ─► Snapshot
//!                          │ store (--state-dir)                                  │
//!                          ▼                                                      ▼
//!                  replay at boot                          xds: Renderer ─► ADS server ─► Envoy
//! ```
//!
//! Pure (no I/O, no async): [`record`] (the only fields the fold needs, extracted from API
//! objects), [`fold`] (per-pod precedence: annotation, even invalid, over policy over TCP; the
//! tie-break), [`index`] (incremental: a pod event re-renders one pod, a policy event only its
//! service's pods, a resync nothing, a relist equals a fresh build), [`names`] (namespace-qualified
//! Envoy names), [`render`] (delivery map to xDS input), [`plan`] (offline `aether-agent plan`; only
//! its `read_yaml` and `command` read files and print),
//! [`xds::resources`] (Envoy protos, content-hash versions), [`fallback`] (the one vocabulary of
//! TCP-fallback reasons: label, Event reason, note detail, remedy), [`pod_events`] (which pod gets
//! a fallback Event, once per cause).
//!
//! I/O: [`fscheck`] (symlink refusal), [`store`] (state dir), [`cni`] (netns records),
//! [`runtime`] (pod netns from the container runtime over CRI),
//! [`watch`] (kube-runtime watchers), [`driver`] (the reconcile loop), [`xds::server`] (ADS,
//! ACK/NACK tracking, connected streams), [`xds::readiness`] (is Envoy caught up: pure),
//! [`recorder`] (the pod Event task), [`metrics`] and [`admin`] (`/healthz`, `/readyz`,
//! `/metrics`), [`shutdown`] (which socket files to remove at exit: pure decisions, then
//! `lstat`/unlink), [`agent`] (`run`), [`startup`] (`run` from its flags: the tokio runtime, the
//! exit code), [`cli`] (the command line, and [`cli::dispatch`] to the subcommand), [`logging`].

#![forbid(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod cli;
pub mod cni;
pub mod driver;
pub mod fallback;
pub mod fold;
pub mod fscheck;
pub mod index;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod pod_events;
pub mod record;
pub mod recorder;
pub mod render;
pub mod runtime;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod watch;
pub mod xds;

pub use fallback::TcpReason;
pub use fold::{Delivery, Settings, Source};
pub use index::{Change, Conflict, DeliveryMap, Index, PodDelivery};
pub use record::{PodKey, PodRecord, PolicyRecord, RecordError};
