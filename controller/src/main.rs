//! aether-controller entry point: parse flags, set up logging, run the subcommand
//! ([`aether_controller::cli::dispatch`]).
//!
//! The process allocates through jemalloc ([`tikv_jemallocator`]), like `aether-agent`: under
//! admission load glibc's malloc/free were ~17 % of the webhook's self time (perf; `make bench`
//! section 2 measures the webhook against its floor).

use std::process::ExitCode;

use aether_controller::cli;
use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    cli.log.init();
    cli::dispatch(cli.command)
}
