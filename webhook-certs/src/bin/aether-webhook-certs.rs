//! `aether-webhook-certs`: mints the webhook's CA and serving certificate; `bootstrap` is the
//! chart's hook Job (Secret + caBundle), `cleanup` its post-delete Job (deletes that Secret).
//! Parses the flags, sets up logging, runs the subcommand ([`aether_webhook_certs::cli::dispatch`]).

use aether_webhook_certs::cli;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    cli::dispatch(cli::Cli::parse().command)
}
