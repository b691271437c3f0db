//! One run of the oha load generator (`--oha`) for `--secs` seconds, JSON output parsed into an
//! [`OhaRun`]: from this machine ([`oha`]), inside a [`Netns`] ([`oha_in`]), or through a wrapper
//! that execs it ([`oha_with`], e.g. `nsenter` into a node).

use std::process::{Command, Stdio};

use anyhow::{Context, ensure};

use crate::Opts;
use crate::netns::Netns;
use crate::stats::{self, OhaRun};

/// One oha run; `args` come before the URL.
pub fn oha(opts: &Opts, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
    oha_in(opts, None, args, url)
}

/// One oha run, inside `netns` when given.
pub fn oha_in(opts: &Opts, netns: Option<&Netns>, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
    let cmd = match netns {
        Some(ns) => ns.command(&opts.oha),
        None => Command::new(&opts.oha),
    };
    oha_with(opts, cmd, args, url)
}

/// One oha run with `cmd`, which runs oha (or a wrapper that execs it, as `nsenter`).
pub fn oha_with(opts: &Opts, mut cmd: Command, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
    let out = cmd
        .args(["--no-tui", "--output-format", "json", "-z", &format!("{}s", opts.secs)])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", opts.oha.display()))?;
    ensure!(out.status.success(), "oha {args:?} {url} failed: {}", String::from_utf8_lossy(&out.stderr));
    stats::parse_oha(&String::from_utf8_lossy(&out.stdout))
}
