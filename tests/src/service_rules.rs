//! Whether kube-proxy (iptables mode) has programmed a Service's ClusterIP and port on a node
//! (its DNAT to the endpoints), read from `iptables-save` / `ip6tables-save`, so that a test sends
//! no traffic to a ClusterIP before then.
//!
//! Why it matters: a TCP SYN sent to a ClusterIP that has no rule yet leaves without DNAT, and the
//! kernel keeps the conntrack entry it made for it (state SYN_SENT, untranslated) for
//! `net.netfilter.nf_conntrack_tcp_timeout_syn_sent`, 120 s by default. Any later connection from
//! the same client that the kernel gives the same source port within those 120 s matches that
//! entry and is sent to the ClusterIP itself, untranslated, however long the rule has existed:
//! on the test node (where the Service CIDR is on-link) it waits for an ARP answer nobody gives
//! and fails after about 3 s (EHOSTUNREACH), elsewhere it is lost and times out. With 50 new
//! connections a second, Linux reuses a source port within seconds to a minute (it picks ports
//! with a random stride), so one SYN sent before the rule (or as kube-proxy replaces a Service's
//! REJECT by its DNAT, see [`programs`]) is enough for a later minute of load to lose requests. Kubernetes knows this as
//! kubernetes/kubernetes#48719 and #101607 (kube-proxy does not delete stale TCP conntrack
//! entries); docs/install.md, "Checked on a real node", has the capture.

use std::net::SocketAddr;
use std::time::Duration;

use crate::node::run;

/// How long [`wait_programmed`] waits: kube-proxy syncs within a second of an EndpointSlice
/// change (its `minSyncPeriod`) on an idle node, and much later on a busy 2-core one.
pub const WAIT: Duration = Duration::from_secs(120);

/// True when `rules` (the output of `iptables-save`, or `ip6tables-save` for an IPv6 `target`)
/// holds kube-proxy's nat-table rule for `target`'s address and port, such as
/// `-A KUBE-SERVICES -d 10.96.0.1/32 ... --dport 443 -j KUBE-SVC-...` (`/128` for IPv6): the
/// Service has endpoints and its connections are translated. The filter table's REJECT for a Service without endpoints does not
/// count: kube-proxy replaces it with the nat rule once endpoints come, and a SYN sent as it does
/// can pass neither (seen on the test node: one untranslated SYN between the refused ones and the
/// first translated one, 20 ms later). Addresses are matched as the tools print them (IPv6 in its
/// compressed form, as Rust prints it too).
pub fn programs(rules: &str, target: SocketAddr) -> bool {
    let prefix = if target.is_ipv4() { 32 } else { 128 };
    let dst = format!("{}/{prefix}", target.ip());
    let dport = target.port().to_string();
    let mut table = "";
    rules.lines().any(|l| {
        if let Some(name) = l.strip_prefix('*') {
            table = name.trim();
            return false;
        }
        let words: Vec<&str> = l.split_whitespace().collect();
        let has = |flag: &str, value: &str| words.windows(2).any(|w| w == [flag, value]);
        table == "nat" && words.starts_with(&["-A", "KUBE-SERVICES"]) && has("-d", &dst) && has("--dport", &dport)
    })
}

/// The command that prints the rules [`programs`] reads for `target`'s family.
pub fn save_command(target: SocketAddr) -> &'static str {
    if target.is_ipv4() { "iptables-save" } else { "ip6tables-save" }
}

/// How many of the conntrack entries in `listed` (the output of `conntrack -L -p tcp`, one entry
/// per line: the original tuple's `src= dst= sport= dport=`, then the reply tuple's) go to
/// `target` untranslated: original destination `target`, reply source `target`'s address (a
/// translated entry's reply comes from the endpoint). Each one sends a connection that reuses its
/// source port to the ClusterIP itself (see the module's doc).
pub fn untranslated(listed: &str, target: SocketAddr) -> usize {
    let ip = target.ip().to_string();
    let port = target.port().to_string();
    listed
        .lines()
        .filter(|l| {
            let field =
                |name: &str| -> Vec<&str> { l.split_whitespace().filter_map(|w| w.strip_prefix(name)).collect() };
            let (dst, dport, src) = (field("dst="), field("dport="), field("src="));
            dst.first() == Some(&ip.as_str())
                && dport.first() == Some(&port.as_str())
                && src.get(1) == Some(&ip.as_str())
        })
        .count()
}

/// The untranslated entries ([`untranslated`]) for `target` in this process's network namespace,
/// read with `conntrack -L` (conntrack-tools; root).
///
/// # Errors
/// When conntrack fails to run.
pub fn untranslated_here(target: SocketAddr) -> anyhow::Result<usize> {
    let family = if target.is_ipv4() { "ipv4" } else { "ipv6" };
    Ok(untranslated(&run("conntrack", &["-L", "-f", family, "-p", "tcp"])?, target))
}

/// Waits until the rules that `save` prints [`programs`] `target`, checking every 200 ms up to
/// [`WAIT`]. `save` runs the command it is given ([`save_command`], no arguments) where the client
/// will run: the host, or a node's namespaces.
///
/// # Errors
/// When no rule comes within [`WAIT`] (naming `target`, with `save`'s last error if it failed).
pub fn wait_programmed(save: impl Fn(&str) -> anyhow::Result<String>, target: SocketAddr) -> anyhow::Result<()> {
    crate::eventually(&format!("kube-proxy's rule for Service {target}"), WAIT, || {
        Ok(programs(&save(save_command(target))?, target))
    })
}

/// [`wait_programmed`] on this machine's own rules (the single node's kube-proxy runs in the host's
/// namespaces).
///
/// # Errors
/// As [`wait_programmed`].
pub fn wait_programmed_here(target: SocketAddr) -> anyhow::Result<()> {
    wait_programmed(|cmd| run(cmd, &[]), target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "\
*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.7.9/32 -p tcp -m comment --comment \"default/empty:http has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.200.53/32 -p tcp -m comment --comment \"default/hdir:http cluster IP\" -m tcp --dport 8080 -j KUBE-SVC-ABCDEF
-A KUBE-SVC-ABCDEF -d 10.96.1.1/32 -p tcp -m tcp --dport 9090 -j KUBE-SEP-X
-A KUBE-SERVICES -d fd00:10:96::2a/128 -p tcp -m tcp --dport 8080 -j KUBE-SVC-V6
COMMIT
";

    #[test]
    fn a_service_with_endpoints_is_programmed_one_without_is_not() {
        assert!(programs(SAVED, "10.96.200.53:8080".parse().unwrap()));
        assert!(programs(SAVED, "[fd00:10:96::2a]:8080".parse().unwrap()));
        assert!(!programs(SAVED, "10.96.7.9:80".parse().unwrap()), "the filter table's REJECT does not count");
    }

    #[test]
    fn another_port_another_address_or_another_chain_is_not() {
        assert!(!programs(SAVED, "10.96.200.53:80".parse().unwrap()), "port");
        assert!(!programs(SAVED, "10.96.200.5:8080".parse().unwrap()), "a prefix of the address");
        assert!(!programs(SAVED, "10.96.1.1:9090".parse().unwrap()), "only KUBE-SERVICES counts");
        assert!(!programs(SAVED, "10.96.200.53:808".parse().unwrap()), "a prefix of the port");
        assert!(!programs("", "10.96.200.53:8080".parse().unwrap()));
    }

    #[test]
    fn only_an_untranslated_entry_to_the_target_counts() {
        // As conntrack -L prints them (captured on the test node): one sent before the rule, one
        // translated to the pod, one to another port.
        let listed = "\
tcp      6 117 SYN_SENT src=10.244.77.1 dst=10.96.200.53 sport=51126 dport=8080 [UNREPLIED] src=10.96.200.53 dst=10.244.77.1 sport=8080 dport=51126 mark=0 use=1
tcp      6 86399 ESTABLISHED src=10.244.77.1 dst=10.96.200.53 sport=51132 dport=8080 src=10.244.77.8 dst=10.244.77.1 sport=8080 dport=51132 [ASSURED] mark=0 use=1
tcp      6 117 SYN_SENT src=10.244.77.1 dst=10.96.200.53 sport=51140 dport=80 [UNREPLIED] src=10.96.200.53 dst=10.244.77.1 sport=80 dport=51140 mark=0 use=1
";
        assert_eq!(untranslated(listed, "10.96.200.53:8080".parse().unwrap()), 1);
        assert_eq!(untranslated(listed, "10.96.200.53:80".parse().unwrap()), 1);
        assert_eq!(untranslated(listed, "10.96.200.5:8080".parse().unwrap()), 0);
        assert_eq!(untranslated("", "10.96.200.53:8080".parse().unwrap()), 0);
    }

    #[test]
    fn the_save_command_follows_the_family() {
        assert_eq!(save_command("10.0.0.1:1".parse().unwrap()), "iptables-save");
        assert_eq!(save_command("[::1]:1".parse().unwrap()), "ip6tables-save");
    }
}
