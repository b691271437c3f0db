//! The processes the local sections start: a workspace binary next to `aether-bench`
//! ([`workspace_bin`]) and a child killed on drop with its log file ([`Proc`]): the release
//! `aether-controller`, `webhook-floor` and `uds-echo`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aether_tests::{ControlPlane, free_port, http_get_status};
use anyhow::{Context, bail, ensure};

/// A workspace binary next to this one (`target/release/NAME`: run.sh builds them all).
pub fn workspace_bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().context("aether-bench has no directory")?.join(name);
    ensure!(bin.is_file(), "{} is not built: run `cargo build --release --workspace --bins`", bin.display());
    Ok(bin)
}

/// A child process killed on drop, with its log file.
pub struct Proc {
    /// The process (its id for `/proc`, perf and signals).
    pub child: Child,
    /// Its stderr, quoted when it fails.
    pub log: PathBuf,
    /// The port it listens on (a free loopback port chosen for it).
    pub port: u16,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Starts `cmd` (stdin and stdout closed, stderr to `log`) listening on `port`.
    pub fn spawn(mut cmd: Command, log: PathBuf, port: u16) -> anyhow::Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(Proc { child, log, port })
    }

    /// Polls `ready` every 50 ms for at most 30 s; an error (with the log) if it exits first or
    /// is not ready by then.
    pub fn wait_until(&mut self, what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            if let Some(status) = self.child.try_wait()? {
                bail!("{what} exited ({status}): {}", std::fs::read_to_string(&self.log).unwrap_or_default());
            }
            ensure!(
                Instant::now() < deadline,
                "{what} not ready after 30 s: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The release `aether-controller run` with its TLS files in `certs` (the same flags as the
    /// harness's `Controller`), `KUBECONFIG` pointing at the bench's control plane (for a status
    /// writer, when the binary has one). `port` is the webhook port.
    pub fn controller(cp: &ControlPlane, certs: &Path) -> anyhow::Result<Proc> {
        let (port, admin) = (free_port(), free_port());
        let mut cmd = Command::new(workspace_bin("aether-controller")?);
        cmd.arg("run")
            .args(["--webhook-addr", &format!("127.0.0.1:{port}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
            .arg("--tls-dir")
            .arg(certs)
            .env("KUBECONFIG", cp.kubeconfig());
        let mut p = Proc::spawn(cmd, certs.join("controller.log"), port)?;
        p.wait_until("aether-controller", || http_get_status(admin, "/readyz") == Some(200))?;
        Ok(p)
    }

    /// `webhook-floor` on the same certificates.
    pub fn floor(certs: &Path) -> anyhow::Result<Proc> {
        let port = free_port();
        let mut cmd = Command::new(workspace_bin("webhook-floor")?);
        cmd.arg("--tls-dir").arg(certs).args(["--addr", &format!("127.0.0.1:{port}")]);
        let mut p = Proc::spawn(cmd, certs.join("floor.log"), port)?;
        p.wait_until("webhook-floor", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())?;
        Ok(p)
    }

    /// `uds-echo` on a Unix socket (`Ok(socket)`) or a TCP port.
    pub fn echo(dir: &Path, name: &str, socket: Option<&Path>) -> anyhow::Result<Proc> {
        let port = free_port();
        let mut cmd = Command::new(workspace_bin("uds-echo")?);
        match socket {
            Some(s) => cmd.arg("--socket").arg(s),
            None => cmd.args(["--tcp", &format!("127.0.0.1:{port}")]),
        };
        cmd.args(["--name", name]);
        let mut p = Proc::spawn(cmd, dir.join(format!("{name}.log")), port)?;
        match socket {
            Some(s) => p.wait_until(name, || std::os::unix::net::UnixStream::connect(s).is_ok())?,
            None => p.wait_until(name, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())?,
        }
        Ok(p)
    }
}
