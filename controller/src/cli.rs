//! The command line of aether-controller: the flags in [`flags`] (re-exported here), and
//! [`dispatch`], which runs the parsed subcommand. The subcommands import their flags from
//! [`flags`], not from here, so this module is the only one that names both.

use std::process::ExitCode;

pub mod flags;

pub use flags::{
    AgentAccess, Cli, Command, ControllerSocketHelp, Output, PodsDirArg, RunArgs, ValidateArgs, VerifyArgs,
};

pub use crate::logging::{LogFormat, LogLevel};

/// Runs a subcommand to its end: `crd` here, `validate` in [`crate::offline::validate`], `run`
/// in [`crate::startup::run`], `verify-install` in [`crate::verify::run`], `probe` in
/// [`aether_serve_policy::probe::command`]. Returns the process exit code.
pub fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Crd => {
            print!("{}", aether_crds::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Validate(args) => crate::offline::validate(&args),
        Command::Run(args) => crate::startup::run(*args),
        Command::VerifyInstall(args) => crate::verify::run(&args),
        Command::Probe(args) => aether_serve_policy::probe::command(&args),
    }
}
