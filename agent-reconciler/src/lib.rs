//! aether's node reconciler, embedded in `aether-agent` (proposal 034 Phases 1 and 1b, agent
//! side; DESIGN.md "What runs where").
//!
//! Its pure core is the four modules below: data types and functions only, with no I/O, no
//! async and no Kubernetes client. The watch drivers turn API objects into records and feed the
//! [`index::Index`]; the xDS layer renders the [`index::DeliveryMap`] snapshots it hands out.
//!
//! ```text
//! Pod ──PodRecord::from_pod──┐                         ┌─► Change (re-rendered pods, conflicts)
//!                            ├─► Index ─► fold::deliver ┤
//! EndpointPolicy ─PolicyRecord::from_policy─┘           └─► Arc<DeliveryMap> ─► xDS (names::*)
//! ```
//!
//! - [`record`]: [`record::PodRecord`] and [`record::PolicyRecord`], the only fields the fold
//!   needs, extracted by pure functions; serde-serializable for the state dir.
//! - [`fold`]: the per-pod precedence fold (annotation, even invalid, over policy over TCP), the
//!   policy tie-break, and [`fold::TcpReason`] tokens for every degradation.
//! - [`index`]: the incremental index; a pod event re-renders one pod, a policy event only the
//!   pods of its service, a resync nothing, and a relist equals a fresh build.
//! - [`names`]: namespace-qualified Envoy cluster names, unique and stable.

#![forbid(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod cli;
pub mod cni;
pub mod driver;
pub mod fold;
pub mod fscheck;
pub mod index;
pub mod names;
pub mod plan;
pub mod record;
pub mod render;
pub mod store;
pub mod watch;
pub mod xds;

pub use fold::{Delivery, Settings, Source, TcpReason};
pub use index::{Change, Conflict, DeliveryMap, Index, PodDelivery};
pub use record::{PodKey, PodRecord, PolicyRecord, RecordError};
