//! The answer of `kubectl aether why`: the pod's [`Decision`], and whether it is the agent's live
//! one or the offline fold's (and then why the agent was not reached and what offline cannot
//! know). Pure data and its text form; [`crate::why`] fetches it.

use aether_agent_core::decision::{Decision, DeclaredBy, EffectiveDelivery};
use serde::{Deserialize, Serialize};

/// The agent pod that answered (or was asked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRef {
    /// Its namespace.
    pub namespace: String,
    /// Its pod name.
    pub name: String,
    /// Its debug port (reached through pods/portforward).
    pub port: u16,
}

/// The answer, the `-o json|yaml` shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// `<namespace>/<name>` of the pod asked about.
    pub pod: String,
    /// The node the pod is scheduled to (`spec.nodeName`), if any.
    pub node: Option<String>,
    /// True: the node agent's live decision. False: the offline fold (see `offlineReason`).
    pub live: bool,
    /// The agent pod asked, when one was found.
    pub agent: Option<AgentRef>,
    /// Why the agent's live decision could not be read (offline answers only).
    pub offline_reason: Option<String>,
    /// The node facts the offline fold cannot know (offline answers only).
    pub offline_unknowns: Vec<String>,
    /// The decision; `None` when there is none to give (a pod that is not managed).
    pub decision: Option<Decision>,
    /// A remark, e.g. that the pod is not managed.
    pub note: Option<String>,
}

/// What the offline fold cannot know, given the rules it assumed.
pub fn offline_unknowns(pods_dir: &str, socket_limit: &str) -> Vec<String> {
    vec![
        format!(
            "the node's pods dir and socket limit (assumed --kubelet-pods-dir={pods_dir} --socket-limit={socket_limit})"
        ),
        "on-disk refusals of the socket path (symlink, hard link, not a socket, unreadable)".to_owned(),
        "socket pins (--pin-dir): the path Envoy actually dials".to_owned(),
        "the pod's network namespace: inbound listeners, and TCP via 127.0.0.1 in it".to_owned(),
        "the node's cluster cap (--max-clusters) and listeners Envoy could not bind".to_owned(),
    ]
}

fn line(s: &mut String, key: &str, value: impl AsRef<str>) {
    s.push_str(&format!("{:<11}{}\n", format!("{key}:"), value.as_ref()));
}

/// The text form: a header saying LIVE or OFFLINE (with the reason), then one line per fact.
pub fn render_text(a: &Answer) -> String {
    let mut s = String::new();
    let node = a.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_else(|| " (not scheduled)".into());
    line(&mut s, "pod", format!("{}{node}", a.pod));
    match (a.live, &a.agent) {
        (true, Some(agent)) => {
            let at = a.decision.as_ref().and_then(|d| d.decided_at.as_deref()).unwrap_or("?");
            line(
                &mut s,
                "answer",
                format!("LIVE from agent {}/{} (port {}), decided {at}", agent.namespace, agent.name, agent.port),
            );
        }
        _ => {
            let why = a.offline_reason.as_deref().unwrap_or("not asked");
            line(&mut s, "answer", format!("OFFLINE (the agent's fold on API objects only): {why}"));
        }
    }
    if let Some(note) = &a.note {
        line(&mut s, "note", note);
    }
    if let Some(d) = &a.decision {
        let source = match (d.source, &d.policy) {
            (DeclaredBy::Policy, Some(p)) => format!("policy {p}"),
            (DeclaredBy::Annotation, _) => "annotation endpoint.aether.io/uds-socket".to_owned(),
            (DeclaredBy::Policy, None) => "policy".to_owned(),
            (DeclaredBy::None, _) => "none (no socket declared)".to_owned(),
        };
        let socket = d.socket.as_deref().map(|v| format!(", socket {v:?}")).unwrap_or_default();
        line(&mut s, "delivery", delivery_words(d.delivery));
        line(&mut s, "source", format!("{source}{socket}"));
        if let Some(p) = &d.path {
            line(&mut s, "path", p);
        }
        if let Some(p) = &d.pin {
            line(&mut s, "pin", format!("{p} (Envoy dials this agent-owned path)"));
        }
        match (&d.reason, &d.event_reason) {
            (Some(r), Some(e)) => line(&mut s, "reason", format!("{r} (pod Event {e})")),
            (Some(r), None) => line(&mut s, "reason", r),
            _ => {}
        }
        line(&mut s, "detail", &d.detail);
        if let Some(c) = &d.conflict {
            line(
                &mut s,
                "conflict",
                format!(
                    "several valid EndpointPolicies target service {}: {} applies (smallest name); not applied: {}",
                    c.service,
                    c.winner,
                    c.losers.join(", ")
                ),
            );
        }
        line(&mut s, "clusters", list(&d.clusters));
        line(&mut s, "listeners", list(&d.listeners));
        if let Some(h) = &d.health_check {
            line(&mut s, "health", h);
        }
        if a.live {
            line(&mut s, "netns", d.netns.as_deref().unwrap_or("(not known to the agent)"));
        }
    }
    if !a.live {
        s.push_str("offline cannot know:\n");
        for u in &a.offline_unknowns {
            s.push_str(&format!("  - {u}\n"));
        }
    }
    s
}

fn list(items: &[String]) -> String {
    if items.is_empty() { "(none)".to_owned() } else { items.join(", ") }
}

fn delivery_words(d: EffectiveDelivery) -> &'static str {
    match d {
        EffectiveDelivery::Pipe => "pipe (Envoy dials the pod's Unix socket)",
        EffectiveDelivery::Tcp => "tcp (Envoy dials the pod's port over TCP)",
        EffectiveDelivery::Waiting => "waiting (TCP, but neither a pod IP nor a netns is known yet: no clusters)",
        EffectiveDelivery::Refused => "refused (served no clusters at all: a cap)",
    }
}

#[cfg(test)]
mod tests {
    use aether_agent_core::decision::ConflictView;

    use super::*;

    fn decision() -> Decision {
        Decision {
            namespace: "shop".into(),
            name: "cart-1".into(),
            uid: aether_fixtures::UID.into(),
            managed: true,
            source: DeclaredBy::Policy,
            policy: Some("a-wins".into()),
            socket: Some("s/app.sock".into()),
            path: None,
            pin: None,
            delivery: EffectiveDelivery::Tcp,
            reason: Some("volume-not-emptydir".into()),
            event_reason: Some("UdsVolumeNotEmptyDir".into()),
            detail: "EndpointPolicy shop/a-wins for service shop/cart: \"s/app.sock\" names volume \"s\", which is not an emptyDir volume of this pod".into(),
            conflict: Some(ConflictView { service: "shop/cart".into(), winner: "a-wins".into(), losers: vec!["b-loses".into()] }),
            clusters: vec!["app_shop_cart-1_8080".into(), "health_shop_cart-1".into()],
            listeners: vec![],
            health_check: Some("gRPC Health/Check of service \"shop.Cart\" over HTTP/2".into()),
            netns: None,
            decided_at: Some("2026-11-30T16:00:00Z".into()),
        }
    }

    #[test]
    fn a_live_answer_names_the_agent_the_reason_the_conflict_and_the_clusters() {
        let a = Answer {
            pod: "shop/cart-1".into(),
            node: Some("node-a".into()),
            live: true,
            agent: Some(AgentRef { namespace: "aether-system".into(), name: "aether-node-x".into(), port: 9091 }),
            offline_reason: None,
            offline_unknowns: vec![],
            decision: Some(decision()),
            note: None,
        };
        let text = render_text(&a);
        let want = [
            "pod:       shop/cart-1 on node node-a\n",
            "answer:    LIVE from agent aether-system/aether-node-x (port 9091), decided 2026-11-30T16:00:00Z\n",
            "delivery:  tcp (Envoy dials the pod's port over TCP)\n",
            "source:    policy a-wins, socket \"s/app.sock\"\n",
            "reason:    volume-not-emptydir (pod Event UdsVolumeNotEmptyDir)\n",
            "conflict:  several valid EndpointPolicies target service shop/cart: a-wins applies (smallest name); not applied: b-loses\n",
            "clusters:  app_shop_cart-1_8080, health_shop_cart-1\n",
            "listeners: (none)\n",
            "health:    gRPC Health/Check of service \"shop.Cart\" over HTTP/2\n",
            "netns:     (not known to the agent)\n",
        ];
        for w in want {
            assert!(text.contains(w), "{w:?} missing from:\n{text}");
        }
        assert!(!text.contains("OFFLINE") && !text.contains("offline cannot know"), "{text}");
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(
            (json["live"].as_bool(), json["decision"]["reason"].as_str()),
            (Some(true), Some("volume-not-emptydir"))
        );
        assert_eq!(json["decision"]["conflict"]["losers"][0], "b-loses");
        assert_eq!(serde_json::from_value::<Answer>(json).unwrap(), a, "the JSON shape round-trips");
    }

    #[test]
    fn an_offline_answer_is_labelled_with_why_and_lists_what_it_cannot_know() {
        let mut d = decision();
        d.decided_at = None;
        let a = Answer {
            pod: "shop/cart-1".into(),
            node: Some("node-a".into()),
            live: false,
            agent: None,
            offline_reason: Some("no agent pod on node node-a".into()),
            offline_unknowns: offline_unknowns("/var/lib/kubelet/pods", "sun-path"),
            decision: Some(d),
            note: None,
        };
        let text = render_text(&a);
        assert!(
            text.contains("answer:    OFFLINE (the agent's fold on API objects only): no agent pod on node node-a\n"),
            "{text}"
        );
        assert!(text.contains("offline cannot know:\n  - the node's pods dir and socket limit (assumed --kubelet-pods-dir=/var/lib/kubelet/pods --socket-limit=sun-path)\n"), "{text}");
        for fact in ["on-disk refusals", "socket pins", "network namespace"] {
            assert!(text.contains(fact), "{fact} missing from:\n{text}");
        }
        assert!(!text.contains("netns:"), "offline says nothing of the netns but that it cannot know it");
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["live"], false);
        assert_eq!(json["offlineReason"], "no agent pod on node node-a");
        assert_eq!(json["offlineUnknowns"].as_array().map(Vec::len), Some(5));
    }
}
