//! `aether-proxy-launcher`: see the crate docs and `--help`.

use std::process::ExitCode;
use std::time::Duration;

use aether_proxy_launcher::cli::{Cli, Command};
use aether_proxy_launcher::envoy::Envoy;
use aether_proxy_launcher::marker;
use aether_proxy_launcher::supervise::{self, Config, HandOver};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Probe(p) => match marker::check(&p.marker, Duration::from_secs(p.max_age_seconds)) {
            Ok(line) => {
                println!("ready: {line}");
                ExitCode::SUCCESS
            }
            Err(why) => {
                println!("{why}");
                ExitCode::FAILURE
            }
        },
        Command::Run(r) => {
            aether_process::logging::init(cli.log_format, cli.log_level);
            let mut envoy = r.envoy.into_iter();
            let binary = envoy.next().expect("clap requires the Envoy command").into();
            supervise::run(Config {
                envoy: Envoy { binary, args: envoy.collect() },
                hot_restart: (!r.no_hot_restart).then(|| HandOver {
                    state_dir: r.state_dir,
                    shm_dir: r.shm_dir,
                    base_id: r.base_id,
                    parent_shutdown_seconds: r.parent_shutdown_seconds,
                    successor_wait: Duration::from_secs(r.successor_wait_seconds),
                    foreign_wait: Duration::from_secs(r.foreign_wait_seconds),
                }),
                admin: r.admin,
                marker: r.marker,
                live_timeout: Duration::from_secs(r.live_timeout_seconds),
                crash_restarts: r.crash_restarts,
            })
        }
    }
}
