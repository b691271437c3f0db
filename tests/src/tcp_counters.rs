//! The kernel's TCP counters of a network namespace (`nstat -asz`), and the few that tell a lost
//! request's cause apart: a SYN dropped at a full or closing listener, a retransmission, a reset
//! sent or received, an abort with unread data. The continuity tests print their deltas over an
//! event beside what the load saw, so a failure leaves the kernel's side of it in the log.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Counter name (`TcpRetransSegs`, `TcpExtListenDrops`, ...) to its absolute value.
pub type Counters = BTreeMap<String, u64>;

/// The counters printed, in this order: SYNs dropped at a listener (its accept queue full, or it
/// closing), SYNs and segments retransmitted, resets sent, connections reset or failed while
/// being opened, aborts with data unread or at close, retransmission timeouts.
pub const WATCHED: [&str; 10] = [
    "TcpExtListenDrops",
    "TcpExtListenOverflows",
    "TcpExtTCPSynRetrans",
    "TcpRetransSegs",
    "TcpOutRsts",
    "TcpEstabResets",
    "TcpAttemptFails",
    "TcpExtTCPAbortOnData",
    "TcpExtTCPAbortOnClose",
    "TcpExtTCPTimeouts",
];

/// The `Tcp*` counters of `nstat -asz` output (`<name> <value> <rate>` per line).
pub fn parse(nstat: &str) -> Counters {
    nstat
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next().filter(|n| n.starts_with("Tcp"))?;
            Some((name.to_owned(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// The counters of the network namespace at `netns` (a bind-mounted namespace file such as
/// `/run/netns/<name>`, entered with `nsenter --net`), or of this process's own with `None`.
/// Needs root for another namespace. nstat's history file is left alone (`-s`).
///
/// # Errors
/// When nstat (or nsenter) fails to run, with its stderr.
pub fn read(netns: Option<&Path>) -> anyhow::Result<Counters> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.display())).args(["--", "nstat", "-asz"]);
            c
        }
        None => {
            let mut c = Command::new("nstat");
            c.arg("-asz");
            c
        }
    };
    let out = cmd.stdin(Stdio::null()).output().context("running nstat")?;
    if !out.status.success() {
        bail!("nstat -asz in {netns:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

/// The [`WATCHED`] counters' growth from `before` to `after`: `TcpExtListenDrops +0, ...`.
pub fn deltas(before: &Counters, after: &Counters) -> String {
    WATCHED
        .iter()
        .map(|k| format!("{k} +{}", after.get(*k).unwrap_or(&0).saturating_sub(*before.get(*k).unwrap_or(&0))))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tcp_counters_are_read_and_deltas_name_each_watched_one() {
        let before = parse("#kernel\nIpInReceives 10 0.0\nTcpOutRsts 5 0.0\nTcpExtListenDrops 1 0.0\n");
        assert_eq!(before.len(), 2);
        let after = parse("TcpOutRsts 7 0.0\nTcpExtListenDrops 1 0.0\nTcpRetransSegs 3 0.0\n");
        let d = deltas(&before, &after);
        assert!(d.starts_with("TcpExtListenDrops +0, "), "{d}");
        assert!(d.contains("TcpOutRsts +2") && d.contains("TcpRetransSegs +3"), "{d}");
        assert_eq!(d.matches(", ").count(), WATCHED.len() - 1);
    }
}
