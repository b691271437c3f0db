//! A network namespace made for the bench ([`Netns`]): the stand-in for a pod's netns in
//! section 4b ([`crate::inbound`]). Needs root.

use std::process::{Command, Stdio};

use anyhow::{Context, ensure};

/// A network namespace made for the bench (`ip netns add`, loopback up), deleted when dropped:
/// a pod's netns without the pod. Drop it after the processes started in it.
pub struct Netns {
    name: String,
}

impl Netns {
    /// `ip netns add NAME` and `ip link set lo up` in it. Needs root (CAP_SYS_ADMIN).
    pub fn add(name: &str) -> anyhow::Result<Netns> {
        let ip = |args: &[&str]| -> anyhow::Result<()> {
            let out = Command::new("ip").args(args).stdin(Stdio::null()).output().context("running ip")?;
            ensure!(
                out.status.success(),
                "ip {} failed (the inbound row needs root and iproute2): {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(())
        };
        ip(&["netns", "add", name])?;
        // From here on the guard deletes it, also when bringing lo up fails.
        let ns = Netns { name: name.to_owned() };
        ip(&["netns", "exec", name, "ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its bind mount: what a listener's `network_namespace_filepath` names.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `program` run inside it. `ip netns exec` execs `program` in place (no fork), so the child
    /// is the program itself and killing it (a `Proc` dropped) stops it.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
