//! Section 4b of `make bench` (docs/benchmarks.md, "4b. Inbound: client in the pod netns → Envoy
//! listener in the netns → socket vs the app on TCP in the netns (no Envoy)"): the inbound
//! listener the agent renders, bound by a static Envoy in a network namespace made for the run
//! and proxying to the app's Unix socket, against the same app on TCP in that namespace with no
//! Envoy. Needs root.

use std::path::Path;
use std::process::{Command, Stdio};

use aether_tests::{envoy_bin, free_port};
use anyhow::ensure;

use crate::netns::Netns;
use crate::oha::oha_in;
use crate::processes::{Proc, workspace_bin};
use crate::stats::{self, OhaRun, Spread, md_table, ratio, show_count, show_ratio, show_secs};
use crate::{Opts, Report};

/// Port of the inbound listener and of the app's TCP port inside the bench's netns (fresh, so
/// nothing else holds them).
const INBOUND_PORT: u16 = 8080;
const APP_TCP_PORT: u16 = 9090;

/// A static bootstrap with one inbound listener as the agent renders it
/// (`aether_agent_reconciler::xds::build_inbound_listener` with the default `BuildOptions`,
/// written out by hand as JSON): 0.0.0.0:`port` bound in `netns` (`network_namespace_filepath`),
/// `enable_reuse_port: false`, `connection_limit` (4096) then `tcp_proxy` (idle timeout 1 h) to a
/// STATIC cluster whose one endpoint is the app's socket (`pipe`), like `build_cluster` builds a
/// pipe endpoint (connect timeout 1 s, panic threshold 0, no health check).
fn inbound_bootstrap(admin: u16, netns: &str, port: u16, socket: &Path) -> serde_json::Value {
    let (name, cluster) = ("inbound_bench_8080", "app_bench_uds");
    serde_json::json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin } } },
        "static_resources": {
            "clusters": [{
                "name": cluster, "type": "STATIC", "connect_timeout": "1s",
                "common_lb_config": { "healthy_panic_threshold": { "value": 0.0 } },
                "load_assignment": { "cluster_name": cluster, "endpoints": [{ "lb_endpoints": [{ "endpoint": {
                    "address": { "pipe": { "path": socket } } } }] }] }
            }],
            "listeners": [{
                "name": name,
                "address": { "socket_address": {
                    "address": "0.0.0.0", "port_value": port, "network_namespace_filepath": netns } },
                "enable_reuse_port": false,
                "filter_chains": [{ "filters": [
                    { "name": "envoy.filters.network.connection_limit", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit",
                        "stat_prefix": name, "max_connections": 4096 } },
                    { "name": "envoy.filters.network.tcp_proxy", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": name, "cluster": cluster, "idle_timeout": "3600s" } }
                ] }]
            }]
        }
    })
}

/// One GET of `url` from inside `ns` (oha, one request): whether it got a 200.
fn get_ok_in(opts: &Opts, ns: &Netns, url: &str) -> bool {
    ns.command(&opts.oha)
        .args(["--no-tui", "--output-format", "json", "-n", "1", "-t", "1s", url])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| stats::parse_oha(&String::from_utf8_lossy(&o.stdout)).ok())
        .is_some_and(|run| run.statuses.iter().any(|(c, n)| c == "200" && *n > 0) && run.failures("200") == 0)
}

/// Section 4b: the inbound listener (client in the pod's netns → Envoy's listener bound in that
/// netns → tcp_proxy → the app's Unix socket) against the same app on TCP in the netns, no Envoy.
pub fn section(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("aebi").tempdir_in("/tmp")?;
    // Declared before the processes, so dropped after them (locals drop in reverse order): every
    // process below is stopped before the netns is deleted, on every exit path.
    let ns = Netns::add(&format!("aether-bench-{}", std::process::id()))?;
    let socket = work.path().join("app.sock");
    let _uds = Proc::echo(work.path(), "inbound-uds", Some(&socket))?;
    let mut cmd = ns.command(workspace_bin("uds-echo")?);
    cmd.args(["--tcp", &format!("127.0.0.1:{APP_TCP_PORT}"), "--name", "inbound-tcp"]);
    let mut tcp = Proc::spawn(cmd, work.path().join("inbound-tcp.log"), APP_TCP_PORT)?;
    let tcp_url = format!("http://127.0.0.1:{APP_TCP_PORT}/x");
    tcp.wait_until("uds-echo --tcp in the netns", || get_ok_in(opts, &ns, &tcp_url))?;

    let admin = free_port();
    let config = work.path().join("envoy.json");
    let bootstrap = inbound_bootstrap(admin, &ns.path(), INBOUND_PORT, &socket);
    std::fs::write(&config, serde_json::to_vec_pretty(&bootstrap)?)?;
    let mut cmd = Command::new(envoy_bin()?);
    cmd.arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warning", "--base-id-path"])
        .arg(work.path().join("base-id"));
    let mut envoy = Proc::spawn(cmd, work.path().join("envoy.log"), INBOUND_PORT)?;
    let listener_url = format!("http://127.0.0.1:{INBOUND_PORT}/x");
    envoy.wait_until("envoy (inbound listener in the netns)", || get_ok_in(opts, &ns, &listener_url))?;

    let mut table = Vec::new();
    for conns in [1usize, 32] {
        let mut runs: [Vec<OhaRun>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..opts.reps {
            for (i, (side, url)) in [("inbound listener", &listener_url), ("app on TCP", &tcp_url)].iter().enumerate() {
                let run = oha_in(opts, Some(&ns), &["-c".to_owned(), conns.to_string()], url)?;
                ensure!(run.failures("200") == 0, "{side} at {conns} connections failed: {run:?}");
                runs[i].push(run);
            }
        }
        let s = |i: usize, f: fn(&OhaRun) -> f64| Spread::of(&runs[i].iter().map(f).collect::<Vec<_>>());
        let (Some(lrps), Some(trps), Some(lp99), Some(tp99)) =
            (s(0, |x| x.rps), s(1, |x| x.rps), s(0, |x| x.p99), s(1, |x| x.p99))
        else {
            continue;
        };
        table.push(vec![
            conns.to_string(),
            lrps.show(show_count),
            trps.show(show_count),
            show_ratio(ratio(lrps.median, trps.median)),
            lp99.show(show_secs),
            tp99.show(show_secs),
            show_ratio(ratio(lp99.median, tp99.median)),
        ]);
    }
    r.line(
        "### 4b. Inbound: client in the pod netns → Envoy listener in the netns → socket vs the app on TCP in the \
         netns (no Envoy)\n",
    );
    r.line(&format!(
        "A network namespace made for the run stands in for a pod's. In it, oha sends GETs at saturation over 1 and \
         32 keep-alive connections either to the inbound listener a static Envoy (`--concurrency 1`) binds there as \
         the agent renders it (`network_namespace_filepath`, `connection_limit`, `tcp_proxy` to a `pipe` cluster; \
         the `uds-echo` app on its Unix socket), or to the same `uds-echo` code listening on 127.0.0.1 inside the \
         namespace with no Envoy; {} runs of {} s per cell, the two sides alternating. This shows the cost of the \
         extra proxy hop the listener adds: there is no kube-proxy DNAT in the bench (the real-node suite proves the \
         Service path). Envoy, the app and oha share the 2 cores.\n",
        opts.reps, opts.secs
    ));
    r.add(&md_table(
        &[
            "client conns",
            "listener→UDS req/s",
            "TCP in netns req/s",
            "listener/TCP req/s",
            "listener→UDS p99",
            "TCP in netns p99",
            "listener/TCP p99",
        ],
        &table,
    ));
    r.line("");
    Ok(())
}
