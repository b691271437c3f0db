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
        Command::Install(i) => match install(&i.to) {
            Ok(dest) => {
                println!("installed {}", dest.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cannot install into {}: {e}", i.to.display());
                ExitCode::FAILURE
            }
        },
        Command::Run(r) => {
            cli.log.init();
            if let Some(s) = r.foreign_wait_seconds {
                tracing::warn!(
                    "--foreign-wait-seconds={s} is ignored: beside an Envoy outside the hand-over the launcher \
                     stands by until it exits, then starts at once"
                );
            }
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
                    owner: r.owner,
                }),
                admin: r.admin,
                foreign_admins: r.foreign_admin,
                marker: r.marker,
                live_timeout: Duration::from_secs(r.live_timeout_seconds),
                crash_restarts: r.crash_restarts,
            })
        }
    }
}

/// Copies the running binary to `<dir>/aether-proxy-launcher` (a temporary file, then rename).
fn install(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let dest = dir.join("aether-proxy-launcher");
    let tmp = dir.join(".aether-proxy-launcher.tmp");
    std::fs::copy(std::env::current_exe()?, &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &dest)?;
    Ok(dest)
}
