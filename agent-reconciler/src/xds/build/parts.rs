//! Proto pieces more than one builder uses: durations, addresses, the connection-capped filter
//! chain every listener the agent serves has.

use std::net::IpAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{Address, Pipe, SocketAddress, address, socket_address::PortSpecifier};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, filter};
use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, UInt64Value};
use envoy_types::util::pack_any;

/// `d` as a protobuf `Duration` (saturating).
pub(super) fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// One filter chain: Envoy's `connection_limit` network filter (at most `max_connections` open
/// connections, stats under `stat_prefix`; one past it is closed at once and counted in
/// `connection_limit.<stat_prefix>.limited_connections`), then the network filter `name` with
/// `config`. Every listener the agent serves is capped this way.
pub(super) fn connection_limited(stat_prefix: &str, max_connections: u64, name: &str, config: Any) -> FilterChain {
    let limit = ConnectionLimit {
        stat_prefix: stat_prefix.to_owned(),
        max_connections: Some(UInt64Value { value: max_connections }),
        ..Default::default()
    };
    FilterChain {
        filters: vec![
            Filter {
                name: "envoy.filters.network.connection_limit".to_owned(),
                config_type: Some(filter::ConfigType::TypedConfig(pack_any(limit))),
            },
            Filter { name: name.to_owned(), config_type: Some(filter::ConfigType::TypedConfig(config)) },
        ],
        ..Default::default()
    }
}

/// A `pipe` address at `path` with file mode `mode` (0: Envoy's default).
pub(super) fn pipe_address(path: &str, mode: u32) -> Address {
    Address { address: Some(address::Address::Pipe(Pipe { path: path.to_owned(), mode })) }
}

/// `ip:port`, bound inside the network namespace file `netns` when given.
pub(super) fn socket_address(ip: IpAddr, port: u16, netns: Option<&str>) -> SocketAddress {
    SocketAddress {
        address: ip.to_string(),
        port_specifier: Some(PortSpecifier::PortValue(u32::from(port))),
        network_namespace_filepath: netns.unwrap_or_default().to_owned(),
        ..Default::default()
    }
}
