//! The synthetic node the agent benches fold and render (shared by `scale` and `memory`).
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

use aether_agent_reconciler::fold::Settings;
use aether_agent_reconciler::fscheck::Refusal;
use aether_agent_reconciler::record::{PodKey, PodRecord, PolicyRecord};
use aether_agent_reconciler::render;
use aether_agent_reconciler::xds::{BuildOptions, Encoder, ResourceSet, Snapshot, SpecChange};
use aether_agent_reconciler::{Change, Index};

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

/// Pod `i`: service `i / PODS_PER_SERVICE`; `edited` switches its health path (a pod event that
/// changes one of its two clusters, whether it is delivered over TCP or a pipe).
pub fn pod(i: usize, edited: bool) -> PodRecord {
    let s = i / PODS_PER_SERVICE;
    let ip = Ipv4Addr::new(10, (i / 62_500) as u8, (i / 250 % 250) as u8, (i % 250) as u8 + 1);
    let api = aether_fixtures::pod(&namespace(s), &format!("{}-{i}", service(s)))
        .uid(&aether_fixtures::uid(i))
        .sa(&service(s))
        .emptydir("s")
        .ip(&ip.to_string())
        .annotation_health_path(if edited { "/healthz" } else { "/ready" })
        .build();
    PodRecord::from_pod(&api).expect("a well-formed pod").expect("a managed pod")
}

/// Policy `k` on service `k`; `alt` switches its socket file (a policy event that changes the
/// delivery of every pod of that service).
pub fn policy(k: usize, alt: bool) -> PolicyRecord {
    let api = aether_fixtures::policy(&namespace(k), &format!("pol-{k}"))
        .target(&service(k))
        .socket(if alt { "s/alt.sock" } else { "s/app.sock" })
        .build();
    PolicyRecord::from_policy(&api, &settings()).expect("a named policy")
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

impl Node {
    /// [`Node::build`] with the records generated while the index takes them (for memory
    /// measurements: no second copy of the input stays alive).
    pub fn build_lazily(n_pods: usize, n_policies: usize) -> Node {
        let mut index = Index::new(settings());
        index.reset_policies((0..n_policies).map(|k| policy(k, false)));
        index.reset_pods((0..n_pods).map(|i| pod(i, false)));
        Node::encoded(index)
    }
}
