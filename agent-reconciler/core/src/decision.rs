//! What the agent decided for one pod, as an operator reads it (`kubectl aether why`,
//! docs/kubectl-plugin.md): a pure projection of the pod's [`PodDelivery`] entry, the on-disk
//! check's [`Refusal`] (if any) and the open [`Conflict`] on its service key into a serde
//! [`Decision`].
//!
//! The agent serves it on its admin port (`GET /debug/pods/{namespace}/{name}`, the list on
//! `GET /debug/pods`); the plugin `kubectl-aether` reads it through the API server's pod proxy,
//! and builds the same shape offline from the fold alone ([`Decision::offline`]) when the agent
//! cannot be reached. JSON field names are camelCase:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `namespace`, `name`, `uid` | string | the pod |
//! | `managed` | bool | label `aether.io/managed: "true"` (always true on the agent: it keeps only managed pods) |
//! | `source` | `annotation` \| `policy` \| `none` | where the declared socket came from ([`DeclaredBy`]) |
//! | `policy` | string? | the EndpointPolicy whose socket was considered |
//! | `socket` | string? | the declared `<volume>/<file>` value, even a rejected one |
//! | `path` | string? | the resolved socket path, for a pipe |
//! | `pin` | string? | the agent-owned pin path Envoy dials instead (`--pin-dir`) |
//! | `delivery` | `pipe` \| `tcp` \| `waiting` \| `refused` | what Envoy is given ([`EffectiveDelivery`]) |
//! | `reason` | string? | the kebab-case label: a [`crate::TcpReason`] label, `no-socket-declared`, or none for a pipe |
//! | `eventReason` | string? | the CamelCase reason of the pod's Warning Event for that label |
//! | `detail` | string | the sentence: the fold's reason, or the on-disk refusal |
//! | `conflict` | object? | `{service, winner, losers}`: several valid policies target the pod's service |
//! | `clusters` | list of strings | the Envoy clusters rendered for the pod (`app_…`, `health_…`) |
//! | `listeners` | list of strings | the inbound listeners rendered for it (`inbound_…`) |
//! | `healthCheck` | string? | the delegated health check of its `health_` cluster, e.g. `gRPC Health/Check of service "shop.Cart" over HTTP/2` (absent from agents before 0.9.0) |
//! | `netns` | string? | the pod's network namespace file, when the agent knows it |
//! | `decidedAt` | string? | RFC 3339 time of the agent's last decision for the pod (none offline) |
//!
//! `delivery`, `clusters` and `listeners` are what [`crate::render::render_pod`] gives the pod (the
//! same function the agent publishes with), so the board cannot disagree with Envoy's resources.

use serde::{Deserialize, Serialize};

use crate::fold::Source;
use crate::index::{Conflict, PodDelivery};
use crate::record::PodKey;
use crate::refusal::Refusal;
use crate::render::{self, Effective};

/// Where a pod's declared socket came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclaredBy {
    /// The pod's `endpoint.aether.io/uds-socket` annotation (it wins, even when invalid).
    Annotation,
    /// The winning EndpointPolicy of the pod's service key.
    Policy,
    /// Neither: the pod is delivered over TCP without a fallback.
    None,
}

/// What Envoy is actually given for the pod, after the on-disk check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EffectiveDelivery {
    /// Over the pod's Unix socket (through its pin with `--pin-dir`).
    Pipe,
    /// Over TCP: `127.0.0.1:<port>` in the pod's netns, else `<pod IP>:<port>`.
    Tcp,
    /// Not rendered yet: TCP with neither a netns nor a pod IP.
    Waiting,
    /// Served no clusters at all (a cap: [`crate::TcpReason::serves_nothing`]).
    Refused,
}

impl EffectiveDelivery {
    /// The kebab-case token used in JSON and text: `pipe`, `tcp`, `waiting` or `refused`.
    pub fn label(self) -> &'static str {
        match self {
            EffectiveDelivery::Pipe => "pipe",
            EffectiveDelivery::Tcp => "tcp",
            EffectiveDelivery::Waiting => "waiting",
            EffectiveDelivery::Refused => "refused",
        }
    }
}

/// Several valid EndpointPolicies target the pod's service key: only `winner` (the
/// lexicographically smallest name) applies; `losers` do not (docs/contracts.md, "Precedence: which
/// delivery a pod gets").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictView {
    /// The contested service key, `<namespace>/<service>`.
    pub service: String,
    /// The policy in effect.
    pub winner: String,
    /// The other valid policies, sorted: the ones that lost.
    pub losers: Vec<String>,
}

impl From<&Conflict> for ConflictView {
    fn from(c: &Conflict) -> Self {
        ConflictView { service: c.key.to_string(), winner: c.winner.clone(), losers: c.losers.clone() }
    }
}

/// One pod's decision (the module docs list the JSON fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID (an offline plan of a manifest without one uses a placeholder).
    pub uid: String,
    /// Whether the pod carries `aether.io/managed: "true"`.
    pub managed: bool,
    /// Where the declared socket came from.
    pub source: DeclaredBy,
    /// The EndpointPolicy whose socket was considered, if it came from one.
    pub policy: Option<String>,
    /// The declared `<volume>/<file>` value, even a rejected one.
    pub socket: Option<String>,
    /// The resolved socket path (bytes as the proxy sees them), for a pipe.
    pub path: Option<String>,
    /// The agent-owned path Envoy dials instead of `path` when pinning is on.
    pub pin: Option<String>,
    /// What Envoy is given.
    pub delivery: EffectiveDelivery,
    /// The kebab-case reason label ([`crate::TcpReason::label`] or `no-socket-declared`); `None` for a
    /// pipe.
    pub reason: Option<String>,
    /// The CamelCase reason of the pod's Warning Event for `reason` ([`crate::TcpReason::event_reason`]).
    pub event_reason: Option<String>,
    /// The sentence saying why (the fold's reason, or the on-disk refusal).
    pub detail: String,
    /// The conflict on the pod's service key, if several valid policies target it.
    pub conflict: Option<ConflictView>,
    /// The Envoy clusters rendered for the pod.
    pub clusters: Vec<String>,
    /// The inbound listeners rendered for the pod.
    pub listeners: Vec<String>,
    /// The delegated health check of the pod's `health_` cluster
    /// ([`crate::record::PodRecord::health_summary`]); `None` from an agent that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<String>,
    /// The pod's network-namespace file as the proxy sees it, when known.
    pub netns: Option<String>,
    /// When the agent last decided for this pod (RFC 3339); `None` offline.
    pub decided_at: Option<String>,
}

impl From<&Effective> for EffectiveDelivery {
    fn from(e: &Effective) -> Self {
        match e {
            Effective::Pipe(_) => EffectiveDelivery::Pipe,
            Effective::Tcp => EffectiveDelivery::Tcp,
            Effective::Waiting => EffectiveDelivery::Waiting,
            Effective::Refused => EffectiveDelivery::Refused,
        }
    }
}

impl Decision {
    /// The live decision for the pod at `key`: its index entry, the on-disk refusal of its pipe
    /// (if any), the conflict on its service key (if any), and when it was decided (RFC 3339,
    /// from the caller: the core reads no clock).
    pub fn project(
        key: &PodKey,
        entry: &PodDelivery,
        refusal: Option<&Refusal>,
        conflict: Option<&Conflict>,
        decided_at: Option<String>,
    ) -> Decision {
        let d = &entry.delivery;
        // What render gives this pod: the delivery Envoy gets, its clusters and listeners.
        let rendered = render::render_pod(entry, refusal);
        let delivery = EffectiveDelivery::from(&rendered.effective);
        let clusters = rendered.clusters.into_iter().map(|c| c.name).collect();
        let listeners = rendered.listeners.into_iter().map(|l| l.name).collect();
        let source = match (d.source, d.policy.is_some(), entry.pod.uds_socket.is_some()) {
            (Source::Annotation, ..) | (Source::Tcp(_), _, true) => DeclaredBy::Annotation,
            (Source::Policy, ..) | (Source::Tcp(_), true, false) => DeclaredBy::Policy,
            _ => DeclaredBy::None,
        };
        // The on-disk refusal overrides the fold's pipe; a cap (refused) keeps the fold's reason.
        let (reason, detail) = match (refusal, delivery) {
            (Some(r), EffectiveDelivery::Tcp | EffectiveDelivery::Waiting) if entry.dial.is_some() => {
                (Some(r.tcp_reason()), r.to_string())
            }
            _ => (d.tcp_reason(), d.reason.clone()),
        };
        let label = match (reason, d.source) {
            (Some(r), _) => Some(r.label().to_owned()),
            (None, Source::NoSocketDeclared) => Some(Source::NoSocketDeclared.label().to_owned()),
            (None, _) => None,
        };
        let pin = match (&entry.dial, &d.path) {
            (Some(dial), Some(path)) if dial != path.as_str() => Some(dial.clone()),
            _ => None,
        };
        Decision {
            namespace: key.namespace.to_string(),
            name: key.name.to_string(),
            uid: key.uid.to_string(),
            managed: true,
            source,
            policy: d.policy.clone(),
            socket: d.socket.clone(),
            path: d.path.as_ref().map(|p| p.as_str().to_owned()),
            pin,
            delivery,
            reason: label,
            event_reason: reason.map(|r| r.event_reason().to_owned()),
            detail,
            conflict: conflict.map(ConflictView::from),
            clusters,
            listeners,
            health_check: Some(entry.pod.health_summary()),
            netns: entry.netns.clone(),
            decided_at,
        }
    }

    /// The decision the fold alone makes for `entry`, as an offline tool sees it (no on-disk
    /// check, no pins, no netns, no time): [`Decision::project`] with none of the node's facts.
    pub fn offline(key: &PodKey, entry: &PodDelivery, conflict: Option<&Conflict>) -> Decision {
        Decision::project(key, entry, None, conflict, None)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use aether_crds::EndpointPolicy;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::TcpReason;
    use crate::fold::Settings;
    use crate::index::Index;
    use crate::record::{PodRecord, PolicyRecord};

    const UID: &str = aether_fixtures::UID;
    const PODS: &str = "/var/lib/kubelet/pods";

    fn record(pod: Pod) -> PodRecord {
        PodRecord::from_pod(&pod).unwrap().unwrap()
    }

    fn policy(name: &str, target: &str, socket: &str, settings: &Settings) -> PolicyRecord {
        let p: EndpointPolicy = aether_fixtures::policy("shop", name).target(target).socket(socket).build();
        PolicyRecord::from_policy(&p, settings).unwrap()
    }

    /// The decision of the only pod of `index` (or the one named `name`).
    fn decision(index: &Index, name: &str, refusal: Option<&Refusal>) -> Decision {
        let map = index.snapshot();
        let (key, entry) = map.iter().find(|(k, _)| *k.name == *name).expect("the pod is in the map");
        let conflict = index.conflicts().find(|c| c.key == entry.pod.service_key());
        Decision::project(key, entry, refusal, conflict, Some("2026-11-30T16:00:00Z".into()))
    }

    #[test]
    fn an_annotation_pod_is_a_pipe_with_its_path_clusters_and_listeners() {
        let mut index = Index::new(Settings::new(PODS, true));
        let pod = aether_fixtures::pod("shop", "cart-1").uid(UID).sa("cart").emptydir("s").ip("10.1.2.3");
        index.apply_pod(record(pod.annotation_socket("s/app.sock").annotation_ports("8080,9090").build()));
        index.set_netns(UID, Some("/run/netns/cni-1".into()));
        let d = decision(&index, "cart-1", None);
        assert_eq!(
            (d.source, d.delivery, d.reason.as_deref()),
            (DeclaredBy::Annotation, EffectiveDelivery::Pipe, None)
        );
        assert_eq!(
            d.path.as_deref(),
            Some(format!("{PODS}/{UID}/volumes/kubernetes.io~empty-dir/s/app.sock").as_str())
        );
        assert_eq!((d.socket.as_deref(), d.pin.as_deref(), d.policy.as_deref()), (Some("s/app.sock"), None, None));
        assert_eq!(d.clusters, ["app_shop_cart-1_8080", "app_shop_cart-1_9090", "health_shop_cart-1"]);
        assert_eq!(d.listeners, ["inbound_shop_cart-1_8080", "inbound_shop_cart-1_9090"]);
        assert_eq!(d.netns.as_deref(), Some("/run/netns/cni-1"));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["delivery"], "pipe");
        assert_eq!(json["source"], "annotation");
        assert_eq!(json["decidedAt"], "2026-11-30T16:00:00Z");
        assert_eq!(serde_json::from_value::<Decision>(json).unwrap(), d, "the JSON shape round-trips");
    }

    #[test]
    fn a_policy_pod_names_its_policy_and_with_pinning_the_pin_envoy_dials() {
        let settings = Settings::new(PODS, true).with_pin_dir(Some("/run/aether/pins".into()));
        let mut index = Index::new(settings.clone());
        index.apply_policy(policy("cart-sock", "cart", "s/app.sock", &settings));
        index.apply_pod(record(aether_fixtures::pod("shop", "cart-1").uid(UID).sa("cart").emptydir("s").build()));
        let d = decision(&index, "cart-1", None);
        assert_eq!(
            (d.source, d.policy.as_deref(), d.delivery),
            (DeclaredBy::Policy, Some("cart-sock"), EffectiveDelivery::Pipe)
        );
        assert_eq!(d.pin.as_deref(), Some(format!("/run/aether/pins/{UID}.sock").as_str()));
        assert!(d.path.as_deref().is_some_and(|p| p.ends_with("/s/app.sock")));
        assert!(d.listeners.is_empty(), "no netns known: no inbound listener");
        assert_eq!(d.conflict, None);
    }

    #[test]
    fn a_tcp_fallback_names_its_reason_label_event_reason_and_the_folds_sentence() {
        let mut index = Index::new(Settings::new(PODS, true));
        let pod = aether_fixtures::pod("shop", "cart-1").uid(UID).sa("cart").emptydir("s").ip("10.1.2.3");
        index.apply_pod(record(pod.annotation_socket("s/this-name-is-far-too-long.sock").build()));
        let d = decision(&index, "cart-1", None);
        assert_eq!((d.source, d.delivery), (DeclaredBy::Annotation, EffectiveDelivery::Tcp));
        assert_eq!(d.reason.as_deref(), Some(TcpReason::PathTooLong.label()));
        assert_eq!(d.event_reason.as_deref(), Some(TcpReason::PathTooLong.event_reason()));
        assert!(d.detail.contains("s/this-name-is-far-too-long.sock"), "{}", d.detail);
        assert_eq!(d.path, None);
        assert_eq!(d.clusters, ["app_shop_cart-1_8080", "health_shop_cart-1"], "TCP to the pod IP");
    }

    #[test]
    fn an_on_disk_refusal_overrides_the_pipe_with_its_own_reason() {
        let mut index = Index::new(Settings::new(PODS, true));
        let pod = aether_fixtures::pod("shop", "cart-1").uid(UID).sa("cart").emptydir("s");
        index.apply_pod(record(pod.annotation_socket("s/app.sock").build()));
        let refusal = Refusal::Symlink { path: "/x/s".into() };
        let d = decision(&index, "cart-1", Some(&refusal));
        assert_eq!(d.delivery, EffectiveDelivery::Waiting, "no pod IP and no netns yet");
        assert_eq!(d.reason.as_deref(), Some("symlink"));
        assert_eq!(d.detail, refusal.to_string());
    }

    #[test]
    fn a_pod_whose_service_has_a_conflict_names_the_winner_and_the_losing_policy() {
        let settings = Settings::new(PODS, true);
        let mut index = Index::new(settings.clone());
        index.apply_policy(policy("a-first", "cart", "s/app.sock", &settings));
        index.apply_policy(policy("b-second", "cart", "s/other.sock", &settings));
        index.apply_pod(record(aether_fixtures::pod("shop", "cart-1").uid(UID).sa("cart").emptydir("s").build()));
        let d = decision(&index, "cart-1", None);
        assert_eq!(d.policy.as_deref(), Some("a-first"));
        let c = d.conflict.expect("the conflict is named");
        assert_eq!(
            (c.service.as_str(), c.winner.as_str(), c.losers.as_slice()),
            ("shop/cart", "a-first", &["b-second".to_owned()][..])
        );
    }

    #[test]
    fn plain_tcp_is_labelled_no_socket_declared_and_is_not_a_fallback() {
        let mut index = Index::new(Settings::new(PODS, true));
        index.apply_pod(record(aether_fixtures::pod("shop", "cart-1").uid(UID).sa("cart").build()));
        let d = decision(&index, "cart-1", None);
        assert_eq!((d.source, d.delivery), (DeclaredBy::None, EffectiveDelivery::Waiting));
        assert_eq!((d.reason.as_deref(), d.event_reason.as_deref()), (Some("no-socket-declared"), None));
        assert!(d.clusters.is_empty(), "waiting: no pod IP, no netns");
    }

    /// The projection's delivery and names equal what render gives every pod of one map.
    #[test]
    fn the_projection_agrees_with_render_for_every_pod() {
        let mut index = Index::new(Settings::new(PODS, true));
        // Over the per-pod port cap: served no clusters at all.
        let too_many: Vec<String> = (1..=65).map(|p| p.to_string()).collect();
        let uids = [
            UID,
            "11111111-2222-4333-8444-555555555555",
            "21111111-2222-4333-8444-555555555555",
            "31111111-2222-4333-8444-555555555555",
        ];
        let pods = [
            aether_fixtures::pod("shop", "pipe")
                .uid(uids[0])
                .sa("a")
                .emptydir("s")
                .ip("10.0.0.1")
                .annotation_socket("s/a.sock"),
            aether_fixtures::pod("shop", "tcp").uid(uids[1]).sa("b").ip("10.0.0.2"),
            aether_fixtures::pod("shop", "wait").uid(uids[2]).sa("c").emptydir("s").annotation_socket("s/c.sock"),
            aether_fixtures::pod("shop", "capped")
                .uid(uids[3])
                .sa("d")
                .ip("10.0.0.4")
                .annotation_ports(&too_many.join(",")),
        ];
        for p in pods {
            index.apply_pod(record(p.build()));
        }
        index.set_netns(uids[0], Some("/run/netns/p".into()));
        let map = index.snapshot();
        let wait_key = map.iter().find(|(k, _)| &*k.name == "wait").unwrap().0.clone();
        let refused = HashMap::from([(wait_key, Refusal::NotDirectory { path: "/x".into() })]);
        let rendered = render::render(&map, &refused);
        for (key, entry) in map.iter() {
            let d = Decision::project(key, entry, refused.get(key), None, None);
            let want = match &rendered.effective[key] {
                Effective::Pipe(_) => EffectiveDelivery::Pipe,
                Effective::Tcp => EffectiveDelivery::Tcp,
                Effective::Waiting => EffectiveDelivery::Waiting,
                Effective::Refused => EffectiveDelivery::Refused,
            };
            assert_eq!(d.delivery, want, "{key}");
            let mine = |n: &str| n.split('_').nth(2) == Some(&*key.name);
            let clusters: Vec<&str> =
                rendered.snapshot.clusters.iter().map(|c| c.name.as_str()).filter(|n| mine(n)).collect();
            let listeners: Vec<&str> =
                rendered.snapshot.listeners.iter().map(|l| l.name.as_str()).filter(|n| mine(n)).collect();
            assert_eq!(d.clusters, clusters, "{key}");
            assert_eq!(d.listeners, listeners, "{key}");
        }
        let kinds: Vec<EffectiveDelivery> =
            map.iter().map(|(k, e)| Decision::project(k, e, refused.get(k), None, None).delivery).collect();
        for want in
            [EffectiveDelivery::Pipe, EffectiveDelivery::Tcp, EffectiveDelivery::Waiting, EffectiveDelivery::Refused]
        {
            assert!(kinds.contains(&want), "the table covers {want:?}: {kinds:?}");
        }
    }
}
