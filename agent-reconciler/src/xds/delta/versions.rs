//! Per-resource versions for delta xDS: [`resource_version`] derives a resource's version from
//! the digest the renderer computed once, when it rendered the resource
//! ([`Served`](super::super::resources::Served) keeps both): nothing is hashed or compared again
//! per publish or per stream.

/// The version of one resource from its [`resource_digest`](super::super::resources::resource_digest)
/// (name, type URL and encoded bytes): hex of the first 16 bytes, 32 characters. Same content,
/// same version, across agent restarts, so a reconnecting Envoy's `initial_resource_versions`
/// match what a new agent serves.
pub fn resource_version(digest: &[u8; 32]) -> String {
    let mut head = [0u8; 16];
    head.copy_from_slice(&digest[..16]);
    // One formatting call (zero-padded to 32 digits), not one String per byte.
    format!("{:032x}", u128::from_be_bytes(head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resources::{CLUSTER_TYPE_URL, Resources, resource_digest};
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    fn cluster(name: &str, timeout_s: i64) -> Cluster {
        Cluster {
            name: name.to_owned(),
            connect_timeout: Some(PbDuration { seconds: timeout_s, nanos: 0 }),
            ..Default::default()
        }
    }

    fn pairs(r: &Resources) -> Vec<(String, String)> {
        r.get(CLUSTER_TYPE_URL).unwrap().iter().map(|s| (s.resource.name.clone(), s.version.clone())).collect()
    }

    #[test]
    fn versions_follow_content_and_unchanged_resources_keep_theirs() {
        let one = Resources::from_protos(vec![cluster("a", 1), cluster("b", 1)], vec![]);
        let v1 = pairs(&one);
        assert_eq!(v1.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let digest = resource_digest(&one.clusters.get("a").unwrap().resource);
        assert_eq!(v1[0].1, resource_version(&digest));
        assert_eq!(v1[0].1.len(), 32);
        assert_ne!(v1[0].1, v1[1].1, "different content, different version");

        let two = Resources::from_protos(vec![cluster("a", 1), cluster("b", 2), cluster("c", 1)], vec![]);
        let v2 = pairs(&two);
        assert_eq!(v2[0], v1[0], "a is unchanged");
        assert_ne!(v2[1].1, v1[1].1, "b changed");
        // A version is the content's: the same resources built again (a restarted agent) agree.
        let again = Resources::from_protos(vec![cluster("c", 1), cluster("b", 2), cluster("a", 1)], vec![]);
        assert_eq!(pairs(&again), v2);
    }
}
