//! From the delivery map to the xDS input: one pure function (docs/contracts.md, "Envoy resources
//! and their names").
//!
//! For every pod in the [`DeliveryMap`]:
//! - one `app_<ns>_<pod>_<port>` cluster per declared port, all dialing the same endpoint;
//! - one `health_<ns>_<pod>` cluster with the pod's active health check (HTTP on its health path,
//!   HTTP/2 codec when the primary port is `h2`; gRPC's health protocol over HTTP/2 when it is
//!   `grpc`; or connect-only), answered by the health gateway.
//!
//! - for a pod delivered over its socket whose netns and IPs are known, one `inbound_<ns>_<pod>_<port>`
//!   listener per declared port, bound in the pod's netns, to the `app_` cluster of that port
//!   (not for ports whose listener Envoy could not bind: [`crate::PodDelivery::inbound_failed`]).
//!   A TCP-delivered pod gets none: its app owns the port.
//!
//! The endpoint is the pipe for a pod delivered over its socket, unless the on-disk check refused
//! it (then TCP, with the refusal as the reason). TCP is `127.0.0.1:<port>` inside the pod's network
//! namespace when the index holds one for the pod (the container runtime's answer, else a CNI
//! record), else `<pod IP>:<port>`. A TCP pod with neither yet gets
//! no cluster until it has one ("rendered once they have what their delivery needs"), but its
//! health cluster name is listed, so the health gateway reports it unhealthy (503), not unknown.
//! A pod refused by a cap (over the per-pod port cap, or past `--max-clusters`:
//! [`crate::TcpReason::serves_nothing`]) gets no cluster and no listener at all, and its health
//! cluster name is listed the same way.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use crate::index::{DeliveryMap, PodDelivery};
use crate::model::{self as xds, ClusterSpec, Endpoint, ListenerSpec, Snapshot};
use crate::names;
use crate::record::{HealthCheck, InboundProxy, PodKey, PodRecord};
use crate::refusal::Refusal;

/// Where a rendered pod is actually delivered, after the on-disk check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effective {
    /// Over the Unix socket at this path.
    Pipe(String),
    /// Over TCP (the fold chose TCP, or the on-disk check refused the pipe).
    Tcp,
    /// Not rendered yet: TCP with no network namespace and no pod IP.
    Waiting,
    /// Served no clusters at all: over the per-pod port cap or past the node's cluster cap
    /// ([`crate::TcpReason::serves_nothing`]). Its health cluster is still listed (503).
    Refused,
}

/// The xDS input and, per pod, what it was rendered as.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rendered {
    /// What the xDS layer serves.
    pub snapshot: Snapshot,
    /// Per pod, the effective delivery.
    pub effective: HashMap<PodKey, Effective>,
}

fn tcp_endpoint(pod: &PodRecord, port: u16, netns: Option<&str>) -> Option<Endpoint> {
    match netns {
        Some(ns) => Some(Endpoint::Tcp { address: IpAddr::V4(Ipv4Addr::LOCALHOST), port, netns: Some(ns.to_owned()) }),
        None => pod.pod_ips.first().map(|ip| Endpoint::Tcp { address: *ip, port, netns: None }),
    }
}

/// What one pod contributes to the [`Snapshot`]: its clusters (app clusters in port order, then
/// its health cluster), its inbound listeners, the name of its health cluster (listed even when
/// no cluster is served) and its effective delivery. The unit the shell keeps per pod, so a change
/// re-renders only the pods it touched ([`render_pod`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PodRender {
    /// Its delivery and health clusters, in the order [`render`] lists them.
    pub clusters: Vec<ClusterSpec>,
    /// Its inbound listeners, one per declared port that has one.
    pub listeners: Vec<ListenerSpec>,
    /// `health_<ns>_<pod>`: answered by the health gateway (503 while no cluster serves it).
    pub health_cluster: String,
    /// How the pod is delivered after the on-disk check.
    pub effective: Effective,
}

/// Renders one pod's entry of the map: pure, no I/O. `refused` is the on-disk check's refusal of its
/// pipe, if any. [`render`] is this, in key order, over the whole map.
pub fn render_pod(entry: &PodDelivery, refused: Option<&Refusal>) -> PodRender {
    let pod = &entry.pod;
    let pipe = entry.dial.clone().filter(|_| refused.is_none());
    let ns = entry.netns.as_deref();
    let endpoint_for = |port: u16| match &pipe {
        Some(path) => Some(Endpoint::Pipe { path: path.clone() }),
        None => tcp_endpoint(pod, port, ns),
    };
    let primary = pod.primary_port();
    // Listed even while waiting: the gateway then answers 503 (known, not healthy), not 404.
    let mut out = PodRender {
        clusters: Vec::new(),
        listeners: Vec::new(),
        health_cluster: names::health_cluster(&pod.namespace, &pod.name),
        effective: Effective::Refused,
    };
    if entry.delivery.tcp_reason().is_some_and(crate::TcpReason::serves_nothing) {
        return out;
    }
    let Some(health_endpoint) = endpoint_for(primary.port) else {
        out.effective = Effective::Waiting;
        return out;
    };
    for p in &pod.ports {
        let Some(endpoint) = endpoint_for(p.port) else { continue };
        out.clusters.push(ClusterSpec {
            name: names::app_cluster(&pod.namespace, &pod.name, p.port),
            endpoint,
            health: None,
            http2: p.protocol.is_http2(),
        });
    }
    // Only once the pod has its IPs: Envoy refuses to change a listener's addresses in place in
    // the same netns, so the IPv6 address must be known before the listener is first offered.
    if let (Some(_), Some(netns), false) = (&pipe, ns, pod.pod_ips.is_empty()) {
        let ipv6 = pod.pod_ips.iter().any(IpAddr::is_ipv6);
        for p in pod.ports.iter().filter(|p| !entry.inbound_failed.contains(&p.port)) {
            out.listeners.push(ListenerSpec {
                name: names::inbound_listener(&pod.namespace, &pod.name, p.port),
                netns: netns.to_owned(),
                port: p.port,
                ipv6,
                cluster: names::app_cluster(&pod.namespace, &pod.name, p.port),
                http: pod.inbound == InboundProxy::Http,
            });
        }
    }
    let h2 = primary.protocol.is_http2();
    let health = match &pod.health {
        HealthCheck::Http { path } => xds::HealthCheck::Http { path: path.clone(), h2 },
        HealthCheck::Connect => xds::HealthCheck::Connect,
        HealthCheck::Grpc { service } => xds::HealthCheck::Grpc { service: service.clone() },
    };
    // gRPC's health protocol runs over HTTP/2 whatever the primary port says.
    let http2 = h2 || matches!(health, xds::HealthCheck::Grpc { .. });
    out.clusters.push(ClusterSpec {
        name: out.health_cluster.clone(),
        endpoint: health_endpoint,
        health: Some(health),
        http2,
    });
    out.effective = pipe.map_or(Effective::Tcp, Effective::Pipe);
    out
}

/// Renders `map` into clusters: pure, no I/O. Each entry's [`crate::PodDelivery::netns`] (a node
/// fact the shell stored in the index) says where TCP is dialed; `refused` holds the pods whose
/// pipe the on-disk check refused. The pods' [`render_pod`] output, concatenated in key order.
pub fn render(map: &DeliveryMap, refused: &HashMap<PodKey, Refusal>) -> Rendered {
    let mut out = Rendered::default();
    for (key, entry) in map.iter() {
        let pod = render_pod(entry, refused.get(key));
        out.snapshot.health_clusters.push(pod.health_cluster);
        out.snapshot.clusters.extend(pod.clusters);
        out.snapshot.listeners.extend(pod.listeners);
        out.effective.insert(key.clone(), pod.effective);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::Settings;
    use crate::index::Index;

    const UID: &str = aether_fixtures::UID;

    /// The record of managed pod shop/cart-1 (ServiceAccount cart, emptyDir `s`) declaring ports
    /// 8080 (HTTP/1.1) and 9090 (h2) and health path /ready, with `socket` as its socket
    /// annotation and `ips` as its pod IPs.
    fn pod(socket: Option<&str>, ips: &[&str]) -> PodRecord {
        let mut p = aether_fixtures::pod("shop", "cart-1")
            .uid(UID)
            .sa("cart")
            .emptydir("s")
            .annotation_ports("8080,9090=h2")
            .annotation_health_path("/ready");
        if let Some(socket) = socket {
            p = p.annotation_socket(socket);
        }
        for ip in ips {
            p = p.ip(ip);
        }
        PodRecord::from_pod(&p.build()).unwrap().unwrap()
    }

    fn map_of(p: PodRecord) -> DeliveryMap {
        map_in_netns(p, None)
    }

    /// The map of one pod whose netns fact the shell set to `netns`.
    fn map_in_netns(p: PodRecord, netns: Option<&str>) -> DeliveryMap {
        let mut index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        let uid = p.uid.clone();
        index.apply_pod(p);
        index.set_netns(&uid, netns.map(str::to_owned));
        (*index.snapshot()).clone()
    }

    #[test]
    fn a_pipe_pod_gets_one_app_cluster_per_port_and_a_health_cluster_all_on_the_socket() {
        let r = render(&map_of(pod(Some("s/app.sock"), &[])), &HashMap::new());
        let names: Vec<&str> = r.snapshot.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["app_shop_cart-1_8080", "app_shop_cart-1_9090", "health_shop_cart-1"]);
        let path = format!("/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~empty-dir/s/app.sock");
        assert!(r.snapshot.clusters.iter().all(|c| c.endpoint == Endpoint::Pipe { path: path.clone() }));
        assert!(r.snapshot.clusters[1].http2, "the h2 port uses the HTTP/2 codec");
        assert_eq!(r.snapshot.clusters[2].health, Some(xds::HealthCheck::Http { path: "/ready".into(), h2: false }));
        assert_eq!(r.snapshot.health_clusters, ["health_shop_cart-1"]);
    }

    #[test]
    fn a_grpc_primary_port_gets_an_http2_health_cluster_with_the_grpc_check() {
        let api = aether_fixtures::pod("shop", "api.v2-1")
            .uid(UID)
            .emptydir("s")
            .annotation_socket("s/app.sock")
            .annotation_ports("9090=grpc,8080")
            .annotation("endpoint.aether.io/grpc-health-service", "shop.Api")
            .build();
        let r = render(&map_of(PodRecord::from_pod(&api).unwrap().unwrap()), &HashMap::new());
        let c = &r.snapshot.clusters;
        assert_eq!((c[0].name.as_str(), c[0].http2), ("app_shop_api.v2-1_9090", true));
        assert_eq!((c[1].name.as_str(), c[1].http2), ("app_shop_api.v2-1_8080", false));
        assert_eq!(c[2].health, Some(xds::HealthCheck::Grpc { service: "shop.Api".into() }));
        assert!(c[2].http2, "gRPC's health protocol runs over HTTP/2");
        assert!(c.iter().all(|c| c.validate().is_ok()));
    }

    #[test]
    fn a_refused_pipe_falls_back_to_tcp_in_the_pods_netns() {
        let map = map_in_netns(pod(Some("s/app.sock"), &["10.1.2.3"]), Some("/var/run/netns/cni-1"));
        let key = map.iter().next().unwrap().0.clone();
        let refused = HashMap::from([(key.clone(), Refusal::Symlink { path: "/x".into() })]);
        let r = render(&map, &refused);
        assert_eq!(
            r.snapshot.clusters[0].endpoint,
            Endpoint::Tcp {
                address: "127.0.0.1".parse().unwrap(),
                port: 8080,
                netns: Some("/var/run/netns/cni-1".into())
            }
        );
        assert_eq!(r.effective[&key], Effective::Tcp);
    }

    #[test]
    fn a_tcp_pod_without_netns_uses_its_ip_and_waits_without_one() {
        let r = render(&map_of(pod(None, &["10.1.2.3"])), &HashMap::new());
        assert_eq!(
            r.snapshot.clusters[0].endpoint,
            Endpoint::Tcp { address: "10.1.2.3".parse().unwrap(), port: 8080, netns: None }
        );
        let r = render(&map_of(pod(None, &[])), &HashMap::new());
        assert!(r.snapshot.clusters.is_empty());
        assert_eq!(r.snapshot.health_clusters, ["health_shop_cart-1"], "the gateway answers 503 for a waiting pod");
        assert_eq!(r.effective.values().next(), Some(&Effective::Waiting));
    }

    fn listener_names(r: &Rendered) -> Vec<&str> {
        r.snapshot.listeners.iter().map(|l| l.name.as_str()).collect()
    }

    #[test]
    fn a_pipe_pod_with_a_known_netns_gets_one_inbound_listener_per_port_to_its_app_cluster() {
        let r =
            render(&map_in_netns(pod(Some("s/app.sock"), &["10.1.2.3"]), Some("/run/netns/cni-1")), &HashMap::new());
        assert_eq!(listener_names(&r), ["inbound_shop_cart-1_8080", "inbound_shop_cart-1_9090"]);
        let l = &r.snapshot.listeners[1];
        assert_eq!((l.port, l.netns.as_str(), l.cluster.as_str()), (9090, "/run/netns/cni-1", "app_shop_cart-1_9090"));
        assert!(!l.ipv6, "no [::] listener for a pod without an IPv6 address");
        let dual = map_in_netns(pod(Some("s/app.sock"), &["10.1.2.3", "fd00::3"]), Some("/run/netns/cni-1"));
        assert!(render(&dual, &HashMap::new()).snapshot.listeners.iter().all(|l| l.ipv6));
        assert!(!l.http, "bytes are relayed unless the pod asks for HTTP");
        let mut http = pod(Some("s/app.sock"), &["10.1.2.3"]);
        http.inbound = InboundProxy::Http;
        let r = render(&map_in_netns(http, Some("/run/netns/cni-1")), &HashMap::new());
        assert!(r.snapshot.listeners.iter().all(|l| l.http), "every port of an inbound-proxy: http pod");
    }

    #[test]
    fn no_inbound_listener_without_a_netns_or_ips_for_a_tcp_pod_or_a_refused_pipe() {
        let unknown_netns = render(&map_of(pod(Some("s/app.sock"), &["10.1.2.3"])), &HashMap::new());
        assert!(unknown_netns.snapshot.listeners.is_empty());
        let no_ips = render(&map_in_netns(pod(Some("s/app.sock"), &[]), Some("/run/netns/cni-1")), &HashMap::new());
        assert!(no_ips.snapshot.listeners.is_empty(), "the address set must be known before the first offer");
        let tcp = render(&map_in_netns(pod(None, &["10.1.2.3"]), Some("/run/netns/cni-1")), &HashMap::new());
        assert!(tcp.snapshot.listeners.is_empty(), "a TCP pod's app owns its port");
        let map = map_in_netns(pod(Some("s/app.sock"), &["10.1.2.3"]), Some("/run/netns/cni-1"));
        let key = map.iter().next().unwrap().0.clone();
        let refused = HashMap::from([(key, Refusal::Symlink { path: "/x".into() })]);
        assert!(render(&map, &refused).snapshot.listeners.is_empty());
    }

    #[test]
    fn a_port_envoy_could_not_bind_loses_only_its_listener_until_the_netns_changes() {
        let mut index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        index.apply_pod(pod(Some("s/app.sock"), &["10.1.2.3"]));
        index.set_netns(UID, Some("/run/netns/cni-1".into()));
        assert!(index.mark_inbound_failed(UID, 8080).map_changed);
        assert!(index.mark_inbound_failed(UID, 8080).is_empty(), "marking twice changes nothing");
        let r = render(&index.snapshot(), &HashMap::new());
        assert_eq!(listener_names(&r), ["inbound_shop_cart-1_9090"]);
        assert_eq!(r.snapshot.clusters.len(), 3, "its clusters stay");
        index.set_netns(UID, Some("/run/netns/cni-2".into()));
        let r = render(&index.snapshot(), &HashMap::new());
        assert_eq!(listener_names(&r), ["inbound_shop_cart-1_8080", "inbound_shop_cart-1_9090"]);
    }

    #[test]
    fn a_withdrawn_listener_is_offered_again_on_request_and_only_once() {
        let mut index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        index.apply_pod(pod(Some("s/app.sock"), &["10.1.2.3"]));
        index.set_netns(UID, Some("/run/netns/cni-1".into()));
        assert!(index.reoffer_inbound(UID).is_empty(), "nothing withdrawn: nothing to offer again");
        index.mark_inbound_failed(UID, 8080);
        index.mark_inbound_failed(UID, 9090);
        assert!(listener_names(&render(&index.snapshot(), &HashMap::new())).is_empty());
        let change = index.reoffer_inbound(UID);
        assert!(change.map_changed);
        assert_eq!(change.rerendered.len(), 1, "only that pod is re-rendered");
        let r = render(&index.snapshot(), &HashMap::new());
        assert_eq!(listener_names(&r), ["inbound_shop_cart-1_8080", "inbound_shop_cart-1_9090"]);
        assert!(index.reoffer_inbound(UID).is_empty(), "offered already");
        assert!(index.reoffer_inbound("no-such-uid").is_empty());
    }

    #[test]
    fn the_index_names_exactly_the_pods_a_change_touched_and_render_pod_rerenders_them() {
        let mut index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
        let p = |name: &str, uid: &str, sa: &str| {
            let api = aether_fixtures::pod("shop", name).uid(uid).sa(sa).emptydir("s").ip("10.1.2.3").build();
            PodRecord::from_pod(&api).unwrap().unwrap()
        };
        let (a, b) = ("11111111-2222-4333-8444-555555555555", "22222222-2222-4333-8444-555555555555");
        index.reset_pods([p("a", a, "cart"), p("b", b, "web")]);
        assert_eq!(index.take_changed().len(), 2);
        assert!(index.take_changed().is_empty(), "taken once");
        let before = render(&index.snapshot(), &HashMap::new());

        let policy = aether_fixtures::policy("shop", "cart-uds").target("cart").socket("s/app.sock").build();
        index.apply_policy(crate::PolicyRecord::from_policy(&policy, index.settings()).unwrap());
        index.apply_pod(p("b", b, "web"));
        let changed: Vec<String> = index.take_changed().into_iter().map(|k| k.name.to_string()).collect();
        assert_eq!(changed, ["a"], "the policy's pod only; an equal pod event changes nothing");

        // Re-rendering the changed pod alone gives what a whole render gives.
        let map = index.snapshot();
        let after = render(&map, &HashMap::new());
        let (key, entry) = map.iter().next().unwrap();
        let one = render_pod(entry, None);
        assert_eq!(one.clusters, after.snapshot.clusters[..2]);
        assert_eq!(after.snapshot.clusters[2..], before.snapshot.clusters[2..], "the other pod is untouched");
        assert!(matches!(one.effective, Effective::Pipe(_)) && after.effective[key] == one.effective);

        index.delete_pod(b);
        assert_eq!(
            index.take_changed().into_iter().map(|k| k.name.to_string()).collect::<Vec<_>>(),
            ["b"],
            "a removal is a change"
        );
    }

    #[test]
    fn with_pinning_envoy_dials_the_pods_pin_never_its_own_path() {
        let settings = Settings::new("/var/lib/kubelet/pods", true).with_pin_dir(Some("/run/aether/pins".into()));
        let mut index = Index::new(settings);
        index.apply_pod(pod(Some("s/app.sock"), &["10.1.2.3"]));
        let r = render(&index.snapshot(), &HashMap::new());
        let pin = format!("/run/aether/pins/{UID}.sock");
        assert!(r.snapshot.clusters.iter().all(|c| c.endpoint == Endpoint::Pipe { path: pin.clone() }));
        assert_eq!(r.effective.values().next(), Some(&Effective::Pipe(pin)));
        let entry = index.snapshot();
        let d = &entry.iter().next().unwrap().1.delivery;
        assert!(d.path.as_ref().unwrap().as_str().ends_with("/s/app.sock"), "the delivery still names the socket");
    }
}
