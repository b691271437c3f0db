//! Section 4 of `make bench` (docs/benchmarks.md, "4. Data plane: Envoy to the app over the Unix
//! socket vs TCP loopback"): a static Envoy routing by path to the same `uds-echo` code on a Unix
//! socket or on TCP, with upstream keep-alive and with a new upstream connection per request,
//! under oha at saturation.

use std::path::Path;
use std::process::Command;

use aether_tests::{envoy_bin, free_port, http_get_status};
use anyhow::ensure;

use crate::oha::oha;
use crate::processes::Proc;
use crate::stats::{OhaRun, Spread, md_table, ratio, show_count, show_ratio, show_secs};
use crate::{Goal, Opts, Report};

fn dataplane_bootstrap(admin: u16, listen: u16, socket: &Path, tcp_port: u16) -> serde_json::Value {
    let cluster = |name: &str, address: serde_json::Value, per_conn: Option<u32>| {
        let mut http = serde_json::json!({
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http_protocol_options": {} }
        });
        if let Some(n) = per_conn {
            http["common_http_protocol_options"] = serde_json::json!({ "max_requests_per_connection": n });
        }
        serde_json::json!({
            "name": name, "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": { "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": http },
            "load_assignment": { "cluster_name": name, "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": address } }] }] }
        })
    };
    let pipe = serde_json::json!({ "pipe": { "path": socket } });
    let tcp = serde_json::json!({ "socket_address": { "address": "127.0.0.1", "port_value": tcp_port } });
    let routes: Vec<serde_json::Value> = ["uds_keepalive", "uds_per_request", "tcp_keepalive", "tcp_per_request"]
        .iter()
        .map(|c| serde_json::json!({ "match": { "prefix": format!("/{c}") }, "route": { "cluster": c, "timeout": "5s" } }))
        .collect();
    serde_json::json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin } } },
        "static_resources": {
            "clusters": [
                cluster("uds_keepalive", pipe.clone(), None),
                cluster("uds_per_request", pipe, Some(1)),
                cluster("tcp_keepalive", tcp.clone(), None),
                cluster("tcp_per_request", tcp, Some(1)),
            ],
            "listeners": [{
                "name": "inbound",
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": listen } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound",
                        "route_config": { "virtual_hosts": [{ "name": "all", "domains": ["*"], "routes": routes }] },
                        "http_filters": [{ "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } }]
                    }
                }] }]
            }]
        }
    })
}

/// Writes section 4.
pub fn section(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("aebd").tempdir_in("/tmp")?;
    let socket = work.path().join("app.sock");
    let _uds = Proc::echo(work.path(), "uds", Some(&socket))?;
    let tcp = Proc::echo(work.path(), "tcp", None)?;
    let (admin, listen) = (free_port(), free_port());
    let config = work.path().join("envoy.json");
    std::fs::write(&config, serde_json::to_vec_pretty(&dataplane_bootstrap(admin, listen, &socket, tcp.port))?)?;
    let mut cmd = Command::new(envoy_bin()?);
    cmd.arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warning", "--base-id-path"])
        .arg(work.path().join("base-id"));
    let mut envoy = Proc::spawn(cmd, work.path().join("envoy.log"), listen)?;
    envoy.wait_until("envoy", || http_get_status(listen, "/uds_keepalive/ready") == Some(200))?;
    for c in ["uds_per_request", "tcp_keepalive", "tcp_per_request"] {
        ensure!(http_get_status(listen, &format!("/{c}/ready")) == Some(200), "{c} does not answer through Envoy");
    }

    let mut table = Vec::new();
    let mut worst_ratio: Option<(f64, String)> = None;
    for per_request in [false, true] {
        for conns in [1usize, 32] {
            let mut runs: [Vec<OhaRun>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..opts.reps {
                for (i, side) in ["uds", "tcp"].iter().enumerate() {
                    let cluster = format!("{side}_{}", if per_request { "per_request" } else { "keepalive" });
                    let run = oha(
                        opts,
                        &["-c".to_owned(), conns.to_string()],
                        &format!("http://127.0.0.1:{listen}/{cluster}/x"),
                    )?;
                    ensure!(run.failures("200") == 0, "{cluster} at {conns} connections failed: {run:?}");
                    runs[i].push(run);
                }
            }
            let s = |i: usize, f: fn(&OhaRun) -> f64| Spread::of(&runs[i].iter().map(f).collect::<Vec<_>>());
            let (Some(urps), Some(trps), Some(up50), Some(tp50), Some(up99), Some(tp99)) =
                (s(0, |x| x.rps), s(1, |x| x.rps), s(0, |x| x.p50), s(1, |x| x.p50), s(0, |x| x.p99), s(1, |x| x.p99))
            else {
                continue;
            };
            let rr = ratio(urps.median, trps.median);
            let label =
                format!("{}, {conns} conn", if per_request { "new upstream conn per request" } else { "keep-alive" });
            if let Some(x) = rr
                && worst_ratio.as_ref().is_none_or(|(w, _)| x < *w)
            {
                worst_ratio = Some((x, label));
            }
            table.push(vec![
                (if per_request { "new per request" } else { "keep-alive" }).to_owned(),
                conns.to_string(),
                urps.show(show_count),
                trps.show(show_count),
                show_ratio(rr),
                up50.show(show_secs),
                tp50.show(show_secs),
                up99.show(show_secs),
                tp99.show(show_secs),
            ]);
        }
    }
    r.line("## 4. Data plane: Envoy to the app over the Unix socket vs TCP loopback\n");
    r.line(&format!(
        "A static Envoy (`--concurrency 1`, no agent) with one HTTP listener on loopback routing by path to four \
         clusters: the same `uds-echo` server code listening on a Unix socket (`pipe`) or on 127.0.0.1 (`--tcp`), \
         each with upstream keep-alive and with `max_requests_per_connection: 1` (a new upstream connection per \
         request). oha sends GETs at saturation over 1 and 32 keep-alive downstream connections; {} runs of {} s per \
         cell, UDS and TCP alternating. Envoy, the echo server and oha share the 2 cores.\n",
        opts.reps, opts.secs
    ));
    r.add(&md_table(
        &[
            "upstream connections",
            "client conns",
            "UDS req/s",
            "TCP req/s",
            "UDS/TCP req/s",
            "UDS p50",
            "TCP p50",
            "UDS p99",
            "TCP p99",
        ],
        &table,
    ));
    r.line("");
    if let Some((worst, label)) = worst_ratio {
        r.goals.push(Goal {
            goal: "UDS ≥ TCP",
            figure: format!("lowest UDS/TCP throughput ratio {worst:.2}× ({label})"),
            met: Some(worst >= 1.0),
            limit: "run-to-run spread on shared cores is several percent; a ratio within the spread of 1.0 is a tie"
                .into(),
        });
    }
    Ok(())
}
