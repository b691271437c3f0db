//! `kubectl aether why`: the agent's live decision through a port-forward to its loopback-only
//! debug port, else the offline fold on the pod and its namespace's EndpointPolicies, labelled as
//! such.
//!
//! 1. Read the pod; an unmanaged pod gets a note and no decision (the agent ignores it).
//! 2. Find the agent pod on the pod's `spec.nodeName` (`--agent-namespace`, `--agent-selector`).
//! 3. Open the API server's `pods/portforward` to that pod's `--agent-debug-port` (kube-rs
//!    [`Api::portforward`]; the container runtime dials `localhost:<port>` in the pod's network
//!    namespace, the node's for the host-network agent pod) and send
//!    `GET /debug/pods/<ns>/<name>` over it (HTTP/1.1, hyper). The debug port binds loopback only,
//!    so a port-forward, which the API server authorizes per user (`get` and `create` on
//!    `pods/portforward`), is the only way in: the pod proxy would drop the caller's identity
//!    before the agent.
//! 4. Any failure of 2–3 (no agent pod there, RBAC forbids `list pods` or `get`/`create` on
//!    `pods/portforward`, a refused port, a time-out, the agent not knowing the pod) becomes the
//!    offline answer's reason; the offline decision comes from the agent's own core (records, index, fold:
//!    [`aether_agent_core`], as `aether-agent plan` uses it), without the node's facts.

use std::time::Duration;

use aether_agent_core::decision::Decision;
use aether_agent_core::{Index, PodRecord, PolicyRecord, Settings};
use aether_crds::EndpointPolicy;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

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
    let (agents, agent) = find_agent(client, node, args).await?;
    let agent_name = agent.metadata.name.clone().unwrap_or_default();
    let port = args.agent_debug_port;
    let agent_ns = agent.metadata.namespace.clone().unwrap_or_default();
    answer.agent = Some(AgentRef { namespace: agent_ns.clone(), name: agent_name.clone(), port });
    let via = format!("the port-forward to agent {agent_ns}/{agent_name}:{port}");
    let timeout = Duration::from_secs(args.agent_timeout_seconds);
    let (status, body) =
        match tokio::time::timeout(timeout, get_forwarded(&agents, &agent_name, port, namespace, name)).await {
            Err(_) => return Err(format!("{via} gave no answer within {} s", timeout.as_secs())),
            Ok(Err(failed)) => return Err(forward_failure(&via, failed)),
            Ok(Ok(answer)) => answer,
        };
    if status.is_success() {
        return serde_json::from_slice::<Decision>(&body).map_err(|e| {
            format!("{via} answered HTTP {status} but not a decision ({e}): is that port the agent's debug port?")
        });
    }
    Err(agent_refusal(&via, status, &body))
}

/// The agent pod on `node`: the first of `--agent-namespace`'s namespaces, in order, with a pod
/// matching `--agent-selector` there that has a pod IP. Returns the pods API of its namespace
/// and the pod; else why none was found (every namespace's answer).
async fn find_agent(client: &kube::Client, node: &str, args: &WhyArgs) -> Result<(Api<Pod>, Pod), NotReached> {
    let lp = ListParams::default().labels(&args.agent_selector).fields(&format!("spec.nodeName={node}"));
    let mut why_not = Vec::new();
    for ns in &args.agent_namespace {
        let agents: Api<Pod> = Api::namespaced(client.clone(), ns);
        match agents.list(&lp).await {
            Err(e) => why_not.push(format!("cannot list agent pods in namespace {ns}: {}", api_error(&e))),
            Ok(found) => {
                if let Some(agent) =
                    found.items.iter().find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
                {
                    return Ok((agents, agent.clone()));
                }
                why_not.push(match found.items.len() {
                    0 => format!("no agent pod on node {node} in namespace {ns}"),
                    n => format!("{n} agent pod(s) on node {node} in namespace {ns}, but none has a pod IP yet"),
                });
            }
        }
    }
    Err(format!(
        "{} with labels {} (is the chart installed there? see --agent-namespace, --agent-selector)",
        why_not.join("; "),
        args.agent_selector
    ))
}

/// How a port-forwarded request failed.
#[derive(Debug)]
pub enum Forward {
    /// The API server refused the port-forward (RBAC, no such pod, the kubelet unreachable).
    Refused(kube::Error),
    /// The forward opened but the request failed; with the runtime's message for the port when
    /// it sent one (e.g. `connect: connection refused`).
    Request(String, Option<String>),
}

/// `GET /debug/pods/<namespace>/<name>` on `port` of agent pod `agent` through the API server's
/// port-forward: the answer's status and body.
async fn get_forwarded(
    agents: &Api<Pod>,
    agent: &str,
    port: u16,
    namespace: &str,
    name: &str,
) -> Result<(http::StatusCode, Bytes), Forward> {
    let mut forwarder = agents.portforward(agent, &[port]).await.map_err(Forward::Refused)?;
    let stream = forwarder.take_stream(port).ok_or_else(|| Forward::Request("no stream for the port".into(), None))?;
    let port_error = forwarder.take_error(port);
    let result = async {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        let connection = tokio::spawn(connection);
        let request = http::Request::get(format!("/debug/pods/{namespace}/{name}"))
            .header(http::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| format!("reading the answer: {e}"))?.to_bytes();
        drop(sender);
        connection.abort();
        Ok::<_, String>((status, body))
    }
    .await;
    match result {
        Ok(answer) => {
            forwarder.abort();
            Ok(answer)
        }
        Err(e) => {
            // The runtime reports a refused or failed dial on the port's error channel.
            let said = match port_error {
                Some(said) => tokio::time::timeout(Duration::from_secs(1), said).await.ok().flatten(),
                None => None,
            };
            forwarder.abort();
            Err(Forward::Request(e, said))
        }
    }
}

/// Says why a port-forwarded request is no decision: RBAC (403 on `pods/portforward`), another
/// API server refusal, or the request failing on the forward (with the runtime's message).
pub fn forward_failure(via: &str, failed: Forward) -> String {
    match failed {
        Forward::Refused(kube::Error::Api(s)) if s.code == 403 => format!(
            "RBAC forbids the port-forward ({via}): you need `get` and `create` on `pods/portforward` in the agent's namespace ({})",
            s.message
        ),
        Forward::Refused(kube::Error::Api(s)) => format!("{via} was refused: HTTP {}: {}", s.code, s.message),
        Forward::Refused(e) => format!("{via} was refused: {e}"),
        Forward::Request(e, Some(said)) => format!("{via} failed: {said} ({e})"),
        Forward::Request(e, None) => format!("{via} failed: {e}"),
    }
}

/// Says why the agent's non-2xx answer is no decision: its own 404 (`{"error": ...}`: it does
/// not know the pod), else the status and body.
pub fn agent_refusal(via: &str, status: http::StatusCode, body: &[u8]) -> String {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    match json.as_ref().and_then(|j| j.get("error")).and_then(|v| v.as_str()) {
        Some(error) if status == http::StatusCode::NOT_FOUND => {
            format!("the agent answered through {via} but does not know the pod: {error}")
        }
        _ => format!("{via}: the agent answered HTTP {status}: {}", String::from_utf8_lossy(body).trim()),
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
    fn a_failed_forward_says_whether_rbac_the_api_server_the_runtime_or_the_agent_refused() {
        let via = "the port-forward to agent aether-system/a:9092";
        let agent = br#"{"error":"the agent on node n knows no managed pod shop/x","node":"n"}"#;
        let s = agent_refusal(via, http::StatusCode::NOT_FOUND, agent);
        assert!(s.starts_with("the agent answered through") && s.contains("knows no managed pod shop/x"), "{s}");
        assert_eq!(
            agent_refusal(via, http::StatusCode::BAD_GATEWAY, b"oops\n"),
            format!("{via}: the agent answered HTTP 502 Bad Gateway: oops")
        );
        let forbidden = kube::core::Status::failure(
            "pods \"a\" is forbidden: User \"u\" cannot create resource \"pods/portforward\"",
            "Forbidden",
        )
        .with_code(403);
        let s = forward_failure(via, Forward::Refused(kube::Error::Api(Box::new(forbidden))));
        assert!(
            s.contains("RBAC forbids the port-forward") && s.contains("`get` and `create` on `pods/portforward`"),
            "{s}"
        );
        let refused = "failed to connect to localhost:9092 inside namespace \"x\": connect: connection refused";
        let s = forward_failure(via, Forward::Request("connection closed".into(), Some(refused.into())));
        assert_eq!(s, format!("{via} failed: {refused} (connection closed)"));
    }
}
