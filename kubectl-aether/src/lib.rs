//! `kubectl aether`: a kubectl plugin for aether's operators (docs/kubectl-plugin.md).
//!
//! - `why pod/NAME`: what the node agent actually decided for a pod ([`why`]), read live from the
//!   agent's admin port through the API server's pod proxy, else the offline fold, labelled.
//! - `validate -f FILE...`: the admission webhook's decision offline (`aether_controller::offline`).
//! - `budget`: the socket-value arithmetic ([`budget`], `aether_crds::udspath::Budget`).
//! - `completion bash|zsh|fish`.
//!
//! Modules: [`cli`] (flags), [`cluster`] (kubeconfig → client), [`why`] (the live read and the
//! offline fold), [`answer`] (what `why` prints), [`budget`], [`output`] (`-o text|json|yaml`),
//! [`run`] (dispatch and exit codes). `docs/kubectl-plugin.md` shows the commands and outputs.

#![forbid(unsafe_code)]

pub mod answer;
pub mod budget;
pub mod cli;
pub mod cluster;
pub mod output;
pub mod run;
pub mod why;
