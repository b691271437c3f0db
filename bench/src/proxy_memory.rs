//! Section "Envoy memory per cluster" of `make bench` (why: one pod declaring 10,000
//! ports took the node's Envoy from 70 to 566 MiB, past the chart's 512Mi limit).
//!
//! What runs: the release `aether-agent` serving a state dir of N/2 one-port pods (so N
//! `app_`/`health_` clusters exactly as the agent renders them: TCP to 127.0.0.1 on a closed port,
//! HTTP health check) with no API server (it serves its state dir), `--max-clusters` above N, and
//! a real Envoy started with the chart's bootstrap and flags (`aether_fixtures::envoy`) at
//! `--concurrency` 1, 2, 8 and 16 (the chart sets none: Envoy then runs one worker per hardware
//! thread). Once Envoy has every cluster active and its health checks have run, the section reads
//! Envoy's resident set (`VmRSS` of `/proc/<pid>/status`) and its heap (`allocated` of the admin
//! `/memory`), and derives the cost of one cluster from the largest size against an empty CDS.
//!
//! The sizes include the agent's `--max-clusters` default, read from `aether-agent run --help`,
//! so the table shows what the chart's Envoy holds at the cap. At the cap and the chart's worker
//! count the Envoy also has the chart's stats listener, and [`crate::scrape_flood`] floods it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use aether_fixtures::Envoy;
use aether_tests::{envoy_bin, free_port, http_get_status};
use anyhow::{Context, bail, ensure};

use crate::processes::{Proc, workspace_bin};
use crate::stats::{md_table, show_count};
use crate::{Goal, Report};

/// The chart's `proxy.resources.limits.memory`, in MiB.
const CHART_LIMIT_MIB: f64 = 512.0;
/// Envoy worker threads measured (the chart leaves Envoy's default: one per hardware thread).
const CONCURRENCY: [usize; 4] = [1, 2, 8, 16];
/// The goal holds up to this many workers; more are shown for the slope.
const GOAL_WORKERS: usize = 8;
/// Cluster counts measured besides the agent's default cap.
const SIZES: [usize; 3] = [0, 1_000, 10_000];
const NODE: &str = "bench-node";

/// One measurement: Envoy at `concurrency` workers holding `clusters` dynamic clusters.
struct Sample {
    concurrency: usize,
    clusters: usize,
    rss_mib: f64,
    allocated_mib: f64,
    /// From Envoy's start to every cluster active.
    load_secs: f64,
    /// The admin under a scrape flood ([`FLOOD_WORKERS`] workers at the cap only).
    flood: Option<crate::scrape_flood::Figures>,
}

/// The worker count of the cell at the cap whose Envoy is also flooded with scrapes: the chart's
/// `proxy.concurrency`.
const FLOOD_WORKERS: usize = 2;

/// Runs the section and adds its table and goal to `r`.
pub fn section(r: &mut Report) -> anyhow::Result<()> {
    let agent = workspace_bin("aether-agent")?;
    let cap = default_max_clusters(&agent)?;
    let mut sizes: Vec<usize> = SIZES.iter().copied().chain([cap]).collect();
    sizes.sort_unstable();
    let mut samples = Vec::new();
    for concurrency in CONCURRENCY {
        for &clusters in &sizes {
            // Beyond 2 workers the empty CDS and the cap tell enough.
            if concurrency > 2 && clusters != 0 && clusters != cap {
                continue;
            }
            let flood = concurrency == FLOOD_WORKERS && clusters == cap;
            samples.push(
                measure(&agent, concurrency, clusters, flood)
                    .with_context(|| format!("Envoy at --concurrency {concurrency} with {clusters} clusters"))?,
            );
        }
    }

    r.line("## 5. Envoy memory per cluster\n");
    r.line(&format!(
        "The release `aether-agent` serving N/2 one-port pods from its state dir (no API server), so N `app_`/`health_` \
         clusters exactly as it renders them (TCP to a closed loopback port, HTTP health check), to a real Envoy with the \
         chart's bootstrap and flags at `--concurrency` 1, 2, 8 and 16 (the chart sets none: Envoy runs one worker per \
         hardware thread, 2 here). Read once every cluster is active and the health checks ran: `VmRSS` of the Envoy \
         process and `allocated` of its admin `/memory`. One process per cell. The agent's `--max-clusters` default is \
         {cap}; the chart's proxy limit is {CHART_LIMIT_MIB:.0} MiB.\n"
    ));
    let mut rows = Vec::new();
    for s in &samples {
        rows.push(vec![
            s.concurrency.to_string(),
            show_count(s.clusters as f64),
            format!("{:.0} MiB", s.rss_mib),
            format!("{:.0} MiB", s.allocated_mib),
            format!("{:.1} s", s.load_secs),
        ]);
    }
    r.add(&md_table(&["workers", "clusters", "Envoy RSS", "heap allocated", "CDS applied after"], &rows));
    let mut per_cluster = Vec::new();
    for concurrency in CONCURRENCY {
        let of = |n: usize| samples.iter().find(|s| s.concurrency == concurrency && s.clusters == n);
        let largest = samples.iter().filter(|s| s.concurrency == concurrency).map(|s| s.clusters).max();
        let (Some(empty), Some(top)) = (of(0), largest.and_then(of)) else { continue };
        if top.clusters == 0 {
            continue;
        }
        let kib = |a: f64, b: f64| (b - a) * 1024.0 / top.clusters as f64;
        let at_cap = of(cap).map(|s| s.rss_mib);
        per_cluster.push((concurrency, kib(empty.rss_mib, top.rss_mib), kib(empty.allocated_mib, top.allocated_mib)));
        r.line(&format!(
            "- {concurrency} worker{}: {:.1} KiB RSS and {:.1} KiB of heap per cluster ({} → {} clusters); {} at the \
             default cap of {cap}.",
            if concurrency == 1 { "" } else { "s" },
            kib(empty.rss_mib, top.rss_mib),
            kib(empty.allocated_mib, top.allocated_mib),
            show_count(empty.clusters as f64),
            show_count(top.clusters as f64),
            at_cap.map_or("not measured".to_owned(), |m| format!("{m:.0} MiB RSS")),
        ));
    }
    r.line("");
    if let Some((s, f)) = samples.iter().find_map(|s| Some((s, s.flood.as_ref()?))) {
        r.line(&crate::scrape_flood::report(f, s.clusters, s.concurrency));
    }
    let worst = samples
        .iter()
        .filter(|s| s.clusters == cap && s.concurrency <= GOAL_WORKERS)
        .max_by(|a, b| a.rss_mib.total_cmp(&b.rss_mib));
    r.goals.push(Goal {
        goal: "Node proxy inside 512 MiB at --max-clusters",
        figure: match worst {
            Some(s) => format!(
                "{:.0} MiB RSS at the default cap of {cap} clusters ({} workers; ≤ {:.0} MiB wanted)",
                s.rss_mib,
                s.concurrency,
                CHART_LIMIT_MIB / 2.0
            ),
            None => "n/a".into(),
        },
        // Margin: half the limit, up to 8 workers, for heap growth under churn, connections with
        // traffic (buffers are per connection, not per cluster) and Envoy's own spikes.
        met: worst.map(|s| s.rss_mib <= CHART_LIMIT_MIB / 2.0),
        limit: format!(
            "per cluster: {}; more workers cost more per cluster",
            per_cluster.iter().map(|(c, rss, _)| format!("{rss:.0} KiB at {c} workers")).collect::<Vec<_>>().join(", ")
        ),
    });
    Ok(())
}

/// The `--max-clusters` default printed by `aether-agent run --help` (`[default: N]`).
fn default_max_clusters(agent: &Path) -> anyhow::Result<usize> {
    let out = Command::new(agent).args(["run", "--help"]).output().context("aether-agent run --help")?;
    let help = String::from_utf8_lossy(&out.stdout);
    let flag = help.find("--max-clusters").context("aether-agent has no --max-clusters flag")?;
    let rest = &help[flag..];
    let start = rest.find("[default: ").context("--max-clusters shows no default")? + "[default: ".len();
    let end = rest[start..].find(']').context("unterminated default")?;
    rest[start..start + end].trim().parse().context("--max-clusters default is not a number")
}

/// One pod record as the agent's state dir keeps it (agent-reconciler/src/store.rs, format 1;
/// the fields of `aether_agent_core::record::PodRecord`). A drift fails the cluster count below.
fn pod_record(i: usize, port: u16) -> serde_json::Value {
    serde_json::json!({
        "version": 1,
        "record": {
            "uid": uid(i),
            "namespace": "bench",
            "name": format!("p-{i:05}"),
            "serviceAccount": "default",
            "ports": [{ "port": port, "protocol": "http1" }],
            "health": { "kind": "http", "path": "/" },
            "udsSocket": null,
            "podIps": ["127.0.0.1"],
            "emptyDirs": [],
            "staticPod": null,
            "defects": [],
            "created": 1_700_000_000 + i as i64
        }
    })
}

fn uid(i: usize) -> String {
    format!("{i:08x}-0000-4000-8000-{i:012x}")
}

fn measure(agent: &Path, concurrency: usize, clusters: usize, flood: bool) -> anyhow::Result<Sample> {
    let work = tempfile::Builder::new().prefix("aebm").tempdir_in("/tmp")?;
    let (state, pods, run) = (work.path().join("state"), work.path().join("pods"), work.path().join("run"));
    for d in [&state.join("pods"), &pods, &run] {
        std::fs::create_dir_all(d)?;
    }
    // Nothing listens there: every health check fails at once, as for pods still starting.
    let closed = free_port();
    for i in 0..clusters / 2 {
        std::fs::write(state.join("pods").join(format!("{}.json", uid(i))), pod_record(i, closed).to_string())?;
    }
    let xds = run.join("xds.sock");
    let admin = free_port();
    let mut cmd = Command::new(agent);
    cmd.arg("run")
        .args(["--node-name", NODE, "--admin-addr", &format!("127.0.0.1:{admin}"), "--cri-endpoint="])
        // Any free loopback debug port, by env: an earlier release under comparison has no such flag.
        .env("AETHER_DEBUG_ADDR", "127.0.0.1:0")
        .args(["--max-clusters", &clusters.max(2).to_string()])
        .arg("--kubelet-pods-dir")
        .arg(&pods)
        .arg("--state-dir")
        .arg(&state)
        .arg("--xds-address")
        .arg(format!("unix://{}", xds.display()))
        .arg("--health-socket")
        .arg(run.join("health.sock"))
        // No API server: the agent serves its state dir.
        .env("KUBECONFIG", work.path().join("no-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST");
    let mut agent = Proc::spawn(cmd, work.path().join("agent.log"), admin)?;
    agent.wait_until("aether-agent", || http_get_status(admin, "/healthz") == Some(200) && xds.exists())?;

    let envoy_dir = work.path().join("envoy");
    let mut builder = Envoy::builder(&xds, NODE, &envoy_dir).binary(envoy_bin()?).log_level("warning");
    if flood {
        builder = builder.stats_listener()?;
    }
    std::fs::create_dir_all(&envoy_dir)?;
    std::fs::write(envoy_dir.join("envoy.json"), serde_json::to_vec_pretty(&builder.bootstrap())?)?;
    let mut args = builder.args();
    let workers = args.iter().position(|a| a == "--concurrency").context("the launcher sets --concurrency")? + 1;
    args[workers] = concurrency.to_string();
    let mut cmd = aether_fixtures::process::killed_with_parent(envoy_bin()?);
    cmd.args(&args);
    let started = Instant::now();
    let mut envoy = Proc::spawn(cmd, work.path().join("envoy.stderr"), 0)?;
    let address = envoy_dir.join("admin.address");
    let mut admin_port = 0;
    envoy.wait_until("envoy", || {
        admin_port = std::fs::read_to_string(&address)
            .ok()
            .and_then(|a| a.trim().parse::<std::net::SocketAddr>().ok())
            .map_or(0, |a| a.port());
        admin_port != 0 && http_get_status(admin_port, "/ready").is_some()
    })?;
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let get = |path: &str| -> anyhow::Result<String> {
        Ok(http.get(format!("http://127.0.0.1:{admin_port}{path}")).send()?.error_for_status()?.text()?)
    };
    // `cluster_manager.*` from one GET: `name: value` lines.
    let stats = || -> anyhow::Result<std::collections::HashMap<String, u64>> {
        let text = get("/stats?filter=cluster_manager")?;
        Ok(text
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
            .collect())
    };
    // The bootstrap's static clusters count too: wait for the first CDS, then for all of ours.
    let deadline = Instant::now() + Duration::from_secs(300);
    let statics = envoy_statics(&builder);
    loop {
        let now = stats()?;
        let stat = |name: &str| now.get(name).copied().unwrap_or(0);
        let (active, warming) = (stat("cluster_manager.active_clusters"), stat("cluster_manager.warming_clusters"));
        let updated = stat("cluster_manager.cds.update_success") > 0;
        if updated && warming == 0 && active as usize == statics + clusters {
            break;
        }
        if let Some(status) = envoy.child.try_wait()? {
            bail!("envoy exited ({status}) with {active} clusters active");
        }
        ensure!(
            Instant::now() < deadline,
            "Envoy has {active} clusters active ({warming} warming), want {statics} + {clusters}; agent log:\n{}",
            std::fs::read_to_string(work.path().join("agent.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let load_secs = started.elapsed().as_secs_f64();
    // Let every health checker run (the agent's interval is 2 s) and the heap settle.
    std::thread::sleep(Duration::from_secs(8));
    let mut rss = Vec::new();
    let mut allocated = Vec::new();
    for _ in 0..5 {
        rss.push(rss_mib(envoy.child.id())?);
        allocated.push(allocated_mib(&get("/memory")?)?);
        std::thread::sleep(Duration::from_millis(400));
    }
    let flood = if flood {
        let listeners: serde_json::Value = serde_json::from_str(&get("/listeners?format=json")?)?;
        let stats_port = listeners["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["name"] == "stats")
            .and_then(|l| l["local_address"]["socket_address"]["port_value"].as_u64())
            .context("the stats listener's port")?;
        Some(crate::scrape_flood::measure(admin_port, u16::try_from(stats_port)?)?)
    } else {
        None
    };
    drop(envoy);
    drop(agent);
    Ok(Sample {
        flood,
        concurrency,
        clusters,
        rss_mib: crate::stats::percentile(&rss, 50.0).unwrap_or(f64::NAN),
        allocated_mib: crate::stats::percentile(&allocated, 50.0).unwrap_or(f64::NAN),
        load_secs,
    })
}

/// The static clusters of the chart's bootstrap (they are active before any CDS).
fn envoy_statics(builder: &aether_fixtures::EnvoyBuilder) -> usize {
    builder.bootstrap()["static_resources"]["clusters"].as_array().map_or(0, Vec::len)
}

/// `VmRSS` of process `pid`, in MiB.
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

/// `allocated` of Envoy's admin `/memory` (a JSON object whose numbers are strings), in MiB.
fn allocated_mib(body: &str) -> anyhow::Result<f64> {
    let v: serde_json::Value = serde_json::from_str(body).context("/memory is not JSON")?;
    let allocated = &v["allocated"];
    let bytes: f64 = match allocated {
        serde_json::Value::String(s) => s.parse()?,
        serde_json::Value::Number(n) => n.as_f64().context("allocated")?,
        _ => bail!("no allocated in {body}"),
    };
    Ok(bytes / (1024.0 * 1024.0))
}
