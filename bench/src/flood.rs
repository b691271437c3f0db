//! The section "3g. A file flood in one pod's socket volume" of `make bench` (docs/benchmarks.md):
//! what a file flood in one pod's socket volume costs the agent.
//!
//! The stage of the re-pin section (docs/benchmarks.md, section 3b, "Re-pin": the release
//! `aether-agent` with `--pin-dir`, a real Envoy on its ADS), one pod delivered over its socket
//! through its pin. A thread then creates and deletes `--flood-files` files (100,000) in that pod's
//! volume dir, as fast as it can: inotify reports every one to the agent's socket watch. Measured:
//! the flood's wall time, the agent's CPU time over it (all threads,
//! `/proc/<pid>/task/*/schedstat`), and the delivery of a second pod created meanwhile (from its
//! app's socket appearing to the first request through Envoy that it answers), against the same
//! delivery with no flood. `BENCH_FLOOD_BASELINE` may name another `aether-agent` binary (an
//! earlier release) to measure the same way, for a before/after table.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aether_tests::{ControlPlane, Scrape};
use anyhow::Context;

use crate::node_pods::schedstat_ns;
use crate::processes::workspace_bin;
use crate::repin::{Stage, app, until};
use crate::stats::{md_table, show_secs};
use crate::{Goal, Opts, Report};

const NODE: &str = "bench-flood-node";
/// The goal: the agent spends at most this share of one core while one pod floods its volume.
const FLOOD_CPU_TARGET: f64 = 0.10;

/// One agent binary's figures.
struct Row {
    label: String,
    files: usize,
    flood: Duration,
    cpu: Duration,
    idle_delivery: Duration,
    flood_delivery: Duration,
    /// `aether_agent_socket_watch_events_total{outcome="overflow"}` after the flood (`None`: an
    /// agent without the counter).
    overflows: Option<f64>,
}

/// Creates pod `name` in `ns`, starts its app and returns how long from its socket appearing
/// until Envoy serves it through its pin.
fn deliver(
    stage: &Stage,
    cp: &ControlPlane,
    ns: &str,
    name: &str,
) -> anyhow::Result<(Duration, crate::processes::Proc)> {
    let (_, socket) = stage.pod(cp, ns, name, NODE)?;
    let cluster = format!("app_{ns}_{name}_8080");
    let app = app(stage.work.path(), name, &socket)?;
    let t0 = until(&format!("{name}'s socket"), Duration::from_micros(200), || socket.exists())?;
    let served = until(&format!("Envoy serving {name}"), Duration::from_millis(2), || stage.served_by(&cluster, name))
        .with_context(|| stage.agent_log())?;
    Ok((served - t0, app))
}

/// Creates and deletes `files` files in `dir` until done or `stop`; returns how many it made.
fn flood(dir: &Path, files: usize, stop: &AtomicBool) -> usize {
    let mut made = 0;
    for i in 0..files {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let f = dir.join(format!("junk-{i}"));
        if std::fs::write(&f, b"").is_ok() && std::fs::remove_file(&f).is_ok() {
            made += 1;
        }
    }
    made
}

fn measure(cp: &ControlPlane, run: usize, label: &str, agent_bin: &Path, files: usize) -> anyhow::Result<Row> {
    let ns = format!("bench-flood-{run}");
    cp.kubectl_ok(&["create", "namespace", &ns])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", &ns, "app"])?;
    let stage = Stage::start(cp, NODE, agent_bin)?;
    let (idle_delivery, _idle_app) = deliver(&stage, cp, &ns, "idle-1")?;
    let (_, socket) = stage.pod(cp, &ns, "flooder", NODE)?;
    let _flooder = app(stage.work.path(), "flooder", &socket)?;
    until("Envoy serving the flooder", Duration::from_millis(5), || {
        stage.served_by(&format!("app_{ns}_flooder_8080"), "flooder")
    })
    .with_context(|| stage.agent_log())?;
    std::thread::sleep(Duration::from_secs(1));

    let pid = stage.agent.child.id();
    let (dir, stop) = (socket.parent().context("the volume dir")?.to_owned(), Arc::new(AtomicBool::new(false)));
    let cpu0 = schedstat_ns(pid)?;
    let t0 = Instant::now();
    let flooding = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || flood(&dir, files, &stop))
    };
    std::thread::sleep(Duration::from_millis(500));
    let delivered = deliver(&stage, cp, &ns, "new-1");
    if delivered.is_err() {
        stop.store(true, Ordering::Relaxed);
    }
    let made = flooding.join().map_err(|_| anyhow::anyhow!("the flood thread panicked"))?;
    let flood = t0.elapsed();
    // What the agent still had queued when the flood ended counts too.
    std::thread::sleep(Duration::from_millis(500));
    let cpu = Duration::from_nanos(schedstat_ns(pid)? - cpu0);
    let (flood_delivery, _new_app) = delivered?;
    anyhow::ensure!(made == files, "the flood made {made} of {files} files");
    let scrape = Scrape::get(stage.agent.port)?;
    let overflows = scrape
        .has("aether_agent_socket_watch_events_total")
        .then(|| scrape.value("aether_agent_socket_watch_events_total", &[("outcome", "overflow")]));
    Ok(Row { label: label.to_owned(), files, flood, cpu, idle_delivery, flood_delivery, overflows })
}

/// The section, for this build's agent and, with `BENCH_FLOOD_BASELINE`, another one.
pub(crate) fn section_flood(r: &mut Report, opts: &Opts, cp: &ControlPlane) -> anyhow::Result<()> {
    let mut agents = vec![("this build".to_owned(), workspace_bin("aether-agent")?)];
    if let Some(base) = std::env::var_os("BENCH_FLOOD_BASELINE").map(PathBuf::from) {
        anyhow::ensure!(base.is_file(), "BENCH_FLOOD_BASELINE={} is not a file", base.display());
        agents.insert(0, (format!("baseline `{}`", base.display()), base));
    }
    let mut rows = Vec::new();
    for (i, (label, bin)) in agents.iter().enumerate() {
        rows.push(measure(cp, i, label, bin, opts.flood_files).with_context(|| format!("flood with {label}"))?);
    }
    r.line("### 3g. A file flood in one pod's socket volume\n");
    r.line(&format!(
        "The stage of 3b (release agent with `--pin-dir`, real Envoy). One pod delivered over its socket; a thread \
         creates and deletes {} files in its volume dir as fast as it can (inotify reports each creation and \
         deletion to the agent's socket watch). Agent CPU: all its threads over the flood plus 0.5 s (`schedstat`); \
         \"% of a core\" divides it by the flood's wall time. A second pod is created 0.5 s into the flood: from its \
         app's socket appearing to the first request through Envoy it answers; the same for a pod created before \
         the flood. Overflows: the agent's `aether_agent_socket_watch_events_total{{outcome=\"overflow\"}}` (the \
         kernel dropped events because the agent read too slowly).\n",
        opts.flood_files
    ));
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.label.clone(),
                format!("{} files in {}", row.files, show_secs(row.flood.as_secs_f64())),
                show_secs(row.cpu.as_secs_f64()),
                format!("{:.0} %", 100.0 * row.cpu.as_secs_f64() / row.flood.as_secs_f64()),
                show_secs(row.idle_delivery.as_secs_f64()),
                show_secs(row.flood_delivery.as_secs_f64()),
                row.overflows.map_or("(not counted)".to_owned(), |n| format!("{n}")),
            ]
        })
        .collect();
    r.add(&md_table(
        &[
            "agent",
            "flood",
            "agent CPU",
            "% of a core",
            "new pod served (no flood)",
            "new pod served (during the flood)",
            "inotify queue overflows",
        ],
        &table,
    ));
    r.line("");
    let now = rows.last().context("no row")?;
    r.goals.push(Goal {
        goal: "a file flood costs the agent little",
        figure: format!(
            "{} files: agent CPU {} ({:.0} % of a core); a new pod served in {} during it",
            now.files,
            show_secs(now.cpu.as_secs_f64()),
            100.0 * now.cpu.as_secs_f64() / now.flood.as_secs_f64(),
            show_secs(now.flood_delivery.as_secs_f64())
        ),
        met: Some(now.cpu.as_secs_f64() <= FLOOD_CPU_TARGET * now.flood.as_secs_f64()),
        limit: format!("at most {:.0} % of a core", FLOOD_CPU_TARGET * 100.0),
    });
    Ok(())
}
