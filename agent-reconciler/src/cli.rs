//! The command line of `aether-agent`: the flags in [`flags`] (re-exported here), and
//! [`dispatch`], which runs the parsed subcommand. The subcommands import their flags from
//! [`flags`], not from here, so this module is the only one that names both.

use std::process::ExitCode;

pub mod flags;

pub use flags::{AgentSocketHelp, Cli, Command, DeliveryArgs, MAX_CLUSTERS_RANGE, Output, PlanArgs, RunArgs};

pub use crate::logging::{LogFormat, LogLevel};

/// Runs a subcommand to its end: `run` in [`crate::startup::run`], `plan` in
/// [`crate::plan::command`], `probe` in [`aether_serve_policy::probe::command`]. Returns the
/// process exit code.
pub fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => crate::startup::run(*args),
        Command::Plan(args) => crate::plan::command(&args),
        Command::Probe(args) => aether_serve_policy::probe::command(&args),
    }
}
