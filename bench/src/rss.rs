//! Section 3d of `make bench`: the resident size of the running agent per pod.
//!
//! The release `aether-agent` (default flags, no Envoy attached) watching the bench's
//! kube-apiserver; the pods are real API objects on the agent's node, created through the API in
//! parallel: managed, a service account, one container, one `emptyDir`, and a pod IP (a status
//! write: no kubelet runs), so each is delivered over TCP and renders its clusters. For each node
//! size a fresh agent (empty state dir) starts, lists the pods, and its `VmRSS` and `VmHWM`
//! (`/proc/<pid>/status`, KiB) are read once `aether_agent_pods` counts every pod and its CPU
//! time has stopped moving. The per-pod figure is the growth over an agent started with no pods.
//!
//! The forced relist is a real one: kube-apiserver is stopped, etcd's revision is moved past the
//! agent's watch (one key written through etcd's v3 JSON gateway) and compacted, and
//! kube-apiserver is started again, so the agent's resumed watch is answered 410 Gone
//! (`aether_agent_watch_errors_total{resource="pods",reason="expired"}` counts it) and
//! kube-runtime lists every pod again.

use std::path::Path;
use std::time::{Duration, Instant};

use aether_tests::{ControlPlane, Scrape};
use anyhow::{Context, ensure};

use crate::node_pods::{FOLD, PodSet, WRITERS, folded, memory_kib, start_agent};
use crate::processes::Proc;
use crate::stats::md_table;
use crate::{Goal, Opts, Report};

const NS: &str = "bench-rss";
const NODE: &str = "bench-rss-node";
/// The node sizes measured, in pods.
const SIZES: [usize; 2] = [1_000, 10_000];
/// The target (docs/benchmarks.md, "Goals"): live RSS growth per pod at 10k pods, in KiB.
const TARGET_KIB_PER_POD: f64 = 8.0;
/// The port of etcd's client URL (from the control plane's `env` file).
fn etcd_port(cp: &ControlPlane) -> anyhow::Result<u16> {
    let env = std::fs::read_to_string(cp.dir().join("env"))?;
    env.lines()
        .find_map(|l| l.strip_prefix("export AETHER_ETCD_PORT="))
        .and_then(|p| p.trim().parse().ok())
        .context("the control plane's env file names no AETHER_ETCD_PORT")
}

/// Forces a relist: kube-apiserver stopped, one etcd write past the agent's watch, etcd
/// compacted to its head, kube-apiserver started; then waits for the agent's 410 and its fold.
fn force_relist(cp: &ControlPlane, agent: &mut Proc, admin: u16, n: usize) -> anyhow::Result<()> {
    let expired = || -> anyhow::Result<f64> {
        Ok(Scrape::get(admin)?.value("aether_agent_watch_errors_total", &[("resource", "pods"), ("reason", "expired")]))
    };
    let before = expired()?;
    cp.stop_apiserver()?;
    let etcd = format!("http://127.0.0.1:{}", etcd_port(cp)?);
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build()?;
    // base64 of "/aether-bench/relist" and "1".
    let put: serde_json::Value = http
        .post(format!("{etcd}/v3/kv/put"))
        .json(&serde_json::json!({"key": "L2FldGhlci1iZW5jaC9yZWxpc3Q=", "value": "MQ=="}))
        .send()?
        .error_for_status()?
        .json()?;
    let revision: u64 =
        put["header"]["revision"].as_str().and_then(|r| r.parse().ok()).context("etcd's put answered no revision")?;
    http.post(format!("{etcd}/v3/kv/compaction"))
        .json(&serde_json::json!({"revision": revision.to_string(), "physical": true}))
        .send()?
        .error_for_status()?;
    cp.start_apiserver()?;
    let deadline = Instant::now() + FOLD;
    while expired()? <= before {
        ensure!(Instant::now() < deadline, "the agent's pod watch was never answered 410 after the compaction");
        std::thread::sleep(Duration::from_millis(200));
    }
    folded(agent, admin, n)
}

/// One row: (pods, RSS after the list, HWM after the list, RSS after the relist, HWM after it).
struct Sample {
    pods: usize,
    listed: (u64, u64),
    relisted: (u64, u64),
    /// How the agent says it lists pods (`strategy=` of its "watching this node's pods" line).
    strategy: String,
}

/// The list strategy the agent logged (`strategy=Streaming` or `strategy=Paged`), or "not logged"
/// (an older agent that does not log it).
fn strategy(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("watching this node's pods"))
        .filter_map(|l| l.split("strategy=").nth(1))
        .filter_map(|rest| rest.split(|c: char| !c.is_alphanumeric()).next())
        .next_back()
        .map_or_else(|| "not logged".to_owned(), str::to_owned)
}

/// The section.
pub(crate) fn section_rss(r: &mut Report, _opts: &Opts, cp: &ControlPlane) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("aebr").tempdir_in("/tmp")?;
    cp.install_crd()?;
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "app"])?;

    let pods = PodSet { namespace: NS, node: NODE, prefix: "rss-", service_account: "app", net: 1 };
    let (mut agent, admin) = start_agent(cp, &work.path().join("empty"), NODE, &[])?;
    folded(&mut agent, admin, 0)?;
    let (baseline, _) = memory_kib(agent.child.id())?;
    drop(agent);

    let mut samples = Vec::new();
    let mut created = 0;
    for n in SIZES {
        let t0 = Instant::now();
        pods.create(cp, created..n)?;
        created = n;
        eprintln!("rss: {n} pods created in {:.1} s", t0.elapsed().as_secs_f64());
        let (mut agent, admin) = start_agent(cp, &work.path().join(format!("pods-{n}")), NODE, &[])?;
        folded(&mut agent, admin, n)?;
        let listed = memory_kib(agent.child.id())?;
        force_relist(cp, &mut agent, admin, n)?;
        let relisted = memory_kib(agent.child.id())?;
        samples.push(Sample { pods: n, listed, relisted, strategy: strategy(&agent.log) });
    }

    r.line("### 3d. The running agent's resident size per pod\n");
    r.line(&format!(
        "The release `aether-agent` (default flags, no Envoy attached) watching the bench's kube-apiserver; the pods \
         are API objects on its node created through the API ({WRITERS} writers at once): managed, a service \
         account, one container, one `emptyDir` and a pod IP, so each renders its TCP clusters. Each size starts a \
         fresh agent (empty state dir); `VmRSS`/`VmHWM` from `/proc/<pid>/status` once `aether_agent_pods` counts \
         every pod and the process's CPU time has stopped moving (≤ 2 ticks in 1 s). Per pod = (RSS − {baseline} \
         KiB, the RSS of the same agent with no pods) / pods. Relist: kube-apiserver stopped, etcd written once and \
         compacted to its head, kube-apiserver started, so the agent's resumed pod watch is answered 410 Gone \
         (counted in `aether_agent_watch_errors_total{{reason=\"expired\"}}`) and it lists every pod again. \
         \"list strategy\" is what the agent logged: `Streaming` (a watch with `sendInitialEvents`, Kubernetes \
         streaming lists) or `Paged` (`list` calls of 500).\n"
    ));
    let per_pod = |kib: u64, pods: usize| kib.saturating_sub(baseline) as f64 / pods as f64;
    let rows: Vec<Vec<String>> = samples
        .iter()
        .map(|s| {
            vec![
                s.pods.to_string(),
                format!("{} KiB", s.listed.0),
                format!("{:.1}", per_pod(s.listed.0, s.pods)),
                format!("{} KiB", s.listed.1),
                format!("{} KiB", s.relisted.0),
                format!("{:.1}", per_pod(s.relisted.0, s.pods)),
                format!("{} KiB", s.relisted.1),
                s.strategy.clone(),
            ]
        })
        .collect();
    r.add(&md_table(
        &[
            "pods",
            "RSS after the list",
            "KiB/pod",
            "peak (VmHWM)",
            "RSS after a relist",
            "KiB/pod",
            "peak after the relist",
            "list strategy",
        ],
        &rows,
    ));
    r.line("");
    r.plots.rss.extend(samples.iter().map(|s| crate::plots::RssPoint {
        pods: s.pods,
        baseline_kib: baseline,
        listed_kib: s.listed.0,
        relisted_kib: s.relisted.0,
    }));
    if let Some(big) = samples.iter().max_by_key(|s| s.pods) {
        let worst = per_pod(big.listed.0.max(big.relisted.0), big.pods);
        r.goals.push(Goal {
            goal: "Live agent RSS growth ≤ 8 KiB per pod at 10k pods",
            figure: format!(
                "{worst:.1} KiB/pod at {} pods (the larger of after the list and after a relist)",
                big.pods
            ),
            met: Some(worst <= TARGET_KIB_PER_POD),
            limit: "see section 3d".into(),
        });
    }
    Ok(())
}
