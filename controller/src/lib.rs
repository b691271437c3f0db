//! aether-controller: the cluster-scoped half of aether's UDS delivery (docs/reference.md,
//! "`aether-controller`").
//!
//! - [`admission`]: AdmissionReview v1 parsing and the decision, dispatched by kind, with warnings.
//! - [`warnings`]: the admission warnings (other policy on the Service, missing Service, budget).
//! - [`status`]: the `Accepted` condition a policy should carry (GEP-713 reasons). Pure.
//! - [`status_writer`]: the status writer: reflectors shared with the webhook, the Controller,
//!   writes.
//! - [`lease`]: leader election on a Lease, so one replica writes status.
//! - [`webhook`]: `POST /validate` over axum (body cap, 400/413 answers).
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics` on a plain port.
//! - [`server`]: `run`, binding both listeners (TLS via rustls with the ring provider).
//! - [`startup`]: `run` from its flags: the status writer's kube configuration and Lease, the
//!   TLS files, the tokio runtime, the exit code.
//! - [`offline`]: `validate`, the same decision for YAML files.
//! - [`verify`]: `verify-install`, the install check `helm test` and the startup-check Job run.
//! - [`cli`]: the command line: its flags ([`cli::flags`]), and [`cli::dispatch`] to the
//!   subcommand.
//! - [`logging`]: `--log-format` and the log set-up.

pub mod admin;
pub mod admission;
pub mod cli;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod offline;
pub mod server;
pub mod startup;
pub mod status;
pub mod status_writer;
pub mod verify;
pub mod warnings;
pub mod webhook;
