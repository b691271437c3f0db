//! Specs the xDS unit tests build from.

use aether_agent_core::model::{ClusterSpec, Endpoint, HealthCheck, ListenerSpec};

/// Cluster `name` on the pipe `path`, with an HTTP/1 health check of `/`.
pub(crate) fn pipe(name: &str, path: &str) -> ClusterSpec {
    ClusterSpec {
        name: name.to_owned(),
        endpoint: Endpoint::Pipe { path: path.to_owned() },
        health: Some(HealthCheck::Http { path: "/".to_owned(), h2: false }),
        http2: false,
    }
}

/// Cluster `name` over TCP to `127.0.0.1:9090` from inside a netns, HTTP/2 with an HTTP/2 check.
pub(crate) fn h2_with_netns(name: &str) -> ClusterSpec {
    ClusterSpec {
        name: name.to_owned(),
        endpoint: Endpoint::Tcp {
            address: "127.0.0.1".parse().unwrap(),
            port: 9090,
            netns: Some("/var/run/netns/cni-1".to_owned()),
        },
        health: Some(HealthCheck::Http { path: "/healthz".to_owned(), h2: true }),
        http2: true,
    }
}

/// Inbound listener `name` on `port` in `/run/netns/cni-1`, to cluster `app_ns_a_<port>`.
pub(crate) fn inbound(name: &str, port: u16) -> ListenerSpec {
    ListenerSpec {
        name: name.to_owned(),
        netns: "/run/netns/cni-1".to_owned(),
        port,
        ipv6: false,
        cluster: format!("app_ns_a_{port}"),
        http: false,
    }
}
