//! One [`ClusterSpec`] to an Envoy `Cluster` (CDS), with its active health check.

use std::collections::HashMap;
use std::net::IpAddr;

use aether_agent_core::model::{ClusterSpec, Endpoint, HealthCheck, RenderError};
use aether_agent_core::names;
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, CommonLbConfig, DiscoveryType},
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, BindConfig, HealthCheck as PbHealthCheck, Http2ProtocolOptions, address,
    health_check::{GrpcHealthCheck, HealthChecker, HttpHealthCheck, TcpHealthCheck},
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig},
};
use envoy_types::pb::envoy::r#type::v3::{CodecClientType, Percent};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use super::parts::{pb_duration, pipe_address, socket_address};
use crate::xds::options::{BuildOptions, HealthTiming};

/// Host header of every active HTTP health check.
pub const HEALTH_CHECK_HOST: &str = "localhost";

/// Builds one validated spec's Envoy `Cluster`: type STATIC with one host in `load_assignment`,
/// explicit `connect_timeout`, `healthy_panic_threshold` 0 (an unhealthy host gets no traffic
/// instead of panic-mode traffic), the active health check if any.
///
/// # Errors
/// What [`ClusterSpec::validate`] returns; nothing is built then.
pub fn build_cluster(spec: &ClusterSpec, opts: &BuildOptions) -> Result<Cluster, RenderError> {
    spec.validate()?;
    let (address, upstream_bind_config) = match &spec.endpoint {
        Endpoint::Pipe { path } => (pipe_address(path, 0), None),
        Endpoint::Tcp { address, port, netns } => {
            let host =
                Address { address: Some(address::Address::SocketAddress(socket_address(*address, *port, None))) };
            // The source address only carries the namespace: port 0 and the unspecified address
            // of the host's family, so the kernel picks both inside that namespace.
            let bind = netns.as_deref().map(|ns| {
                let any: IpAddr = match address {
                    IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                    IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                };
                BindConfig { source_address: Some(socket_address(any, 0, Some(ns))), ..Default::default() }
            });
            (host, bind)
        }
    };
    let health_checks = spec.health.as_ref().map(|h| health_check(h, &opts.health)).into_iter().collect();
    let mut typed_extension_protocol_options = HashMap::new();
    if spec.http2 {
        let options = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions::default())),
            })),
            ..Default::default()
        };
        // One entry only: prost encodes a `map` field in `HashMap` iteration order, which differs
        // between two maps of the same content; a map of one entry encodes, and so versions,
        // by its content only.
        typed_extension_protocol_options
            .insert("envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(), pack_any(options));
    }
    Ok(Cluster {
        name: spec.name.clone(),
        alt_stat_name: names::stat_name(&spec.name),
        connect_timeout: Some(pb_duration(opts.connect_timeout)),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: spec.name.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
                        address: Some(address),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        upstream_bind_config,
        health_checks,
        common_lb_config: Some(CommonLbConfig {
            healthy_panic_threshold: Some(Percent { value: 0.0 }),
            ..Default::default()
        }),
        typed_extension_protocol_options,
        ..Default::default()
    })
}

fn health_check(h: &HealthCheck, t: &HealthTiming) -> PbHealthCheck {
    let checker = match h {
        HealthCheck::Http { path, h2 } => HealthChecker::HttpHealthCheck(HttpHealthCheck {
            host: HEALTH_CHECK_HOST.to_owned(),
            path: path.clone(),
            codec_client_type: if *h2 { CodecClientType::Http2 as i32 } else { CodecClientType::Http1 as i32 },
            ..Default::default()
        }),
        HealthCheck::Connect => HealthChecker::TcpHealthCheck(TcpHealthCheck::default()),
        HealthCheck::Grpc { service } => HealthChecker::GrpcHealthCheck(GrpcHealthCheck {
            service_name: service.clone(),
            authority: HEALTH_CHECK_HOST.to_owned(),
            ..Default::default()
        }),
    };
    PbHealthCheck {
        timeout: Some(pb_duration(t.timeout)),
        interval: Some(pb_duration(t.interval)),
        no_traffic_interval: Some(pb_duration(t.interval)),
        interval_jitter_percent: t.jitter_percent,
        unhealthy_threshold: Some(UInt32Value { value: t.unhealthy_threshold }),
        healthy_threshold: Some(UInt32Value { value: t.healthy_threshold }),
        health_checker: Some(checker),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::test_specs::{h2_with_netns, pipe};
    use aether_agent_core::model::validate_pipe_path;
    use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    #[test]
    fn a_107_byte_pipe_path_renders_and_108_is_rejected_before_rendering() {
        let ok = format!("/{}", "a".repeat(106));
        assert_eq!(ok.len(), 107);
        assert!(build_cluster(&pipe("app_a", &ok), &BuildOptions::default()).is_ok());
        let long = format!("/{}", "a".repeat(107));
        assert_eq!(pipe("app_a", &long).validate(), Err(RenderError::PipePathTooLong { path: long.clone(), len: 108 }));
    }

    #[test]
    fn pipe_length_counts_bytes_not_characters() {
        // 53 two-byte characters = 106 bytes + '/' = 107: fine; one more byte is not.
        let ok = format!("/{}", "é".repeat(53));
        assert_eq!(ok.len(), 107);
        assert!(validate_pipe_path(&ok).is_ok());
        assert!(validate_pipe_path(&format!("{ok}x")).is_err());
    }

    #[test]
    fn relative_or_nul_paths_and_bad_names_are_rejected() {
        assert!(validate_pipe_path("rel/sock").is_err());
        assert!(validate_pipe_path("/a\0b").is_err());
        assert!(validate_pipe_path("@abstract").is_err());
        assert_eq!(pipe("", "/s").validate(), Err(RenderError::EmptyName));
        assert!(matches!(pipe("a b", "/s").validate(), Err(RenderError::InvalidName { .. })));
        let mut bad_health = pipe("h", "/s");
        bad_health.health = Some(HealthCheck::Http { path: "no-slash".to_owned(), h2: false });
        assert_eq!(bad_health.validate().unwrap_err().label(), "invalid-health-path");
    }

    #[test]
    fn pipe_cluster_is_static_with_no_bind_config_and_zero_panic_threshold() {
        let c = build_cluster(&pipe("app_ns_p_8080", "/s.sock"), &BuildOptions::default()).unwrap();
        assert_eq!(c.cluster_discovery_type, Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)));
        assert!(c.upstream_bind_config.is_none());
        assert_eq!(c.connect_timeout, Some(PbDuration { seconds: 1, nanos: 0 }));
        let threshold = c.common_lb_config.unwrap().healthy_panic_threshold.unwrap();
        assert_eq!(threshold.value, 0.0);
        let hc = &c.health_checks[0];
        let Some(HealthChecker::HttpHealthCheck(http)) = &hc.health_checker else {
            panic!("expected an HTTP health check");
        };
        assert_eq!(http.host, "localhost");
        assert_eq!(http.codec_client_type, CodecClientType::Http1 as i32);
        assert_eq!(hc.no_traffic_interval, hc.interval);
        assert_eq!(hc.interval_jitter_percent, 50);
        assert_eq!(hc.initial_jitter, None, "a first check delayed by jitter holds a changed cluster warming");
    }

    #[test]
    fn netns_goes_to_the_source_address_and_h2_to_both_codecs() {
        let c = build_cluster(&h2_with_netns("app_ns_p_9090"), &BuildOptions::default()).unwrap();
        let src = c.upstream_bind_config.unwrap().source_address.unwrap();
        assert_eq!(src.network_namespace_filepath, "/var/run/netns/cni-1");
        assert_eq!(src.address, "0.0.0.0");
        assert_eq!(src.port_specifier, Some(PortSpecifier::PortValue(0)));
        let Some(HealthChecker::HttpHealthCheck(http)) = &c.health_checks[0].health_checker else {
            panic!("expected an HTTP health check");
        };
        assert_eq!(http.codec_client_type, CodecClientType::Http2 as i32);
        assert_eq!(c.typed_extension_protocol_options.len(), 1);
    }

    #[test]
    fn connect_health_is_a_tcp_check_without_payload() {
        let mut spec = pipe("health_ns_p", "/s");
        spec.health = Some(HealthCheck::Connect);
        let c = build_cluster(&spec, &BuildOptions::default()).unwrap();
        assert_eq!(c.health_checks[0].health_checker, Some(HealthChecker::TcpHealthCheck(TcpHealthCheck::default())));
    }
}
