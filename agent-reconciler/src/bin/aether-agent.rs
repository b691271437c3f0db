//! aether-agent entry point: parse flags, set up logging, run the subcommand
//! ([`aether_agent_reconciler::cli::dispatch`]).
//!
//! The process allocates through jemalloc ([`tikv_jemallocator`]), not glibc's malloc: the
//! agent holds ~10k pods' small records and renders, and a relist briefly holds a second copy of
//! them; glibc kept the freed copies resident as fragmented arena space, jemalloc returns them
//! to the OS (docs/benchmarks.md, section 3d, "The running agent's resident size per pod").

use std::process::ExitCode;

use aether_agent_reconciler::cli;
use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    cli.log.init();
    cli::dispatch(cli.command)
}
