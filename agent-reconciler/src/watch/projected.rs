//! [`ProjectedPod`]: a Pod read off the wire with only the fields the agent uses
//! (docs/design-notes.md, "Per-change work and a lean process").
//!
//! A Pod as the API server serves it is mostly what the agent never reads: `managedFields`, the
//! containers, the projected service-account volume, conditions, container statuses, tolerations.
//! Deserialized as a k8s-openapi [`Pod`] it costs tens of KiB of small allocations per pod, and
//! the initial list used to hold every one of them at once. [`ProjectedPod`] deserializes the same
//! JSON and keeps only what [`aether_agent_core::record::PodRecord::from_pod`], the loop's input
//! ([`crate::event`]) and kube-runtime's watcher read; everything else is skipped by the parser
//! without being allocated:
//!
//! - `metadata`: `name`, `namespace`, `uid`, `resourceVersion` (the watcher resumes from it),
//!   `creationTimestamp`, the `aether.io/managed` label, the `endpoint.aether.io/*` annotations
//!   and `kubernetes.io/config.mirror`, the owner references of `kind: Node`;
//! - `spec`: `serviceAccountName`, `nodeName`, and the names of the `emptyDir` volumes;
//! - `status`: `phase`, `podIP`, `podIPs`.
//!
//! [`ProjectedPod::into_pod`] gives [`crate::event`] a [`Pod`] holding exactly those fields, so the
//! record built from it equals the record of the full object (tested below on every fixture
//! shape the record reads).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

#[cfg(test)]
use aether_agent_core::record::{PodRecord, RecordError};
use aether_crds::pod::{MANAGED_LABEL, MIRROR_ANNOTATION};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, PodIP, PodSpec, PodStatus, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The prefix of the pod annotations the agent reads (docs/contracts.md, "Managed pods and their
/// annotations").
const ENDPOINT_ANNOTATION_PREFIX: &str = "endpoint.aether.io/";

/// Whether the agent reads annotation `key`: `endpoint.aether.io/*` and the static-pod mirror.
fn kept_annotation(key: &str) -> bool {
    key.starts_with(ENDPOINT_ANNOTATION_PREFIX) || key == MIRROR_ANNOTATION
}

/// A Pod with only the fields the agent reads (see the module doc); `apiVersion: v1`, `kind:
/// Pod`, namespaced, listed and watched like [`Pod`].
#[derive(Clone, Debug, Deserialize)]
pub struct ProjectedPod {
    #[serde(deserialize_with = "meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Spec>,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    service_account_name: Option<String>,
    #[serde(default)]
    node_name: Option<String>,
    /// The names of the `emptyDir` volumes, in order.
    #[serde(default, deserialize_with = "empty_dirs")]
    volumes: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Option<Vec<PodIP>>,
}

impl ProjectedPod {
    /// The [`Pod`] holding the projected fields (and nothing else).
    pub fn into_pod(self) -> Pod {
        let spec = self.spec.map(|s| PodSpec {
            service_account_name: s.service_account_name,
            node_name: s.node_name,
            volumes: s.volumes.map(|names| {
                names
                    .into_iter()
                    .map(|name| Volume { name, empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() })
                    .collect()
            }),
            ..PodSpec::default()
        });
        let status = self.status.map(|s| PodStatus {
            phase: s.phase,
            pod_ip: s.pod_ip,
            pod_ips: s.pod_ips,
            ..PodStatus::default()
        });
        Pod { metadata: self.metadata, spec, status }
    }

    /// The pod's record ([`PodRecord::from_pod`] of [`ProjectedPod::into_pod`]): `None` for a pod
    /// that is not managed or has finished. The agent reads its pods in [`crate::event`]; this is
    /// for the tests below, which compare it with the record of the full object.
    ///
    /// # Errors
    /// Those of [`PodRecord::from_pod`] (a missing or invalid name, namespace or UID).
    #[cfg(test)]
    pub fn record(self) -> Result<Option<PodRecord>, RecordError> {
        PodRecord::from_pod(&self.into_pod())
    }
}

impl Resource for ProjectedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The metadata fields kept (everything else, `managedFields` first, is skipped unread).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default, deserialize_with = "labels")]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "annotations")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "node_owners")]
    owner_references: Option<Vec<OwnerReference>>,
}

fn meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references,
        ..ObjectMeta::default()
    })
}

/// A JSON object of strings (or `null`), keeping only the entries whose key passes `keep`;
/// the values of the others are skipped unread.
struct FilteredMap(fn(&str) -> bool);

impl<'de> Visitor<'de> for FilteredMap {
    type Value = Option<BTreeMap<String, String>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings or null")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if (self.0)(&key) {
                kept.insert(key, map.next_value::<String>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(kept))
    }
}

fn labels<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(FilteredMap(|k| k == MANAGED_LABEL))
}

fn annotations<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(FilteredMap(kept_annotation))
}

fn node_owners<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<OwnerReference>>, D::Error> {
    let all: Option<Vec<OwnerReference>> = Option::deserialize(d)?;
    Ok(all.map(|refs| refs.into_iter().filter(|o| o.api_version == "v1" && o.kind == "Node").collect()))
}

/// `spec.volumes` (or `null`): the names of those with an `emptyDir` (even `{}`); the rest of
/// each volume is skipped unread.
struct EmptyDirs;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeHead {
    name: String,
    #[serde(default)]
    empty_dir: Option<IgnoredAny>,
}

impl<'de> Visitor<'de> for EmptyDirs {
    type Value = Option<Vec<String>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of volumes or null")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut names = Vec::new();
        while let Some(v) = seq.next_element::<VolumeHead>()? {
            if v.empty_dir.is_some() {
                names.push(v.name);
            }
        }
        Ok(Some(names))
    }
}

fn empty_dirs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    d.deserialize_option(EmptyDirs)
}

#[cfg(test)]
mod tests {
    use aether_fixtures::pod;
    use serde_json::json;

    use super::*;

    /// The pod as the API server would serve it, with fields the agent never reads added.
    fn served(p: Pod) -> serde_json::Value {
        let mut v = serde_json::to_value(&p).unwrap();
        v["apiVersion"] = json!("v1");
        v["kind"] = json!("Pod");
        v["metadata"]["resourceVersion"] = json!("4711");
        v["metadata"]["managedFields"] =
            json!([{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]);
        v["metadata"]["labels"]["app"] = json!("cart");
        v["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json!("{\"big\": true}");
        let spec = v["spec"].as_object_mut().unwrap();
        spec.entry("volumes").or_insert(json!([])).as_array_mut().unwrap().push(json!({
            "name": "kube-api-access",
            "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}
        }));
        spec.insert("tolerations".into(), json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]));
        v["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        v
    }

    fn project(v: &serde_json::Value) -> Pod {
        let p: ProjectedPod = serde_json::from_slice(&serde_json::to_vec(v).unwrap()).unwrap();
        p.into_pod()
    }

    #[test]
    fn the_projection_yields_the_record_of_the_full_pod() {
        let uid = aether_fixtures::UID;
        let shapes = [
            pod("shop", "cart-1").uid(uid).sa("cart").node("n1").emptydir("s").ip("10.0.0.7").phase("Running"),
            pod("shop", "cart-2")
                .uid(uid)
                .emptydir("a")
                .configmap("c", "cm")
                .emptydir("b")
                .annotation_socket("b/app.sock")
                .annotation_ports("8080,9090=h2")
                .annotation_port("9090")
                .annotation_health_path("/ready")
                .annotation_protocol("tcp")
                .ip("10.0.0.8")
                .ip("fd00::8"),
            pod("kube-system", "etcd-n1").uid(uid).node("n1").mirror("0123456789abcdef0123456789abcdef", Some("n1")),
            pod("shop", "done").uid(uid).phase("Succeeded"),
            pod("shop", "bad").uid(uid).annotation_ports("x,y"),
            pod("shop", "unmanaged").uid(uid).unmanaged(),
        ];
        for shape in shapes {
            let full = shape.build();
            let wire = served(full.clone());
            let from_wire: Pod = serde_json::from_value(wire.clone()).unwrap();
            let projected = project(&wire);
            assert_eq!(
                PodRecord::from_pod(&projected),
                PodRecord::from_pod(&from_wire),
                "{}",
                serde_json::to_string(&wire).unwrap()
            );
            assert_eq!(PodRecord::from_pod(&projected), PodRecord::from_pod(&full));
            let record = serde_json::from_value::<ProjectedPod>(wire.clone()).unwrap().record();
            assert_eq!(record, PodRecord::from_pod(&full));
            assert_eq!(projected.metadata.resource_version.as_deref(), Some("4711"));
        }
    }

    #[test]
    fn what_the_agent_never_reads_is_left_out() {
        let wire = served(pod("shop", "cart-1").sa("cart").emptydir("s").annotation_socket("s/app.sock").build());
        let p = project(&wire);
        assert_eq!(p.metadata.managed_fields, None);
        assert_eq!(p.metadata.labels.unwrap().keys().collect::<Vec<_>>(), [MANAGED_LABEL]);
        assert_eq!(p.metadata.annotations.unwrap().keys().collect::<Vec<_>>(), ["endpoint.aether.io/uds-socket"]);
        let spec = p.spec.unwrap();
        assert_eq!(spec.volumes.unwrap().iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["s"]);
        assert_eq!(spec.tolerations, None);
        assert_eq!(p.status.unwrap().conditions, None);
    }

    #[test]
    fn nulls_and_absent_parts_are_absent() {
        let wire = json!({"metadata": {"name": "p", "labels": null, "annotations": null, "ownerReferences": null},
                          "spec": {"volumes": null}});
        let p = project(&wire);
        assert_eq!((p.metadata.labels, p.metadata.annotations, p.metadata.owner_references), (None, None, None));
        assert_eq!(p.spec.unwrap().volumes, None);
        assert!(p.status.is_none());
    }
}
