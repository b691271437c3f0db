//! Presets shared by the integration tests, over the workspace's fixtures (`aether-fixtures`):
//! pods and policies are built with its builders and go through the same pure extraction the
//! watch drivers use (`PodRecord::from_pod`, `PolicyRecord::from_policy`).

#![allow(dead_code, missing_docs, unused_imports)]

use aether_agent_reconciler::{PodRecord, PolicyRecord, Settings};
use aether_crds::udspath::DEFAULT_PODS_DIR;
pub use aether_fixtures::{PodBuilder, UID, uid};
use k8s_openapi::api::core::v1::Pod;

/// Settings with the default pods dir (budget 16) and pipes enabled.
pub fn settings() -> Settings {
    Settings::new(DEFAULT_PODS_DIR, true)
}

/// A managed pod as the API server serves it on node `node-a`: UID `uid`, running as
/// `service_account`, an emptyDir `sockets`, a configMap volume `config`, IP 10.0.0.7.
pub fn api_pod(namespace: &str, name: &str, uid: &str, service_account: &str) -> PodBuilder {
    aether_fixtures::pod(namespace, name)
        .uid(uid)
        .sa(service_account)
        .node("node-a")
        .emptydir("sockets")
        .configmap("config", "cfg")
        .ip("10.0.0.7")
}

/// The record of a managed API pod.
pub fn record(pod: &Pod) -> PodRecord {
    PodRecord::from_pod(pod).expect("a well-formed pod").expect("a managed pod")
}

/// The record of [`api_pod`].
pub fn pod(namespace: &str, name: &str, uid: &str, service_account: &str) -> PodRecord {
    record(&api_pod(namespace, name, uid, service_account).build())
}

/// The record of [`api_pod`] with a `uds-socket` annotation.
pub fn pod_with_socket(namespace: &str, name: &str, uid: &str, service_account: &str, socket: &str) -> PodRecord {
    record(&api_pod(namespace, name, uid, service_account).annotation_socket(socket).build())
}

/// The record of policy `namespace/name` on Service `service` over `socket`, validated against
/// `settings`' budget.
pub fn policy_in(settings: &Settings, namespace: &str, name: &str, service: &str, socket: &str) -> PolicyRecord {
    let api = aether_fixtures::policy(namespace, name).target(service).socket(socket).build();
    PolicyRecord::from_policy(&api, settings).expect("a named policy")
}

/// The record of a policy, validated against the default settings.
pub fn policy(namespace: &str, name: &str, service: &str, socket: &str) -> PolicyRecord {
    policy_in(&settings(), namespace, name, service, socket)
}

/// A reqwest builder; reqwest is built without a TLS provider, so install ring first.
pub fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}
