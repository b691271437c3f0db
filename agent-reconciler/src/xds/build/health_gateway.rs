//! The health gateway: `GET /healthz/<health cluster>` on the `--health-socket` pipe, answered
//! by Envoy's `envoy.filters.http.health_check` filter from that cluster's active health state
//! (200 when every host passes, 503 otherwise, also for a listed cluster Envoy does not have), 404
//! for a cluster that is not listed and for every other request.
//!
//! Two xDS resources, so that pod churn never touches the listener:
//!
//! - the listener [`HEALTH_LISTENER_NAME`] (LDS, [`build_health_listener`]): the pipe, Envoy's
//!   `envoy.filters.network.connection_limit` (cap [`BuildOptions::health_max_connections`];
//!   outside the overload manager's global cap),
//!   and an HTTP connection manager whose filters are one filter discovered over ECDS
//!   ([`HEALTH_CHECKS_NAME`]) and the router (every request the filter does not answer gets the
//!   route's 404). It depends on the node's settings only: built once, never replaced.
//! - the filter's configuration [`HEALTH_CHECKS_NAME`] (ECDS, type
//!   [`EXTENSION_CONFIG_TYPE_URL`](crate::xds::resource_set::EXTENSION_CONFIG_TYPE_URL) on the
//!   same ADS stream, [`build_health_checks`]): an `ExtensionWithMatcher` around the `envoy.filters.http.composite` filter whose match tree maps
//!   the exact `:path` `/healthz/<name>` of each listed cluster to a `health_check` filter for that
//!   cluster. A pod added or removed changes this resource only. Envoy applies an ECDS update to
//!   the streams that start after it, on every connection, existing keep-alive ones included, and
//!   drains nothing (measured in `tests/health_gateway.rs`; docs/benchmarks.md, section 3c, times
//!   it).
//!
//! Why not the alternatives (`docs/design-notes.md`, "Health gateway without listener churn"):
//! one `health_check` filter per cluster in the listener (the old design) replaces the filter
//! chain on every pod change, and connections on the old chain keep the old list until they
//! drain; the `health_check` filter has no per-route config, so RDS alone cannot select a cluster
//! (only with the composite filter's per-route matcher, new in Envoy 1.40); one listener per pod
//! cannot share the one gateway socket the mesh calls.
//!
//! Envoy versions: ECDS of an HTTP filter, the composite filter, `ExtensionWithMatcher` with an
//! `xds_matcher` (Envoy 1.21+) and the `connection_limit` network filter are all long-standing;
//! tested against Envoy 1.40.

use std::collections::{BTreeMap, HashMap};

use aether_agent_core::model::{RenderError, validate_pipe_path};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, ExtensionConfigSource, TypedExtensionConfig,
    config_source::ConfigSourceSpecifier, data_source,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, Route, RouteConfiguration, RouteMatch, VirtualHost,
    header_matcher::HeaderMatchSpecifier, route, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::common::matching::v3::ExtensionWithMatcher;
use envoy_types::pb::envoy::extensions::filters::http::composite::v3::{Composite, ExecuteFilterAction};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck as HealthCheckFilter;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
    http_connection_manager::{CodecType, RouteSpecifier},
    http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    HttpRequestHeaderMatchInput, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use envoy_types::pb::xds::core::v3::TypedExtensionConfig as XdsExtensionConfig;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::{OnMatch, on_match};
use envoy_types::util::pack_any;
use prost::{Message, Name};

use super::parts::{connection_limited, pipe_address};
use crate::xds::options::BuildOptions;

/// Name of the health-gateway listener served over LDS (also its stat prefix).
pub const HEALTH_LISTENER_NAME: &str = "aether_health";
/// Path prefix the health gateway answers: `GET /healthz/<health cluster name>`.
pub const HEALTHZ_PREFIX: &str = "/healthz/";
/// Name of the gateway's discovered HTTP filter: the ECDS resource name and the filter's name in
/// the listener (Envoy's stats: `extension_config_discovery.http_filter.aether_health_checks.*`).
pub const HEALTH_CHECKS_NAME: &str = "aether_health_checks";

const HEALTH_CHECK_FILTER: &str = "envoy.filters.http.health_check";
const COMPOSITE_FILTER: &str = "envoy.filters.http.composite";

/// Builds the gateway listener: a `pipe` listener on `opts.health_socket` (file mode
/// `opts.health_socket_mode`) with one filter chain: `envoy.filters.network.connection_limit`
/// (`opts.health_max_connections`; a connection past it is closed at once and counted in Envoy's
/// `connection_limit.aether_health.limited_connections`), then an HTTP connection manager (codec
/// auto, Envoy's default timeouts) with the ECDS filter [`HEALTH_CHECKS_NAME`] (ADS, accepting
/// only an `ExtensionWithMatcher`) and the router, whose one route answers 404 `no such health
/// cluster`. It names no health cluster: a pod change never changes it.
///
/// # Errors
/// [`RenderError::InvalidPath`] or [`RenderError::PipePathTooLong`] for the socket path.
/// `Ok(None)` when `opts.health_socket` is `None` (no gateway).
pub fn build_health_listener(opts: &BuildOptions) -> Result<Option<Listener>, RenderError> {
    let Some(socket) = &opts.health_socket else { return Ok(None) };
    validate_pipe_path(socket)?;
    let discovered = HttpFilter {
        name: HEALTH_CHECKS_NAME.to_owned(),
        config_type: Some(http_filter::ConfigType::ConfigDiscovery(ExtensionConfigSource {
            config_source: Some(ConfigSource {
                config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource::default())),
                resource_api_version: ApiVersion::V3 as i32,
                ..Default::default()
            }),
            type_urls: vec![ExtensionWithMatcher::type_url()],
            ..Default::default()
        })),
        ..Default::default()
    };
    let router = HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Router::default()))),
        ..Default::default()
    };
    let not_found = Route {
        r#match: Some(RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".to_owned())), ..Default::default() }),
        action: Some(route::Action::DirectResponse(DirectResponseAction {
            status: 404,
            body: Some(DataSource {
                specifier: Some(data_source::Specifier::InlineString("no such health cluster\n".to_owned())),
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    let hcm = HttpConnectionManager {
        codec_type: CodecType::Auto as i32,
        stat_prefix: HEALTH_LISTENER_NAME.to_owned(),
        http_filters: vec![discovered, router],
        route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
            name: HEALTH_LISTENER_NAME.to_owned(),
            virtual_hosts: vec![VirtualHost {
                name: HEALTH_LISTENER_NAME.to_owned(),
                domains: vec!["*".to_owned()],
                routes: vec![not_found],
                ..Default::default()
            }],
            ..Default::default()
        })),
        ..Default::default()
    };
    Ok(Some(Listener {
        name: HEALTH_LISTENER_NAME.to_owned(),
        address: Some(pipe_address(socket, opts.health_socket_mode)),
        filter_chains: vec![connection_limited(
            HEALTH_LISTENER_NAME,
            opts.health_max_connections,
            "envoy.filters.network.http_connection_manager",
            pack_any(hcm),
        )],
        // Outside the overload manager's global connection cap (the chart's bootstrap,
        // docs/listeners.md): capped on its own, so a flood of a pod's inbound listener cannot
        // refuse the health checks of every pod.
        ignore_global_conn_limit: true,
        ..Default::default()
    }))
}

/// Builds the gateway's ECDS resource [`HEALTH_CHECKS_NAME`] for `health_clusters` (any order,
/// duplicates ignored): an `ExtensionWithMatcher` whose `xds_matcher` is an exact-match map on
/// the request's `:path` (`envoy.type.matcher.v3.HttpRequestHeaderMatchInput`), one entry
/// `/healthz/<name>` per cluster, each an `ExecuteFilterAction` of an
/// `envoy.filters.http.health_check` filter (`pass_through_mode: false`, that one cluster at
/// 100 %), around the `envoy.filters.http.composite` filter. An empty list gives a matcher with
/// no tree (every request reaches the router's 404).
///
/// The map is O(1) per request in Envoy; its entries are encoded in name order, so the same list
/// always gives the same bytes (envoy-types' `HashMap` would encode them in a random order).
pub fn build_health_checks(health_clusters: &[String]) -> TypedExtensionConfig {
    let map: BTreeMap<String, OnMatch> =
        health_clusters.iter().map(|name| (format!("{HEALTHZ_PREFIX}{name}"), check_action(name))).collect();
    let tree = (!map.is_empty()).then(|| sorted::MatcherTree {
        input: Some(XdsExtensionConfig {
            name: "request-path".to_owned(),
            typed_config: Some(pack_any(HttpRequestHeaderMatchInput { header_name: ":path".to_owned() })),
        }),
        exact_match_map: Some(sorted::MatchMap { map }),
    });
    let wrapper = sorted::ExtensionWithMatcher {
        xds_matcher: Some(sorted::Matcher { matcher_tree: tree }),
        extension_config: Some(TypedExtensionConfig {
            name: COMPOSITE_FILTER.to_owned(),
            typed_config: Some(pack_any(Composite::default())),
        }),
    };
    TypedExtensionConfig {
        name: HEALTH_CHECKS_NAME.to_owned(),
        typed_config: Some(Any { type_url: ExtensionWithMatcher::type_url(), value: wrapper.encode_to_vec() }),
    }
}

/// The match action for cluster `name`: run a `health_check` filter that answers for it alone.
fn check_action(name: &str) -> OnMatch {
    let path = format!("{HEALTHZ_PREFIX}{name}");
    // One entry: prost encodes a `map` field in `HashMap` iteration order, so only a map of one
    // entry encodes the same content to the same bytes.
    let min_healthy = HashMap::from([(name.to_owned(), Percent { value: 100.0 })]);
    let check = HealthCheckFilter {
        pass_through_mode: Some(BoolValue { value: false }),
        cluster_min_healthy_percentages: min_healthy,
        // The map already matched this exact path; the filter checks it again, so it can never
        // answer for another request.
        headers: vec![HeaderMatcher {
            name: ":path".to_owned(),
            header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
                match_pattern: Some(MatchPattern::Exact(path)),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    let action = ExecuteFilterAction {
        typed_config: Some(TypedExtensionConfig {
            name: HEALTH_CHECK_FILTER.to_owned(),
            typed_config: Some(pack_any(check)),
        }),
        ..Default::default()
    };
    OnMatch {
        on_match: Some(on_match::OnMatch::Action(XdsExtensionConfig {
            name: name.to_owned(),
            typed_config: Some(pack_any(action)),
        })),
        ..Default::default()
    }
}

/// Wire twins of the envoy-types messages on the way from `ExtensionWithMatcher` down to the
/// exact-match map, with a `BTreeMap` where envoy-types has a `HashMap` (prost encodes a map in
/// its iteration order). Same field numbers and types, so the bytes decode as the real messages
/// (a test decodes them with envoy-types); oneof members are plain optional fields here, which
/// protobuf encodes identically.
mod sorted {
    use std::collections::BTreeMap;

    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::xds::core::v3::TypedExtensionConfig as XdsExtensionConfig;
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::OnMatch;

    /// `envoy.extensions.common.matching.v3.ExtensionWithMatcher`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ExtensionWithMatcher {
        /// `extension_config`.
        #[prost(message, optional, tag = "2")]
        pub extension_config: Option<TypedExtensionConfig>,
        /// `xds_matcher`.
        #[prost(message, optional, tag = "3")]
        pub xds_matcher: Option<Matcher>,
    }

    /// `xds.type.matcher.v3.Matcher`, the `matcher_tree` member of its `matcher_type` oneof.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Matcher {
        /// `matcher_tree`.
        #[prost(message, optional, tag = "2")]
        pub matcher_tree: Option<MatcherTree>,
    }

    /// `xds.type.matcher.v3.Matcher.MatcherTree`, the `exact_match_map` member of `tree_type`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct MatcherTree {
        /// `input`.
        #[prost(message, optional, tag = "1")]
        pub input: Option<XdsExtensionConfig>,
        /// `exact_match_map`.
        #[prost(message, optional, tag = "2")]
        pub exact_match_map: Option<MatchMap>,
    }

    /// `xds.type.matcher.v3.Matcher.MatcherTree.MatchMap`, entries in key order.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct MatchMap {
        /// `map`.
        #[prost(btree_map = "string, message", tag = "1")]
        pub map: BTreeMap<String, OnMatch>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resource_set::EXTENSION_CONFIG_TYPE_URL;
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::{MatcherType, matcher_tree::TreeType};

    fn unwrap(config: &TypedExtensionConfig) -> ExtensionWithMatcher {
        let any = config.typed_config.as_ref().expect("typed config");
        assert_eq!(any.type_url, ExtensionWithMatcher::type_url());
        ExtensionWithMatcher::decode(any.value.as_slice()).expect("decodes as the real ExtensionWithMatcher")
    }

    #[test]
    fn the_checks_map_each_listed_path_to_a_health_check_of_that_cluster_alone() {
        let config = build_health_checks(&["health_ns_b".to_owned(), "health_ns_a".to_owned()]);
        assert_eq!(config.name, HEALTH_CHECKS_NAME);
        let wrapper = unwrap(&config);
        let inner = wrapper.extension_config.unwrap();
        assert_eq!(inner.name, COMPOSITE_FILTER);
        assert_eq!(inner.typed_config.unwrap().type_url, Composite::type_url());
        let Some(MatcherType::MatcherTree(tree)) = wrapper.xds_matcher.unwrap().matcher_type else {
            panic!("a matcher tree")
        };
        let input = tree.input.unwrap().typed_config.unwrap();
        let input = HttpRequestHeaderMatchInput::decode(input.value.as_slice()).unwrap();
        assert_eq!(input.header_name, ":path");
        let Some(TreeType::ExactMatchMap(map)) = tree.tree_type else { panic!("an exact-match map") };
        let mut keys: Vec<&str> = map.map.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["/healthz/health_ns_a", "/healthz/health_ns_b"]);
        let Some(on_match::OnMatch::Action(action)) = &map.map["/healthz/health_ns_a"].on_match else {
            panic!("an action")
        };
        let action = ExecuteFilterAction::decode(action.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
        let filter = action.typed_config.unwrap();
        assert_eq!(filter.name, HEALTH_CHECK_FILTER);
        let check = HealthCheckFilter::decode(filter.typed_config.unwrap().value.as_slice()).unwrap();
        assert_eq!(check.pass_through_mode, Some(BoolValue { value: false }));
        assert_eq!(check.cluster_min_healthy_percentages.len(), 1);
        assert_eq!(check.cluster_min_healthy_percentages["health_ns_a"].value, 100.0);
        let Some(HeaderMatchSpecifier::StringMatch(m)) = &check.headers[0].header_match_specifier else { panic!() };
        assert_eq!(m.match_pattern, Some(MatchPattern::Exact("/healthz/health_ns_a".to_owned())));
    }

    #[test]
    fn the_same_list_in_any_order_encodes_to_the_same_bytes() {
        let names: Vec<String> = (0..50).map(|i| format!("health_ns_p{i}")).collect();
        let mut shuffled = names.clone();
        shuffled.reverse();
        shuffled.push(names[7].clone());
        let one = build_health_checks(&names).encode_to_vec();
        for _ in 0..10 {
            assert_eq!(build_health_checks(&shuffled).encode_to_vec(), one);
        }
        // And the twin's bytes equal what envoy-types builds from the same content.
        let decoded = unwrap(&build_health_checks(&names));
        let reencoded = ExtensionWithMatcher::decode(decoded.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, reencoded);
        let Some(MatcherType::MatcherTree(tree)) = decoded.xds_matcher.unwrap().matcher_type else { panic!() };
        let Some(TreeType::ExactMatchMap(map)) = tree.tree_type else { panic!() };
        assert_eq!(map.map.len(), 50);
        assert_ne!(build_health_checks(&names[1..]).encode_to_vec(), one, "a change changes the bytes");
    }

    #[test]
    fn no_clusters_is_a_matcher_without_a_tree() {
        let wrapper = unwrap(&build_health_checks(&[]));
        assert_eq!(wrapper.xds_matcher.unwrap().matcher_type, None);
    }

    #[test]
    fn the_listener_names_no_cluster_and_discovers_its_checks_over_ads_behind_a_connection_limit() {
        let opts = BuildOptions { health_max_connections: 7, ..BuildOptions::default() };
        let l = build_health_listener(&opts).unwrap().unwrap();
        assert_eq!(l.name, HEALTH_LISTENER_NAME);
        assert_eq!(l.address, Some(super::super::parts::pipe_address("/run/aether/health.sock", 0o666)));
        let filters = &l.filter_chains[0].filters;
        let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["envoy.filters.network.connection_limit", "envoy.filters.network.http_connection_manager"]);
        let Some(filter::ConfigType::TypedConfig(any)) = &filters[0].config_type else { panic!() };
        let limit = ConnectionLimit::decode(any.value.as_slice()).unwrap();
        assert_eq!(limit.max_connections, Some(UInt64Value { value: 7 }));
        let Some(filter::ConfigType::TypedConfig(any)) = &filters[1].config_type else { panic!() };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [HEALTH_CHECKS_NAME, "envoy.filters.http.router"]);
        let Some(http_filter::ConfigType::ConfigDiscovery(source)) = &hcm.http_filters[0].config_type else {
            panic!("discovered over ECDS")
        };
        assert_eq!(source.type_urls, [ExtensionWithMatcher::type_url()]);
        let specifier = source.config_source.as_ref().unwrap().config_source_specifier.clone();
        assert_eq!(specifier, Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource::default())));

        assert_eq!(build_health_listener(&BuildOptions { health_socket: None, ..opts.clone() }), Ok(None));
        let long = BuildOptions { health_socket: Some(format!("/{}", "h".repeat(107))), ..opts };
        assert!(matches!(build_health_listener(&long), Err(RenderError::PipePathTooLong { .. })));
    }

    #[test]
    fn the_type_url_matches_the_proto() {
        assert_eq!(EXTENSION_CONFIG_TYPE_URL, TypedExtensionConfig::type_url());
    }
}
