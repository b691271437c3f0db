//! The synthetic node the agent benches fold and render, and the live agent's path minus its I/O
//! (shared by `scale` and `memory`).
//!
//! - `pods` managed pods spread over ten namespaces, [`PODS_PER_SERVICE`] replicas per service
//!   (ServiceAccount), one HTTP port each, a pod IP, an `emptyDir` volume `s`, no annotation;
//! - `policies` valid EndpointPolicies, policy `k` targeting service `k` with socket `s/app.sock`.
//!   Services without a policy are delivered over TCP; policies beyond the node's services target
//!   services with no pod here (the agent watches policies cluster-wide).
//!
//! Each pod renders two clusters (`app_<ns>_<pod>_8080` and `health_<ns>_<pod>`).
//!
//! Pods and policies are built with the workspace's fixtures (`aether-fixtures`) and extracted
//! into records by the agent's own `PodRecord::from_pod` / `PolicyRecord::from_policy`, as the
//! watch drivers do.

#![allow(dead_code, missing_docs)]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use aether_agent_reconciler::cni::CniRecords;
use aether_agent_reconciler::driver::{Collaborators, Driver};
use aether_agent_reconciler::event::{self, Event as Watch};
use aether_agent_reconciler::fold::Settings;
use aether_agent_reconciler::fscheck::Refusal;
use aether_agent_reconciler::record::{PodKey, PodRecord, PolicyRecord};
use aether_agent_reconciler::render;
use aether_agent_reconciler::status::Status;
use aether_agent_reconciler::xds::publish::{PodSpecs, SpecSource, pod_specs};
use aether_agent_reconciler::xds::{BuildOptions, Encoder, ResourceSet, Snapshot, SpecChange};
use aether_agent_reconciler::{Change, Index};
use aether_crds::EndpointPolicy;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

/// Replicas of one service on the node.
pub const PODS_PER_SERVICE: usize = 5;
/// Namespaces the pods and policies are spread over.
pub const NAMESPACES: usize = 10;
/// The kubelet pods dir the fold runs with.
pub const PODS_DIR: &str = "/var/lib/kubelet/pods";

fn namespace(service: usize) -> String {
    format!("ns-{}", service % NAMESPACES)
}

fn service(service: usize) -> String {
    format!("svc-{service}")
}

/// Pod `i` as the API server hands it over: service `i / PODS_PER_SERVICE`; `edited` switches
/// its health path (a pod event that changes one of its two clusters, whether it is delivered
/// over TCP or a pipe).
pub fn api_pod(i: usize, edited: bool) -> Pod {
    let s = i / PODS_PER_SERVICE;
    let ip = Ipv4Addr::new(10, (i / 62_500) as u8, (i / 250 % 250) as u8, (i % 250) as u8 + 1);
    aether_fixtures::pod(&namespace(s), &format!("{}-{i}", service(s)))
        .uid(&aether_fixtures::uid(i))
        .sa(&service(s))
        .emptydir("s")
        .ip(&ip.to_string())
        .annotation_health_path(if edited { "/healthz" } else { "/ready" })
        .build()
}

/// The record of [`api_pod`] `i`, as the watch extracts it.
pub fn pod(i: usize, edited: bool) -> PodRecord {
    PodRecord::from_pod(&api_pod(i, edited)).expect("a well-formed pod").expect("a managed pod")
}

/// Policy `k` as the API server hands it over: it targets service `k`; `alt` switches its
/// socket file (a policy event that changes the delivery of that service's pods).
pub fn api_policy(k: usize, alt: bool) -> EndpointPolicy {
    aether_fixtures::policy(&namespace(k), &format!("pol-{k}"))
        .target(&service(k))
        .socket(if alt { "s/alt.sock" } else { "s/app.sock" })
        .build()
}

/// The record of [`api_policy`] `k`, as the watch extracts it.
pub fn policy(k: usize, alt: bool) -> PolicyRecord {
    PolicyRecord::from_policy(&api_policy(k, alt), &settings()).expect("a named policy")
}

pub fn pods(n: usize) -> Vec<PodRecord> {
    (0..n).map(|i| pod(i, false)).collect()
}

pub fn policies(n: usize) -> Vec<PolicyRecord> {
    (0..n).map(|k| policy(k, false)).collect()
}

pub fn settings() -> Settings {
    Settings::new(PODS_DIR, true)
}

/// The agent's state for one node: the index, the last model and the xDS encoder's cache.
pub struct Node {
    pub index: Index,
    pub encoder: Encoder,
    pub snapshot: Arc<Snapshot>,
    pub resources: ResourceSet,
    refused: HashMap<PodKey, Refusal>,
}

impl Node {
    /// The full build: index from a relist of policies and pods, render every pod, encode every
    /// cluster with a fresh encoder (what a restart, or an implementation without incremental
    /// state, does).
    pub fn build(pods: Vec<PodRecord>, policies: Vec<PolicyRecord>) -> Node {
        let mut index = Index::new(settings());
        index.reset_policies(policies);
        index.reset_pods(pods);
        Node::encoded(index)
    }

    /// `index` rendered and encoded with a fresh encoder.
    fn encoded(index: Index) -> Node {
        let refused = HashMap::new();
        let snapshot = Arc::new(render::render(&index.snapshot(), &refused).snapshot);
        let mut encoder = Encoder::new(BuildOptions::default());
        let resources = encoder.update([SpecChange::Whole(snapshot.clone())]);
        Node { index, encoder, snapshot, resources, refused }
    }

    /// `render::render` of the current delivery map (cluster specs, no encoding).
    pub fn render_specs(&self) -> Snapshot {
        render::render(&self.index.snapshot(), &self.refused).snapshot
    }

    /// What the agent does after one index mutation (driver `after` + xDS encoder): when the
    /// delivery map changed, render it into cluster specs and let the cached encoder encode the
    /// clusters whose spec changed.
    pub fn publish(&mut self, change: &Change) {
        if change.map_changed {
            self.snapshot = Arc::new(render::render(&self.index.snapshot(), &self.refused).snapshot);
            self.resources = self.encoder.update([SpecChange::Whole(self.snapshot.clone())]);
        }
    }
}

/// Clusters whose spec differs between two models (added, changed or removed, by name): what
/// [`Encoder`] re-encodes, since it reuses what it serves under a name only for an equal spec.
pub fn clusters_changed(before: &Snapshot, after: &Snapshot) -> usize {
    let old: HashMap<&str, _> = before.clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let new: HashMap<&str, _> = after.clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let changed = new.iter().filter(|(name, spec)| old.get(*name) != Some(*spec)).count();
    changed + old.keys().filter(|name| !new.contains_key(*name)).count()
}

/// The live agent minus its I/O: the driver loop and the encoder task's step, wired by the
/// channel the agent uses (no state dir, detached collaborators, no debounce, no send).
pub struct Agent {
    pub driver: Driver,
    pub specs: PodSpecs,
    pub encoder: Encoder,
    pub resources: ResourceSet,
}

impl Agent {
    /// Boots on `pods` and `policies` (as the watches' first lists) and renders everything.
    pub fn boot(pods: Vec<Pod>, policies: Vec<EndpointPolicy>) -> Agent {
        // The watch hands over the records of the listed pods (it keeps no Pod objects).
        Agent::boot_on_records(pods.iter().filter_map(event::listed_record).collect(), policies)
    }

    /// [`Agent::boot`] on `n_pods` pods [`api_pod`] and `n_policies` policies [`api_policy`], each
    /// pod turned into its record as soon as it is built (for memory measurements: no Pod object
    /// stays alive).
    pub fn boot_lazily(n_pods: usize, n_policies: usize) -> Agent {
        let records = (0..n_pods).filter_map(|i| event::listed_record(&api_pod(i, false))).collect();
        Agent::boot_on_records(records, (0..n_policies).map(|k| api_policy(k, false)).collect())
    }

    fn boot_on_records(pods: Vec<PodRecord>, policies: Vec<EndpointPolicy>) -> Agent {
        let (tx, mut specs) = pod_specs();
        let (status, _) = watch::channel(Status::default());
        let detached = Collaborators::detached();
        let mut driver = Driver::new(Index::new(settings()), None, CniRecords::default(), tx, status, detached);
        driver.handle(Watch::PoliciesListed(policies));
        driver.handle(Watch::PodsListed(pods));
        let mut encoder = Encoder::new(BuildOptions::default());
        let resources = specs.encode(&mut encoder, true);
        Agent { driver, specs, encoder, resources }
    }

    /// One watch event through the driver, then the encoder task's step.
    pub fn event(&mut self, event: Watch) {
        self.driver.handle(event);
        self.resources = self.specs.encode(&mut self.encoder, false);
    }
}
