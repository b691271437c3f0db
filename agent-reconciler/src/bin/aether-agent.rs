//! aether-agent entry point: parse flags, set up logging, run the subcommand
//! ([`aether_agent_reconciler::cli::dispatch`]).

use std::process::ExitCode;

use aether_agent_reconciler::{cli, logging};
use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.log_format, cli.log_level);
    cli::dispatch(cli.command)
}
