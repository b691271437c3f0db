//! `make bench`, section 1: resident memory per pod of the agent's state.
//!
//! For each pod count, a fresh process (this executable, re-run with `AETHER_MEM_PODS=N`) reads
//! `VmRSS` from `/proc/self/status`, then boots the live agent's path on the synthetic node of
//! `common/mod.rs` (10 policies) as the `agent_*` groups of `scale` do, and keeps what the agent
//! keeps: the driver (index of records and delivery map, each pod's rendering, fallback ledger),
//! the channel to the encoder task, and the encoder's state (each pod's specs, who serves each
//! name, the encoded and digested resources). The encoder is fed per pod (`SpecChange::Pod`), as
//! in the agent. Each pod is turned into its record as soon as it is built, so no API object is
//! counted. `(after − before) / N` is printed as one JSON line per count, and written to
//! `$AETHER_BENCH_OUT/agent-memory.json` when set.

#![allow(missing_docs)]

mod common;

use std::process::Command;

const PODS: [usize; 3] = [110, 1_000, 10_000];
const POLICIES: usize = 10;
const REPETITIONS: usize = 3;

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

fn measure(n: usize) -> serde_json::Value {
    let before = vm_rss_kib();
    let agent = common::Agent::boot_lazily(n, POLICIES);
    let after = vm_rss_kib();
    let clusters = agent.resources.clusters.len();
    std::hint::black_box(&agent);
    serde_json::json!({
        "pods": n,
        "policies": POLICIES,
        "clusters": clusters,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "bytes_per_pod": (after.saturating_sub(before) * 1024) as f64 / n as f64,
    })
}

fn main() {
    if let Some(n) = std::env::var("AETHER_MEM_PODS").ok().and_then(|v| v.parse().ok()) {
        println!("{}", measure(n));
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let mut rows = Vec::new();
    for n in PODS {
        for _ in 0..REPETITIONS {
            let out = Command::new(&exe).env("AETHER_MEM_PODS", n.to_string()).output().expect("re-running myself");
            assert!(out.status.success(), "memory child failed: {}", String::from_utf8_lossy(&out.stderr));
            let row: serde_json::Value = serde_json::from_slice(&out.stdout).expect("child prints JSON");
            println!("{row}");
            rows.push(row);
        }
    }
    if let Some(dir) = std::env::var_os("AETHER_BENCH_OUT") {
        std::fs::create_dir_all(&dir).expect("creating $AETHER_BENCH_OUT");
        let text = serde_json::to_string_pretty(&rows).expect("serialize");
        std::fs::write(std::path::Path::new(&dir).join("agent-memory.json"), text).expect("writing agent-memory.json");
    }
}
