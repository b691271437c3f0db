//! Builders shared by the integration tests: pods and policies go through the same pure
//! extraction the watch drivers use (`PodRecord::from_pod`, `PolicyRecord::from_policy`).

#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;

use aether_agent_reconciler::{PodRecord, PolicyRecord, Settings};
use aether_crds::policy::{EndpointPolicy, EndpointPolicySpec, TargetRef};
use aether_crds::udspath::DEFAULT_PODS_DIR;
use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, EmptyDirVolumeSource, Pod, PodIP, PodSpec, PodStatus, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The UID of the field reports.
pub const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

/// Settings with the default pods dir (budget 16) and pipes enabled.
pub fn settings() -> Settings {
    Settings::new(DEFAULT_PODS_DIR, true)
}

/// A distinct canonical UUID per number.
pub fn uid(n: usize) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

/// A managed pod as the API server serves it: an emptyDir `sockets`, a configMap `config`.
pub fn api_pod(namespace: &str, name: &str, uid: &str, service_account: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: Some(uid.to_owned()),
            labels: Some(BTreeMap::from([("aether.io/managed".to_owned(), "true".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some(service_account.to_owned()),
            node_name: Some("node-a".to_owned()),
            volumes: Some(vec![
                Volume {
                    name: "sockets".to_owned(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                },
                Volume {
                    name: "config".to_owned(),
                    config_map: Some(ConfigMapVolumeSource { name: "cfg".to_owned(), ..Default::default() }),
                    ..Volume::default()
                },
            ]),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            pod_ip: Some("10.0.0.7".to_owned()),
            pod_ips: Some(vec![PodIP { ip: "10.0.0.7".to_owned() }]),
            ..PodStatus::default()
        }),
    }
}

/// Sets one annotation on an API pod.
pub fn annotate(mut pod: Pod, key: &str, value: &str) -> Pod {
    pod.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key.to_owned(), value.to_owned());
    pod
}

/// Makes an API pod the mirror of a static pod: the config hash annotation and, when `owner` is
/// given, an owner reference to that Node (kubelet's shape).
pub fn mirror(pod: Pod, hash: &str, owner: Option<&str>) -> Pod {
    let mut pod = annotate(pod, "kubernetes.io/config.mirror", hash);
    pod.metadata.owner_references = owner.map(|node| {
        vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: node.to_owned(),
            uid: "11111111-2222-4333-8444-555555555555".to_owned(),
            controller: Some(true),
            ..OwnerReference::default()
        }]
    });
    pod
}

/// The record of a managed API pod.
pub fn record(pod: &Pod) -> PodRecord {
    PodRecord::from_pod(pod).expect("a well-formed pod").expect("a managed pod")
}

/// The record of a managed pod with the given UID, in `namespace`, running as `service_account`.
pub fn pod(namespace: &str, name: &str, uid: &str, service_account: &str) -> PodRecord {
    record(&api_pod(namespace, name, uid, service_account))
}

/// The same pod with a `uds-socket` annotation.
pub fn pod_with_socket(namespace: &str, name: &str, uid: &str, service_account: &str, socket: &str) -> PodRecord {
    record(&annotate(api_pod(namespace, name, uid, service_account), "endpoint.aether.io/uds-socket", socket))
}

/// An EndpointPolicy object.
pub fn api_policy(namespace: &str, name: &str, service: &str, socket: &str) -> EndpointPolicy {
    let spec = EndpointPolicySpec {
        target_ref: TargetRef { group: String::new(), kind: "Service".to_owned(), name: service.to_owned() },
        uds_socket: socket.to_owned(),
    };
    let mut policy = EndpointPolicy::new(name, spec);
    policy.metadata.namespace = Some(namespace.to_owned());
    policy
}

/// The record of a policy, validated against `settings`' budget.
pub fn policy_in(settings: &Settings, namespace: &str, name: &str, service: &str, socket: &str) -> PolicyRecord {
    PolicyRecord::from_policy(&api_policy(namespace, name, service, socket), settings).expect("a named policy")
}

/// The record of a policy, validated against the default settings.
pub fn policy(namespace: &str, name: &str, service: &str, socket: &str) -> PolicyRecord {
    policy_in(&settings(), namespace, name, service, socket)
}
