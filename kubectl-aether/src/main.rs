//! `kubectl-aether`: the kubectl plugin binary (`kubectl aether ...` once it is on the PATH).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    kubectl_aether::run::run(kubectl_aether::cli::Cli::parse())
}
