//! Section 7 of `make bench` (docs/benchmarks.md, "7. Cross-node"):
//! delivery over a pod's socket against delivery over TCP, seen from a client on another node:
//! what moving the last hop from TCP to the socket does to a cross-node call's latency, on two
//! real nodes (`aether_tests::nodes::RealNodes`: kubelet, containerd, kube-proxy per node, the
//! charts installed with helm).
//!
//! Two Deployments of the same `uds-echo` code run on `aether-node-2`: `uds` on its Unix socket
//! (annotated: the node's Envoy binds the inbound listener in the pod's netns and dials the socket)
//! and `tcp` on TCP 8080 (not managed: no Envoy in the path). oha runs in `aether-node-1`'s
//! network namespace and sends GETs to each Service's ClusterIP (kube-proxy DNAT, then the node
//! network to node 2), the two sides alternating. Needs root, like the multi-node suite.

use std::process::{Command, Stdio};

use aether_tests::node::{README_NODE_NAMESPACE, aether_chart_args, release_namespace_command};
use aether_tests::nodes::{ClusterNode, RealNodes, app};
use aether_tests::{eventually, repo_root};
use anyhow::{Context, ensure};

use crate::oha::oha_with;
use crate::stats::{OhaRun, Spread, md_table, ratio, show_count, show_ratio, show_secs};
use crate::{Opts, Report};

const SERVER_NODE: &str = "aether-node-2";
const CLIENT_NODE: &str = "aether-node-1";

/// `oha` run in `node`'s network namespace (`nsenter -n` execs it in place).
fn oha_on(opts: &Opts, node: &ClusterNode, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
    let mut cmd = Command::new("nsenter");
    cmd.args(["-t", &node.pid.to_string(), "-n", "--"]).arg(&opts.oha);
    oha_with(opts, cmd, args, url)
}

pub fn section(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
    let nodes = RealNodes::up(2).context("two real nodes (AETHER_NODES=2 tests/harness/node.sh up)")?;
    let crds = repo_root().join("charts/aether-crds");
    nodes.helm(&["install", "aether-crds", crds.to_str().context("path")?, "--wait"])?;
    let kube = nodes.kube();
    kube.ok(&release_namespace_command("aether-system"))?;
    let node_ns = format!("daemonset.namespace={README_NODE_NAMESPACE}");
    let args = aether_chart_args("install", "aether", "aether-system", &[&node_ns])?;
    nodes.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    kube.apply(&app("uds").annotated().only_on_node(SERVER_NODE).deployment_manifest(1))?;
    kube.apply(&app("tcp").over_tcp().only_on_node(SERVER_NODE).deployment_manifest(1))?;
    for d in ["deployment/uds", "deployment/tcp"] {
        kube.ok(&["rollout", "status", "-n", "default", d, "--timeout=180s"])?;
    }
    let from = nodes.node(CLIENT_NODE)?;
    let mut urls = Vec::new();
    for (name, over) in [("uds", "over unix:"), ("tcp", "over tcp:")] {
        let ip = kube.ok(&["get", "service", "-n", "default", name, "-o", "jsonpath={.spec.clusterIP}"])?;
        let url = format!("http://{}:8080/x", ip.trim());
        eventually(&format!("{url} answers {over} from {CLIENT_NODE}"), std::time::Duration::from_secs(60), || {
            let out = Command::new("nsenter")
                .args(["-t", &from.pid.to_string(), "-n", "--", "curl", "-s", "-m", "2", &url])
                .stdin(Stdio::null())
                .output()?;
            Ok(String::from_utf8_lossy(&out.stdout).contains(over))
        })?;
        urls.push(url);
    }

    let cells: [(&str, Vec<String>); 3] = [
        ("1 keep-alive connection", vec!["-c".into(), "1".into()]),
        ("32 keep-alive connections", vec!["-c".into(), "32".into()]),
        ("8 clients, a new connection per request", vec!["-c".into(), "8".into(), "--disable-keepalive".into()]),
    ];
    let mut table = Vec::new();
    for (cell, args) in &cells {
        let mut runs: [Vec<OhaRun>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..opts.reps {
            for (i, url) in urls.iter().enumerate() {
                let run = oha_on(opts, from, args, url)?;
                ensure!(run.failures("200") == 0, "{url} ({cell}) failed: {run:?}");
                runs[i].push(run);
            }
        }
        let s = |i: usize, f: fn(&OhaRun) -> f64| Spread::of(&runs[i].iter().map(f).collect::<Vec<_>>());
        let (Some(urps), Some(trps), Some(u50), Some(t50), Some(u99), Some(t99)) =
            (s(0, |x| x.rps), s(1, |x| x.rps), s(0, |x| x.p50), s(1, |x| x.p50), s(0, |x| x.p99), s(1, |x| x.p99))
        else {
            continue;
        };
        table.push(vec![
            cell.to_string(),
            urps.show(show_count),
            trps.show(show_count),
            show_ratio(ratio(urps.median, trps.median)),
            u50.show(show_secs),
            t50.show(show_secs),
            show_ratio(ratio(u50.median, t50.median)),
            u99.show(show_secs),
            t99.show(show_secs),
            show_ratio(ratio(u99.median, t99.median)),
        ]);
    }
    // The node shape this ran on, as the kubelets report it (node.sh's defaults: IPv4, containerd 2.x).
    let runtimes = kube.ok(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.containerRuntimeVersion}"])?;
    let kernels = kube.ok(&["get", "nodes", "-o", "jsonpath={.items[0].status.nodeInfo.kernelVersion}"])?;
    let mut runtimes: Vec<&str> = runtimes.split_whitespace().collect();
    runtimes.dedup();
    r.line("## 7. Cross-node: a client on another node, the pod on its socket vs the same app on TCP\n");
    r.line(&format!(
        "Node shape: runtime {}, IP family IPv4 (Service ClusterIPs and pod IPs), kernel {}.\n",
        runtimes.join(", "),
        kernels.trim()
    ));
    r.line(&format!(
        "Two real nodes on this machine (`AETHER_NODES=2 tests/harness/node.sh up`: each its own network and mount \
         namespaces, containerd, kubelet and kube-proxy; the charts installed with helm). On {SERVER_NODE}, the same \
         `uds-echo` code runs twice: Deployment `uds` on its Unix socket (the node's Envoy binds the inbound \
         listener in the pod's netns and dials the socket) and Deployment `tcp` on TCP 8080 (no Envoy in the path). \
         oha runs in {CLIENT_NODE}'s network namespace against each Service's ClusterIP (kube-proxy DNAT, then the \
         node network); {} runs of {} s per cell, the two sides alternating. Both nodes, Envoy, the apps and oha \
         share the 2 cores.\n",
        opts.reps, opts.secs
    ));
    r.add(&md_table(
        &[
            "client",
            "UDS req/s",
            "TCP req/s",
            "UDS/TCP req/s",
            "UDS p50",
            "TCP p50",
            "UDS/TCP p50",
            "UDS p99",
            "TCP p99",
            "UDS/TCP p99",
        ],
        &table,
    ));
    r.line("");
    let diff = nodes.down()?;
    ensure!(diff.is_empty(), "the host differs after node.sh down:\n{}", diff.join("\n"));
    Ok(())
}
