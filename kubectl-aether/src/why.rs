//! `kubectl aether why`: the agent's live decision through the API server's pod proxy, else the
//! offline fold on the pod and its namespace's EndpointPolicies, labelled as such.
//!
//! 1. Read the pod; an unmanaged pod gets a note and no decision (the agent ignores it).
//! 2. Find the agent pod on the pod's `spec.nodeName` (`--agent-namespace`, `--agent-selector`).
//! 3. `GET /api/v1/namespaces/<agent-ns>/pods/<agent-pod>:<admin-port>/proxy/debug/pods/<ns>/<name>`
//!    (kube-rs has no helper for the pod proxy: a raw request through [`kube::Client::send`]).
//! 4. Any failure of 2–3 (no agent pod there, RBAC forbids `list pods` or `get pods/proxy`, a
//!    proxy error, a time-out, the agent not knowing the pod) becomes the offline answer's
//!    reason; the offline decision comes from the agent's own core (records, index, fold:
//!    [`aether_agent_core`], as `aether-agent plan` uses it), without the node's facts.

use std::time::Duration;

use aether_agent_core::decision::Decision;
use aether_agent_core::{Index, PodRecord, PolicyRecord, Settings};
use aether_crds::EndpointPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::client::Body;

use crate::answer::{AgentRef, Answer, offline_unknowns};
use crate::cli::WhyArgs;

/// Why the live decision could not be read: the offline answer's reason.
type NotReached = String;

/// Answers `why` for pod `name` in `namespace`.
///
/// # Errors
/// Only when the pod itself cannot be read (not found, forbidden, API server unreachable).
pub async fn why(client: &kube::Client, namespace: &str, name: &str, args: &WhyArgs) -> anyhow::Result<Answer> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(name).await.map_err(|e| anyhow::anyhow!("cannot read pod {namespace}/{name}: {e}"))?;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let mut answer = Answer {
        pod: format!("{namespace}/{name}"),
        node: node.clone(),
        live: false,
        agent: None,
        offline_reason: None,
        offline_unknowns: Vec::new(),
        decision: None,
        note: None,
    };
    let managed = pod.metadata.labels.as_ref().and_then(|l| l.get(aether_crds::pod::MANAGED_LABEL));
    if managed.map(String::as_str) != Some(aether_crds::pod::MANAGED_VALUE) {
        answer.note = Some(format!(
            "the pod is not managed (label {}={:?} missing): the agent ignores it and it keeps its ordinary delivery",
            aether_crds::pod::MANAGED_LABEL,
            aether_crds::pod::MANAGED_VALUE
        ));
        answer.offline_reason = Some("not asked: the pod is not managed".to_owned());
        return Ok(answer);
    }
    let reached = match (&node, args.offline) {
        (_, true) => Err("--offline".to_owned()),
        (None, false) => Err("the pod is not scheduled to a node yet, so no agent decides for it".to_owned()),
        (Some(node), false) => live(client, node, namespace, name, args, &mut answer).await,
    };
    match reached {
        Ok(decision) => {
            answer.live = true;
            answer.decision = Some(decision);
        }
        Err(reason) => {
            let (decision, policies_note) = offline(client, &pod, args).await;
            let reason = match policies_note {
                Some(note) => format!("{reason}; {note}"),
                None => reason,
            };
            answer.offline_reason = Some(reason);
            answer.offline_unknowns = offline_unknowns(
                &args.rules.pods_dir,
                aether_crds::SocketLimit::from(args.rules.socket_limit).flag_value(),
            );
            answer.decision = decision;
        }
    }
    Ok(answer)
}

/// Finds the agent pod on `node` and reads its decision for `namespace/name`.
async fn live(
    client: &kube::Client,
    node: &str,
    namespace: &str,
    name: &str,
    args: &WhyArgs,
    answer: &mut Answer,
) -> Result<Decision, NotReached> {
    let agents: Api<Pod> = Api::namespaced(client.clone(), &args.agent_namespace);
    let lp = ListParams::default().labels(&args.agent_selector).fields(&format!("spec.nodeName={node}"));
    let found = agents.list(&lp).await.map_err(|e| {
        format!(
            "cannot list agent pods in namespace {} (selector {}): {}",
            args.agent_namespace,
            args.agent_selector,
            api_error(&e)
        )
    })?;
    let Some(agent) = found.items.iter().find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()) else {
        return Err(match found.items.len() {
            0 => format!(
                "no agent pod on node {node} in namespace {} with labels {} (is the chart installed there? see \
                 --agent-namespace, --agent-selector)",
                args.agent_namespace, args.agent_selector
            ),
            n => format!("{n} agent pod(s) on node {node}, but none has a pod IP yet"),
        });
    };
    let agent_name = agent.metadata.name.clone().unwrap_or_default();
    answer.agent = Some(AgentRef {
        namespace: args.agent_namespace.clone(),
        name: agent_name.clone(),
        port: args.agent_admin_port,
    });
    let path = proxy_path(&args.agent_namespace, &agent_name, args.agent_admin_port, namespace, name);
    let request = http::Request::get(&path).body(Body::empty()).map_err(|e| format!("bad request {path}: {e}"))?;
    let timeout = Duration::from_secs(args.agent_timeout_seconds);
    let via = format!("the pod proxy to agent {}/{agent_name}:{}", args.agent_namespace, args.agent_admin_port);
    let response = match tokio::time::timeout(timeout, client.send(request)).await {
        Err(_) => return Err(format!("{via} gave no answer within {} s", timeout.as_secs())),
        Ok(Err(e)) => return Err(format!("{via} failed: {e}")),
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    let body = match tokio::time::timeout(timeout, response.into_body().collect_bytes()).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(format!("{via}: reading the answer failed: {e}")),
        Err(_) => return Err(format!("{via}: the answer did not complete within {} s", timeout.as_secs())),
    };
    if status.is_success() {
        return serde_json::from_slice::<Decision>(&body).map_err(|e| {
            format!("{via} answered HTTP {status} but not a decision ({e}): is that port the agent's admin port?")
        });
    }
    Err(proxy_failure(&via, status, &body))
}

/// The pod-proxy path of the agent's decision for `namespace/name`.
pub fn proxy_path(agent_ns: &str, agent_pod: &str, port: u16, namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{agent_ns}/pods/{agent_pod}:{port}/proxy/debug/pods/{namespace}/{name}")
}

/// Says why a pod-proxy answer with a non-2xx `status` is no decision: the agent's own 404
/// (`{"error": ...}`: it does not know the pod), RBAC (403), or the API server's Status text.
pub fn proxy_failure(via: &str, status: http::StatusCode, body: &[u8]) -> String {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |k: &str| json.as_ref().and_then(|j| j.get(k)).and_then(|v| v.as_str()).map(str::to_owned);
    let is_status = json.as_ref().and_then(|j| j.get("kind")).and_then(|k| k.as_str()) == Some("Status");
    match (status.as_u16(), is_status, field("error"), field("message")) {
        (404, false, Some(error), _) => format!("the agent answered through {via} but does not know the pod: {error}"),
        (403, _, _, message) => format!(
            "RBAC forbids the pod proxy ({via}): you need `get` on `pods/proxy` in the agent's namespace ({})",
            message.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned())
        ),
        (_, _, _, Some(message)) => format!("{via} failed: HTTP {status}: {message}"),
        _ => format!("{via} failed: HTTP {status}: {}", String::from_utf8_lossy(body).trim()),
    }
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!("RBAC forbids it ({})", s.message),
        e => e.to_string(),
    }
}

/// The offline decision for `pod`, from the agent's core on the pod and its namespace's
/// EndpointPolicies; and a note when the policies could not be listed (the fold then ran
/// without them).
async fn offline(client: &kube::Client, pod: &Pod, args: &WhyArgs) -> (Option<Decision>, Option<String>) {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let api: Api<EndpointPolicy> = Api::namespaced(client.clone(), &namespace);
    let (policies, note) = match api.list(&ListParams::default()).await {
        Ok(list) => (list.items, None),
        Err(e) => (
            Vec::new(),
            Some(format!(
                "the EndpointPolicies of namespace {namespace} could not be listed ({}), so the offline fold ran without them",
                api_error(&e)
            )),
        ),
    };
    (fold(pod, &policies, &args.rules.rules()), note)
}

/// The agent's fold for `pod` against `policies`, with the given rules and no node facts.
/// `None` for a pod the agent does not keep (not managed, unreadable).
pub fn fold(pod: &Pod, policies: &[EndpointPolicy], rules: &aether_crds::Rules) -> Option<Decision> {
    let settings = Settings::with_rules(rules.clone(), true);
    let mut index = Index::new(settings.clone());
    for p in policies {
        if let Ok(rec) = PolicyRecord::from_policy(p, &settings) {
            index.apply_policy(rec);
        }
    }
    let rec = PodRecord::from_pod(pod).ok().flatten()?;
    let (key, service) = (rec.key(), rec.service_key());
    index.apply_pod(rec);
    let map = index.snapshot();
    let entry = map.get(&key)?;
    let conflict = index.conflicts().find(|c| c.key == service);
    Some(Decision::offline(&key, entry, conflict))
}

#[cfg(test)]
mod tests {
    use aether_agent_core::decision::{DeclaredBy, EffectiveDelivery};

    use super::*;

    fn rules() -> aether_crds::Rules {
        aether_crds::Rules::new(aether_crds::udspath::DEFAULT_PODS_DIR)
    }

    #[test]
    fn the_offline_fold_names_the_losing_policy_and_the_pipe_it_would_give() {
        let pod =
            aether_fixtures::pod("shop", "cart-1").uid(aether_fixtures::UID).sa("cart").emptydir("s").ip("10.0.0.1");
        let policies = [
            aether_fixtures::policy("shop", "b-loses").target("cart").socket("s/b.sock").build(),
            aether_fixtures::policy("shop", "a-wins").target("cart").socket("s/a.sock").build(),
        ];
        let d = fold(&pod.build(), &policies, &rules()).expect("a managed pod");
        assert_eq!(
            (d.source, d.policy.as_deref(), d.delivery),
            (DeclaredBy::Policy, Some("a-wins"), EffectiveDelivery::Pipe)
        );
        let c = d.conflict.expect("the conflict");
        assert_eq!(c.losers, ["b-loses"]);
        assert_eq!((d.decided_at, d.netns, d.pin), (None, None, None), "offline knows no node facts");
    }

    #[test]
    fn the_offline_fold_gives_the_tcp_fallback_reason_and_nothing_for_an_unmanaged_pod() {
        let pod = aether_fixtures::pod("shop", "cart-1").uid(aether_fixtures::UID).sa("cart").ip("10.0.0.1");
        let d = fold(&pod.clone().annotation_socket("s/a.sock").build(), &[], &rules()).unwrap();
        assert_eq!(
            (d.delivery, d.reason.as_deref()),
            (EffectiveDelivery::Tcp, Some(aether_agent_core::TcpReason::VolumeNotEmptyDir.label()))
        );
        assert!(fold(&pod.unmanaged().build(), &[], &rules()).is_none());
    }

    #[test]
    fn a_proxy_failure_says_whether_the_agent_rbac_or_the_api_server_refused() {
        let via = "the pod proxy to agent aether-system/a:9091";
        let agent = br#"{"error":"the agent on node n knows no managed pod shop/x","node":"n"}"#;
        let s = proxy_failure(via, http::StatusCode::NOT_FOUND, agent);
        assert!(s.starts_with("the agent answered through") && s.contains("knows no managed pod shop/x"), "{s}");
        let forbidden = br#"{"kind":"Status","status":"Failure","message":"pods \"a\" is forbidden: User \"u\" cannot get resource \"pods/proxy\"","reason":"Forbidden","code":403}"#;
        let s = proxy_failure(via, http::StatusCode::FORBIDDEN, forbidden);
        assert!(s.contains("RBAC forbids the pod proxy") && s.contains("cannot get resource \"pods/proxy\""), "{s}");
        let unreachable = br#"{"kind":"Status","message":"error trying to reach service: dial tcp 10.0.0.9:9091: connect: connection refused","code":503}"#;
        let s = proxy_failure(via, http::StatusCode::SERVICE_UNAVAILABLE, unreachable);
        assert_eq!(
            s,
            format!(
                "{via} failed: HTTP 503 Service Unavailable: error trying to reach service: dial tcp 10.0.0.9:9091: connect: connection refused"
            )
        );
        let s = proxy_failure(via, http::StatusCode::BAD_GATEWAY, b"oops\n");
        assert_eq!(s, format!("{via} failed: HTTP 502 Bad Gateway: oops"));
    }

    #[test]
    fn the_proxy_path_addresses_the_agent_port_and_the_pod() {
        assert_eq!(
            proxy_path("aether-system", "aether-node-x", 9091, "shop", "cart-1"),
            "/api/v1/namespaces/aether-system/pods/aether-node-x:9091/proxy/debug/pods/shop/cart-1"
        );
    }
}
