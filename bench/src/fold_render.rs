//! Section 1 of `make bench` (docs/benchmarks.md, "1. Agent: fold and render at node scale"):
//! reads what the agent's criterion benches wrote (`agent-reconciler/benches/scale.rs`: sample
//! times under `--criterion`; `agent-reconciler/benches/memory.rs` and the re-render counts:
//! `agent-counts.json` and `agent-memory.json` under `--agent-out`) and prints the full build, the
//! per-event cost, the work per event, the live agent's `agent_*` path and the resident memory per
//! pod at 110, 1k and 10k pods. Starts no process.

use anyhow::Context;

use crate::stats::{self, Spread, md_table, ratio, show_count, show_ratio, show_secs};
use crate::{Goal, Opts, Report};

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

/// Writes section 1 from the agent benches' output; an error names the file that is missing.
pub fn section(r: &mut Report, opts: &Opts) -> anyhow::Result<()> {
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
