//! The Envoy binary: what it is (`--version`, `--hot-restart-version`), whether a configuration is
//! valid (`--mode validate`, which does no hot restart and so cannot disturb the running Envoy),
//! and the command line of one epoch.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::epoch::{Build, Version};

/// Errors of asking the binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// It could not be run.
    #[error("cannot run {binary}: {source}")]
    Run {
        /// The binary.
        binary: String,
        /// Why.
        source: std::io::Error,
    },
    /// `--version` printed no release number.
    #[error("{binary} --version printed no release number: {output:?}")]
    Version {
        /// The binary.
        binary: String,
        /// What it printed.
        output: String,
    },
    /// `--mode validate` rejected the configuration.
    #[error("Envoy rejects its configuration (--mode validate, {status}): {output}")]
    Invalid {
        /// Its exit status.
        status: String,
        /// The last lines it printed.
        output: String,
    },
}

/// The Envoy command: the binary and the arguments the chart gives it (without the hot restart
/// flags, which the launcher adds per epoch).
#[derive(Debug, Clone)]
pub struct Envoy {
    /// The binary (a name is looked up on `PATH`).
    pub binary: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// Hot restart settings shared by every epoch on the node.
#[derive(Debug, Clone)]
pub struct HotRestart {
    /// `--base-id`.
    pub base_id: u32,
    /// `--socket-path`: the hot restart sockets' path prefix in the node's state dir.
    pub socket_path: PathBuf,
    /// `--parent-shutdown-time-s`: how long a parent drains after its child took over, in seconds.
    pub parent_shutdown_seconds: u32,
}

/// Runs `binary` with `args`: its exit status and what it printed (stdout, then stderr).
fn run<S: AsRef<std::ffi::OsStr>>(binary: &Path, args: &[S]) -> Result<(std::process::ExitStatus, String), Error> {
    let out = Command::new(binary)
        .args(args)
        .output()
        .map_err(|source| Error::Run { binary: binary.display().to_string(), source })?;
    Ok((out.status, format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
}

fn output(binary: &Path, args: &[&str]) -> Result<String, Error> {
    run(binary, args).map(|(_, text)| text)
}

/// The release number in `envoy --version`'s line (`envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`).
pub fn parse_version(line: &str) -> Option<Version> {
    let after = line.split("version:").nth(1)?;
    Version::parse(after.trim().split('/').nth(1)?)
}

impl Envoy {
    /// What the binary is. `base_id` is the one this launcher runs with.
    pub fn build(&self, base_id: u32) -> Result<Build, Error> {
        let v = output(&self.binary, &["--version"])?;
        let version = parse_version(&v)
            .ok_or_else(|| Error::Version { binary: self.binary.display().to_string(), output: v.trim().into() })?;
        let hr = output(&self.binary, &["--hot-restart-version"])?;
        let hr = hr.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("").to_owned();
        let hot_restart_version = (!hr.is_empty() && hr != "disabled").then_some(hr);
        Ok(Build { version, hot_restart_version, base_id })
    }

    /// `envoy --mode validate <args>`: Ok when Envoy accepts the configuration.
    pub fn validate(&self) -> Result<(), Error> {
        let args: Vec<std::ffi::OsString> =
            self.args.iter().cloned().chain(["--mode".into(), "validate".into()]).collect();
        let (status, text) = run(&self.binary, &args)?;
        if status.success() {
            return Ok(());
        }
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        Err(Error::Invalid {
            status: status.to_string(),
            output: tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
        })
    }

    /// The command of one epoch. `hot_restart` `None`: `--disable-hot-restart` (the hand-over is
    /// switched off).
    pub fn command(&self, epoch: u32, hot_restart: Option<&HotRestart>) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(&self.args);
        match hot_restart {
            None => {
                cmd.arg("--disable-hot-restart");
            }
            Some(hr) => {
                cmd.arg("--restart-epoch").arg(epoch.to_string());
                cmd.arg("--base-id").arg(hr.base_id.to_string());
                cmd.arg("--socket-path").arg(&hr.socket_path);
                cmd.args(["--socket-mode", "600"]);
                // If the parent exits between our decision and Envoy's first message to it, start
                // cold instead of aborting.
                cmd.arg("--skip-hot-restart-on-no-parent");
                // No stats RPC after the take-over: the only message left is the final Terminate.
                cmd.arg("--skip-hot-restart-parent-stats");
                cmd.arg("--parent-shutdown-time-s").arg(hr.parent_shutdown_seconds.to_string());
            }
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_number_is_read_from_the_version_line() {
        assert_eq!(
            parse_version("envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL"),
            Some(Version(1, 40, 0))
        );
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn each_epoch_gets_the_hot_restart_flags_or_none() {
        let e = Envoy { binary: "envoy".into(), args: vec!["-c".into(), "/etc/envoy/envoy.yaml".into()] };
        let hr = HotRestart { base_id: 7391, socket_path: "/run/aether-proxy/hr".into(), parent_shutdown_seconds: 60 };
        let args = |c: Command| c.get_args().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        assert_eq!(
            args(e.command(3, Some(&hr))),
            "-c /etc/envoy/envoy.yaml --restart-epoch 3 --base-id 7391 --socket-path /run/aether-proxy/hr \
             --socket-mode 600 --skip-hot-restart-on-no-parent --skip-hot-restart-parent-stats \
             --parent-shutdown-time-s 60"
        );
        assert_eq!(args(e.command(0, None)), "-c /etc/envoy/envoy.yaml --disable-hot-restart");
    }
}
