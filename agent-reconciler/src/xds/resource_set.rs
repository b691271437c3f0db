//! What the ADS server serves: per type URL a set of packed resources with a content-hash version
//! ([`TypedResources`]), the three sets together with what was left out ([`ResourceSet`]), and how
//! each version is computed ([`resource_digest`], [`resource_version`]).
//!
//! Versions: every resource is digested once, when it is encoded (SHA-256 over its name, type URL
//! and bytes); its delta-xDS version is a prefix of that digest, and a set's version hashes the
//! set's type URL, size and the wrapping sum of its digests, kept up to date per added or removed
//! resource. The same content gives the same versions in any order and across agent restarts, so
//! a reconnecting Envoy's `initial_resource_versions` match what a new agent serves.

use std::collections::HashMap;
use std::sync::Arc;

use aether_agent_core::model::RenderError;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use prost::Name;
use sha2::{Digest, Sha256};

/// Type URL of an Envoy v3 `Cluster` (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of an Envoy v3 `Listener` (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of an Envoy v3 `TypedExtensionConfig` (ECDS).
pub const EXTENSION_CONFIG_TYPE_URL: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// One packed resource: its name and the packed proto.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedResource {
    /// Resource name (cluster, listener or extension config name).
    pub name: String,
    /// The packed Envoy proto.
    pub resource: Any,
}

/// One served resource: the packed proto, its [`resource_digest`] (computed once, when it is
/// encoded) and its delta-xDS version derived from that digest ([`resource_version`]). Two are
/// equal when their digests are.
#[derive(Clone, Debug)]
pub struct Served {
    /// The resource's name and packed proto.
    pub resource: NamedResource,
    /// SHA-256 over its name, type URL and encoded bytes.
    pub digest: [u8; 32],
    /// Its delta-xDS version: hex of the first 16 bytes of `digest`.
    pub version: String,
}

impl PartialEq for Served {
    fn eq(&self, other: &Served) -> bool {
        self.digest == other.digest
    }
}

impl Served {
    /// Digests `resource` once.
    pub fn new(resource: NamedResource) -> Served {
        let digest = resource_digest(&resource);
        Served { version: resource_version(&digest), resource, digest }
    }

    /// `resource` packed under `name`, digested.
    pub(super) fn packed(name: &str, resource: Any) -> Served {
        Served::new(NamedResource { name: name.to_owned(), resource })
    }
}

/// Where a resource sits in a [`TypedResources`] set: its name, then its rank among resources of
/// that name (0 unless duplicates were handed over on purpose, [`ResourceSet::from_protos`]).
pub type SetKey = (String, u32);

/// All resources of one type URL, by name, with their content-hash version. The set is a
/// persistent map ([`imbl::OrdMap`]): cloning it shares its structure, and a change of `k`
/// resources costs O(k log n), as does finding what differs between two versions of it
/// ([`imbl::OrdMap::diff`] skips what they share).
#[derive(Clone, Debug, PartialEq)]
pub struct TypedResources {
    /// Type URL of every resource ([`CLUSTER_TYPE_URL`], [`LISTENER_TYPE_URL`] or
    /// [`EXTENSION_CONFIG_TYPE_URL`]).
    pub type_url: String,
    /// Hex SHA-256 (first 16 bytes, 32 hex characters) over the type URL, the number of
    /// resources and the lane-wise wrapping sum of their [`resource_digest`]s (a multiset hash):
    /// same content, same version, whatever the order; kept up to date per added or removed
    /// resource, so no pass over the set is needed when one resource changes.
    pub version: String,
    /// The resources, in name order.
    pub resources: imbl::OrdMap<SetKey, Arc<Served>>,
    /// The running sum of the digests (four 64-bit lanes, wrapping).
    sum: [u64; 4],
}

/// SHA-256 over one resource's name, packed type URL and encoded bytes (each length-prefixed).
pub fn resource_digest(r: &NamedResource) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [r.name.as_bytes(), r.resource.type_url.as_bytes(), &r.resource.value] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The version of one resource from its [`resource_digest`] (name, type URL and encoded bytes):
/// hex of the first 16 bytes, 32 characters. Same content, same version, across agent restarts,
/// so a reconnecting Envoy's `initial_resource_versions` match what a new agent serves. Also the
/// form of a set's version ([`TypedResources::version`]).
pub fn resource_version(digest: &[u8; 32]) -> String {
    let mut head = [0u8; 16];
    head.copy_from_slice(&digest[..16]);
    // One formatting call (zero-padded to 32 digits), not one String per byte.
    format!("{:032x}", u128::from_be_bytes(head))
}

/// The four 64-bit lanes of a digest.
fn lanes(digest: &[u8; 32]) -> [u64; 4] {
    std::array::from_fn(|i| u64::from_be_bytes(digest[i * 8..i * 8 + 8].try_into().unwrap_or_default()))
}

impl TypedResources {
    /// An empty set of `type_url`, with its version.
    pub fn empty(type_url: impl Into<String>) -> Self {
        let mut set = TypedResources {
            type_url: type_url.into(),
            version: String::new(),
            resources: imbl::OrdMap::new(),
            sum: [0; 4],
        };
        set.seal();
        set
    }

    /// Builds the set from packed resources (any order) and computes the version. Duplicate
    /// names are kept, in the order given (a way to hand Envoy something it NACKs).
    pub fn new(type_url: impl Into<String>, resources: Vec<NamedResource>) -> Self {
        let mut set = TypedResources::empty(type_url);
        let mut ranks: HashMap<String, u32> = HashMap::new();
        for r in resources {
            let rank = ranks.entry(r.name.clone()).or_default();
            set.add((r.name.clone(), *rank), Arc::new(Served::new(r)));
            *rank += 1;
        }
        set.seal();
        set
    }

    /// Serves `r` under `key` (replacing what was there). Call [`TypedResources::seal`] after a
    /// batch of changes.
    pub(super) fn add(&mut self, key: SetKey, r: Arc<Served>) {
        for (lane, add) in self.sum.iter_mut().zip(lanes(&r.digest)) {
            *lane = lane.wrapping_add(add);
        }
        if let Some(old) = self.resources.insert(key, r) {
            self.subtract(&old.digest);
        }
    }

    /// Stops serving `key`; call [`TypedResources::seal`] after a batch of changes.
    pub(super) fn take(&mut self, key: &SetKey) {
        if let Some(old) = self.resources.remove(key) {
            self.subtract(&old.digest);
        }
    }

    fn subtract(&mut self, digest: &[u8; 32]) {
        for (lane, sub) in self.sum.iter_mut().zip(lanes(digest)) {
            *lane = lane.wrapping_sub(sub);
        }
    }

    /// Recomputes `version` from the count and the running sum: O(1).
    pub(super) fn seal(&mut self) {
        let mut h = Sha256::new();
        h.update((self.type_url.len() as u64).to_be_bytes());
        h.update(self.type_url.as_bytes());
        h.update((self.resources.len() as u64).to_be_bytes());
        for lane in self.sum {
            h.update(lane.to_be_bytes());
        }
        self.version = resource_version(&h.finalize().into());
    }

    /// The served resource named `name` (the first of that name).
    pub fn get(&self, name: &str) -> Option<&Served> {
        self.resources.get(&(name.to_owned(), 0)).map(Arc::as_ref)
    }

    /// The resources in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Served> {
        self.resources.values().map(Arc::as_ref)
    }

    /// Number of resources.
    pub fn len(&self) -> usize {
        self.resources.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    /// Names of the resources, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.resources.keys().map(|(name, _)| name.as_str()).collect()
    }
}

/// A cluster or listener left out of the served resources, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Cluster or listener name (the gateway's listener name for the gateway).
    pub name: String,
    /// Why.
    pub error: RenderError,
}

/// Everything the ADS server serves at one moment: the CDS, LDS and ECDS sets plus what was left
/// out.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceSet {
    /// `Cluster`s ([`CLUSTER_TYPE_URL`]).
    pub clusters: TypedResources,
    /// `Listener`s ([`LISTENER_TYPE_URL`]): the health gateway, if configured, and the inbound
    /// listeners.
    pub listeners: TypedResources,
    /// `TypedExtensionConfig`s ([`EXTENSION_CONFIG_TYPE_URL`], ECDS): the health gateway's checks
    /// when the gateway listener is served, else none.
    pub extension_configs: TypedResources,
    /// Specs that failed validation and are not in `clusters`/`listeners`.
    pub rejected: Vec<Rejected>,
}

impl Default for ResourceSet {
    /// No clusters, no listeners, no extension configs.
    fn default() -> Self {
        ResourceSet::from_protos(Vec::new(), Vec::new())
    }
}

impl ResourceSet {
    /// Packs already-built protos without any validation (tests, or a caller with its own
    /// builders), with no extension configs. Duplicate names are kept.
    pub fn from_protos(clusters: Vec<Cluster>, listeners: Vec<Listener>) -> Self {
        let clusters =
            clusters.into_iter().map(|c| NamedResource { name: c.name.clone(), resource: pack_any(c) }).collect();
        let listeners =
            listeners.into_iter().map(|l| NamedResource { name: l.name.clone(), resource: pack_any(l) }).collect();
        ResourceSet {
            clusters: TypedResources::new(Cluster::type_url(), clusters),
            listeners: TypedResources::new(Listener::type_url(), listeners),
            extension_configs: TypedResources::new(EXTENSION_CONFIG_TYPE_URL, Vec::new()),
            rejected: Vec::new(),
        }
    }

    /// The same resources with `configs` as the ECDS set (packed without validation, like
    /// [`ResourceSet::from_protos`]).
    pub fn with_extension_configs(mut self, configs: Vec<TypedExtensionConfig>) -> Self {
        let configs =
            configs.into_iter().map(|c| NamedResource { name: c.name.clone(), resource: pack_any(c) }).collect();
        self.extension_configs = TypedResources::new(EXTENSION_CONFIG_TYPE_URL, configs);
        self
    }

    /// The set for `type_url`, if we serve that type (CDS, LDS and ECDS).
    pub fn get(&self, type_url: &str) -> Option<&TypedResources> {
        self.sets().into_iter().find(|set| set.type_url == type_url)
    }

    /// The served type URLs, in push order: clusters before the listeners and extension configs
    /// that name them.
    pub fn type_urls(&self) -> [&str; 3] {
        self.sets().map(|set| set.type_url.as_str())
    }

    /// True when every version equals `other`'s (nothing to push).
    pub fn same_versions(&self, other: &ResourceSet) -> bool {
        self.sets().into_iter().zip(other.sets()).all(|(a, b)| a.type_url == b.type_url && a.version == b.version)
    }

    fn sets(&self) -> [&TypedResources; 3] {
        [&self.clusters, &self.listeners, &self.extension_configs]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    #[test]
    fn type_urls_match_the_protos() {
        assert_eq!(CLUSTER_TYPE_URL, Cluster::type_url());
        assert_eq!(LISTENER_TYPE_URL, Listener::type_url());
    }

    fn cluster(name: &str, timeout_s: i64) -> Cluster {
        Cluster {
            name: name.to_owned(),
            connect_timeout: Some(PbDuration { seconds: timeout_s, nanos: 0 }),
            ..Default::default()
        }
    }

    fn pairs(r: &ResourceSet) -> Vec<(String, String)> {
        r.get(CLUSTER_TYPE_URL).unwrap().iter().map(|s| (s.resource.name.clone(), s.version.clone())).collect()
    }

    #[test]
    fn versions_follow_content_and_unchanged_resources_keep_theirs() {
        let one = ResourceSet::from_protos(vec![cluster("a", 1), cluster("b", 1)], vec![]);
        let v1 = pairs(&one);
        assert_eq!(v1.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let digest = resource_digest(&one.clusters.get("a").unwrap().resource);
        assert_eq!(v1[0].1, resource_version(&digest));
        assert_eq!(v1[0].1.len(), 32);
        assert_ne!(v1[0].1, v1[1].1, "different content, different version");

        let two = ResourceSet::from_protos(vec![cluster("a", 1), cluster("b", 2), cluster("c", 1)], vec![]);
        let v2 = pairs(&two);
        assert_eq!(v2[0], v1[0], "a is unchanged");
        assert_ne!(v2[1].1, v1[1].1, "b changed");
        // A version is the content's: the same resources built again (a restarted agent) agree.
        let again = ResourceSet::from_protos(vec![cluster("c", 1), cluster("b", 2), cluster("a", 1)], vec![]);
        assert_eq!(pairs(&again), v2);
    }
}
