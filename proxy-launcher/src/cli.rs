//! The command line.

use std::ffi::OsString;
use std::path::PathBuf;

use aether_process::logging::LogArgs;
use clap::{Parser, Subcommand};

use crate::admin::EnvoyAdmin;

/// PID 1 of the node proxy container: starts Envoy so that replacing the proxy pod hands its
/// listening sockets over (an Envoy hot restart across the two pods) and refuses no connection.
///
/// `run` validates Envoy's configuration (`--mode validate`), picks the restart epoch from the
/// node's state dir, starts Envoy with the hot restart flags added, and writes the readiness
/// marker once that Envoy serves (LIVE at its epoch). On SIGTERM it keeps a serving Envoy up until
/// a successor takes over (at most --successor-wait-seconds), and lets a handed-over Envoy finish
/// draining. `probe` is the kubelet's readiness check.
#[derive(Parser, Debug)]
#[command(name = "aether-proxy-launcher", version = aether_process::build_info::VERSION_LINE, about, long_about)]
pub struct Cli {
    /// --log-format and --log-level.
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run Envoy: `aether-proxy-launcher run [OPTIONS] -- envoy --config-path ... [ENVOY ARGS]`.
    Run(RunArgs),
    /// Readiness: exit 0 when the marker was refreshed within --max-age-seconds, else 1 with why.
    Probe(ProbeArgs),
    /// Copy this binary to `DIR/aether-proxy-launcher` (mode 0755): an initContainer of the
    /// agent's image installs it into an emptyDir the Envoy container runs it from.
    Install(InstallArgs),
}

/// `install`.
#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// The directory to copy the binary into (created if missing).
    #[arg(long)]
    pub to: PathBuf,
}

/// `run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The host directory shared by every proxy pod on the node (hostPath, on tmpfs): the start
    /// lock, the `alive.EPOCH` locks, the live-epoch record and Envoy's hot restart sockets.
    /// Root-only: the launcher makes it mode 0700 (files 0600) and refuses one root does not own.
    #[arg(long, default_value = "/run/aether-proxy")]
    pub state_dir: PathBuf,
    /// The directory that is every proxy pod's /dev/shm (the same host directory in each), where
    /// Envoy keeps its hot restart segment. Made root-only (0700; refused unless root owns it) at
    /// start, unless it is sticky (a host's own shared /dev/shm, mode 1777), which is left alone.
    #[arg(long, default_value = "/dev/shm")]
    pub shm_dir: PathBuf,
    /// Envoy's --base-id: the same on every proxy pod of the node; names the shared memory
    /// segment and the sockets. A change is a cold replacement.
    #[arg(long, default_value_t = 7391, value_parser = clap::value_parser!(u32).range(1..=400_000_000))]
    pub base_id: u32,
    /// After a successor took over, how long the old Envoy keeps its established connections
    /// (Envoy's --parent-shutdown-time-s), in seconds; then it exits and ends them.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub parent_shutdown_seconds: u32,
    /// On SIGTERM while this pod's Envoy serves: how long to keep serving for a successor pod to
    /// take over (a deleted pod's replacement), in seconds, before stopping Envoy cold. 0 stops at
    /// once.
    #[arg(long, default_value_t = 30)]
    pub successor_wait_seconds: u64,
    /// Which proxy DaemonSet this pod belongs to, as `<namespace>/<name>` (the chart passes its
    /// own). Recorded with the serving epoch: a launcher never takes over an Envoy recorded with
    /// another owner (a second release on the node, or this one before a namespace move, which
    /// would leave that release's pod superseded); it stands by, Ready without serving, until that
    /// Envoy exits and the other owner's launchers are gone, then starts cold. Each launcher holds
    /// its owner's lease (`owner.<hash>` in the state dir) for its whole run, and the last one
    /// removes it at a clean exit; a lease left unheld (a killed container) counts for 10
    /// minutes. Unset, or a record without one (releases up to 0.10.0), matches every owner.
    /// Ignored with --no-hot-restart (no record is kept).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_owner)]
    pub owner: Option<String>,
    /// Deprecated and ignored (accepted so that older command lines still parse). Beside an Envoy
    /// that takes no part in the hand-over (an older release's) the launcher now stands by without
    /// bound: the pod is Ready without serving until that Envoy exits, then Envoy starts cold at
    /// once. Starting cold beside it would fail every listener's bind.
    #[arg(long, value_name = "SECONDS")]
    pub foreign_wait_seconds: Option<u64>,
    /// How long a started Envoy may take to serve (admin state LIVE at its epoch), in seconds,
    /// before it is killed and counted as a failed start.
    #[arg(long, default_value_t = 300)]
    pub live_timeout_seconds: u64,
    /// Unexpected Envoy exits restarted in process within 10 minutes; one more and the launcher
    /// exits 1 (the kubelet's restart back-off takes over).
    #[arg(long, default_value_t = 5)]
    pub crash_restarts: usize,
    /// Envoy's admin, as the bootstrap binds it: an absolute path is a Unix socket
    /// (admin.address.pipe; the chart's is /run/aether/envoy/admin.sock, mode 0600), else IP:PORT.
    /// A Unix socket keeps the admin, which can stop every listener of the node, out of reach of
    /// port-forwards (they dial TCP only) and of non-root processes: the launcher makes its
    /// directory root's and mode 0700 before Envoy starts, holds it (shared flock) while its Envoy
    /// runs, and the node's last launcher removes the socket and the directory when it stops. The launcher waits there for its Envoy
    /// to be LIVE, and refreshes the readiness marker only while Envoy says there that it serves
    /// (LIVE, no listener stopped).
    #[arg(long, default_value = "/run/aether/envoy/admin.sock")]
    pub admin: EnvoyAdmin,
    /// Another admin address (same syntax; repeatable) where an Envoy outside this hand-over may
    /// answer: the chart passes 127.0.0.1:<proxy.adminPort>, where Envoys of releases up to 0.10.0
    /// have theirs. Beside such an Envoy (or one answering on --admin) with no epoch of ours
    /// running, the launcher stands by instead of starting one that would fail every bind.
    #[arg(long, value_name = "ADDR")]
    pub foreign_admin: Vec<EnvoyAdmin>,
    /// The readiness marker (a pod-local path, e.g. on an emptyDir).
    #[arg(long)]
    pub marker: PathBuf,
    /// Switch the hand-over off: Envoy runs with --disable-hot-restart and SIGTERM stops it at
    /// once (the DaemonSet must then replace pods delete-first).
    #[arg(long)]
    pub no_hot_restart: bool,
    /// The Envoy binary and its arguments (without the hot restart flags, which are added per
    /// epoch: --restart-epoch, --base-id, --socket-path, --socket-mode, --parent-shutdown-time-s,
    /// --skip-hot-restart-on-no-parent, --skip-hot-restart-parent-stats).
    #[arg(last = true, required = true, num_args = 1..)]
    pub envoy: Vec<OsString>,
}

/// `--owner`: `<namespace>/<name>`, each a Kubernetes object name (RFC 1123: at most 253
/// lowercase alphanumerics, `-` and `.`).
fn parse_owner(s: &str) -> Result<String, String> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 253
            && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match s.split_once('/') {
        Some((ns, name)) if name_ok(ns) && name_ok(name) => Ok(s.to_owned()),
        _ => Err(format!("{s:?}: expected <namespace>/<name>, each lowercase alphanumerics, '-' or '.' (at most 253)")),
    }
}

/// `probe`.
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The readiness marker `run` writes.
    #[arg(long)]
    pub marker: PathBuf,
    /// The marker's greatest age, in seconds.
    #[arg(long, default_value_t = 5)]
    pub max_age_seconds: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = ["aether-proxy-launcher", "run", "--marker=/m"].iter().chain(args).chain(&["--", "envoy"]);
        Cli::try_parse_from(argv).map(|c| match c.command {
            Command::Run(r) => r,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn the_owner_is_a_namespace_and_a_name() {
        assert_eq!(
            run(&["--owner=aether-system/aether-proxy"]).unwrap().owner.as_deref(),
            Some("aether-system/aether-proxy")
        );
        assert_eq!(run(&[]).unwrap().owner, None);
        for bad in ["aether-proxy", "/aether-proxy", "ns/", "Team/aether-proxy", "ns/a/b"] {
            let e = run(&[&format!("--owner={bad}")]).unwrap_err().to_string();
            assert!(e.contains("expected <namespace>/<name>"), "{bad}: {e}");
        }
    }
}
