//! The pure half of `aether-agent plan` (the command, which reads the files and prints, is
//! `aether_agent_reconciler::plan::command`): offline, what each managed pod would get and why.
//!
//! Pods and policies come from multi-document YAML of ordinary Pod and EndpointPolicy manifests
//! (a `List` is expanded; other kinds are ignored). A pod without `metadata.uid` (a manifest, not
//! a live object) gets a 36-byte placeholder UID, which takes the same room as a real one, and its
//! reason says so. The decision is the agent's own fold; the on-disk check is not run offline.

use aether_crds::policy;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::Value;

use crate::fallback::TcpReason;
use crate::fold::Source;
use crate::index::Index;
use crate::names;
use crate::record::{PodRecord, PolicyRecord};
use crate::settings::Settings;

/// One pod's plan, the `-o json` element.
#[derive(Debug, Serialize, PartialEq)]
pub struct PodPlan {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The UID used (the placeholder when the manifest had none).
    pub uid: String,
    /// `annotation`, `policy` or `tcp`.
    pub source: String,
    /// The declared socket value, if any.
    pub socket: Option<String>,
    /// The resolved socket path for a pipe.
    pub path: Option<String>,
    /// Why: for TCP, the reason token and the sentence.
    pub reason: String,
    /// The Envoy clusters the pod gets.
    pub clusters: Vec<String>,
    /// The health check of its `health_` cluster ([`PodRecord::health_summary`]); JSON
    /// `healthCheck`, as in `kubectl aether why`.
    #[serde(rename = "healthCheck")]
    pub health_check: String,
}

/// Input that cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct InputError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

fn kind_of(v: &Value) -> (&str, &str) {
    (v.get("apiVersion").and_then(Value::as_str).unwrap_or(""), v.get("kind").and_then(Value::as_str).unwrap_or(""))
}

/// Plans every managed pod in `pods` against the policies in `policies`.
///
/// # Errors
/// [`InputError`] for a Pod or EndpointPolicy document that does not parse as one.
pub fn plan(pods: &[Value], policies: &[Value], settings: &Settings) -> Result<Vec<PodPlan>, InputError> {
    let mut index = Index::new(settings.clone());
    for doc in policies {
        if kind_of(doc) != (&format!("{}/{}", policy::GROUP, policy::VERSION), policy::KIND) {
            continue;
        }
        let mut doc = doc.clone();
        if doc.pointer("/metadata/namespace").is_none() {
            doc["metadata"]["namespace"] = Value::from("default");
        }
        let p: aether_crds::EndpointPolicy = serde_json::from_value(doc.clone()).map_err(|e| InputError {
            path: "policies".into(),
            reason: format!("EndpointPolicy {}: {e}", doc["metadata"]["name"]),
        })?;
        let rec = PolicyRecord::from_policy(&p, settings)
            .map_err(|e| InputError { path: "policies".into(), reason: e.to_string() })?;
        index.apply_policy(rec);
    }
    for (i, doc) in pods.iter().enumerate() {
        if kind_of(doc) != ("v1", "Pod") {
            continue;
        }
        let mut doc = doc.clone();
        if doc.pointer("/metadata/namespace").is_none() {
            doc["metadata"]["namespace"] = Value::from("default");
        }
        if doc.pointer("/metadata/uid").is_none() {
            doc["metadata"]["uid"] = Value::from(aether_crds::PodDirId::numbered_placeholder(i as u64 + 1).as_str());
        }
        let pod: Pod = serde_json::from_value(doc.clone())
            .map_err(|e| InputError { path: "pods".into(), reason: format!("Pod {}: {e}", doc["metadata"]["name"]) })?;
        match PodRecord::from_pod(&pod) {
            Ok(Some(rec)) => {
                index.apply_pod(rec);
            }
            Ok(None) => {}
            Err(e) => return Err(InputError { path: "pods".into(), reason: e.to_string() }),
        }
    }
    let map = index.snapshot();
    Ok(map
        .iter()
        .map(|(key, e)| {
            let d = &e.delivery;
            // A pod refused by a cap (too many ports) is served no clusters at all.
            let refused = d.tcp_reason().is_some_and(TcpReason::serves_nothing);
            let mut clusters: Vec<String> = Vec::new();
            if !refused {
                clusters.extend(e.pod.ports.iter().map(|p| names::app_cluster(&key.namespace, &key.name, p.port)));
                clusters.push(names::health_cluster(&key.namespace, &key.name));
            }
            PodPlan {
                namespace: key.namespace.to_string(),
                name: key.name.to_string(),
                uid: key.uid.to_string(),
                source: match d.source {
                    Source::Tcp(_) | Source::NoSocketDeclared => "tcp".into(),
                    s @ (Source::Annotation | Source::Policy) => s.label().into(),
                },
                socket: d.socket.clone(),
                path: d.path.as_ref().map(|p| p.as_str().to_owned()),
                reason: match d.source {
                    Source::Annotation | Source::Policy => d.reason.clone(),
                    s @ (Source::Tcp(_) | Source::NoSocketDeclared) => format!("{}: {}", s.label(), d.reason),
                },
                clusters,
                health_check: e.pod.health_summary(),
            }
        })
        .collect())
}

/// Text report: one block per pod.
pub fn render_text(plans: &[PodPlan]) -> String {
    let mut s = String::new();
    for p in plans {
        let via = match &p.path {
            Some(path) => format!("pipe {path}"),
            None if p.clusters.is_empty() => "no clusters (refused)".to_owned(),
            None => "TCP".to_owned(),
        };
        s.push_str(&format!(
            "{}/{}: {via} (source: {})\n    why: {}\n    clusters: {}\n    health: {}\n",
            p.namespace,
            p.name,
            p.source,
            p.reason,
            p.clusters.join(", "),
            p.health_check
        ));
    }
    s.push_str(&format!(
        "managed pods: {}, over a Unix socket: {}\n",
        plans.len(),
        plans.iter().filter(|p| p.path.is_some()).count()
    ));
    s
}
