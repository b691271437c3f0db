//! Section 3e of `make bench`: what one policy change costs the live agent and the wire, at 110,
//! 1,000 and 10,000 pods on its node, with a real Envoy on incremental (`DELTA_GRPC`, the chart's)
//! and State-of-the-World (`GRPC`) ADS.
//!
//! The pods are API objects on the agent's node ([`crate::node_pods`]): one service of
//! [`TARGET_PODS`] pods (service account `target`) and the rest in another (`app`), grown
//! 110 → 1k → 10k, a fresh release agent per size (`--max-clusters` raised so every pod is served).
//! Per size, each mode gets a fresh Envoy (the fixture's chart bootstrap, one worker); once it holds
//! every cluster and the agent is quiet, policy `pc` on service `target` is created and deleted in
//! turn through the API (webhook registered: the release controller admits each create). Each write
//! changes the 5 pods' 10 clusters (`app_` and `health_`: TCP ↔ pipe).
//!
//! Per write:
//! - write → ACK: from just before the API request to the first scrape (every ~1 ms, one keep-alive
//!   client) in which the agent's `aether_xds_acks_total{type="cluster"}` has grown;
//! - agent CPU, on as many further writes whose ACK is polled every 10 ms (1 ms polling alone costs
//!   the agent ~10 % of a core, more than the change): the sum of the first field of
//!   `/proc/<pid>/task/*/schedstat` (ns on CPU), from just
//!   before the write to [`SETTLE`] after the ACK, less the idle agent's rate measured with the
//!   same polling (and without it, for the settle) over [`BASELINE`];
//! - bytes and clusters sent: growth of `aether_xds_bytes_sent_total` and
//!   `aether_xds_resources_sent_total` `{type="cluster",mode}`. The changed clusters' encoded size is
//!   the number of clusters the delta stream sent times the mean size of one cluster on the
//!   State-of-the-World stream at the same node size (its responses carry every cluster).
//!
//! Envoy's own `cluster_manager.cds.update_success` is read before and after each mode's writes as a
//! cross-check of the ACK count.

use std::path::Path;
use std::time::{Duration, Instant};

use aether_fixtures::{Envoy, policy};
use aether_tests::{ControlPlane, Scrape, envoy_bin};
use anyhow::{Context, ensure};

use crate::ads_mode::Mode;
use crate::api_client::api_client;
use crate::node_pods::{PodSet, folded, quiet, schedstat_ns, start_agent, xds_socket};
use crate::plots::ChangePoint;
use crate::processes::Proc;
use crate::stats::{md_table, percentile, ratio, show_ratio, show_secs};
use crate::{Goal, Opts, Report};

const NS: &str = "bench-pc";
const NODE: &str = "bench-pc-node";
/// The node sizes measured, in pods (the target service's pods included).
const SIZES: [usize; 3] = [110, 1_000, 10_000];
/// Pods of the service the policy targets: one write changes their 2 clusters each.
const TARGET_PODS: usize = 5;
/// The agent's `--max-clusters`: every pod of the largest size served (2 clusters a pod), with room.
const MAX_CLUSTERS: usize = 2 * SIZES[2] + 1_000;
/// How long after the ACK the agent's CPU keeps being counted (work that follows the push).
const SETTLE: Duration = Duration::from_millis(150);
/// The idle interval the CPU baselines are measured over.
const BASELINE: Duration = Duration::from_secs(2);
/// The ACK poll period of the write → ACK writes.
const POLL: Duration = Duration::from_millis(1);
/// The ACK poll period of the CPU writes.
const CPU_POLL: Duration = Duration::from_millis(10);
/// The longest wait for Envoy to hold every cluster (20k clusters at 10k pods).
const ENVOY_LOAD: Duration = Duration::from_secs(150);
/// Targets (docs/benchmarks.md, "Goals").
const CPU_TARGET_S: f64 = 0.005;
const ACK_P99_10K_S: f64 = 0.100;
const ACK_P99_1K_S: f64 = 0.060;
const GROWTH_TARGET: f64 = 1.5;

/// Writes per mode at a node size: about 20 at 1k and 10k, fewer at 110 (create/delete pairs).
fn writes_at(pods: usize) -> usize {
    if pods < 1_000 { 8 } else { 20 }
}

/// The figures of one node size × mode, one entry per write.
struct Run {
    pods: usize,
    mode: Mode,
    /// Agent CPU per write less the idle baseline, seconds.
    cpu: Vec<f64>,
    /// Bytes of CDS responses sent per write.
    bytes: Vec<f64>,
    /// Clusters sent per write.
    clusters: Vec<f64>,
    /// Write → the agent counting Envoy's ACK, seconds.
    ack: Vec<f64>,
    /// On the write → ACK writes: the API request alone (admission webhook and storage included),
    /// seconds.
    api: Vec<f64>,
    /// On the write → ACK writes: the agent's own `aether_xds_change_to_ack_seconds` for the
    /// write (from the watch event to Envoy's ACK; the mean when it stamped several types),
    /// seconds.
    event_ack: Vec<f64>,
    /// Envoy's `cluster_manager.cds.update_success` growth over the writes.
    envoy_updates: u64,
    /// Envoy's `main_thread.watchdog_miss` growth over the writes: times its main thread (which
    /// applies CDS and ACKs) did not come back to its event loop within the watchdog's 200 ms.
    envoy_stalls: u64,
    /// The idle agent's CPU while polled every [`CPU_POLL`], as a fraction of one core.
    idle_polled: f64,
    /// Writes in all (write → ACK and CPU).
    writes: usize,
}

/// The agent's metrics over one keep-alive client.
struct Metrics {
    client: reqwest::blocking::Client,
    url: String,
}

impl Metrics {
    fn new(admin: u16) -> anyhow::Result<Metrics> {
        let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build()?;
        Ok(Metrics { client, url: format!("http://127.0.0.1:{admin}/metrics") })
    }

    fn scrape(&self) -> anyhow::Result<Scrape> {
        Scrape::parse(&self.client.get(&self.url).send()?.error_for_status()?.text()?)
    }
}

/// `(sum, count)` of the agent's `aether_xds_change_to_ack_seconds` histogram in one scrape.
fn change_to_ack(s: &Scrape) -> (f64, f64) {
    (s.value("aether_xds_change_to_ack_seconds_sum", &[]), s.value("aether_xds_change_to_ack_seconds_count", &[]))
}

/// `(acks, bytes, clusters)` for CDS in `mode` from one scrape.
fn cds(s: &Scrape, mode: Mode) -> (f64, f64, f64) {
    let tm = [("type", "cluster"), ("mode", mode.label())];
    (
        s.value("aether_xds_acks_total", &[("type", "cluster")]),
        s.value("aether_xds_bytes_sent_total", &tm),
        s.value("aether_xds_resources_sent_total", &tm),
    )
}

/// The agent's CPU rate (fraction of a core) over [`BASELINE`], scraping it every `poll` if given.
fn idle_rate(pid: u32, metrics: &Metrics, poll: Option<Duration>) -> anyhow::Result<f64> {
    let (c0, t0) = (schedstat_ns(pid)?, Instant::now());
    while t0.elapsed() < BASELINE {
        if poll.is_some() {
            metrics.scrape()?;
        }
        std::thread::sleep(poll.unwrap_or(POLL));
    }
    Ok((schedstat_ns(pid)? - c0) as f64 / 1e9 / t0.elapsed().as_secs_f64())
}

/// A fresh Envoy on the agent in `dir` for `mode`, holding at least `clusters` clusters and
/// acknowledged, with the agent quiet again.
fn envoy(dir: &Path, mode: Mode, clusters: usize, agent: &Proc, metrics: &Metrics) -> anyhow::Result<Envoy> {
    let envoy_dir = dir.join(format!("envoy-{}", mode.label()));
    let builder = Envoy::builder(xds_socket(dir), NODE, &envoy_dir).binary(envoy_bin()?);
    let mut envoy = if mode == Mode::Sotw { builder.sotw() } else { builder }.start()?;
    let deadline = Instant::now() + ENVOY_LOAD;
    loop {
        // Its admin may not answer in time while it builds thousands of clusters: not yet.
        let active = envoy.stat("cluster_manager.active_clusters").unwrap_or(0) as usize;
        let acked = cds(&metrics.scrape()?, mode).0 >= 1.0;
        if active >= clusters && acked {
            break;
        }
        if let Some(status) = envoy.try_wait()? {
            anyhow::bail!("envoy exited ({status}): {}", envoy.log_tail());
        }
        ensure!(
            Instant::now() < deadline,
            "Envoy holds {active} clusters of {clusters} after {} s: {}",
            ENVOY_LOAD.as_secs(),
            envoy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    quiet(agent.child.id())?;
    Ok(envoy)
}

/// Envoy's stat `name`, asked again for up to 30 s while its admin (one thread, busy with
/// thousands of clusters' health checks) does not answer in time.
fn envoy_stat(envoy: &Envoy, name: &str) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match envoy.stat(name) {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Envoy's count of main-thread stalls: its watchdog's misses (the main thread did not return to
/// its event loop within the default `miss_timeout`, 200 ms).
const ENVOY_STALLS: &str = "main_thread.watchdog_miss";

/// The policy writes against one Envoy: create and delete in turn, `writes` in all.
struct Writer<'a> {
    api: &'a reqwest::blocking::Client,
    collection: &'a str,
    policy: &'a serde_json::Value,
}

impl Writer<'_> {
    fn write(&self, create: bool) -> anyhow::Result<()> {
        let resp = if create {
            self.api.post(self.collection).json(self.policy).send()?
        } else {
            self.api.delete(format!("{}/pc", self.collection)).send()?
        };
        ensure!(resp.status().is_success(), "policy write: {} {}", resp.status(), resp.text().unwrap_or_default());
        Ok(())
    }
}

/// Measures `writes_at(pods)` writes for write → ACK (the agent scraped every [`POLL`]) and as
/// many for CPU (scraped every [`CPU_POLL`], so the scrapes' own cost stays small next to the
/// change's and is subtracted at the idle rate measured with the same polling).
fn measure(
    pods: usize,
    mode: Mode,
    agent: &Proc,
    metrics: &Metrics,
    envoy: &Envoy,
    writer: &Writer,
) -> anyhow::Result<Run> {
    let pid = agent.child.id();
    let idle_polled = idle_rate(pid, metrics, Some(CPU_POLL))?;
    let idle = idle_rate(pid, metrics, None)?;
    let updates0 = envoy_stat(envoy, "cluster_manager.cds.update_success")?;
    let stalls0 = envoy_stat(envoy, ENVOY_STALLS)?;
    let mut run = Run {
        pods,
        mode,
        cpu: Vec::new(),
        bytes: Vec::new(),
        clusters: Vec::new(),
        ack: Vec::new(),
        api: Vec::new(),
        event_ack: Vec::new(),
        envoy_updates: 0,
        envoy_stalls: 0,
        idle_polled,
        writes: 0,
    };
    for k in 0..2 * writes_at(pods) {
        let for_cpu = k >= writes_at(pods);
        let poll = if for_cpu { CPU_POLL } else { POLL };
        let before = metrics.scrape()?;
        let (acks0, bytes0, clusters0) = cds(&before, mode);
        let hist0 = change_to_ack(&before);
        let cpu0 = schedstat_ns(pid)?;
        let t0 = Instant::now();
        writer.write(k % 2 == 0)?;
        let written = t0.elapsed().as_secs_f64();
        let acked = loop {
            let now = Instant::now();
            if cds(&metrics.scrape()?, mode).0 > acks0 {
                break now;
            }
            ensure!(
                now - t0 < Duration::from_secs(10),
                "no CDS ACK 10 s after policy write {k} ({pods} pods; {} pods delivered over TCP instead of their \
                 socket); the agent's log ends: {}",
                metrics.scrape()?.value("aether_agent_tcp_fallbacks", &[]),
                log_tail(&agent.log)
            );
            std::thread::sleep(poll);
        };
        std::thread::sleep(SETTLE);
        let cpu1 = schedstat_ns(pid)?;
        let after = metrics.scrape()?;
        let (_, bytes1, clusters1) = cds(&after, mode);
        let polled = (acked - t0).as_secs_f64();
        if for_cpu {
            run.cpu.push((cpu1 - cpu0) as f64 / 1e9 - idle_polled * polled - idle * SETTLE.as_secs_f64());
        } else {
            let hist1 = change_to_ack(&after);
            run.ack.push(polled);
            run.api.push(written);
            if hist1.1 > hist0.1 {
                run.event_ack.push((hist1.0 - hist0.0) / (hist1.1 - hist0.1));
            }
        }
        run.bytes.push(bytes1 - bytes0);
        run.clusters.push(clusters1 - clusters0);
        run.writes += 1;
    }
    run.envoy_updates = envoy_stat(envoy, "cluster_manager.cds.update_success")? - updates0;
    run.envoy_stalls = envoy_stat(envoy, ENVOY_STALLS)? - stalls0;
    Ok(run)
}

/// Removes the webhook registration when dropped (later sections write policies without one).
struct Registered<'a>(&'a ControlPlane);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let _ = self.0.delete_webhook();
    }
}

/// The last 30 lines of the log at `path`.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A CPU figure; one below zero (the idle baseline subtracted was larger than the change: the
/// agent was not idle while its baseline was measured) is shown as such, not as a time.
fn show_cpu(s: f64) -> String {
    if s < 0.0 { "< 0 (idle baseline noise)".to_owned() } else { show_secs(s) }
}

/// What limits write → ACK in `run`: the split of its slowest write into the API request, the
/// agent's event → ACK and the rest (the watch delivering the change), and the agent's largest
/// CPU per change.
fn ack_limit(run: &Run, load: &str) -> String {
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let worst = (0..run.ack.len()).max_by(|a, b| run.ack[*a].total_cmp(&run.ack[*b]));
    let split = match worst {
        Some(i) if run.event_ack.len() == run.ack.len() => {
            let (total, api, agent) = (run.ack[i], run.api[i], run.event_ack[i]);
            let part = if agent >= api && agent >= total - api - agent {
                format!(
                    "the agent's watch event → Envoy's ACK (debounce, render, push and Envoy applying CDS; the \
                     agent's own CPU per change stayed ≤ {}, so most of it is Envoy's main thread, which applies CDS \
                     and ACKs while it also runs {} clusters' health checks; its watchdog counted {} main-thread \
                     stalls ≥ 200 ms over the {} writes)",
                    show_cpu(max(&run.cpu)),
                    2 * run.pods,
                    run.envoy_stalls,
                    run.writes
                )
            } else if api >= total - api - agent {
                "the API request (the admission webhook's call and etcd's write)".to_owned()
            } else {
                "the watch delivering the change to the agent (API server → agent)".to_owned()
            };
            format!(
                "the slowest write ({}) was {} API request, {} watch event → ACK in the agent's \
                 `aether_xds_change_to_ack_seconds` and {} between them: most of it is {part}",
                show_secs(total),
                show_secs(api),
                show_secs(agent),
                show_secs((total - api - agent).max(0.0)),
            )
        }
        _ => format!("the agent's own CPU per change stayed ≤ {}", show_cpu(max(&run.cpu))),
    };
    format!("20 ms of every write is the agent's xDS debounce; {split}; load average at the end of section 3e: {load}")
}

/// p50 of `v`, or NaN when empty.
fn p50(v: &[f64]) -> f64 {
    percentile(v, 50.0).unwrap_or(f64::NAN)
}

/// Bytes as `12.3 kB` (1000-based) or `456 B`.
fn show_bytes(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// The section.
pub(crate) fn section_per_change(r: &mut Report, _opts: &Opts, cp: &ControlPlane) -> anyhow::Result<()> {
    let started = Instant::now();
    let work = tempfile::Builder::new().prefix("aebp").tempdir_in("/tmp")?;
    cp.install_crd()?;
    let certs = work.path().join("certs");
    std::fs::create_dir_all(&certs)?;
    let bundle = aether_webhook_certs::mint(&["127.0.0.1".into(), "localhost".into()])?;
    aether_webhook_certs::write_dir(&bundle, &certs)?;
    let controller = Proc::controller(cp, &certs)?;
    cp.register_webhook(
        &format!("https://127.0.0.1:{}/validate", controller.port),
        &certs.join(aether_webhook_certs::CA_FILE),
    )?;
    let _registered = Registered(cp);
    cp.kubectl_ok(&["create", "namespace", NS])?;
    for sa in ["app", "target"] {
        cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, sa])?;
    }
    let target = PodSet { namespace: NS, node: NODE, prefix: "pc-target-", service_account: "target", net: 100 };
    let bulk = PodSet { namespace: NS, node: NODE, prefix: "pc-", service_account: "app", net: 1 };
    target.create(cp, 0..TARGET_PODS)?;
    let (api, server) = api_client(cp)?;
    let collection = format!("{server}/apis/config.aether.io/v1/namespaces/{NS}/endpointpolicies");
    let policy_json = policy(NS, "pc").target("target").socket("s/app.sock").json();
    let writer = Writer { api: &api, collection: &collection, policy: &policy_json };

    let mut runs = Vec::new();
    let mut created = 0;
    for n in SIZES {
        let t0 = Instant::now();
        bulk.create(cp, created..n - TARGET_PODS)?;
        created = n - TARGET_PODS;
        // Short: the target pods' pipes live under it (see `node_pods::pods_dir`).
        let dir = work.path().join(n.to_string());
        let (mut agent, admin) = start_agent(cp, &dir, NODE, &["--max-clusters".into(), MAX_CLUSTERS.to_string()])?;
        folded(&mut agent, admin, n)?;
        eprintln!("per-change: {n} pods created and folded in {:.1} s", t0.elapsed().as_secs_f64());
        let metrics = Metrics::new(admin)?;
        for mode in [Mode::Delta, Mode::Sotw] {
            let t0 = Instant::now();
            let envoy = envoy(&dir, mode, 2 * n, &agent, &metrics)
                .with_context(|| format!("Envoy ({}) on the agent at {n} pods", mode.name()))?;
            eprintln!(
                "per-change: Envoy ({}) holds {n} pods' clusters after {:.1} s",
                mode.name(),
                t0.elapsed().as_secs_f64()
            );
            runs.push(measure(n, mode, &agent, &metrics, &envoy, &writer)?);
            drop(envoy);
        }
        drop(agent);
    }
    drop(controller);
    report(r, &runs, started.elapsed());
    Ok(())
}

/// The p50 agent CPU of `mode` at `pods`.
fn cpu_at(runs: &[Run], pods: usize, mode: Mode) -> Option<f64> {
    runs.iter().find(|r| r.pods == pods && r.mode == mode).map(|r| p50(&r.cpu))
}

/// The changed clusters' encoded size at `pods`: the clusters the delta stream sent per write
/// (p50) × the mean encoded size of one cluster on the SotW stream (its responses carry them all).
fn changed_size(runs: &[Run], pods: usize) -> Option<f64> {
    let delta = runs.iter().find(|r| r.pods == pods && r.mode == Mode::Delta)?;
    let sotw = runs.iter().find(|r| r.pods == pods && r.mode == Mode::Sotw)?;
    let per_cluster = sotw.bytes.iter().sum::<f64>() / sotw.clusters.iter().sum::<f64>();
    Some(p50(&delta.clusters) * per_cluster)
}

fn report(r: &mut Report, runs: &[Run], wall: Duration) {
    r.line("### 3e. One policy change on the live agent: CPU, bytes to Envoy, write → ACK (Delta vs SotW)\n");
    r.line(&format!(
        "The release `aether-agent` (`--max-clusters {MAX_CLUSTERS}`, default debounce) watching the bench's \
         kube-apiserver, with a real Envoy (the chart bootstrap, one worker) on its ADS socket; the node's pods are API \
         objects (as in 3d) grown {} pods, {TARGET_PODS} of them in the service the policy targets. Per size a fresh \
         agent; per mode a fresh Envoy, `DELTA_GRPC` (the chart's) then `GRPC` (State of the World), measured once it \
         holds every cluster. Policy `pc` is created and deleted in turn through the API (webhook included): each \
         write changes the {TARGET_PODS} pods' {} clusters. *write → ACK*: from just before the API request to the \
         first scrape (every ~1 ms) where the agent's `aether_xds_acks_total{{type=\"cluster\"}}` grew. *agent CPU*: \
         `/proc/<pid>/task/*/schedstat` (ns on a CPU, all threads) from before the write to {} ms after the ACK, \
         on as many further writes whose ACK is polled every 10 ms instead (1 ms polling costs the idle agent ~10 % \
         of a core, more than a change), less the idle agent's rate over the same time (measured over {} s with \
         the same polling; shown). *bytes*, \
         *clusters*: growth of `aether_xds_bytes_sent_total` / `aether_xds_resources_sent_total` \
         `{{type=\"cluster\"}}` of the stream's mode (protobuf, no gRPC framing). *of it*: on the write → ACK writes, the API request \
         alone (admission webhook and etcd included) and the agent's own `aether_xds_change_to_ack_seconds` \
         (from the watch event to Envoy's ACK, debounce included); the rest is the watch's delivery. *Envoy CDS updates*: its \
         `cluster_manager.cds.update_success` growth over the writes (cross-check: one per write). *Envoy stalls*: \
         growth of its `main_thread.watchdog_miss` over the writes, the times its main thread (which applies CDS and \
         ACKs) did not return to its event loop within 200 ms. p50 (max) over the writes; wall time of the section {:.0} s.\n",
        SIZES.map(|n| n.to_string()).join(" → "),
        2 * TARGET_PODS,
        SETTLE.as_millis(),
        BASELINE.as_secs(),
        wall.as_secs_f64()
    ));
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| {
            let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
            vec![
                run.pods.to_string(),
                run.mode.name().to_owned(),
                format!("{} + {}", run.ack.len(), run.cpu.len()),
                format!("{} ({})", show_cpu(p50(&run.cpu)), show_cpu(max(&run.cpu))),
                format!("{:.1} %", run.idle_polled * 100.0),
                format!("{} ({})", show_bytes(p50(&run.bytes)), show_bytes(max(&run.bytes))),
                format!("{:.0}", p50(&run.clusters)),
                show_secs(p50(&run.ack)),
                percentile(&run.ack, 99.0).map_or("n/a".into(), show_secs),
                format!("{} ({})", show_secs(p50(&run.api)), show_secs(max(&run.api))),
                format!("{} ({})", show_secs(p50(&run.event_ack)), show_secs(max(&run.event_ack))),
                format!("{} / {}", run.envoy_updates, run.writes),
                run.envoy_stalls.to_string(),
            ]
        })
        .collect();
    r.add(&md_table(
        &[
            "pods",
            "ADS",
            "writes (ACK + CPU)",
            "agent CPU per change",
            "idle agent, polled every 10 ms",
            "CDS bytes sent",
            "clusters sent",
            "write → ACK p50",
            "p99",
            "of it: API request",
            "of it: watch event → ACK (agent)",
            "Envoy CDS updates / writes",
            "Envoy stalls ≥ 200 ms",
        ],
        &rows,
    ));
    r.line("");
    for run in runs {
        r.plots.per_change.push(ChangePoint {
            pods: run.pods,
            mode: run.mode,
            cpu_s: p50(&run.cpu),
            bytes: p50(&run.bytes),
        });
    }
    let [_, k1, k10] = SIZES;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let find = |pods, mode| runs.iter().find(|r: &&Run| r.pods == pods && r.mode == mode);
    if let Some(cpu) = cpu_at(runs, k10, Mode::Delta) {
        r.goals.push(Goal {
            goal: "Policy change at 10k pods: live agent CPU ≤ 5 ms (Delta, real Envoy)",
            figure: format!(
                "{} (p50; SotW: {})",
                show_cpu(cpu),
                cpu_at(runs, k10, Mode::Sotw).map_or("n/a".into(), show_cpu)
            ),
            // Below zero is no measurement (the idle baseline was not idle): not measured.
            met: (cpu >= 0.0).then_some(cpu <= CPU_TARGET_S),
            limit: "see section 3e".into(),
        });
    }
    if let (Some(delta), Some(changed)) = (find(k10, Mode::Delta), changed_size(runs, k10)) {
        let sent = p50(&delta.bytes);
        r.goals.push(Goal {
            goal: "Policy change at 10k pods: bytes sent ≤ 2× the changed clusters' size",
            figure: format!(
                "{} sent for {} of changed clusters ({}; SotW sends {})",
                show_bytes(sent),
                show_bytes(changed),
                show_ratio(ratio(sent, changed)),
                find(k10, Mode::Sotw).map_or("n/a".into(), |s| show_bytes(p50(&s.bytes)))
            ),
            met: Some(sent <= 2.0 * changed),
            limit: "see section 3e".into(),
        });
    }
    for (pods, target, goal) in [
        (k10, ACK_P99_10K_S, "Policy write → Envoy ACK p99 ≤ 100 ms at 10k pods (Delta)"),
        (k1, ACK_P99_1K_S, "Policy write → Envoy ACK p99 ≤ 60 ms at 1k pods (Delta)"),
    ] {
        if let Some(run) = find(pods, Mode::Delta) {
            let p99 = percentile(&run.ack, 99.0).unwrap_or(f64::NAN);
            r.goals.push(Goal {
                goal,
                figure: format!("{} (p50 {}, {} writes)", show_secs(p99), show_secs(p50(&run.ack)), run.ack.len()),
                met: Some(p99 <= target),
                limit: ack_limit(run, &load),
            });
        }
    }
    if let (Some(a), Some(b)) = (cpu_at(runs, k1, Mode::Delta), cpu_at(runs, k10, Mode::Delta)) {
        let growth = ratio(b, a).filter(|_| a > 0.0 && b >= 0.0);
        r.goals.push(Goal {
            goal: "Growth of live per-change agent CPU 1k → 10k pods ≤ 1.5× (Delta)",
            figure: format!("{} ({} → {})", show_ratio(growth), show_cpu(a), show_cpu(b)),
            met: growth.map(|g| g <= GROWTH_TARGET),
            limit: "see section 3e".into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pods: usize, mode: Mode, bytes: Vec<f64>, clusters: Vec<f64>) -> Run {
        Run {
            pods,
            mode,
            cpu: vec![0.001],
            bytes,
            clusters,
            ack: vec![0.03],
            api: vec![0.005],
            event_ack: vec![0.022],
            envoy_updates: 2,
            envoy_stalls: 1,
            idle_polled: 0.0,
            writes: 2,
        }
    }

    #[test]
    fn changed_size_is_delta_clusters_times_the_sotw_mean_cluster() {
        let runs = [
            run(1_000, Mode::Delta, vec![2_100.0, 2_300.0, 2_200.0], vec![10.0, 10.0, 10.0]),
            // 2,010 clusters of 200 bytes each per SotW response.
            run(1_000, Mode::Sotw, vec![402_000.0, 402_000.0], vec![2_010.0, 2_010.0]),
        ];
        assert_eq!(changed_size(&runs, 1_000), Some(2_000.0));
        assert_eq!(changed_size(&runs, 10_000), None);
    }

    #[test]
    fn the_ack_limit_names_the_largest_part_of_the_slowest_write() {
        let mut r = run(1_000, Mode::Delta, vec![], vec![]);
        r.ack = vec![0.06, 0.40, 0.07];
        r.api = vec![0.01, 0.02, 0.01];
        r.event_ack = vec![0.03, 0.35, 0.04];
        let limit = ack_limit(&r, "1 1 1");
        assert!(limit.contains(&show_secs(0.40)) && limit.contains("watch event → Envoy's ACK"), "{limit}");
        assert!(limit.contains("2000 clusters") && limit.contains("1 main-thread stalls"), "{limit}");
        r.api[1] = 0.30;
        r.event_ack[1] = 0.05;
        assert!(ack_limit(&r, "1 1 1").contains("most of it is the API request"));
        r.api[1] = 0.01;
        assert!(ack_limit(&r, "1 1 1").contains("most of it is the watch delivering"));
    }

    #[test]
    fn negative_cpu_is_not_shown_as_a_time() {
        assert_eq!(show_cpu(-0.001), "< 0 (idle baseline noise)");
        assert_eq!(show_cpu(0.0015), show_secs(0.0015));
    }

    #[test]
    fn bytes_show_in_decimal_units() {
        assert_eq!(show_bytes(512.0), "512 B");
        assert_eq!(show_bytes(4_567.0), "4.6 kB");
        assert_eq!(show_bytes(3_400_000.0), "3.40 MB");
    }
}
