//! The agent's fold and render at node scale (criterion; `make bench` reports it in
//! docs/benchmarks.md, section 1).
//!
//! For 110 / 1k / 10k pods and 1 / 10 / 2k policies (see `common/mod.rs` for the synthetic node):
//! - `full_build`: relist policies and pods into a new index, render every pod, encode every
//!   cluster with a fresh encoder;
//! - `policy_change`: one policy's socket edited (its service's pods change delivery);
//! - `pod_change`: one pod's health path edited;
//! - `noop_resync`: one pod re-delivered unchanged by the watch;
//! - `relist_noop`: a relist of all pods, none changed.
//!
//! Each event is timed through what the agent does with it: the index mutation, then (when the
//! delivery map changed) `render::render` of the map and the cached xDS `Encoder`. The record an
//! event delivers is extracted once, before timing (`common::pod`/`policy` build an API object
//! and run the agent's extraction), and cloned per event, as a watch hands over a fresh record.
//!
//! The live agent's own path (docs/design-notes.md "Per-change work and a lean process"),
//! `agent_*` groups, 110 / 1k / 10k pods and 10 policies: a `Driver` (no state dir, detached
//! collaborators) fed the watch events made from API objects, publishing the pods it
//! re-rendered on a `pod_specs` channel, and the encoder task's step on it (encoded, digested,
//! versioned resources ready for the ADS streams; no debounce, no send):
//! - `agent_full_build`: boot (the policy list and the pod list) and the first render;
//! - `agent_policy_change`: one policy's socket edited (the 5 pods of its service change);
//! - `agent_pod_change`: one pod's health path edited;
//! - `agent_recheck`: the periodic re-check (`--recheck-seconds`) with nothing changed and no
//!   container runtime configured.
//!
//! Before timing, one event of each kind is applied to count what it re-renders: pods folded
//! (`Change::rerendered`) and clusters re-encoded (specs that differ from the previous snapshot,
//! which is exactly what the `Encoder` builds again). The counts go to
//! `$AETHER_BENCH_OUT/agent-counts.json` when that variable is set, and to stdout.

#![allow(missing_docs)]

mod common;

use std::time::Duration;

use aether_agent_reconciler::event::Event as Watch;
use aether_agent_reconciler::xds::{Endpoint, SpecChange};
use aether_agent_reconciler::{PodRecord, PolicyRecord};
use aether_crds::EndpointPolicy;
use common::{Agent, Node, api_pod, api_policy, clusters_changed, pod, pods, policies, policy};
use criterion::{BatchSize, BenchmarkId, Criterion};
use k8s_openapi::api::core::v1::Pod;

const PODS: [usize; 3] = [110, 1_000, 10_000];
const POLICIES: [usize; 3] = [1, 10, 2_000];

/// One event kind, applied to a node; `flip` alternates between two states so every call is a
/// real change.
#[derive(Clone, Copy)]
enum Event {
    PolicyChange,
    PodChange,
    NoopResync,
    RelistNoop,
}

impl Event {
    const ALL: [Event; 4] = [Event::PolicyChange, Event::PodChange, Event::NoopResync, Event::RelistNoop];

    fn name(self) -> &'static str {
        match self {
            Event::PolicyChange => "policy_change",
            Event::PodChange => "pod_change",
            Event::NoopResync => "noop_resync",
            Event::RelistNoop => "relist_noop",
        }
    }

    /// Applies the event and publishes; the relist's input is built by the caller.
    fn apply(self, node: &mut Node, inputs: &Inputs, flip: bool, relist: Option<Vec<PodRecord>>) {
        let flip = usize::from(flip);
        let change = match self {
            Event::PolicyChange => node.index.apply_policy(inputs.policy_change[flip].clone()),
            Event::PodChange => node.index.apply_pod(inputs.pod_change[flip].clone()),
            Event::NoopResync => node.index.apply_pod(inputs.noop.clone()),
            Event::RelistNoop => node.index.reset_pods(relist.unwrap_or_default()),
        };
        node.publish(&change);
    }
}

/// The records the single events deliver on a node of `n_pods` pods, indexed by `flip`.
struct Inputs {
    /// Policy 0 with its socket, then with the alternative socket.
    policy_change: [PolicyRecord; 2],
    /// The last pod with its health path, then with the edited one.
    pod_change: [PodRecord; 2],
    /// The middle pod, unchanged.
    noop: PodRecord,
}

impl Inputs {
    fn new(n_pods: usize) -> Inputs {
        Inputs {
            policy_change: [policy(0, false), policy(0, true)],
            pod_change: [pod(n_pods - 1, false), pod(n_pods - 1, true)],
            noop: pod(n_pods / 2, false),
        }
    }
}

fn id(n_pods: usize, n_policies: usize) -> String {
    format!("{n_pods}x{n_policies}")
}

fn counts() -> serde_json::Value {
    let mut rows = Vec::new();
    for n_pods in PODS {
        for n_policies in POLICIES {
            for event in Event::ALL {
                let mut node = Node::build(pods(n_pods), policies(n_policies));
                let before = node.snapshot.clone();
                let change = match event {
                    Event::PolicyChange => node.index.apply_policy(policy(0, true)),
                    Event::PodChange => node.index.apply_pod(pod(n_pods - 1, true)),
                    Event::NoopResync => node.index.apply_pod(pod(n_pods / 2, false)),
                    Event::RelistNoop => node.index.reset_pods(pods(n_pods)),
                };
                node.publish(&change);
                let pipes =
                    node.snapshot.clusters.iter().filter(|c| matches!(c.endpoint, Endpoint::Pipe { .. })).count();
                rows.push(serde_json::json!({
                    "id": id(n_pods, n_policies),
                    "pods": n_pods,
                    "policies": n_policies,
                    "event": event.name(),
                    "pods_refolded": change.rerendered.len(),
                    "clusters_reencoded": clusters_changed(&before, &node.snapshot),
                    "clusters_total": node.snapshot.clusters.len(),
                    "pipe_clusters": pipes,
                    "map_changed": change.map_changed,
                }));
            }
        }
    }
    serde_json::Value::Array(rows)
}

fn bench(c: &mut Criterion) {
    for n_pods in PODS {
        for n_policies in POLICIES {
            let (all_pods, all_policies) = (pods(n_pods), policies(n_policies));
            let inputs = Inputs::new(n_pods);
            c.benchmark_group("full_build").bench_function(BenchmarkId::from_parameter(id(n_pods, n_policies)), |b| {
                b.iter_batched(
                    || (all_pods.clone(), all_policies.clone()),
                    |(p, q)| Node::build(p, q),
                    BatchSize::LargeInput,
                )
            });
            for event in Event::ALL {
                let mut node = Node::build(all_pods.clone(), all_policies.clone());
                let mut flip = false;
                c.benchmark_group(event.name()).bench_function(
                    BenchmarkId::from_parameter(id(n_pods, n_policies)),
                    |b| match event {
                        Event::RelistNoop => b.iter_batched(
                            || all_pods.clone(),
                            |relist| event.apply(&mut node, &inputs, false, Some(relist)),
                            BatchSize::LargeInput,
                        ),
                        _ => b.iter(|| {
                            flip = !flip;
                            event.apply(&mut node, &inputs, flip, None)
                        }),
                    },
                );
            }
        }
    }
}

/// Where a per-event cost goes on the largest node (10k pods, 10 policies): the index mutation
/// alone (a policy change), `render::render` of the unchanged map into cluster specs, and the
/// cached xDS `Encoder` on an unchanged model (compare, version hashes, the served set's clone).
fn stages(c: &mut Criterion) {
    let mut node = Node::build(pods(10_000), policies(10));
    let mut group = c.benchmark_group("stage");
    let mut flip = false;
    let edits = [policy(0, false), policy(0, true)];
    group.bench_function("index_policy_change", |b| {
        b.iter(|| {
            flip = !flip;
            node.index.apply_policy(edits[usize::from(flip)].clone())
        })
    });
    group.bench_function("render_specs", |b| b.iter(|| node.render_specs()));
    let snapshot = node.snapshot.clone();
    group
        .bench_function("xds_render_cached", |b| b.iter(|| node.encoder.update([SpecChange::Whole(snapshot.clone())])));
    group.finish();
}

/// The agent's own path at 110 / 1k / 10k pods with 10 policies (see the module doc).
fn agent(c: &mut Criterion) {
    for n_pods in PODS {
        let id = id(n_pods, 10);
        let (all_pods, all_policies): (Vec<Pod>, Vec<EndpointPolicy>) =
            ((0..n_pods).map(|i| api_pod(i, false)).collect(), (0..10).map(|k| api_policy(k, false)).collect());
        c.benchmark_group("agent_full_build").bench_function(BenchmarkId::from_parameter(&id), |b| {
            b.iter_batched(
                || (all_pods.clone(), all_policies.clone()),
                |(p, q)| Agent::boot(p, q),
                BatchSize::LargeInput,
            )
        });
        let mut node = Agent::boot(all_pods.clone(), all_policies.clone());
        let before = node.encoder.encoded();
        node.event(Watch::PolicyApplied(Box::new(api_policy(0, true))));
        let encoded = node.encoder.encoded() - before;
        println!("{id:>10} agent policy change: clusters encoded {encoded} of {}", node.resources.clusters.len());
        let edits = [api_policy(0, false), api_policy(0, true)];
        let mut flip = false;
        c.benchmark_group("agent_policy_change").bench_function(BenchmarkId::from_parameter(&id), |b| {
            b.iter(|| {
                flip = !flip;
                node.event(Watch::PolicyApplied(Box::new(edits[usize::from(flip)].clone())))
            })
        });
        let edits = [api_pod(n_pods - 1, false), api_pod(n_pods - 1, true)];
        c.benchmark_group("agent_pod_change").bench_function(BenchmarkId::from_parameter(&id), |b| {
            b.iter(|| {
                flip = !flip;
                node.event(Watch::pod_applied(&edits[usize::from(flip)]).expect("a served pod"))
            })
        });
        c.benchmark_group("agent_recheck")
            .bench_function(BenchmarkId::from_parameter(&id), |b| b.iter(|| node.event(Watch::Recheck)));
    }
}

fn main() {
    let counts = counts();
    let text = serde_json::to_string_pretty(&counts).expect("counts serialize");
    if let Some(dir) = std::env::var_os("AETHER_BENCH_OUT") {
        std::fs::create_dir_all(&dir).expect("creating $AETHER_BENCH_OUT");
        std::fs::write(std::path::Path::new(&dir).join("agent-counts.json"), &text).expect("writing agent-counts.json");
    }
    for row in counts.as_array().into_iter().flatten() {
        println!(
            "{:>10} {:<14} pods re-folded {:>6}  clusters re-encoded {:>6} of {:>6}",
            row["id"].as_str().unwrap_or_default(),
            row["event"].as_str().unwrap_or_default(),
            row["pods_refolded"],
            row["clusters_reencoded"],
            row["clusters_total"]
        );
    }
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    agent(&mut c);
    bench(&mut c);
    stages(&mut c);
    c.final_summary();
}
