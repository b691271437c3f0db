//! The API contract of aether's UDS delivery, shared by the controller's webhook, the offline
//! validator and the node agent. Pure: no I/O, no async, no
//! Kubernetes client.
//!
//! - [`policy`]: the `EndpointPolicy` CRD types (`config.aether.io/v1`).
//! - [`udspath`]: socket value grammar, the socket limits (sun_path budget or file system), and the
//!   host path resolver.
//! - [`validate`]: the one decision every component uses for a policy.
//! - [`field_rules`]: the check of each spec field (garde validators), which that decision runs.
//! - [`rules`]: that decision bound to the configured pods dir and socket limit, built once at
//!   start-up.
//! - [`tiebreak`]: the one-policy-per-Service rule ([`tiebreak::resolve`]) and the mesh service key.
//! - [`pod`]: pod label and annotation keys.
//! - `cli` (feature `cli`): `--kubelet-pods-dir` and `--socket-limit` as clap flags, for the
//!   binaries.
//! - [`manifests`]: multi-document YAML text to JSON values (`List` expanded), for the offline tools.

pub mod chart;
#[cfg(feature = "cli")]
pub mod cli;
pub mod field_rules;
pub mod manifests;
pub mod pod;
pub mod policy;
pub mod rules;
pub mod tiebreak;
pub mod udspath;
pub mod validate;

pub use policy::{EndpointPolicy, EndpointPolicySpec, EndpointPolicyStatus, TargetRef};
pub use rules::Rules;
pub use udspath::{Budget, PodDirId, SocketError, SocketLimit, SocketPath};
pub use validate::{FieldViolation, Verdict, review};

/// The CustomResourceDefinition as YAML, exactly as `crdgen` and `aether-controller crd` print it.
///
/// # Panics
/// Never in practice: the CRD is a plain data structure that always serializes.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    yaml_serde::to_string(&EndpointPolicy::crd()).expect("a CRD always serializes to YAML")
}
