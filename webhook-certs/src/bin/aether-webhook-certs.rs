//! `aether-webhook-certs`: mints the webhook's CA and serving certificate; `bootstrap` is the
//! chart's hook Job (Secret + caBundle), `cleanup` its post-delete Job (deletes that Secret).
//! Parses the flags, sets up logging, runs the subcommand ([`aether_webhook_certs::cli::dispatch`]).

use aether_webhook_certs::cli;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    cli.log.init();
    cli::dispatch(cli.command)
}
