//! Per-resource versions for delta xDS: [`VersionCache`] derives, once per published
//! [`Resources`] and for every delta stream together, each resource's version
//! ([`resource_version`]) from the digest the renderer computed when it rendered the resource
//! ([`TypedResources::digests`]): nothing is hashed or compared again per publish.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::super::resources::Resources;
#[cfg(doc)]
use super::super::resources::{TypedResources, resource_digest};

/// The version of one resource from its [`resource_digest`] (name, type URL and encoded bytes):
/// hex of the first 16 bytes, 32 characters. Same content, same version, across agent restarts,
/// so a reconnecting Envoy's `initial_resource_versions` match what a new agent serves.
pub fn resource_version(digest: &[u8; 32]) -> String {
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The `(name, version)` of every resource of every served type, in each set's (name) order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Versions {
    by_type: HashMap<String, Vec<(String, String)>>,
}

impl Versions {
    /// The pairs of `type_url`, aligned with its [`TypedResources::resources`]; empty for a type
    /// not served.
    pub fn of(&self, type_url: &str) -> &[(String, String)] {
        self.by_type.get(type_url).map_or(&[], Vec::as_slice)
    }

    /// The versions of `resources`, from their digests.
    fn compute(resources: &Resources) -> Versions {
        let mut by_type = HashMap::new();
        for type_url in resources.type_urls() {
            let Some(set) = resources.get(type_url) else { continue };
            let pairs = set.resources.iter().zip(&set.digests).map(|(r, d)| (r.name.clone(), resource_version(d)));
            by_type.insert(type_url.to_owned(), pairs.collect());
        }
        Versions { by_type }
    }
}

/// The [`Versions`] of the last published [`Resources`], shared by the delta streams of one
/// server; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct VersionCache {
    last: Arc<Mutex<Option<Computed>>>,
}

/// Published resources and their versions.
type Computed = (Arc<Resources>, Arc<Versions>);

impl VersionCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The versions of `resources`: cached when it is the same `Arc` as last time, else computed
    /// and cached.
    pub fn versions(&self, resources: &Arc<Resources>) -> Arc<Versions> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((r, v)) = last.as_ref()
            && Arc::ptr_eq(r, resources)
        {
            return v.clone();
        }
        let versions = Arc::new(Versions::compute(resources));
        *last = Some((resources.clone(), versions.clone()));
        versions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resources::CLUSTER_TYPE_URL;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    fn cluster(name: &str, timeout_s: i64) -> Cluster {
        Cluster {
            name: name.to_owned(),
            connect_timeout: Some(PbDuration { seconds: timeout_s, nanos: 0 }),
            ..Default::default()
        }
    }

    #[test]
    fn versions_follow_content_and_unchanged_resources_keep_theirs() {
        let cache = VersionCache::new();
        let one = Arc::new(Resources::from_protos(vec![cluster("a", 1), cluster("b", 1)], vec![]));
        let v1 = cache.versions(&one);
        assert!(Arc::ptr_eq(&v1, &cache.versions(&one)), "the same Arc is computed once");
        let pairs = v1.of(CLUSTER_TYPE_URL);
        assert_eq!(pairs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let digest = crate::xds::resources::resource_digest(&one.clusters.resources[0]);
        assert_eq!(pairs[0].1, resource_version(&digest));
        assert_eq!(pairs[0].1.len(), 32);
        assert_ne!(pairs[0].1, pairs[1].1, "different content, different version");

        let two = Arc::new(Resources::from_protos(vec![cluster("a", 1), cluster("b", 2), cluster("c", 1)], vec![]));
        let v2 = cache.versions(&two);
        let after = v2.of(CLUSTER_TYPE_URL);
        assert_eq!(after[0], pairs[0], "a is unchanged");
        assert_ne!(after[1].1, pairs[1].1, "b changed");
        // A version is the content's: a fresh cache (a restarted agent) agrees.
        assert_eq!(*VersionCache::new().versions(&two), *v2);
        assert!(v2.of("type.googleapis.com/unknown").is_empty());
    }
}
