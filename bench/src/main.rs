//! `aether-bench`: the orchestrator of `make bench` (run by `tests/bench/run.sh`).
//!
//! It reads what the agent benches wrote (criterion samples, re-render counts, memory), starts
//! the real components through the `aether_tests` harness (kube-apiserver + etcd, the release
//! `aether-controller`, `aether-agent`, Envoy, `uds-echo`), drives load with oha, prints its
//! sections with their ratios and writes the same text to `docs/benchmarks.md`.
//!
//! `aether-bench --help` lists the options; `tests/bench/run.sh` sets them from its `BENCH_*`
//! environment. `fleet` ([`fleet`]; docs/benchmarks.md, section 3f, "A fleet, simulated") runs 10,
//! then 100 agents with an ADS client each ([`ads_client`]). `repin` ([`repin`], section 3b), `flood`
//! ([`flood`], section 3g) and `nodes` ([`cross_node`], section 7: two real nodes) need root: their
//! agents mount the socket pins, and the nodes are namespaces of this machine.

mod ads_client;
mod ads_mode;
mod continuity;
mod cross_node;
mod fleet;
mod flood;
mod health_gateway;
mod node_pods;
mod per_change;
mod plots;
mod profile;
mod proxy_memory;
mod repin;
mod rss;
mod stats;
mod webhook;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aether_fixtures::{Envoy, pod, policy};
use aether_tests::{ControlPlane, envoy_bin, free_port, http_get_status, repo_root};
use anyhow::{Context, bail, ensure};
use stats::{OhaRun, Spread, md_table, percentile, ratio, show_count, show_ratio, show_secs};

/// Every section `--sections` accepts, in the order the report prints them.
const SECTIONS: [&str; 13] = [
    "agent",
    "webhook",
    "convergence",
    "gateway",
    "repin",
    "flood",
    "dataplane",
    "proxy-memory",
    "continuity",
    "rss",
    "per-change",
    "fleet",
    "nodes",
];

/// The command-line options (`aether-bench --help`); `tests/bench/run.sh` passes them all.
#[derive(clap::Parser)]
#[command(
    name = "aether-bench",
    about = "Measure the agent, the webhook, convergence, the data plane and a fleet against the real components, and write docs/benchmarks.md",
    long_about = "Measure the agent, the webhook, convergence, the data plane and a fleet against the real \
components (kube-apiserver + etcd, the release aether-controller and aether-agent, Envoy, uds-echo), print \
the report and write it to docs/benchmarks.md. Run it through `make bench` (tests/bench/run.sh), which \
builds the release binaries and runs the agent's criterion benches first. The sections repin, flood and \
nodes need root."
)]
struct Opts {
    /// The oha load generator (tests/bench/run.sh installs it into .cache/tools)
    #[arg(long, value_name = "PATH", default_value_os_t = repo_root().join(".cache/tools/bin/oha"))]
    oha: PathBuf,
    /// Where the report is written (Markdown; the SVG plots go to a `benchmarks/` folder next to it)
    #[arg(long, value_name = "FILE", default_value_os_t = repo_root().join("docs/benchmarks.md"))]
    out: PathBuf,
    /// Print the report only; write no file
    #[arg(long, conflicts_with = "out")]
    no_write: bool,
    /// Where the agent benches wrote their counts and memory figures (AETHER_BENCH_OUT)
    #[arg(long, value_name = "DIR", default_value_os_t = repo_root().join("target/aether-bench"))]
    agent_out: PathBuf,
    /// Criterion's output folder of the agent's scale bench (CRITERION_HOME)
    #[arg(long, value_name = "DIR", default_value_os_t = repo_root().join("target/aether-bench/criterion"))]
    criterion: PathBuf,
    /// Repetitions of each load figure
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    reps: usize,
    /// Seconds of load per repetition
    #[arg(long, value_name = "SECONDS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    secs: u64,
    /// Policy changes per convergence figure (section 3)
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    changes: usize,
    /// Socket re-creations per re-pin figure (section 3b)
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    repins: usize,
    /// Files created and deleted in one pod's socket volume (section 3g)
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    flood_files: usize,
    /// The sections to run, comma-separated
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = SECTIONS.map(String::from), value_parser = clap::builder::PossibleValuesParser::new(SECTIONS))]
    sections: Vec<String>,
}

impl Opts {
    /// The report's file, unless `--no-write`.
    fn out(&self) -> Option<&Path> {
        (!self.no_write).then_some(self.out.as_path())
    }

    fn wants(&self, section: &str) -> bool {
        self.sections.iter().any(|s| s == section)
    }
}

/// One goal of the issue: what was measured against what was asked.
struct Goal {
    goal: &'static str,
    figure: String,
    met: Option<bool>,
    limit: String,
}

/// The report being written: Markdown, printed as it grows.
#[derive(Default)]
struct Report {
    text: String,
    goals: Vec<Goal>,
    /// What the sections measured for the SVG plots ([`plots`]).
    plots: plots::Data,
}

impl Report {
    fn add(&mut self, s: &str) {
        print!("{s}");
        self.text.push_str(s);
    }
    fn line(&mut self, s: &str) {
        self.add(&format!("{s}\n"));
    }
}

fn main() -> anyhow::Result<()> {
    let opts = <Opts as clap::Parser>::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = Instant::now();
    let mut r = Report::default();
    machine(&mut r, &opts)?;
    if opts.wants("agent") {
        section_agent(&mut r, &opts).context("section 1 (agent)")?;
    }
    if ["webhook", "convergence", "repin", "flood", "gateway", "rss", "per-change", "fleet"]
        .iter()
        .any(|s| opts.wants(s))
    {
        let cp = ControlPlane::start().context("starting the control plane")?;
        if opts.wants("webhook") || opts.wants("convergence") {
            let certs = tempfile::Builder::new().prefix("aether-bench-certs-").tempdir()?;
            let bundle = aether_webhook_certs::mint(&["127.0.0.1".into(), "localhost".into()])?;
            aether_webhook_certs::write_dir(&bundle, certs.path())?;
            let controller = Proc::controller(&cp, certs.path())?;
            if opts.wants("webhook") {
                webhook::section_webhook(&mut r, &opts, &cp, &controller, certs.path())
                    .context("section 2 (webhook)")?;
            }
            if opts.wants("convergence") {
                section_convergence(&mut r, &opts, &cp, &controller, certs.path())
                    .context("section 3 (convergence)")?;
            }
        }
        if opts.wants("repin") {
            repin::section_repin(&mut r, &opts, &cp).context("section 3b (re-pin)")?;
        }
        if opts.wants("gateway") {
            health_gateway::section_health_gateway(&mut r, &opts, &cp).context("section 3c (health gateway)")?;
        }
        if opts.wants("rss") {
            rss::section_rss(&mut r, &opts, &cp).context("section 3d (agent RSS per pod)")?;
        }
        if opts.wants("per-change") {
            per_change::section_per_change(&mut r, &opts, &cp).context("section 3e (per-change, Delta vs SotW)")?;
        }
        if opts.wants("fleet") {
            fleet::section_fleet(&mut r, &opts, &cp).context("section 3f (a fleet of agents)")?;
        }
        if opts.wants("flood") {
            flood::section_flood(&mut r, &opts, &cp).context("section 3g (file flood)")?;
        }
    }
    if opts.wants("dataplane") {
        section_dataplane(&mut r, &opts).context("section 4 (data plane)")?;
        section_inbound(&mut r, &opts).context("section 4b (inbound listener in a netns)")?;
    }
    if opts.wants("proxy-memory") {
        proxy_memory::section(&mut r).context("section 5 (Envoy memory per cluster)")?;
    }
    if opts.wants("continuity") {
        continuity::section(&mut r).context("section 6 (node proxy continuity)")?;
    }
    if opts.wants("nodes") {
        cross_node::section(&mut r, &opts).context("section 7 (cross-node, UDS vs TCP)")?;
    }
    if let Some(out) = opts.out() {
        plots::section(&mut r, out).context("the SVG plots")?;
    }
    goals(&mut r);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    r.line(&format!(
        "\nWall time of the measuring run (after the build): {:.0} s; load average at the end: {}.",
        started.elapsed().as_secs_f64(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    ));
    if let Some(out) = opts.out() {
        let header = format!(
            "# Benchmarks\n\nProduced by `make bench` (tests/bench/run.sh → `aether-bench`) on {}; this file is its \
             output, unedited. Absolute times on a shared 2-core machine are noisy: the figures that matter are the \
             ratios, each measured in the same run. `median [min–max]` is over the repetitions stated.\n\n",
            utc_now()
        );
        std::fs::write(out, header + &r.text).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

// ------------------------------------------------------------------------------------ machine

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn version_of(bin: &Path, arg: &str) -> String {
    Command::new(bin)
        .arg(arg)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_owned()
        })
        .unwrap_or_else(|| "?".to_owned())
}

fn machine(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total = mem.lines().find_map(|l| l.strip_prefix("MemTotal:")).map(str::trim).unwrap_or("?");
    r.line("## Machine\n");
    r.line(&format!("- CPU: {} × {}", cores, model.unwrap_or("unknown")));
    r.line(&format!("- Memory: {mem_total}; kernel {}", kernel.trim()));
    r.line(&format!("- Load average at the start: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")));
    r.line(&format!(
        "- Load generator: {}; Envoy: {}",
        version_of(&opts.oha, "--version"),
        envoy_bin().map(|e| version_of(&e, "--version")).unwrap_or_else(|e| format!("{e:#}"))
    ));
    r.line(&format!(
        "- Repetitions: {} per load figure ({} s each), {} changes per convergence figure, {} socket re-creations \
         per re-pin figure; agent figures: criterion, 10 samples each; memory: 3 processes per size\n",
        opts.reps, opts.secs, opts.changes, opts.repins
    ));
    Ok(())
}

// ------------------------------------------------------------------------------------ section 1

const PODS: [usize; 3] = [110, 1_000, 10_000];
const POLICIES: [usize; 3] = [1, 10, 2_000];
/// What bounds the full build of 10k pods, from its profile (`perf record` of the criterion
/// `agent_full_build/10000x10` bench; see docs/benchmarks.md section 1).
const FULL_BUILD_BOUND: &str = "perf of agent_full_build/10000x10 (10 boots; flamegraph of an earlier profile: \
     docs/benchmarks/full-build-flamegraph.svg): no superlinear step is left; it is ~15-20 µs of per-pod work spread \
     thin: the xDS encoder 52 % (encoding 20k clusters 24 %, the node's health-check config 6.6 %, per-pod \
     duplicate and validity checks 5.3 %, cluster-name ownership 3.5 %, sorting names 2.2 %), the driver 35 % \
     (Index::reset_pods 17 %, publish 10.4 %), extracting records from the API pods 4.8 % and dropping them 4 %; \
     by kind malloc/free 18.5 % with drops, SHA-256 digests 4.2 %. 50 ms needs ~5 µs per pod: encoding each \
     cluster once without building a Cluster message, no per-pod name formatting, one validation per spec";
const EVENTS: [&str; 4] = ["policy_change", "pod_change", "noop_resync", "relist_noop"];

fn criterion_time(opts: &Opts, group: &str, id: &str) -> anyhow::Result<Spread> {
    let file = opts.criterion.join(group).join(id).join("new/sample.json");
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!("reading {} (run `cargo bench -p aether-agent-reconciler --bench scale`)", file.display())
    })?;
    stats::criterion_samples(&text)
}

fn section_agent(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
    let counts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(opts.agent_out.join("agent-counts.json")).context("reading agent-counts.json")?,
    )?;
    let count = |id: &str, event: &str, field: &str| -> f64 {
        counts
            .as_array()
            .into_iter()
            .flatten()
            .find(|row| row["id"] == id && row["event"] == event)
            .and_then(|row| row[field].as_f64())
            .unwrap_or(f64::NAN)
    };
    r.line("## 1. Agent: fold and render at node scale\n");
    r.line(
        "criterion (`agent-reconciler/benches/scale.rs`, public API only) on a synthetic node: pods in services of 5 \
         replicas over 10 namespaces, one port each (2 clusters per pod: app + health), policy *k* on service *k*. \
         **Full build** = relist policies and pods into a new index, render every pod, encode every cluster with a \
         fresh xDS encoder (an agent restart, or an implementation that re-renders everything on any change). \
         **Per event** = the index mutation, then — when the delivery map changed — `render::render` of the map into \
         cluster specs and the cached xDS `Encoder` (encodes only the clusters whose spec changed): what the agent \
         does per watch event, without the on-disk socket check, the state-dir write and the debounce. Events: one \
         policy's socket edited; one pod's health path edited; one pod re-delivered unchanged (watch resync); a relist \
         of all pods, none changed.\n",
    );
    let mut rows = Vec::new();
    for n in PODS {
        for p in POLICIES {
            let id = format!("{n}x{p}");
            let mut row = vec![show_count(n as f64), show_count(p as f64)];
            let build = criterion_time(opts, "full_build", &id)?;
            row.push(build.show(show_secs));
            for event in EVENTS {
                row.push(criterion_time(opts, event, &id)?.show(show_secs));
            }
            let per_policy = criterion_time(opts, "policy_change", &id)?;
            row.push(show_ratio(ratio(build.median, per_policy.median)));
            rows.push(row);
        }
    }
    r.line("Time (median [min–max] of 10 criterion samples):\n");
    r.add(&md_table(
        &[
            "pods",
            "policies",
            "full build",
            "policy change",
            "pod change",
            "no-op resync",
            "no-op relist",
            "full build ÷ policy change",
        ],
        &rows,
    ));

    let mut rows = Vec::new();
    let mut only_its_service = true;
    for n in PODS {
        for p in POLICIES {
            let id = format!("{n}x{p}");
            let total = count(&id, "policy_change", "clusters_total");
            let mut row = vec![show_count(n as f64), show_count(p as f64), show_count(total)];
            for event in ["policy_change", "pod_change", "noop_resync", "relist_noop"] {
                let (pods, clusters) = (count(&id, event, "pods_refolded"), count(&id, event, "clusters_reencoded"));
                row.push(format!("{} / {}", show_count(pods), show_count(clusters)));
            }
            let pc = count(&id, "policy_change", "clusters_reencoded");
            row.push(show_ratio(ratio(total, pc)));
            only_its_service &= count(&id, "policy_change", "pods_refolded") == 5.0 && pc == 10.0;
            rows.push(row);
        }
    }
    r.line(
        "\nWork per event: pods re-folded (`Change::rerendered` of the index) / clusters re-encoded (cluster specs that \
         differ from the previous snapshot by name — exactly the xDS encoder's cache misses), against re-rendering \
         every pod's clusters (the Go implementation's behaviour):\n",
    );
    r.add(&md_table(
        &[
            "pods",
            "policies",
            "clusters",
            "policy change",
            "pod change",
            "no-op resync",
            "no-op relist",
            "all clusters ÷ re-encoded (policy change)",
        ],
        &rows,
    ));
    r.line(
        "\nA policy change re-folds the 5 pods of its service and re-encodes their 10 clusters at every scale. The \
         per-event groups above keep the earlier whole-map path for comparison: `render::render` rebuilds the node's \
         list of cluster *specs* from the delivery map and the encoder compares each spec with its cache and \
         re-hashes the versions, an O(pods) pass per event. The live agent no longer does that pass: its path is the \
         `agent_*` table below.",
    );
    let stage =
        |id: &str| criterion_time(opts, "stage", id).map(|s| s.show(show_secs)).unwrap_or_else(|e| format!("{e:#}"));
    r.line(&format!(
        "\nWhere a per-event cost goes at 10k pods, 10 policies: the index mutation of a policy change alone {}; \
         `render::render` of the map into cluster specs {}; the cached xDS encoder on an unchanged snapshot (a cache \
         lookup and spec comparison per cluster, cloning each encoded cluster into the new set, sorting by name, and \
         the version over the per-cluster digests; the health-gateway listener is reused while its list is \
         unchanged) {}.",
        stage("index_policy_change"),
        stage("render_specs"),
        stage("xds_render_cached")
    ));
    r.goals.push(Goal {
        goal: "One policy change re-renders only its service's pods",
        figure: format!("{} (5 pods, 10 clusters, at every size)", if only_its_service { "yes" } else { "NO" }),
        met: Some(only_its_service),
        limit: String::new(),
    });

    // The live agent's own path: driver → per-pod render → encoder (`agent_*` groups).
    let mut rows = Vec::new();
    let mut policy = Vec::new();
    for n in PODS {
        let id = format!("{n}x10");
        let [build, pc, pod] =
            ["agent_full_build", "agent_policy_change", "agent_pod_change"].map(|g| criterion_time(opts, g, &id));
        let (build, pc, pod) = (build?, pc?, pod?);
        policy.push(pc.median);
        rows.push(vec![show_count(n as f64), build.show(show_secs), pc.show(show_secs), pod.show(show_secs)]);
    }
    r.line(
        "\nThe live agent's path (`agent_*` groups): a `Driver` fed the watch events, re-rendering only the pods the \
         index reports changed and sending only those to the encoder, whose served sets are persistent maps with \
         running versions (no state dir, no debounce, no ADS send; 10 policies). The per-event groups above emulate \
         the earlier whole-map path (`render::render` of every pod, then the cached encoder over the whole list).\n",
    );
    r.add(&md_table(&["pods", "boot + first render", "policy change", "pod change"], &rows));
    let growth = ratio(policy[2], policy[1]);
    r.goals.push(Goal {
        goal: "Policy change at 10k pods: agent CPU ≤ 5 ms (in-process path, criterion)",
        figure: show_secs(policy[2]),
        met: Some(policy[2] <= 0.005),
        limit: String::new(),
    });
    r.goals.push(Goal {
        goal: "Per-change CPU growth 1k → 10k pods ≤ 1.5× (in-process path, criterion)",
        figure: show_ratio(growth),
        met: Some(growth.is_some_and(|g| g <= 1.5)),
        limit: String::new(),
    });

    let mem: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(opts.agent_out.join("agent-memory.json")).context("reading agent-memory.json")?,
    )?;
    let mut rows = Vec::new();
    for n in PODS {
        let per_pod: Vec<f64> = mem
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| row["pods"].as_u64() == Some(n as u64))
            .filter_map(|row| row["bytes_per_pod"].as_f64())
            .collect();
        let s = Spread::of(&per_pod).context("no memory rows")?;
        rows.push(vec![show_count(n as f64), s.show(|b| format!("{:.1} KiB", b / 1024.0))]);
    }
    r.line(
        "\nResident memory per pod (`agent-reconciler/benches/memory.rs`): `VmRSS` growth of a fresh process while it \
         boots the agent's own path (the driver on the policy and pod lists, the encoder fed per pod, as the \
         `agent_*` groups) and keeps what the agent keeps: the index, the delivery map, each pod's rendering, the \
         encoder's state and the encoded resources (10 policies), divided by the pods; 3 processes per size. An \
         upper bound: it includes allocator slack and the relist's transient buffers the allocator kept; at 110 \
         pods the page granularity of RSS dominates.\n",
    );
    r.add(&md_table(&["pods", "RSS per pod"], &rows));
    let agent_build = criterion_time(opts, "agent_full_build", "10000x10")?.median;
    let build_10k: Vec<(usize, f64)> = POLICIES
        .iter()
        .filter_map(|p| criterion_time(opts, "full_build", &format!("10000x{p}")).ok().map(|s| (*p, s.median)))
        .collect();
    r.goals.push(Goal {
        goal: "Full build (restart) of 10k pods, fold + render + encode without I/O, ≤ 50 ms",
        figure: format!(
            "the agent's boot + first render {} (10 policies); the whole-map full build: {}",
            show_secs(agent_build),
            build_10k.iter().map(|(p, t)| format!("{p} policies {}", show_secs(*t))).collect::<Vec<_>>().join(", ")
        ),
        met: Some(agent_build <= 0.050),
        limit: FULL_BUILD_BOUND.into(),
    });
    r.line("");
    Ok(())
}

// ------------------------------------------------------------------------------------ processes

/// A workspace binary next to this one (`target/release/NAME`: run.sh builds them all).
fn workspace_bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().context("aether-bench has no directory")?.join(name);
    ensure!(bin.is_file(), "{} is not built: run `cargo build --release --workspace --bins`", bin.display());
    Ok(bin)
}

/// A child process killed on drop, with its log file.
struct Proc {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn spawn(mut cmd: Command, log: PathBuf, port: u16) -> anyhow::Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(Proc { child, log, port })
    }

    fn wait_until(&mut self, what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            if let Some(status) = self.child.try_wait()? {
                bail!("{what} exited ({status}): {}", std::fs::read_to_string(&self.log).unwrap_or_default());
            }
            ensure!(
                Instant::now() < deadline,
                "{what} not ready after 30 s: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The release `aether-controller run` with its TLS files in `certs` (the same flags as the
    /// harness's `Controller`), `KUBECONFIG` pointing at the bench's control plane (for a status
    /// writer, when the binary has one). `port` is the webhook port.
    fn controller(cp: &ControlPlane, certs: &Path) -> anyhow::Result<Proc> {
        let (port, admin) = (free_port(), free_port());
        let mut cmd = Command::new(workspace_bin("aether-controller")?);
        cmd.arg("run")
            .args(["--webhook-addr", &format!("127.0.0.1:{port}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
            .arg("--tls-dir")
            .arg(certs)
            .env("KUBECONFIG", cp.kubeconfig());
        let mut p = Proc::spawn(cmd, certs.join("controller.log"), port)?;
        p.wait_until("aether-controller", || http_get_status(admin, "/readyz") == Some(200))?;
        Ok(p)
    }

    /// `webhook-floor` on the same certificates.
    fn floor(certs: &Path) -> anyhow::Result<Proc> {
        let port = free_port();
        let mut cmd = Command::new(workspace_bin("webhook-floor")?);
        cmd.arg("--tls-dir").arg(certs).args(["--addr", &format!("127.0.0.1:{port}")]);
        let mut p = Proc::spawn(cmd, certs.join("floor.log"), port)?;
        p.wait_until("webhook-floor", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())?;
        Ok(p)
    }

    /// `uds-echo` on a Unix socket (`Ok(socket)`) or a TCP port.
    fn echo(dir: &Path, name: &str, socket: Option<&Path>) -> anyhow::Result<Proc> {
        let port = free_port();
        let mut cmd = Command::new(workspace_bin("uds-echo")?);
        match socket {
            Some(s) => cmd.arg("--socket").arg(s),
            None => cmd.args(["--tcp", &format!("127.0.0.1:{port}")]),
        };
        cmd.args(["--name", name]);
        let mut p = Proc::spawn(cmd, dir.join(format!("{name}.log")), port)?;
        match socket {
            Some(s) => p.wait_until(name, || std::os::unix::net::UnixStream::connect(s).is_ok())?,
            None => p.wait_until(name, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())?,
        }
        Ok(p)
    }
}

/// A network namespace made for the bench (`ip netns add`, loopback up), deleted when dropped:
/// a pod's netns without the pod. Drop it after the processes started in it.
struct Netns {
    name: String,
}

impl Netns {
    /// `ip netns add NAME` and `ip link set lo up` in it. Needs root (CAP_SYS_ADMIN).
    fn add(name: &str) -> anyhow::Result<Netns> {
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
    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `program` run inside it. `ip netns exec` execs `program` in place (no fork), so the child
    /// is the program itself and killing it (a `Proc` dropped) stops it.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
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

/// One oha run; `args` come before the URL.
fn oha(opts: &Opts, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
    oha_in(opts, None, args, url)
}

/// One oha run, inside `netns` when given.
fn oha_in(opts: &Opts, netns: Option<&Netns>, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
    let cmd = match netns {
        Some(ns) => ns.command(&opts.oha),
        None => Command::new(&opts.oha),
    };
    oha_with(opts, cmd, args, url)
}

/// One oha run with `cmd`, which runs oha (or a wrapper that execs it, as `nsenter`).
fn oha_with(opts: &Opts, mut cmd: Command, args: &[String], url: &str) -> anyhow::Result<OhaRun> {
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

// ------------------------------------------------------------------------------------ section 3

const NS: &str = "bench";
const NODE: &str = "bench-node";
/// The agent's `--xds-debounce-ms` in the convergence section (its default).
const DEBOUNCE_MS: u64 = 20;

/// The API server's address and the admin client identity, from the harness's kubeconfig.
fn api_client(cp: &ControlPlane) -> anyhow::Result<(reqwest::blocking::Client, String)> {
    let kc = std::fs::read_to_string(cp.kubeconfig())?;
    let field = |k: &str| -> anyhow::Result<String> {
        kc.lines()
            .find_map(|l| l.trim().strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .with_context(|| format!("kubeconfig has no {k}"))
    };
    let server = field("server:")?;
    let ca = std::fs::read(field("certificate-authority:")?)?;
    let mut identity = std::fs::read(field("client-certificate:")?)?;
    identity.extend(std::fs::read(field("client-key:")?)?);
    let client = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .identity(reqwest::Identity::from_pem(&identity)?)
        .timeout(Duration::from_secs(20))
        .build()?;
    Ok((client, server))
}

/// Polls Envoy's admin config_dump (one keep-alive client) until cluster `name`'s endpoint
/// contains `want`; returns when it did.
fn wait_envoy(client: &reqwest::blocking::Client, admin: u16, name: &str, want: &str) -> anyhow::Result<Instant> {
    let url = format!("http://127.0.0.1:{admin}/config_dump?resource=dynamic_active_clusters&name_regex=^{name}$");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = client.get(&url).send()?.text()?;
        let now = Instant::now();
        if body.contains(want) {
            return Ok(now);
        }
        ensure!(now < deadline, "Envoy never showed {want} for {name}: {body}");
        std::thread::sleep(Duration::from_micros(500));
    }
}

struct Convergence {
    via: &'static str,
    apply: Vec<f64>,
    delete: Vec<f64>,
}

fn section_convergence(
    r: &mut Report,
    opts: &Opts,
    cp: &ControlPlane,
    controller: &Proc,
    certs: &Path,
) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("aeb").tempdir_in("/tmp")?;
    let (pods, run) = (work.path().join("pods"), work.path().join("run"));
    std::fs::create_dir_all(&pods)?;
    std::fs::create_dir_all(&run)?;
    cp.install_crd()?;
    cp.register_webhook(
        &format!("https://127.0.0.1:{}/validate", controller.port),
        &certs.join(aether_webhook_certs::CA_FILE),
    )?;
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "echo"])?;
    cp.apply(
        &pod(NS, "echo-1")
            .node(NODE)
            .sa("echo")
            .container("app", "registry.example/uds-echo:bench")
            .emptydir("s")
            .manifest(),
    )?;
    // No kubelet: give the pod an IP so its TCP delivery renders (status subresource).
    cp.kubectl_ok(&[
        "patch",
        "pod",
        "-n",
        NS,
        "echo-1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"podIP":"10.0.0.9","podIPs":[{"ip":"10.0.0.9"}]}}"#,
    ])?;
    let uid = cp.kubectl_ok(&["get", "pod", "-n", NS, "echo-1", "-o", "jsonpath={.metadata.uid}"])?;
    let volume = pods.join(&uid).join("volumes/kubernetes.io~empty-dir/s");
    std::fs::create_dir_all(&volume)?;
    let socket = volume.join("app.sock");
    let _echo = Proc::echo(work.path(), "echo-1", Some(&socket))?;

    let xds = run.join("xds.sock");
    let agent_admin = free_port();
    let mut cmd = Command::new(workspace_bin("aether-agent")?);
    cmd.arg("run")
        .args(["--node-name", NODE, "--admin-addr", &format!("127.0.0.1:{agent_admin}")])
        // Any free loopback debug port, by env: an earlier release under comparison has no such flag.
        .env("AETHER_DEBUG_ADDR", "127.0.0.1:0")
        .args(["--xds-debounce-ms", &DEBOUNCE_MS.to_string()])
        .arg("--kubelet-pods-dir")
        .arg(&pods)
        .arg("--state-dir")
        .arg(work.path().join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", xds.display()))
        .arg("--health-socket")
        .arg(run.join("health.sock"))
        .env("KUBECONFIG", cp.kubeconfig());
    let mut agent = Proc::spawn(cmd, work.path().join("agent.log"), agent_admin)?;
    agent.wait_until("aether-agent", || http_get_status(agent_admin, "/readyz") == Some(200))?;
    let envoy_dir = work.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir)?;
    let envoy = Envoy::builder(&xds, NODE, &envoy_dir).binary(envoy_bin()?).start()?;
    let cluster = "app_bench_echo-1_8080";
    let poll = reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let pipe = format!("\"path\": \"{}\"", socket.display());
    let tcp = "\"address\": \"10.0.0.9\"";
    wait_envoy(&poll, envoy.admin_port(), cluster, tcp).context("the pod's TCP cluster before any policy")?;

    let echo_uds = policy(NS, "echo-uds").target("echo").socket("s/app.sock");
    let (policy_manifest, policy_json) = (echo_uds.manifest(), echo_uds.json());
    let (api, server) = api_client(cp)?;
    let collection = format!("{server}/apis/config.aether.io/v1/namespaces/{NS}/endpointpolicies");
    let mut results = Vec::new();

    // kubectl, as the issue asks: process start, discovery, the write, then the agent and Envoy.
    let mut kc = Convergence { via: "kubectl apply / kubectl delete", apply: Vec::new(), delete: Vec::new() };
    for _ in 0..opts.changes {
        let t0 = Instant::now();
        cp.apply(&policy_manifest)?;
        kc.apply.push((wait_envoy(&poll, envoy.admin_port(), cluster, &pipe)? - t0).as_secs_f64());
        let t0 = Instant::now();
        cp.kubectl_ok(&["delete", "epol", "-n", NS, "echo-uds", "--wait=false"])?;
        kc.delete.push((wait_envoy(&poll, envoy.admin_port(), cluster, tcp)? - t0).as_secs_f64());
    }
    results.push(kc);

    // The API directly (one keep-alive HTTPS client with the kubeconfig's client certificate).
    let mut direct = Convergence { via: "API write (POST / DELETE)", apply: Vec::new(), delete: Vec::new() };
    for _ in 0..opts.changes {
        let t0 = Instant::now();
        let resp = api.post(&collection).json(&policy_json).send()?;
        ensure!(resp.status().is_success(), "create: {} {}", resp.status(), resp.text().unwrap_or_default());
        direct.apply.push((wait_envoy(&poll, envoy.admin_port(), cluster, &pipe)? - t0).as_secs_f64());
        let t0 = Instant::now();
        let resp = api.delete(format!("{collection}/echo-uds")).send()?;
        ensure!(resp.status().is_success(), "delete: {} {}", resp.status(), resp.text().unwrap_or_default());
        direct.delete.push((wait_envoy(&poll, envoy.admin_port(), cluster, tcp)? - t0).as_secs_f64());
    }
    results.push(direct);

    // What kubectl alone costs: a no-op apply (the object exists and is unchanged) and the API's
    // own write latency (create + delete, answered; no wait for Envoy).
    cp.apply(&policy_manifest)?;
    let mut noop = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        cp.apply(&policy_manifest)?;
        noop.push(t0.elapsed().as_secs_f64());
    }
    cp.kubectl_ok(&["delete", "epol", "-n", NS, "echo-uds"])?;
    wait_envoy(&poll, envoy.admin_port(), cluster, tcp)?;
    let mut api_only = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        let resp = api.post(&collection).json(&policy_json).send()?;
        ensure!(resp.status().is_success(), "create: {}", resp.status());
        api_only.push(t0.elapsed().as_secs_f64());
        wait_envoy(&poll, envoy.admin_port(), cluster, &pipe)?;
        api.delete(format!("{collection}/echo-uds")).send()?;
        wait_envoy(&poll, envoy.admin_port(), cluster, tcp)?;
    }

    r.line("## 3. Convergence: policy write → Envoy\n");
    r.line(&format!(
        "A real kube-apiserver + etcd with the webhook registered (the release `aether-controller` admits every \
         create), the release `aether-agent` watching it, a real Envoy on the agent's ADS, and one managed pod whose \
         service the policy targets (its echo server listening on the socket). Each interval runs from just before \
         the write starts to the first poll of Envoy's admin `config_dump` (every ~0.5 ms, one keep-alive client) \
         that shows the pod's cluster dialing the pipe (apply) or its pod IP over TCP again (delete). It includes: \
         the client (kubectl: process start, discovery, the request; or one HTTPS request), the webhook call (create \
         only), the API server and etcd write, the watch event to the agent, the fold and render, the xDS \
         debounce ({DEBOUNCE_MS} ms, the agent's default, coalescing bursts), the push, Envoy's CDS update, and up to one poll. {} changes of each \
         kind, alternating apply and delete.\n",
        opts.changes
    ));
    let mut rows = Vec::new();
    for c in &results {
        for (kind, v) in [("apply → pipe", &c.apply), ("delete → TCP", &c.delete)] {
            rows.push(vec![
                c.via.to_owned(),
                kind.to_owned(),
                percentile(v, 50.0).map_or("n/a".into(), show_secs),
                percentile(v, 99.0).map_or("n/a".into(), show_secs),
                Spread::of(v).map_or("n/a".into(), |s| format!("{}–{}", show_secs(s.min), show_secs(s.max))),
                v.len().to_string(),
            ]);
        }
    }
    r.add(&md_table(&["client", "change", "p50", "p99", "min–max", "n"], &rows));
    let (noop_p50, api_p50) =
        (percentile(&noop, 50.0).unwrap_or(f64::NAN), percentile(&api_only, 50.0).unwrap_or(f64::NAN));
    r.line(&format!(
        "\nFor scale: a no-op `kubectl apply` of the unchanged policy takes {} (p50 of 10): kubectl's own cost; \
         the bare API create (answered, webhook included, no wait for Envoy) takes {} (p50 of 10). The debounce \
         alone is {DEBOUNCE_MS} ms of every figure above.\n",
        show_secs(noop_p50),
        show_secs(api_p50)
    ));
    let kubectl_p99 = percentile(&results[0].apply.iter().chain(&results[0].delete).copied().collect::<Vec<_>>(), 99.0);
    let api_p99 = percentile(&results[1].apply.iter().chain(&results[1].delete).copied().collect::<Vec<_>>(), 99.0);
    r.goals.push(Goal {
        goal: "Convergence p99 ≤ 100 ms",
        figure: format!(
            "kubectl: {}; API write: {} (p99 over apply and delete)",
            kubectl_p99.map_or("n/a".into(), show_secs),
            api_p99.map_or("n/a".into(), show_secs)
        ),
        met: api_p99.zip(kubectl_p99).map(|(a, k)| a <= 0.1 && k <= 0.1),
        limit: format!(
            "{DEBOUNCE_MS} ms of it is the agent's xDS debounce; kubectl's process start and discovery add about {} (no-op apply)",
            show_secs(noop_p50)
        ),
    });
    Ok(())
}

// ------------------------------------------------------------------------------------ section 4

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

fn section_dataplane(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
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

/// Port of the inbound listener and of the app's TCP port inside the bench's netns (fresh, so
/// nothing else holds them).
const INBOUND_PORT: u16 = 8080;
const APP_TCP_PORT: u16 = 9090;

/// A static bootstrap with one inbound listener as the agent renders it
/// (`aether_agent_reconciler::xds::build_inbound_listener` with the default `BuildOptions`,
/// written out by hand as JSON): 0.0.0.0:`port` bound in `netns` (`network_namespace_filepath`),
/// `enable_reuse_port: false`, `connection_limit` (16384) then `tcp_proxy` (idle timeout 1 h) to a
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
                        "stat_prefix": name, "max_connections": 16384 } },
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
fn section_inbound(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
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

// ------------------------------------------------------------------------------------ goals

fn goals(r: &mut Report) {
    r.line("## Goals\n");
    let rows: Vec<Vec<String>> = std::mem::take(&mut r.goals)
        .into_iter()
        .map(|g| {
            let status = match g.met {
                Some(true) => "met",
                Some(false) => "**NOT MET**",
                None => "not measured",
            };
            let limit = if g.met == Some(true) { String::new() } else { g.limit };
            vec![g.goal.to_owned(), g.figure, status.to_owned(), limit]
        })
        .collect();
    r.add(&md_table(&["goal", "this run", "status", "what limits it"], &rows));
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Opts, SECTIONS};

    #[test]
    fn command_line_is_well_formed() {
        Opts::command().debug_assert();
    }

    #[test]
    fn sections_default_to_all_and_reject_an_unknown_name() {
        let all = Opts::try_parse_from(["aether-bench"]).unwrap();
        assert_eq!(all.sections, SECTIONS);
        assert_eq!(all.out(), Some(all.out.as_path()));
        let some = Opts::try_parse_from(["aether-bench", "--sections", "webhook,nodes", "--no-write"]).unwrap();
        assert!(some.wants("nodes") && !some.wants("agent"));
        assert_eq!(some.out(), None);
        let err = Opts::try_parse_from(["aether-bench", "--sections", "webhook,flod"]).err().unwrap();
        assert!(err.to_string().contains("invalid value 'flod' for '--sections <LIST>'"), "{err}");
        let err = Opts::try_parse_from(["aether-bench", "--reps", "0"]).err().unwrap();
        assert!(err.to_string().contains("'--reps <N>'"), "{err}");
    }

    /// `make bench` passes its own default list (`tests/bench/run.sh`): it names the same sections.
    #[test]
    fn run_sh_default_sections_are_these() {
        let script = std::fs::read_to_string(aether_tests::repo_root().join("tests/bench/run.sh")).unwrap();
        let line = script.lines().find(|l| l.starts_with("sections=")).expect("run.sh sets sections=");
        assert_eq!(line, format!("sections=${{BENCH_SECTIONS:-{}}}", SECTIONS.join(",")));
    }
}
