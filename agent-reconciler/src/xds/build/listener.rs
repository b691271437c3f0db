//! One [`ListenerSpec`] to an Envoy inbound `Listener` (LDS): a pod port's listener inside the
//! pod's network namespace that hands every connection to the pod's cluster (docs/reference.md,
//! "`aether-agent`: the node side").

use std::net::IpAddr;

use aether_agent_core::model::{ListenerSpec, RenderError};
use aether_agent_core::names;
use envoy_types::pb::envoy::config::core::v3::{Address, address};
use envoy_types::pb::envoy::config::listener::v3::{AdditionalAddress, Listener};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy::ClusterSpecifier};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::parts::{connection_limited, pb_duration, socket_address};
use crate::xds::options::BuildOptions;

/// Builds one inbound listener: `0.0.0.0:<port>` (plus `[::]:<port>`, IPv6 only, when the spec
/// says so) with `network_namespace_filepath` = the pod's netns, `enable_reuse_port: false` (an
/// app that holds the port with `SO_REUSEPORT` must make the bind fail, not share its
/// connections), and one filter chain: `envoy.filters.network.connection_limit` (the cap of
/// `opts`), then `envoy.filters.network.tcp_proxy` to the spec's cluster with the idle timeout of
/// `opts`. The stat prefix of the listener and its filters is the listener's stat name
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
    let proxy = TcpProxy {
        stat_prefix: stat_name.clone(),
        cluster_specifier: Some(ClusterSpecifier::Cluster(spec.cluster.clone())),
        idle_timeout: Some(pb_duration(opts.inbound_idle_timeout)),
        ..Default::default()
    };
    Ok(Listener {
        name: spec.name.clone(),
        address: Some(on(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))),
        additional_addresses,
        enable_reuse_port: Some(BoolValue { value: false }),
        stat_prefix: stat_name.clone(),
        filter_chains: vec![connection_limited(
            &stat_name,
            opts.inbound_max_connections,
            "envoy.filters.network.tcp_proxy",
            pack_any(proxy),
        )],
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
}
