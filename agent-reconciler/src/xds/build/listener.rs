//! One [`ListenerSpec`] to an Envoy inbound `Listener` (LDS): a pod port's listener inside the
//! pod's network namespace that hands every connection to the pod's cluster (docs/reference.md,
//! "`aether-agent`: the node side").

use std::net::IpAddr;

use aether_agent_core::model::{ListenerSpec, RenderError};
use aether_agent_core::names;
use envoy_types::pb::envoy::config::core::v3::{Address, address};
use envoy_types::pb::envoy::config::core::v3::{Http1ProtocolOptions, HttpProtocolOptions};
use envoy_types::pb::envoy::config::listener::v3::{AdditionalAddress, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
    http_connection_manager::{CodecType, RouteSpecifier, ServerHeaderTransformation, UpgradeConfig},
    http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy::ClusterSpecifier};
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use envoy_types::util::pack_any;

use super::parts::{connection_limited, pb_duration, socket_address};
use crate::xds::options::BuildOptions;

/// Builds one inbound listener: `0.0.0.0:<port>` (plus `[::]:<port>`, IPv6 only, when the spec
/// says so) with `network_namespace_filepath` = the pod's netns, `enable_reuse_port: false` (an
/// app that holds the port with `SO_REUSEPORT` must make the bind fail, not share its
/// connections), and one filter chain: `envoy.filters.network.connection_limit` (the cap of
/// `opts`), then the relay: `envoy.filters.network.tcp_proxy` to the spec's cluster with the idle
/// timeout of `opts`, or, when `spec.http`, the HTTP relay of [`http_relay`]. The stat prefix of the listener and its filters is the listener's stat name
/// ([`names::stat_name`]: dots written `~`), so a dotted pod name keeps Envoy's metric names.
///
/// # Errors
/// What [`ListenerSpec::validate`] returns; nothing is built then.
pub fn build_inbound_listener(spec: &ListenerSpec, opts: &BuildOptions) -> Result<Listener, RenderError> {
    spec.validate()?;
    let on = |ip: IpAddr| Address {
        address: Some(address::Address::SocketAddress(socket_address(ip, spec.port, Some(&spec.netns)))),
    };
    let additional_addresses = if spec.ipv6 {
        vec![AdditionalAddress { address: Some(on(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED))), ..Default::default() }]
    } else {
        Vec::new()
    };
    let stat_name = names::stat_name(&spec.name);
    let (filter, relay) = if spec.http {
        ("envoy.filters.network.http_connection_manager", http_relay(&stat_name, &spec.cluster, opts))
    } else {
        let proxy = TcpProxy {
            stat_prefix: stat_name.clone(),
            cluster_specifier: Some(ClusterSpecifier::Cluster(spec.cluster.clone())),
            idle_timeout: Some(pb_duration(opts.inbound_idle_timeout)),
            ..Default::default()
        };
        ("envoy.filters.network.tcp_proxy", pack_any(proxy))
    };
    Ok(Listener {
        name: spec.name.clone(),
        address: Some(on(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))),
        additional_addresses,
        enable_reuse_port: Some(BoolValue { value: false }),
        stat_prefix: stat_name.clone(),
        filter_chains: vec![connection_limited(&stat_name, opts.inbound_max_connections, filter, relay)],
        ..Default::default()
    })
}

/// The HTTP relay of an `endpoint.aether.io/inbound-proxy: http` port: an HTTP connection manager
/// (codec auto: HTTP/1.1, or HTTP/2 with prior knowledge, as the client speaks) whose one route
/// sends every request to `cluster` (the cluster's own options pick the codec toward the app).
/// It changes as little as an HTTP proxy can: no route timeout (a long request or stream is not
/// cut), stream and connection idle timeouts of `opts.inbound_idle_timeout` (the TCP relay's
/// idle timeout), no `x-request-id` generated, no `x-envoy-*` header added, the app's `server`
/// header passed through, HTTP/1.0 accepted, WebSocket upgrades relayed. What it still does as
/// an HTTP proxy (docs/contracts.md, "Managed pods and their annotations"): it refuses a request
/// Envoy cannot parse (400) or whose headers pass 60 KiB (431), answers 503 when the app's socket
/// does not accept, and adds `x-forwarded-proto` when the client sent none.
///
/// While the Envoy drains (it is being replaced), every response on an HTTP/1.1 connection
/// carries `Connection: close` and an HTTP/2 connection gets a GOAWAY: a keep-alive client moves
/// to the new Envoy between requests instead of losing one in flight when the old Envoy exits
/// (Envoy's "Draining": the HTTP connection manager is the network filter that drains).
pub fn http_relay(stat_prefix: &str, cluster: &str, opts: &crate::xds::options::BuildOptions) -> Any {
    let idle = Some(pb_duration(opts.inbound_idle_timeout));
    let to_cluster = Route {
        r#match: Some(RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".to_owned())), ..Default::default() }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.to_owned())),
            timeout: Some(pb_duration(std::time::Duration::ZERO)),
            ..Default::default()
        })),
        ..Default::default()
    };
    let router = HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Router {
            suppress_envoy_headers: true,
            ..Default::default()
        }))),
        ..Default::default()
    };
    pack_any(HttpConnectionManager {
        codec_type: CodecType::Auto as i32,
        stat_prefix: stat_prefix.to_owned(),
        http_filters: vec![router],
        route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
            name: stat_prefix.to_owned(),
            virtual_hosts: vec![VirtualHost {
                name: stat_prefix.to_owned(),
                domains: vec!["*".to_owned()],
                routes: vec![to_cluster],
                ..Default::default()
            }],
            ..Default::default()
        })),
        common_http_protocol_options: Some(HttpProtocolOptions { idle_timeout: idle, ..Default::default() }),
        http_protocol_options: Some(Http1ProtocolOptions { accept_http_10: true, ..Default::default() }),
        stream_idle_timeout: idle,
        generate_request_id: Some(BoolValue { value: false }),
        server_header_transformation: ServerHeaderTransformation::PassThrough as i32,
        upgrade_configs: vec![UpgradeConfig { upgrade_type: "websocket".to_owned(), ..Default::default() }],
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::options::DEFAULT_INBOUND_MAX_CONNECTIONS;
    use crate::xds::test_specs::inbound;
    use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
    use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use prost::Message;

    #[test]
    fn an_inbound_listener_binds_in_the_pods_netns_without_reuse_port_and_proxies_to_its_cluster() {
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        let opts = BuildOptions::default();
        let mut spec = inbound("inbound_ns_a_8080", 8080);
        let l = build_inbound_listener(&spec, &opts).unwrap();
        let Some(address::Address::SocketAddress(sa)) = l.address.and_then(|a| a.address) else { panic!("no address") };
        assert_eq!((sa.address.as_str(), sa.network_namespace_filepath.as_str()), ("0.0.0.0", "/run/netns/cni-1"));
        assert_eq!(sa.port_specifier, Some(PortSpecifier::PortValue(8080)));
        assert_eq!(l.enable_reuse_port, Some(BoolValue { value: false }));
        assert!(l.additional_addresses.is_empty());
        let filters = &l.filter_chains[0].filters;
        let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["envoy.filters.network.connection_limit", "envoy.filters.network.tcp_proxy"]);
        let Some(ConfigType::TypedConfig(any)) = &filters[1].config_type else { panic!("typed config") };
        let proxy = TcpProxy::decode(any.value.as_slice()).unwrap();
        assert_eq!(proxy.cluster_specifier, Some(ClusterSpecifier::Cluster("app_ns_a_8080".into())));
        let Some(ConfigType::TypedConfig(any)) = &filters[0].config_type else { panic!("typed config") };
        let limit = ConnectionLimit::decode(any.value.as_slice()).unwrap();
        assert_eq!(limit.max_connections, Some(UInt64Value { value: DEFAULT_INBOUND_MAX_CONNECTIONS }));

        spec.ipv6 = true;
        let l = build_inbound_listener(&spec, &opts).unwrap();
        let extra = l.additional_addresses[0].address.clone().and_then(|a| a.address);
        let Some(address::Address::SocketAddress(sa)) = extra else { panic!("no [::] address") };
        assert_eq!((sa.address.as_str(), sa.network_namespace_filepath.as_str()), ("::", "/run/netns/cni-1"));

        spec.netns = "relative/netns".into();
        assert!(matches!(build_inbound_listener(&spec, &opts), Err(RenderError::InvalidPath { .. })));
    }

    #[test]
    fn an_http_inbound_listener_routes_every_request_to_its_cluster_changing_as_little_as_it_can() {
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        let opts = BuildOptions::default();
        let mut spec = inbound("inbound_ns_a_8080", 8080);
        spec.http = true;
        let l = build_inbound_listener(&spec, &opts).unwrap();
        let filters = &l.filter_chains[0].filters;
        let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["envoy.filters.network.connection_limit", "envoy.filters.network.http_connection_manager"]);
        let Some(ConfigType::TypedConfig(any)) = &filters[1].config_type else { panic!("typed config") };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        assert_eq!((hcm.codec_type, hcm.stat_prefix.as_str()), (CodecType::Auto as i32, "inbound_ns_a_8080"));
        let Some(RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier else { panic!("inline routes") };
        let routes = &rc.virtual_hosts[0].routes;
        assert_eq!((rc.virtual_hosts[0].domains.as_slice(), routes.len()), (["*".to_owned()].as_slice(), 1));
        let Some(route::Action::Route(action)) = &routes[0].action else { panic!("a route action") };
        assert_eq!(action.cluster_specifier, Some(route_action::ClusterSpecifier::Cluster("app_ns_a_8080".into())));
        assert_eq!(action.timeout, Some(pb_duration(std::time::Duration::ZERO)), "no route timeout");
        let idle = Some(pb_duration(opts.inbound_idle_timeout));
        assert_eq!(hcm.stream_idle_timeout, idle);
        assert_eq!(hcm.common_http_protocol_options.map(|o| o.idle_timeout), Some(idle));
        assert_eq!(hcm.generate_request_id, Some(BoolValue { value: false }));
        assert_eq!(hcm.server_header_transformation, ServerHeaderTransformation::PassThrough as i32);
        assert_eq!(hcm.upgrade_configs[0].upgrade_type, "websocket");
        let Some(http_filter::ConfigType::TypedConfig(router)) = &hcm.http_filters[0].config_type else { panic!() };
        assert!(Router::decode(router.value.as_slice()).unwrap().suppress_envoy_headers);
    }
}
