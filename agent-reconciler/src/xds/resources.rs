//! The xDS encoder: the core's model rendered to Envoy protos.
//!
//! Nothing here knows Kubernetes: the core's render turns pods into [`ClusterSpec`]s (the model,
//! [`aether_agent_core::model`], re-exported here), this module turns
//! those into Envoy `Cluster`s (CDS) and the health-gateway `Listener` (LDS), packed into
//! envoy-types' `Any`, each set with a content-hash version.
//!
//! Validation happens *before* rendering ([`ClusterSpec::validate`]): a spec Envoy would refuse
//! (a pipe path over 107 bytes, an empty name, ...) is returned as a [`Rejected`] and left out,
//! so the node's update is never NACKed because of one pod.
//!
//! Determinism: prost encodes `map` fields in `HashMap` iteration order, which differs between
//! two maps with the same content. Every map this module fills holds at most one entry, so the
//! encoding, and therefore the version, depends on the content only.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

pub use aether_agent_core::model::{
    ClusterSpec, Endpoint, HealthCheck, ListenerSpec, RenderError, Snapshot, validate_pipe_path,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, CommonLbConfig, DiscoveryType},
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, BindConfig, DataSource, HealthCheck as PbHealthCheck, Http2ProtocolOptions, Pipe, SocketAddress, address,
    data_source,
    health_check::{HealthChecker, HttpHealthCheck, TcpHealthCheck},
    socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{AdditionalAddress, Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, Route, RouteConfiguration, RouteMatch, VirtualHost,
    header_matcher::HeaderMatchSpecifier, route, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck as HealthCheckFilter;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
    http_connection_manager::{CodecType, RouteSpecifier},
    http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy::ClusterSpecifier};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig},
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::{CodecClientType, Percent};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration as PbDuration, UInt32Value, UInt64Value};
use envoy_types::util::pack_any;
use prost::Name;
use sha2::{Digest, Sha256};

/// Default cap on concurrent connections per inbound listener (one pod port).
pub const DEFAULT_INBOUND_MAX_CONNECTIONS: u64 = 16_384;

/// Type URL of an Envoy v3 `Cluster` (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of an Envoy v3 `Listener` (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Name of the health-gateway listener served over LDS.
pub const HEALTH_LISTENER_NAME: &str = "aether_health";
/// Path prefix the health gateway answers: `GET /healthz/<health cluster name>`.
pub const HEALTHZ_PREFIX: &str = "/healthz/";
/// Host header of every active HTTP health check.
pub const HEALTH_CHECK_HOST: &str = "localhost";

/// Timing of active health checks (Envoy `HealthCheck` fields of the same names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthTiming {
    /// Time between two checks; also used as `no_traffic_interval` (whose Envoy default of 60 s
    /// would apply to health clusters, which never carry traffic).
    pub interval: Duration,
    /// Time to wait for a check's answer.
    pub timeout: Duration,
    /// Consecutive failures before a host is marked unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes before an unhealthy host is marked healthy again.
    pub healthy_threshold: u32,
}

impl Default for HealthTiming {
    /// 2 s interval, 1 s timeout, unhealthy after 2 failures, healthy after 1 success.
    fn default() -> Self {
        HealthTiming {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 2,
            healthy_threshold: 1,
        }
    }
}

/// Node-wide rendering settings (agent flags, not per-snapshot data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// `connect_timeout` of every cluster.
    pub connect_timeout: Duration,
    /// Active health-check timing.
    pub health: HealthTiming,
    /// `--health-socket`: path of the health-gateway pipe listener; `None` = no listener (LDS
    /// then serves an empty set).
    pub health_socket: Option<String>,
    /// File mode of the health-gateway socket (e.g. `0o666`).
    pub health_socket_mode: u32,
    /// Cap on concurrent connections of each inbound listener (Envoy's `connection_limit`
    /// network filter: a connection past it is closed at once and counted in the filter's
    /// `limited_connections` stat).
    pub inbound_max_connections: u64,
    /// TCP proxy idle timeout of inbound connections: closed after this long with no bytes
    /// either way (Envoy's default is 1 h; the same value is kept, explicitly).
    pub inbound_idle_timeout: Duration,
}

impl Default for RenderOptions {
    /// 1 s connect timeout, default health timing, health socket `/run/aether/health.sock`
    /// with mode `0o666`, inbound listeners capped at [`DEFAULT_INBOUND_MAX_CONNECTIONS`] with a
    /// 1 h idle timeout.
    fn default() -> Self {
        RenderOptions {
            connect_timeout: Duration::from_secs(1),
            health: HealthTiming::default(),
            health_socket: Some("/run/aether/health.sock".to_owned()),
            health_socket_mode: 0o666,
            inbound_max_connections: DEFAULT_INBOUND_MAX_CONNECTIONS,
            inbound_idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// One rendered resource: its name and the packed proto.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedResource {
    /// Resource name (cluster or listener name).
    pub name: String,
    /// The packed Envoy proto.
    pub resource: Any,
}

/// All resources of one type URL, sorted by name, with their content-hash version.
#[derive(Clone, Debug, PartialEq)]
pub struct TypedResources {
    /// Type URL of every resource ([`CLUSTER_TYPE_URL`] or [`LISTENER_TYPE_URL`]).
    pub type_url: String,
    /// Hex SHA-256 (first 16 bytes, 32 hex characters) over the type URL and, per resource in
    /// name order, its name and [`resource_digest`]: same content, same version. Per-resource
    /// digests let [`Renderer`] hash only what changed (a 10,000-pod node hashes ~1.5 MB of
    /// digests per push, not ~8 MB of encoded clusters).
    pub version: String,
    /// The resources, sorted by name.
    pub resources: Vec<NamedResource>,
}

/// SHA-256 over one resource's name, packed type URL and encoded bytes (each length-prefixed).
pub fn resource_digest(r: &NamedResource) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [r.name.as_bytes(), r.resource.type_url.as_bytes(), &r.resource.value] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

impl TypedResources {
    /// Builds the set from packed resources (any order), sorting them by name and computing
    /// the version. Duplicate names are kept as given (a way to hand Envoy something it NACKs).
    pub fn new(type_url: impl Into<String>, resources: Vec<NamedResource>) -> Self {
        let digested = resources.into_iter().map(|r| (resource_digest(&r), r)).collect();
        Self::from_digested(type_url.into(), digested)
    }

    /// Like [`TypedResources::new`] with each resource's [`resource_digest`] already known.
    fn from_digested(type_url: String, mut digested: Vec<Digested>) -> Self {
        digested.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        let mut h = Sha256::new();
        h.update((type_url.len() as u64).to_be_bytes());
        h.update(type_url.as_bytes());
        for (digest, r) in &digested {
            h.update((r.name.len() as u64).to_be_bytes());
            h.update(r.name.as_bytes());
            h.update(digest);
        }
        let version = h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect();
        TypedResources { type_url, version, resources: digested.into_iter().map(|(_, r)| r).collect() }
    }

    /// Names of the resources, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.resources.iter().map(|r| r.name.as_str()).collect()
    }
}

/// A cluster or listener left out of the rendered resources, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Cluster or listener name ([`HEALTH_LISTENER_NAME`] for the gateway).
    pub name: String,
    /// Why.
    pub error: RenderError,
}

/// The rendered snapshot the ADS server serves: CDS and LDS sets plus what was left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    /// `Cluster`s ([`CLUSTER_TYPE_URL`]).
    pub clusters: TypedResources,
    /// `Listener`s ([`LISTENER_TYPE_URL`]): the health gateway, if configured, and the inbound
    /// listeners.
    pub listeners: TypedResources,
    /// Specs that failed validation and are not in `clusters`/`listeners`.
    pub rejected: Vec<Rejected>,
}

impl Default for Resources {
    /// No clusters, no listeners.
    fn default() -> Self {
        Resources::from_protos(Vec::new(), Vec::new())
    }
}

impl Resources {
    /// Packs already-built protos without any validation (tests, or a caller with its own
    /// rendering). Duplicate names are kept.
    pub fn from_protos(clusters: Vec<Cluster>, listeners: Vec<Listener>) -> Self {
        let clusters =
            clusters.into_iter().map(|c| NamedResource { name: c.name.clone(), resource: pack_any(c) }).collect();
        let listeners =
            listeners.into_iter().map(|l| NamedResource { name: l.name.clone(), resource: pack_any(l) }).collect();
        Resources {
            clusters: TypedResources::new(Cluster::type_url(), clusters),
            listeners: TypedResources::new(Listener::type_url(), listeners),
            rejected: Vec::new(),
        }
    }

    /// The set for `type_url`, if we serve that type (CDS and LDS only).
    pub fn get(&self, type_url: &str) -> Option<&TypedResources> {
        if type_url == self.clusters.type_url {
            Some(&self.clusters)
        } else if type_url == self.listeners.type_url {
            Some(&self.listeners)
        } else {
            None
        }
    }

    /// The served type URLs, in push order (clusters before the listeners that may name them).
    pub fn type_urls(&self) -> [&str; 2] {
        [&self.clusters.type_url, &self.listeners.type_url]
    }

    /// True when both versions equal `other`'s (nothing to push).
    pub fn same_versions(&self, other: &Resources) -> bool {
        self.clusters.version == other.clusters.version && self.listeners.version == other.listeners.version
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn pipe_address(path: &str, mode: u32) -> Address {
    Address { address: Some(address::Address::Pipe(Pipe { path: path.to_owned(), mode })) }
}

fn socket_address(ip: IpAddr, port: u16, netns: Option<&str>) -> SocketAddress {
    SocketAddress {
        address: ip.to_string(),
        port_specifier: Some(PortSpecifier::PortValue(u32::from(port))),
        network_namespace_filepath: netns.unwrap_or_default().to_owned(),
        ..Default::default()
    }
}

/// Renders one validated spec to an Envoy `Cluster`: type STATIC with one host in
/// `load_assignment`, explicit `connect_timeout`, `healthy_panic_threshold` 0 (an unhealthy
/// host gets no traffic instead of panic-mode traffic), the active health check if any.
///
/// # Errors
/// What [`ClusterSpec::validate`] returns; nothing is rendered then.
pub fn render_cluster(spec: &ClusterSpec, opts: &RenderOptions) -> Result<Cluster, RenderError> {
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
        // One entry only: see the module doc on map determinism.
        typed_extension_protocol_options
            .insert("envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(), pack_any(options));
    }
    Ok(Cluster {
        name: spec.name.clone(),
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
    };
    PbHealthCheck {
        timeout: Some(pb_duration(t.timeout)),
        interval: Some(pb_duration(t.interval)),
        no_traffic_interval: Some(pb_duration(t.interval)),
        unhealthy_threshold: Some(UInt32Value { value: t.unhealthy_threshold }),
        healthy_threshold: Some(UInt32Value { value: t.healthy_threshold }),
        health_checker: Some(checker),
        ..Default::default()
    }
}

/// Renders the health gateway: a `pipe` listener on `socket` (file mode `mode`) whose HTTP
/// connection manager answers `GET /healthz/<name>` for each name in `health_clusters` with
/// Envoy's `envoy.filters.http.health_check` filter (`pass_through_mode: false`, 100 % of that
/// cluster's hosts healthy → 200, else 503), and 404 for every other request.
///
/// # Errors
/// [`RenderError::InvalidPath`] or [`RenderError::PipePathTooLong`] for `socket`.
pub fn render_health_listener(socket: &str, mode: u32, health_clusters: &[String]) -> Result<Listener, RenderError> {
    validate_pipe_path(socket)?;
    let mut names: Vec<&String> = health_clusters.iter().collect();
    names.sort();
    names.dedup();
    let mut http_filters: Vec<HttpFilter> = names
        .into_iter()
        .map(|name| {
            let mut min_healthy = HashMap::new();
            // One entry per filter: see the module doc on map determinism.
            min_healthy.insert(name.clone(), Percent { value: 100.0 });
            let config = HealthCheckFilter {
                pass_through_mode: Some(BoolValue { value: false }),
                cluster_min_healthy_percentages: min_healthy,
                headers: vec![HeaderMatcher {
                    name: ":path".to_owned(),
                    header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
                        match_pattern: Some(MatchPattern::Exact(format!("{HEALTHZ_PREFIX}{name}"))),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            };
            HttpFilter {
                name: "envoy.filters.http.health_check".to_owned(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(config))),
                ..Default::default()
            }
        })
        .collect();
    http_filters.push(HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Router::default()))),
        ..Default::default()
    });
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
        http_filters,
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
    Ok(Listener {
        name: HEALTH_LISTENER_NAME.to_owned(),
        address: Some(pipe_address(socket, mode)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".to_owned(),
                config_type: Some(filter::ConfigType::TypedConfig(pack_any(hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// Renders one inbound listener: `0.0.0.0:<port>` (plus `[::]:<port>`, IPv6 only, when the spec
/// says so) with `network_namespace_filepath` = the pod's netns, `enable_reuse_port: false` (an
/// app that holds the port with `SO_REUSEPORT` must make the bind fail, not share its
/// connections), and one filter chain: `envoy.filters.network.connection_limit` (the cap of
/// `opts`), then `envoy.filters.network.tcp_proxy` to the spec's cluster with the idle timeout of
/// `opts`. The stat prefix is the listener name.
///
/// # Errors
/// What [`ListenerSpec::validate`] returns; nothing is rendered then.
pub fn render_inbound_listener(spec: &ListenerSpec, opts: &RenderOptions) -> Result<Listener, RenderError> {
    spec.validate()?;
    let on = |ip: IpAddr| Address {
        address: Some(address::Address::SocketAddress(socket_address(ip, spec.port, Some(&spec.netns)))),
    };
    let additional_addresses = if spec.ipv6 {
        vec![AdditionalAddress { address: Some(on(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED))), ..Default::default() }]
    } else {
        Vec::new()
    };
    let limit = ConnectionLimit {
        stat_prefix: spec.name.clone(),
        max_connections: Some(UInt64Value { value: opts.inbound_max_connections }),
        ..Default::default()
    };
    let proxy = TcpProxy {
        stat_prefix: spec.name.clone(),
        cluster_specifier: Some(ClusterSpecifier::Cluster(spec.cluster.clone())),
        idle_timeout: Some(pb_duration(opts.inbound_idle_timeout)),
        ..Default::default()
    };
    Ok(Listener {
        name: spec.name.clone(),
        address: Some(on(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))),
        additional_addresses,
        enable_reuse_port: Some(BoolValue { value: false }),
        filter_chains: vec![FilterChain {
            filters: vec![
                Filter {
                    name: "envoy.filters.network.connection_limit".to_owned(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack_any(limit))),
                },
                Filter {
                    name: "envoy.filters.network.tcp_proxy".to_owned(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack_any(proxy))),
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// Renders snapshots, re-rendering only the clusters whose spec changed since the last call
/// (a 10,000-pod node re-encodes one cluster when one pod changes), with each resource's digest
/// cached beside it, and the health gateway re-rendered only when its list of clusters changes.
#[derive(Debug, Default)]
pub struct Renderer {
    opts: RenderOptions,
    cache: HashMap<String, Cached>,
    /// Rendered inbound listeners by name, with the spec each came from.
    inbound: HashMap<String, (ListenerSpec, Digested)>,
    /// The gateway listener for the last `health_clusters` list.
    gateway: Option<(Vec<String>, Result<Digested, RenderError>)>,
}

/// A resource with its [`resource_digest`].
type Digested = ([u8; 32], NamedResource);

/// One rendered cluster: the spec it came from, the packed proto and its [`resource_digest`].
#[derive(Debug)]
struct Cached {
    spec: ClusterSpec,
    any: Any,
    digest: [u8; 32],
}

impl Renderer {
    /// A renderer with these node-wide options and an empty cache.
    pub fn new(opts: RenderOptions) -> Self {
        Renderer { opts, cache: HashMap::new(), inbound: HashMap::new(), gateway: None }
    }

    /// The options this renderer uses.
    pub fn options(&self) -> &RenderOptions {
        &self.opts
    }

    /// Renders `snapshot`: every valid cluster (first of each name wins), the health gateway
    /// if `health_socket` is set, and the list of what was left out. Never fails as a whole.
    pub fn render(&mut self, snapshot: &Snapshot) -> Resources {
        let mut rejected = Vec::new();
        let mut seen = HashSet::new();
        let mut clusters = Vec::with_capacity(snapshot.clusters.len());
        let mut cache = HashMap::with_capacity(snapshot.clusters.len());
        for spec in &snapshot.clusters {
            if !seen.insert(spec.name.as_str()) {
                rejected.push(Rejected {
                    name: spec.name.clone(),
                    error: RenderError::DuplicateName { name: spec.name.clone() },
                });
                continue;
            }
            let cached = match self.cache.remove(&spec.name) {
                Some(c) if c.spec == *spec => c,
                _ => match render_cluster(spec, &self.opts) {
                    Ok(cluster) => {
                        let any = pack_any(cluster);
                        let digest = resource_digest(&NamedResource { name: spec.name.clone(), resource: any.clone() });
                        Cached { spec: spec.clone(), any, digest }
                    }
                    Err(error) => {
                        rejected.push(Rejected { name: spec.name.clone(), error });
                        continue;
                    }
                },
            };
            clusters.push((cached.digest, NamedResource { name: spec.name.clone(), resource: cached.any.clone() }));
            cache.insert(spec.name.clone(), cached);
        }
        self.cache = cache;

        let mut listeners = Vec::with_capacity(snapshot.listeners.len() + 1);
        let mut inbound = HashMap::with_capacity(snapshot.listeners.len());
        let mut seen = HashSet::new();
        for spec in &snapshot.listeners {
            if spec.name == HEALTH_LISTENER_NAME || !seen.insert(spec.name.as_str()) {
                rejected.push(Rejected {
                    name: spec.name.clone(),
                    error: RenderError::DuplicateName { name: spec.name.clone() },
                });
                continue;
            }
            let digested = match self.inbound.remove(&spec.name) {
                Some((old, d)) if old == *spec => d,
                _ => match render_inbound_listener(spec, &self.opts) {
                    Ok(l) => {
                        let r = NamedResource { name: spec.name.clone(), resource: pack_any(l) };
                        (resource_digest(&r), r)
                    }
                    Err(error) => {
                        rejected.push(Rejected { name: spec.name.clone(), error });
                        continue;
                    }
                },
            };
            listeners.push(digested.clone());
            inbound.insert(spec.name.clone(), (spec.clone(), digested));
        }
        self.inbound = inbound;
        if let Some(socket) = &self.opts.health_socket {
            let fresh = self.gateway.as_ref().is_some_and(|(names, _)| *names == snapshot.health_clusters);
            if !fresh {
                let rendered = render_health_listener(socket, self.opts.health_socket_mode, &snapshot.health_clusters)
                    .map(|l| {
                        let r = NamedResource { name: l.name.clone(), resource: pack_any(l) };
                        (resource_digest(&r), r)
                    });
                self.gateway = Some((snapshot.health_clusters.clone(), rendered));
            }
            match self.gateway.as_ref().map(|(_, g)| g) {
                Some(Ok(digested)) => listeners.push(digested.clone()),
                Some(Err(error)) => {
                    rejected.push(Rejected { name: HEALTH_LISTENER_NAME.to_owned(), error: error.clone() })
                }
                None => {}
            }
        }
        Resources {
            clusters: TypedResources::from_digested(CLUSTER_TYPE_URL.to_owned(), clusters),
            listeners: TypedResources::from_digested(LISTENER_TYPE_URL.to_owned(), listeners),
            rejected,
        }
    }
}

/// Renders `snapshot` with a fresh [`Renderer`] (no cache); see [`Renderer::render`].
pub fn render(snapshot: &Snapshot, opts: &RenderOptions) -> Resources {
    Renderer::new(opts.clone()).render(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn pipe(name: &str, path: &str) -> ClusterSpec {
        ClusterSpec {
            name: name.to_owned(),
            endpoint: Endpoint::Pipe { path: path.to_owned() },
            health: Some(HealthCheck::Http { path: "/".to_owned(), h2: false }),
            http2: false,
        }
    }

    fn h2_with_netns(name: &str) -> ClusterSpec {
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

    #[test]
    fn type_urls_match_the_protos() {
        assert_eq!(CLUSTER_TYPE_URL, Cluster::type_url());
        assert_eq!(LISTENER_TYPE_URL, Listener::type_url());
    }

    #[test]
    fn a_107_byte_pipe_path_renders_and_108_is_rejected_before_rendering() {
        let ok = format!("/{}", "a".repeat(106));
        assert_eq!(ok.len(), 107);
        assert!(render_cluster(&pipe("app_a", &ok), &RenderOptions::default()).is_ok());
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
        let c = render_cluster(&pipe("app_ns_p_8080", "/s.sock"), &RenderOptions::default()).unwrap();
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
    }

    #[test]
    fn netns_goes_to_the_source_address_and_h2_to_both_codecs() {
        let c = render_cluster(&h2_with_netns("app_ns_p_9090"), &RenderOptions::default()).unwrap();
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
        let c = render_cluster(&spec, &RenderOptions::default()).unwrap();
        assert_eq!(c.health_checks[0].health_checker, Some(HealthChecker::TcpHealthCheck(TcpHealthCheck::default())));
    }

    #[test]
    fn same_content_gives_the_same_version_and_a_change_a_new_one() {
        let opts = RenderOptions::default();
        let snap = Snapshot {
            clusters: vec![pipe("b", "/b"), pipe("a", "/a"), h2_with_netns("c"), h2_with_netns("d")],
            health_clusters: vec!["b".to_owned(), "a".to_owned(), "zz".to_owned()],
            ..Default::default()
        };
        let one = render(&snap, &opts);
        // Order of input does not matter; fresh HashMaps each time must not either.
        let mut reversed = snap.clone();
        reversed.clusters.reverse();
        reversed.health_clusters.reverse();
        for _ in 0..20 {
            let two = render(&reversed, &opts);
            assert!(one.same_versions(&two));
            assert_eq!(one, two);
        }
        let mut changed = snap.clone();
        changed.clusters[0] = pipe("b", "/b2");
        let three = render(&changed, &opts);
        assert_ne!(one.clusters.version, three.clusters.version);
        assert_eq!(one.listeners.version, three.listeners.version);
        assert_eq!(one.clusters.names(), vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn the_cache_reuses_unchanged_clusters_and_drops_removed_ones() {
        let mut r = Renderer::new(RenderOptions::default());
        let snap = Snapshot {
            clusters: vec![pipe("a", "/a"), pipe("b", "/b")],
            health_clusters: vec![],
            ..Default::default()
        };
        let first = r.render(&snap);
        let fresh = render(&snap, r.options());
        assert_eq!(first, fresh);
        let smaller = Snapshot { clusters: vec![pipe("b", "/b")], health_clusters: vec![], ..Default::default() };
        assert_eq!(r.render(&smaller).clusters.names(), vec!["b"]);
        assert_eq!(r.cache.len(), 1);
    }

    #[test]
    fn a_cached_render_equals_a_fresh_one_as_clusters_listeners_and_the_health_list_change() {
        let opts = RenderOptions { health_socket: Some("/run/aether/health.sock".to_owned()), ..Default::default() };
        let mut r = Renderer::new(opts.clone());
        let mut snap = Snapshot {
            clusters: vec![pipe("a", "/a"), pipe("b", "/b")],
            health_clusters: vec!["a".into()],
            ..Default::default()
        };
        for step in 0..8 {
            match step {
                1 => snap.clusters[0] = pipe("a", "/a2"),
                2 => snap.health_clusters.push("b".into()),
                3 => snap.clusters.push(pipe("c", "/c")),
                4 => snap.listeners.push(inbound("inbound_ns_a_8080", 8080)),
                5 => snap.listeners[0].netns = "/run/netns/cni-2".into(),
                6 => snap.listeners.push(inbound("inbound_ns_a_9090", 9090)),
                7 => {
                    snap.listeners.remove(0);
                }
                _ => {}
            }
            assert_eq!(r.render(&snap), render(&snap, &opts), "step {step}");
        }
        assert_eq!(r.inbound.len(), 1, "a removed listener leaves the cache");
    }

    fn inbound(name: &str, port: u16) -> ListenerSpec {
        ListenerSpec {
            name: name.to_owned(),
            netns: "/run/netns/cni-1".to_owned(),
            port,
            ipv6: false,
            cluster: format!("app_ns_a_{port}"),
        }
    }

    #[test]
    fn an_inbound_listener_binds_in_the_pods_netns_without_reuse_port_and_proxies_to_its_cluster() {
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        let opts = RenderOptions::default();
        let mut spec = inbound("inbound_ns_a_8080", 8080);
        let l = render_inbound_listener(&spec, &opts).unwrap();
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
        let l = render_inbound_listener(&spec, &opts).unwrap();
        let extra = l.additional_addresses[0].address.clone().and_then(|a| a.address);
        let Some(address::Address::SocketAddress(sa)) = extra else { panic!("no [::] address") };
        assert_eq!((sa.address.as_str(), sa.network_namespace_filepath.as_str()), ("::", "/run/netns/cni-1"));

        spec.netns = "relative/netns".into();
        assert!(matches!(render_inbound_listener(&spec, &opts), Err(RenderError::InvalidPath { .. })));
    }

    #[test]
    fn one_bad_cluster_is_left_out_and_reported_the_rest_render() {
        let long = format!("/{}", "x".repeat(200));
        let snap = Snapshot {
            clusters: vec![pipe("good", "/g"), pipe("bad", &long), pipe("good", "/dup")],
            health_clusters: vec!["good".to_owned()],
            ..Default::default()
        };
        let r = render(&snap, &RenderOptions::default());
        assert_eq!(r.clusters.names(), vec!["good"]);
        let labels: Vec<_> = r.rejected.iter().map(|x| (x.name.as_str(), x.error.label())).collect();
        assert_eq!(labels, vec![("bad", "pipe-path-too-long"), ("good", "duplicate-name")]);
        // The kept duplicate is the first one.
        let c = Cluster::decode(r.clusters.resources[0].resource.value.as_slice()).unwrap();
        let ep = c.load_assignment.unwrap().endpoints[0].lb_endpoints[0].clone();
        let Some(HostIdentifier::Endpoint(e)) = ep.host_identifier else { panic!() };
        assert_eq!(e.address.unwrap().address, Some(address::Address::Pipe(Pipe { path: "/g".to_owned(), mode: 0 })));
    }

    #[test]
    fn the_health_gateway_has_one_filter_per_cluster_then_the_router() {
        let l =
            render_health_listener("/run/h.sock", 0o666, &["b".to_owned(), "a".to_owned(), "a".to_owned()]).unwrap();
        let Some(filter::ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else { panic!() };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let names: Vec<_> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["envoy.filters.http.health_check", "envoy.filters.http.health_check", "envoy.filters.http.router"]
        );
        let Some(http_filter::ConfigType::TypedConfig(first)) = &hcm.http_filters[0].config_type else { panic!() };
        let hc = HealthCheckFilter::decode(first.value.as_slice()).unwrap();
        assert_eq!(hc.pass_through_mode, Some(BoolValue { value: false }));
        assert_eq!(hc.cluster_min_healthy_percentages["a"].value, 100.0);
        assert_eq!(l.address, Some(pipe_address("/run/h.sock", 0o666)), "pipe listener with the configured mode");
        let too_long = format!("/{}", "h".repeat(107));
        assert!(render_health_listener(&too_long, 0o666, &[]).is_err());
    }

    #[test]
    fn no_health_socket_means_no_listener() {
        let opts = RenderOptions { health_socket: None, ..RenderOptions::default() };
        let r = render(&Snapshot::default(), &opts);
        assert!(r.listeners.resources.is_empty());
        assert_eq!(r.get(LISTENER_TYPE_URL).unwrap().type_url, LISTENER_TYPE_URL);
        assert!(r.get("type.googleapis.com/other").is_none());
    }
}
