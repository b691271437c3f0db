//! The agent's pure core (docs/design-notes.md, "Agent", "Two layers"): everything the node
//! reconciler *decides*, with no I/O and no async runtime. The I/O shell
//! (`aether-agent-reconciler`: watches, the driver loop, the state dir, the on-disk check, the
//! container runtime, the xDS server, the admin port) feeds it facts and serves what it returns.
//!
//! ```text
//! record (API objects → the fields the fold needs)
//!   └─► index (incremental; per pod: fold ─► Delivery, + the node facts the shell gathered)
//!         └─► render (DeliveryMap + refusals ─► model::Snapshot) ─► the shell's xDS encoder
//! ```
//!
//! Modules: [`record`], [`settings`] (the node's configuration), [`fold`] (per-pod precedence:
//! annotation, even invalid, over policy over TCP), [`index`] (a pod event re-folds one pod, a
//! policy event only its service's pods, a relist equals a fresh build), [`admission`] (who holds
//! the node's clusters under `--max-clusters`), [`names`]
//! (namespace-qualified Envoy names), [`model`] (the xDS layer's input: cluster specs and their
//! validation), [`render`], [`refusal`] (why the on-disk check refused a socket),
//! [`fallback`] (the one vocabulary of TCP-fallback reasons), [`pod_events`] (which pod gets a
//! fallback Event, once per cause), [`reoffer`] (when a withdrawn inbound listener is offered
//! again), [`status`] (what the loop reports), [`plan`] (offline plan),
//! [`decision`] (one pod's decision as `kubectl aether why` shows it).
//!
//! Its dependency tree holds no tokio, hyper, tonic or kube client; `make lint` checks it.

#![forbid(unsafe_code)]

pub mod admission;
pub mod decision;
pub mod fallback;
pub mod fold;
pub mod index;
pub mod model;
pub mod names;
pub mod plan;
pub mod pod_events;
pub mod record;
pub mod refusal;
pub mod render;
pub mod reoffer;
pub mod settings;
pub mod status;

pub use fallback::TcpReason;
pub use fold::{Delivery, Settings, Source};
pub use index::{Change, Conflict, DeliveryMap, Index, PodDelivery};
pub use record::{PodKey, PodRecord, PolicyRecord, RecordError};
