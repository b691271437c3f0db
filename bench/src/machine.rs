//! The report's "Machine" heading (docs/benchmarks.md, "Machine"): the CPU and its cores, the
//! memory, the kernel, the load average at the start, the versions of oha and Envoy, and the
//! repetitions the command line asked for, so figures from two runs can be told apart.

use std::path::Path;
use std::process::Command;

use aether_tests::envoy_bin;

use crate::{Opts, Report};

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

/// Writes the "Machine" heading and its list.
pub fn section(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
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
