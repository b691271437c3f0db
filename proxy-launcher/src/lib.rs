//! `aether-proxy-launcher`: PID 1 of the node proxy container. It starts Envoy as a hot restart of
//! the node's running Envoy, so replacing the proxy pod (a rollout, a `helm upgrade`, a deleted
//! pod) hands the listening sockets over and refuses no connection (docs/design-notes.md,
//! "Handing the node proxy over").
//!
//! Pure decisions in [`epoch`] (which epoch to start), [`serving`] (what to do meanwhile) and
//! [`readiness`] (is the serving Envoy still serving); I/O in [`state_dir`] (the node's locks and
//! records), [`shm`] (Envoy's shared memory flag), [`admin`] (Envoy's admin, on its Unix socket),
//! [`envoy`] (the binary), [`marker`] (readiness), and the loop in [`supervise`].

pub mod admin;
pub mod cli;
pub mod envoy;
pub mod epoch;
pub mod marker;
pub mod readiness;
pub mod serving;
pub mod shm;
pub mod state_dir;
pub mod supervise;
