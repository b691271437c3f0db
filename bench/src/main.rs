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
//! agents mount the socket pins, and the nodes are namespaces of this machine. Each section is its
//! module (the machine [`machine`], 1 [`fold_render`], 3 [`convergence`], 4 [`dataplane`], 4b
//! [`inbound`], ...); this file holds the command line, the dispatch and the report's writing.

mod ads_client;
mod ads_mode;
mod api_client;
mod continuity;
mod convergence;
mod cross_node;
mod dataplane;
mod fleet;
mod flood;
mod fold_render;
mod health_gateway;
mod inbound;
mod machine;
mod netns;
mod node_pods;
mod oha;
mod per_change;
mod plots;
mod processes;
mod profile;
mod proxy_memory;
mod repin;
mod rss;
mod scrape_flood;
mod stats;
mod webhook;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use aether_tests::{ControlPlane, repo_root};
use anyhow::Context;
use processes::Proc;
use stats::md_table;

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
    machine::section(&mut r, &opts)?;
    if opts.wants("agent") {
        fold_render::section(&mut r, &opts).context("section 1 (agent)")?;
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
                convergence::section(&mut r, &opts, &cp, &controller, certs.path())
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
        dataplane::section(&mut r, &opts).context("section 4 (data plane)")?;
        inbound::section(&mut r, &opts).context("section 4b (inbound listener in a netns)")?;
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

// ------------------------------------------------------------------------------------ report

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
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
