//! The xDS encoder: the core's model rendered to Envoy protos.
//!
//! Nothing here knows Kubernetes: the core's render turns pods into [`ClusterSpec`]s (the model,
//! [`aether_agent_core::model`], re-exported here), this module turns
//! those into Envoy `Cluster`s (CDS), the inbound `Listener`s and the health gateway (its
//! `Listener` in LDS and its checks in ECDS, rendered by [`super::health_gateway`]), packed into
//! envoy-types' `Any`, each set with a content-hash version.
//!
//! Validation happens *before* rendering ([`ClusterSpec::validate`]): a spec Envoy would refuse
//! (a pipe path over 107 bytes, an empty name, ...) is returned as a [`Rejected`] and left out,
//! so the node's update is never NACKed because of one pod.
//!
//! Determinism: prost encodes `map` fields in `HashMap` iteration order, which differs between
//! two maps with the same content. Every map this module fills holds at most one entry, so the
//! encoding, and therefore the version, depends on the content only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use aether_agent_core::model::{
    ClusterSpec, Endpoint, HealthCheck, ListenerSpec, RenderError, Snapshot, validate_pipe_path,
};
use aether_agent_core::names;
use aether_agent_core::record::PodKey;
pub use aether_agent_core::render::PodRender;
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, CommonLbConfig, DiscoveryType},
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, BindConfig, HealthCheck as PbHealthCheck, Http2ProtocolOptions, Pipe, SocketAddress, TypedExtensionConfig,
    address,
    health_check::{GrpcHealthCheck, HealthChecker, HttpHealthCheck, TcpHealthCheck},
    socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{AdditionalAddress, Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy::ClusterSpecifier};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig},
};
use envoy_types::pb::envoy::r#type::v3::{CodecClientType, Percent};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration as PbDuration, UInt32Value, UInt64Value};
use envoy_types::util::pack_any;
use prost::Name;
use sha2::{Digest, Sha256};

use super::health_gateway::{render_health_checks, render_health_listener};

/// Default cap on concurrent connections per inbound listener (one pod port).
pub const DEFAULT_INBOUND_MAX_CONNECTIONS: u64 = 16_384;

/// Type URL of an Envoy v3 `Cluster` (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of an Envoy v3 `Listener` (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
// The gateway's names (rendered in `health_gateway`), also under this module's paths.
pub use super::health_gateway::{
    DEFAULT_HEALTH_MAX_CONNECTIONS, EXTENSION_CONFIG_TYPE_URL, HEALTH_CHECKS_NAME, HEALTH_LISTENER_NAME, HEALTHZ_PREFIX,
};
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
    /// Envoy's `interval_jitter_percent`: each wait is `interval` plus a random 0 to this
    /// percent of it. Envoy runs every active health check on its main thread, which also applies
    /// xDS updates; clusters created by one CDS response check in lockstep, and without jitter
    /// their checks stay one burst per interval that delays any update arriving during it (at
    /// 10k pods a ~250 ms burst every 2 s: write → ACK p99 ~500 ms). A wide jitter
    /// spreads them over the interval within a few checks. It does not delay a cluster's first
    /// check (`initial_jitter` would, and Envoy holds a changed cluster warming until then).
    pub jitter_percent: u32,
}

impl Default for HealthTiming {
    /// 2 s interval plus up to 50 % jitter (a check every 2–3 s), 1 s timeout, unhealthy after 2
    /// failures, healthy after 1 success.
    fn default() -> Self {
        HealthTiming {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 2,
            healthy_threshold: 1,
            jitter_percent: 50,
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
    /// Cap on concurrent connections to the health gateway (Envoy's `connection_limit` network
    /// filter; see [`DEFAULT_HEALTH_MAX_CONNECTIONS`]).
    pub health_max_connections: u64,
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
    /// with mode `0o666` capped at [`DEFAULT_HEALTH_MAX_CONNECTIONS`], inbound listeners capped at
    /// [`DEFAULT_INBOUND_MAX_CONNECTIONS`] with a 1 h idle timeout.
    fn default() -> Self {
        RenderOptions {
            connect_timeout: Duration::from_secs(1),
            health: HealthTiming::default(),
            health_socket: Some("/run/aether/health.sock".to_owned()),
            health_socket_mode: 0o666,
            health_max_connections: DEFAULT_HEALTH_MAX_CONNECTIONS,
            inbound_max_connections: DEFAULT_INBOUND_MAX_CONNECTIONS,
            inbound_idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// One rendered resource: its name and the packed proto.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedResource {
    /// Resource name (cluster, listener or extension config name).
    pub name: String,
    /// The packed Envoy proto.
    pub resource: Any,
}

/// One served resource: the packed proto, its [`resource_digest`] (computed once, when it is
/// rendered) and its delta-xDS version derived from that digest
/// ([`super::delta::resource_version`]). Two are equal when their digests are.
#[derive(Clone, Debug)]
pub struct Served {
    /// The resource's name and packed proto.
    pub resource: NamedResource,
    /// SHA-256 over its name, type URL and encoded bytes.
    pub digest: [u8; 32],
    /// Its delta-xDS version: hex of the first 16 bytes of `digest`.
    pub version: String,
}

impl PartialEq for Served {
    fn eq(&self, other: &Served) -> bool {
        self.digest == other.digest
    }
}

impl Served {
    /// Digests `resource` once.
    pub fn new(resource: NamedResource) -> Served {
        let digest = resource_digest(&resource);
        Served { version: super::delta::resource_version(&digest), resource, digest }
    }
}

/// Where a resource sits in a [`TypedResources`] set: its name, then its rank among resources of
/// that name (0 unless duplicates were handed over on purpose, [`Resources::from_protos`]).
pub type SetKey = (String, u32);

/// All resources of one type URL, by name, with their content-hash version. The set is a
/// persistent map ([`imbl::OrdMap`]): cloning it shares its structure, and a change of `k`
/// resources costs O(k log n), as does finding what differs between two versions of it
/// ([`imbl::OrdMap::diff`] skips what they share).
#[derive(Clone, Debug, PartialEq)]
pub struct TypedResources {
    /// Type URL of every resource ([`CLUSTER_TYPE_URL`], [`LISTENER_TYPE_URL`] or
    /// [`EXTENSION_CONFIG_TYPE_URL`]).
    pub type_url: String,
    /// Hex SHA-256 (first 16 bytes, 32 hex characters) over the type URL, the number of
    /// resources and the lane-wise wrapping sum of their [`resource_digest`]s (a multiset hash):
    /// same content, same version, whatever the order; kept up to date per added or removed
    /// resource, so no pass over the set is needed when one resource changes.
    pub version: String,
    /// The resources, in name order.
    pub resources: imbl::OrdMap<SetKey, Arc<Served>>,
    /// The running sum of the digests (four 64-bit lanes, wrapping).
    sum: [u64; 4],
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

/// The four 64-bit lanes of a digest.
fn lanes(digest: &[u8; 32]) -> [u64; 4] {
    std::array::from_fn(|i| u64::from_be_bytes(digest[i * 8..i * 8 + 8].try_into().unwrap_or_default()))
}

impl TypedResources {
    /// An empty set of `type_url`, with its version.
    pub fn empty(type_url: impl Into<String>) -> Self {
        let mut set = TypedResources {
            type_url: type_url.into(),
            version: String::new(),
            resources: imbl::OrdMap::new(),
            sum: [0; 4],
        };
        set.seal();
        set
    }

    /// Builds the set from packed resources (any order) and computes the version. Duplicate
    /// names are kept, in the order given (a way to hand Envoy something it NACKs).
    pub fn new(type_url: impl Into<String>, resources: Vec<NamedResource>) -> Self {
        Self::from_served(type_url.into(), resources.into_iter().map(|r| Arc::new(Served::new(r))).collect())
    }

    /// Like [`TypedResources::new`] with each resource already digested.
    fn from_served(type_url: String, served: Vec<Arc<Served>>) -> Self {
        let mut set = TypedResources::empty(type_url);
        let mut ranks: HashMap<String, u32> = HashMap::new();
        for r in served {
            let rank = ranks.entry(r.resource.name.clone()).or_default();
            set.add((r.resource.name.clone(), *rank), r);
            *rank += 1;
        }
        set.seal();
        set
    }

    /// Serves `r` under `key` (replacing what was there). Call [`TypedResources::seal`] after a
    /// batch of changes.
    fn add(&mut self, key: SetKey, r: Arc<Served>) {
        for (lane, add) in self.sum.iter_mut().zip(lanes(&r.digest)) {
            *lane = lane.wrapping_add(add);
        }
        if let Some(old) = self.resources.insert(key, r) {
            self.subtract(&old.digest);
        }
    }

    /// Stops serving `key`; call [`TypedResources::seal`] after a batch of changes.
    fn take(&mut self, key: &SetKey) {
        if let Some(old) = self.resources.remove(key) {
            self.subtract(&old.digest);
        }
    }

    fn subtract(&mut self, digest: &[u8; 32]) {
        for (lane, sub) in self.sum.iter_mut().zip(lanes(digest)) {
            *lane = lane.wrapping_sub(sub);
        }
    }

    /// Recomputes `version` from the count and the running sum: O(1).
    fn seal(&mut self) {
        let mut h = Sha256::new();
        h.update((self.type_url.len() as u64).to_be_bytes());
        h.update(self.type_url.as_bytes());
        h.update((self.resources.len() as u64).to_be_bytes());
        for lane in self.sum {
            h.update(lane.to_be_bytes());
        }
        self.version = super::delta::resource_version(&h.finalize().into());
    }

    /// The served resource named `name` (the first of that name).
    pub fn get(&self, name: &str) -> Option<&Served> {
        self.resources.get(&(name.to_owned(), 0)).map(Arc::as_ref)
    }

    /// The resources in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Served> {
        self.resources.values().map(Arc::as_ref)
    }

    /// Number of resources.
    pub fn len(&self) -> usize {
        self.resources.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    /// Names of the resources, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.resources.keys().map(|(name, _)| name.as_str()).collect()
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

/// The rendered snapshot the ADS server serves: CDS, LDS and ECDS sets plus what was left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    /// `Cluster`s ([`CLUSTER_TYPE_URL`]).
    pub clusters: TypedResources,
    /// `Listener`s ([`LISTENER_TYPE_URL`]): the health gateway, if configured, and the inbound
    /// listeners.
    pub listeners: TypedResources,
    /// `TypedExtensionConfig`s ([`EXTENSION_CONFIG_TYPE_URL`], ECDS): the health gateway's checks
    /// ([`HEALTH_CHECKS_NAME`]) when the gateway listener is served, else none.
    pub extension_configs: TypedResources,
    /// Specs that failed validation and are not in `clusters`/`listeners`.
    pub rejected: Vec<Rejected>,
}

impl Default for Resources {
    /// No clusters, no listeners, no extension configs.
    fn default() -> Self {
        Resources::from_protos(Vec::new(), Vec::new())
    }
}

impl Resources {
    /// Packs already-built protos without any validation (tests, or a caller with its own
    /// rendering), with no extension configs. Duplicate names are kept.
    pub fn from_protos(clusters: Vec<Cluster>, listeners: Vec<Listener>) -> Self {
        let clusters =
            clusters.into_iter().map(|c| NamedResource { name: c.name.clone(), resource: pack_any(c) }).collect();
        let listeners =
            listeners.into_iter().map(|l| NamedResource { name: l.name.clone(), resource: pack_any(l) }).collect();
        Resources {
            clusters: TypedResources::new(Cluster::type_url(), clusters),
            listeners: TypedResources::new(Listener::type_url(), listeners),
            extension_configs: TypedResources::new(EXTENSION_CONFIG_TYPE_URL, Vec::new()),
            rejected: Vec::new(),
        }
    }

    /// The same resources with `configs` as the ECDS set (packed without validation, like
    /// [`Resources::from_protos`]).
    pub fn with_extension_configs(mut self, configs: Vec<TypedExtensionConfig>) -> Self {
        let configs =
            configs.into_iter().map(|c| NamedResource { name: c.name.clone(), resource: pack_any(c) }).collect();
        self.extension_configs = TypedResources::new(EXTENSION_CONFIG_TYPE_URL, configs);
        self
    }

    /// The set for `type_url`, if we serve that type (CDS, LDS and ECDS).
    pub fn get(&self, type_url: &str) -> Option<&TypedResources> {
        self.sets().into_iter().find(|set| set.type_url == type_url)
    }

    /// The served type URLs, in push order: clusters before the listeners and extension configs
    /// that name them.
    pub fn type_urls(&self) -> [&str; 3] {
        self.sets().map(|set| set.type_url.as_str())
    }

    /// True when every version equals `other`'s (nothing to push).
    pub fn same_versions(&self, other: &Resources) -> bool {
        self.sets().into_iter().zip(other.sets()).all(|(a, b)| a.type_url == b.type_url && a.version == b.version)
    }

    fn sets(&self) -> [&TypedResources; 3] {
        [&self.clusters, &self.listeners, &self.extension_configs]
    }
}

fn pb_duration(d: Duration) -> PbDuration {
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

/// Renders one inbound listener: `0.0.0.0:<port>` (plus `[::]:<port>`, IPv6 only, when the spec
/// says so) with `network_namespace_filepath` = the pod's netns, `enable_reuse_port: false` (an
/// app that holds the port with `SO_REUSEPORT` must make the bind fail, not share its
/// connections), and one filter chain: `envoy.filters.network.connection_limit` (the cap of
/// `opts`), then `envoy.filters.network.tcp_proxy` to the spec's cluster with the idle timeout of
/// `opts`. The stat prefix of the listener and its filters is the listener's stat name
/// ([`names::stat_name`]: dots written `~`), so a dotted pod name keeps Envoy's metric names.
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

/// Renders the node's resources, encoding only what changed. Two ways to drive it (one per
/// renderer):
/// - [`Renderer::render`] of a whole [`Snapshot`]: re-encodes only the clusters and listeners
///   whose spec changed since the last call (a cache by name), but passes over the whole snapshot;
/// - [`Renderer::update_pods`] with the pods that changed ([`PodRender`]s, what the agent's driver
///   publishes): only their clusters and listeners are compared, encoded and digested, the served
///   sets are persistent maps updated in place, and the versions are kept by a running sum, so a
///   change costs O(changed · log n) whatever the node's size.
///
/// The health gateway's listener depends on the options only (rendered once); its checks (ECDS)
/// are re-rendered only when the set of health cluster names changes.
#[derive(Debug)]
pub struct Renderer {
    opts: RenderOptions,
    cache: HashMap<String, Cached>,
    /// Rendered inbound listeners by name, with the spec each came from.
    inbound: HashMap<String, (ListenerSpec, Arc<Served>)>,
    /// The gateway listener (`None`: no `health_socket`), or why it could not be rendered.
    gateway: Result<Option<Arc<Served>>, RenderError>,
    /// The gateway's checks for the last `health_clusters` list (shared: it lists every name).
    checks: Option<(Vec<String>, Arc<Served>)>,
    /// The per-pod state of [`Renderer::update_pods`].
    pods: PodSets,
    /// Clusters and listeners encoded so far (both ways of driving): what a test counts to see
    /// that a change encodes only its own resources.
    encoded: u64,
}

/// What [`Renderer::update_pods`] keeps: each pod's render, who claims each name (the smallest
/// pod key wins a name two pods render, like the first in [`Snapshot`] order), the specs served
/// under each name, the health cluster names with their number of pods, each pod's rejected
/// specs, and the served [`Resources`].
#[derive(Debug, Default)]
struct PodSets {
    pods: HashMap<PodKey, Arc<PodRender>>,
    cluster_owners: HashMap<String, Owners>,
    listener_owners: HashMap<String, Owners>,
    /// The spec served under each cluster name, as the pod render it is in and its place there
    /// (the spec is not copied).
    served_clusters: HashMap<String, SpecAt>,
    served_listeners: HashMap<String, ListenerSpec>,
    health: BTreeMap<String, usize>,
    rejected: BTreeMap<PodKey, (Vec<Rejected>, Vec<Rejected>)>,
    current: Option<Resources>,
}

/// A spec inside a pod's render: the render (shared) and the spec's index in its `clusters`.
type SpecAt = (Arc<PodRender>, usize);

/// The cluster spec `at` points to.
fn cluster_at((pod, i): &SpecAt) -> &ClusterSpec {
    &pod.clusters[*i]
}

/// The pods that render one name, sorted by key: the first wins. Nearly always one pod, so a
/// sorted `Vec` (one small allocation) rather than a tree.
type Owners = Vec<PodKey>;

/// Adds `key` to the claimants of `name` (kept sorted, no duplicates).
fn claim(owners: &mut HashMap<String, Owners>, name: &str, key: &PodKey) {
    let set = match owners.get_mut(name) {
        Some(set) => set,
        None => owners.entry(name.to_owned()).or_insert_with(|| Vec::with_capacity(1)),
    };
    if let Err(at) = set.binary_search(key) {
        set.insert(at, key.clone());
    }
}

/// `msg` packed as an `Any` of `type_url` (the constant, not the formatted `Name::type_url`).
fn any(type_url: &str, msg: &impl prost::Message) -> Any {
    Any { type_url: type_url.to_owned(), value: msg.encode_to_vec() }
}

/// Sorts `v` and drops repeats.
fn sorted_unique<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The names touched by a batch, once each, with whether any changed pod released the name.
fn touched(mut names: Vec<(String, bool)>) -> Vec<(String, bool)> {
    names.sort_unstable();
    // `dedup_by` hands (later, kept): fold the later's flag into the kept one.
    names.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 |= later.1;
        }
        same
    });
    names
}

/// [`touched`] for cluster names given as their place in a pod's render (no name copied): each
/// name once, with whether any changed pod released it, in name order.
fn touched_clusters(mut names: Vec<(SpecAt, bool)>) -> Vec<(SpecAt, bool)> {
    fn name(e: &(SpecAt, bool)) -> &str {
        &cluster_at(&e.0).name
    }
    names.sort_unstable_by(|a, b| name(a).cmp(name(b)).then(a.1.cmp(&b.1)));
    names.dedup_by(|later, kept| {
        let same = name(later) == name(kept);
        if same {
            kept.1 |= later.1;
        }
        same
    });
    names
}

/// One rendered cluster: the spec it came from and the served resource.
#[derive(Debug)]
struct Cached {
    spec: ClusterSpec,
    served: Arc<Served>,
}

fn packed(name: &str, resource: Any) -> Served {
    Served::new(NamedResource { name: name.to_owned(), resource })
}

impl Renderer {
    /// A renderer with these node-wide options and an empty cache.
    pub fn new(opts: RenderOptions) -> Self {
        let gateway = render_health_listener(&opts)
            .map(|listener| listener.map(|l| Arc::new(packed(&l.name.clone(), pack_any(l)))));
        Renderer {
            opts,
            cache: HashMap::new(),
            inbound: HashMap::new(),
            gateway,
            checks: None,
            pods: PodSets::default(),
            encoded: 0,
        }
    }

    /// The options this renderer uses.
    pub fn options(&self) -> &RenderOptions {
        &self.opts
    }

    /// How many clusters and inbound listeners this renderer has encoded since it was made.
    pub fn encoded(&self) -> u64 {
        self.encoded
    }

    /// The gateway's checks of `names` (sorted or not: the encoding is by name), from the cache
    /// when the list is the one rendered last.
    fn checks_of(&mut self, names: Vec<String>) -> Arc<Served> {
        match &self.checks {
            Some((last, served)) if *last == names => served.clone(),
            _ => {
                let config = render_health_checks(&names);
                let served = Arc::new(packed(&config.name.clone(), pack_any(config)));
                self.checks = Some((names, served.clone()));
                served
            }
        }
    }

    /// Renders `snapshot`: every valid cluster (first of each name wins), the inbound listeners,
    /// the health gateway if `health_socket` is set (its listener, and its checks of
    /// `snapshot.health_clusters` as the ECDS set), and the list of what was left out. Never fails
    /// as a whole.
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
                        self.encoded += 1;
                        let served = Arc::new(packed(&spec.name, any(CLUSTER_TYPE_URL, &cluster)));
                        Cached { spec: spec.clone(), served }
                    }
                    Err(error) => {
                        rejected.push(Rejected { name: spec.name.clone(), error });
                        continue;
                    }
                },
            };
            clusters.push(cached.served.clone());
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
            let served = match self.inbound.remove(&spec.name) {
                Some((old, d)) if old == *spec => d,
                _ => match render_inbound_listener(spec, &self.opts) {
                    Ok(l) => {
                        self.encoded += 1;
                        Arc::new(packed(&spec.name, any(LISTENER_TYPE_URL, &l)))
                    }
                    Err(error) => {
                        rejected.push(Rejected { name: spec.name.clone(), error });
                        continue;
                    }
                },
            };
            listeners.push(served.clone());
            inbound.insert(spec.name.clone(), (spec.clone(), served));
        }
        self.inbound = inbound;
        let mut extension_configs = Vec::with_capacity(1);
        match self.gateway.clone() {
            Ok(Some(listener)) => {
                listeners.push(listener);
                extension_configs.push(self.checks_of(snapshot.health_clusters.clone()));
            }
            Ok(None) => {}
            Err(error) => rejected.push(Rejected { name: HEALTH_LISTENER_NAME.to_owned(), error }),
        }
        Resources {
            clusters: TypedResources::from_served(CLUSTER_TYPE_URL.to_owned(), clusters),
            listeners: TypedResources::from_served(LISTENER_TYPE_URL.to_owned(), listeners),
            extension_configs: TypedResources::from_served(EXTENSION_CONFIG_TYPE_URL.to_owned(), extension_configs),
            rejected,
        }
    }

    /// Applies the pods that changed since the last call (`None`: the pod is gone; a pod not
    /// listed keeps what it had) and returns the served resources: equal to what
    /// [`Renderer::render`] makes of the [`Snapshot`] of all the pods given so far, in pod key
    /// order (`aether_agent_core::render::render`). Only the named pods' clusters and listeners
    /// are compared, and only those whose spec changed are encoded; the sets are updated in
    /// place (persistent maps, running versions). The gateway's checks are re-rendered when a
    /// health cluster name appears or goes (they list every name: O(pods), on pod arrivals and
    /// departures only).
    pub fn update_pods(&mut self, changes: impl IntoIterator<Item = (PodKey, Option<Arc<PodRender>>)>) -> Resources {
        let mut current = match self.pods.current.take() {
            Some(c) => c,
            None => self.initial(),
        };
        let changes = changes.into_iter();
        let hint = changes.size_hint().0;
        // A boot or relist hands over every pod at once: grow the maps once, not by doubling.
        self.pods.pods.reserve(hint);
        self.pods.cluster_owners.reserve(2 * hint);
        self.pods.served_clusters.reserve(2 * hint);
        // Names and pods touched (sorted and deduplicated below: cheaper than a tree per insert).
        // Each name with whether a changed pod released it (its other claimants must be re-decided).
        let mut clusters: Vec<(SpecAt, bool)> = Vec::with_capacity(2 * hint);
        let mut listeners: Vec<(String, bool)> = Vec::new();
        let mut rejections: Vec<PodKey> = Vec::with_capacity(hint);
        // Health cluster names touched, and whether each was listed before.
        let mut health: HashMap<String, bool> = HashMap::with_capacity(hint);
        for (key, new) in changes {
            let old = match &new {
                Some(n) => self.pods.pods.insert(key.clone(), n.clone()),
                None => self.pods.pods.remove(&key),
            };
            if old.as_deref() == new.as_deref() {
                continue;
            }
            let sets = &mut self.pods;
            for (pod, released) in old.iter().map(|o| (o, true)).chain(new.iter().map(|n| (n, false))) {
                for (i, c) in pod.clusters.iter().enumerate() {
                    if released {
                        release(&mut sets.cluster_owners, &c.name, &key);
                    } else {
                        claim(&mut sets.cluster_owners, &c.name, &key);
                    }
                    clusters.push(((pod.clone(), i), released));
                }
            }
            for l in old.iter().flat_map(|o| &o.listeners) {
                release(&mut sets.listener_owners, &l.name, &key);
                listeners.push((l.name.clone(), true));
            }
            for l in new.iter().flat_map(|n| &n.listeners) {
                claim(&mut sets.listener_owners, &l.name, &key);
                listeners.push((l.name.clone(), false));
            }
            for name in old.iter().chain(&new).map(|p| &p.health_cluster) {
                health.entry(name.clone()).or_insert_with(|| sets.health.contains_key(name));
            }
            if let Some(o) = &old {
                let n = sets.health.entry(o.health_cluster.clone()).or_default();
                *n -= 1;
                if *n == 0 {
                    sets.health.remove(&o.health_cluster);
                }
            }
            if let Some(n) = &new {
                *sets.health.entry(n.health_cluster.clone()).or_default() += 1;
            }
            rejections.push(key);
        }
        for (at, released) in touched_clusters(clusters) {
            let name = cluster_at(&at).name.as_str();
            // Other pods claiming a name a changed pod released or shares: their duplicate
            // verdicts may move (a sole claimant that did not release it is a changed pod).
            match self.pods.cluster_owners.get(name) {
                Some(owners) if released || owners.len() > 1 => rejections.extend(owners.iter().cloned()),
                _ => {}
            }
            self.refresh_cluster(&mut current.clusters, name);
        }
        for (name, released) in touched(listeners) {
            match self.pods.listener_owners.get(&name) {
                Some(owners) if released || owners.len() > 1 => rejections.extend(owners.iter().cloned()),
                _ => {}
            }
            self.refresh_listener(&mut current.listeners, &name);
        }
        for key in sorted_unique(rejections) {
            self.reject(key);
        }
        let health_moved = health.iter().any(|(name, was)| self.pods.health.contains_key(name) != *was);
        if health_moved && let Ok(Some(_)) = &self.gateway {
            let checks = self.checks_of(self.pods.health.keys().cloned().collect());
            current.extension_configs.add((checks.resource.name.clone(), 0), checks);
        }
        current.clusters.seal();
        current.listeners.seal();
        current.extension_configs.seal();
        current.rejected = self.rejected();
        self.pods.current = Some(current.clone());
        current
    }

    /// The resources of a node with no pod: the gateway's listener and empty checks.
    fn initial(&mut self) -> Resources {
        let mut r = Resources::default();
        if let Ok(Some(listener)) = self.gateway.clone() {
            r.listeners.add((listener.resource.name.clone(), 0), listener);
            let checks = self.checks_of(Vec::new());
            r.extension_configs.add((checks.resource.name.clone(), 0), checks);
        }
        r.listeners.seal();
        r.extension_configs.seal();
        r
    }

    /// Serves under cluster `name` the spec of the pod that wins it, encoding it only when it
    /// differs from the one served; removes the name when no pod renders a valid spec for it.
    fn refresh_cluster(&mut self, set: &mut TypedResources, name: &str) {
        let winner = self.pods.cluster_owners.get(name).and_then(|o| o.first());
        let at: Option<SpecAt> = winner
            .and_then(|k| self.pods.pods.get(k))
            .and_then(|p| Some((p.clone(), p.clusters.iter().position(|c| c.name == name)?)));
        if let Some(at) = &at
            && let Some(served) = self.pods.served_clusters.get_mut(name)
            && cluster_at(served) == cluster_at(at)
        {
            // The same spec: point at the winner's current render, so an old one is not kept.
            *served = at.clone();
            return;
        }
        match at.map(|at| {
            let cluster = render_cluster(cluster_at(&at), &self.opts);
            (at, cluster)
        }) {
            Some((at, Ok(cluster))) => {
                self.encoded += 1;
                set.add((name.to_owned(), 0), Arc::new(packed(name, any(CLUSTER_TYPE_URL, &cluster))));
                self.pods.served_clusters.insert(name.to_owned(), at);
            }
            Some((_, Err(_))) | None => {
                if self.pods.served_clusters.remove(name).is_some() {
                    set.take(&(name.to_owned(), 0));
                }
            }
        }
    }

    /// [`Renderer::refresh_cluster`] for inbound listener `name` (never the gateway's name).
    fn refresh_listener(&mut self, set: &mut TypedResources, name: &str) {
        let winner =
            self.pods.listener_owners.get(name).and_then(|o| o.first()).filter(|_| name != HEALTH_LISTENER_NAME);
        let spec = winner.and_then(|k| self.pods.pods.get(k)).and_then(|p| p.listeners.iter().find(|l| l.name == name));
        if spec.is_some() && self.pods.served_listeners.get(name) == spec {
            return;
        }
        match spec.map(|s| (s, render_inbound_listener(s, &self.opts))) {
            Some((spec, Ok(listener))) => {
                self.encoded += 1;
                set.add((name.to_owned(), 0), Arc::new(packed(name, any(LISTENER_TYPE_URL, &listener))));
                self.pods.served_listeners.insert(name.to_owned(), spec.clone());
            }
            Some((_, Err(_))) | None => {
                if self.pods.served_listeners.remove(name).is_some() {
                    set.take(&(name.to_owned(), 0));
                }
            }
        }
    }

    /// Decides again what of pod `key`'s specs is left out, as [`Renderer::render`] would: a
    /// name another pod (a smaller key) also renders, or a spec Envoy would refuse.
    fn reject(&mut self, key: PodKey) {
        let Some(pod) = self.pods.pods.get(&key) else {
            self.pods.rejected.remove(&key);
            return;
        };
        let wins =
            |owners: &HashMap<String, Owners>, name: &str| owners.get(name).and_then(|o| o.first()) == Some(&key);
        let duplicate = |name: &str| Rejected {
            name: name.to_owned(),
            error: RenderError::DuplicateName { name: name.to_owned() },
        };
        // A pod renders a handful of specs: a scan of the earlier ones finds a repeated name.
        let clusters: Vec<Rejected> = pod
            .clusters
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                if pod.clusters[..i].iter().any(|e| e.name == c.name) || !wins(&self.pods.cluster_owners, &c.name) {
                    return Some(duplicate(&c.name));
                }
                c.validate().err().map(|error| Rejected { name: c.name.clone(), error })
            })
            .collect();
        let listeners: Vec<Rejected> = pod
            .listeners
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                if l.name == HEALTH_LISTENER_NAME
                    || pod.listeners[..i].iter().any(|e| e.name == l.name)
                    || !wins(&self.pods.listener_owners, &l.name)
                {
                    return Some(duplicate(&l.name));
                }
                l.validate().err().map(|error| Rejected { name: l.name.clone(), error })
            })
            .collect();
        if clusters.is_empty() && listeners.is_empty() {
            self.pods.rejected.remove(&key);
        } else {
            self.pods.rejected.insert(key, (clusters, listeners));
        }
    }

    /// Everything left out, in [`Renderer::render`]'s order: clusters, listeners, the gateway.
    fn rejected(&self) -> Vec<Rejected> {
        let by_pod = self.pods.rejected.values();
        let mut out: Vec<Rejected> = by_pod.clone().flat_map(|(c, _)| c.iter().cloned()).collect();
        out.extend(by_pod.flat_map(|(_, l)| l.iter().cloned()));
        if let Err(error) = &self.gateway {
            out.push(Rejected { name: HEALTH_LISTENER_NAME.to_owned(), error: error.clone() });
        }
        out
    }
}

/// Removes `key` from the claimants of `name`, dropping the entry when it empties.
fn release(owners: &mut HashMap<String, Owners>, name: &str, key: &PodKey) {
    if let Some(set) = owners.get_mut(name) {
        if let Ok(at) = set.binary_search(key) {
            set.remove(at);
        }
        if set.is_empty() {
            owners.remove(name);
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
        assert_eq!(hc.interval_jitter_percent, 50);
        assert_eq!(hc.initial_jitter, None, "a first check delayed by jitter holds a changed cluster warming");
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
        assert_eq!(one.extension_configs.version, three.extension_configs.version);
        assert_eq!(one.clusters.names(), vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn a_health_cluster_added_or_removed_changes_the_gateways_checks_never_its_listener() {
        let opts = RenderOptions::default();
        let mut snap = Snapshot { health_clusters: vec!["health_ns_a".to_owned()], ..Default::default() };
        let one = render(&snap, &opts);
        assert_eq!(one.listeners.names(), [HEALTH_LISTENER_NAME]);
        assert_eq!(one.extension_configs.names(), [HEALTH_CHECKS_NAME]);
        assert_eq!(one.extension_configs.type_url, EXTENSION_CONFIG_TYPE_URL);
        assert_eq!(one.extension_configs.iter().next().unwrap().resource.resource.type_url, EXTENSION_CONFIG_TYPE_URL);
        for change in 0..2 {
            if change == 0 {
                snap.health_clusters.push("health_ns_b".to_owned());
            } else {
                snap.health_clusters.clear();
            }
            let next = render(&snap, &opts);
            assert_eq!(next.listeners, one.listeners, "the listener is the same resource, same version");
            assert_ne!(next.extension_configs.version, one.extension_configs.version);
            assert!(!next.same_versions(&one));
        }
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

    /// Pod `ns/p<i>` (uid `u<i>`, or `dup` for a second pod of the same name) rendered as
    /// `aether_agent_core::render` would: its app cluster on `path`, its health cluster, and an
    /// inbound listener when `listener`.
    fn pod(i: usize, uid: &str, path: &str, listener: bool) -> (PodKey, Option<Arc<PodRender>>) {
        let key = PodKey { namespace: "ns".into(), name: format!("p{i}").into(), uid: format!("{uid}{i}").into() };
        let app = format!("app_ns_p{i}_8080");
        let render = PodRender {
            clusters: vec![pipe(&app, path), pipe(&format!("health_ns_p{i}"), path)],
            listeners: if listener { vec![inbound(&format!("inbound_ns_p{i}_8080"), 8080)] } else { vec![] },
            health_cluster: format!("health_ns_p{i}"),
            effective: aether_agent_core::render::Effective::Pipe(path.to_owned()),
        };
        (key, Some(Arc::new(render)))
    }

    /// The whole [`Snapshot`] of `pods`, in key order (what the core's `render` lists).
    fn whole(pods: &BTreeMap<PodKey, Arc<PodRender>>) -> Snapshot {
        let mut s = Snapshot::default();
        for p in pods.values() {
            s.clusters.extend(p.clusters.iter().cloned());
            s.listeners.extend(p.listeners.iter().cloned());
            s.health_clusters.push(p.health_cluster.clone());
        }
        s
    }

    #[test]
    fn per_pod_updates_serve_exactly_what_a_whole_render_serves() {
        let opts = RenderOptions::default();
        let mut r = Renderer::new(opts.clone());
        let mut all: BTreeMap<PodKey, Arc<PodRender>> = BTreeMap::new();
        let long = format!("/{}", "x".repeat(200));
        let steps: Vec<Vec<(PodKey, Option<Arc<PodRender>>)>> = vec![
            vec![],
            (0..6).map(|i| pod(i, "u", &format!("/s{i}"), i % 2 == 0)).collect(),
            vec![pod(2, "u", "/s2-moved", true)],
            vec![pod(3, "u", &long, false)],
            // A second pod of the same name: its names are duplicates until the first goes.
            vec![pod(1, "v", "/other", true)],
            vec![(pod(1, "u", "", false).0, None)],
            vec![(pod(4, "u", "", false).0, None), pod(7, "u", "/s7", true), pod(3, "u", "/s3", false)],
            vec![pod(0, "u", "/s0", true)],
        ];
        for (n, step) in steps.into_iter().enumerate() {
            for (k, v) in &step {
                match v {
                    Some(v) => all.insert(k.clone(), v.clone()),
                    None => all.remove(k),
                };
            }
            assert_eq!(r.update_pods(step), render(&whole(&all), &opts), "step {n}");
        }
    }

    #[test]
    fn a_pod_change_encodes_only_its_own_resources_and_shares_the_rest() {
        let mut r = Renderer::new(RenderOptions::default());
        let first = r.update_pods((0..1000).map(|i| pod(i, "u", &format!("/s{i}"), true)));
        assert_eq!((r.encoded(), first.clusters.len(), first.listeners.len()), (3000, 2000, 1001));
        let next = r.update_pods([pod(500, "u", "/moved", true)]);
        assert_eq!(r.encoded(), 3002, "its 2 clusters, nothing else (its listener's spec is the same)");
        assert_ne!(next.clusters.version, first.clusters.version);
        assert_eq!(next.listeners, first.listeners);
        let checks = |r: &Resources| r.extension_configs.resources.values().next().cloned().unwrap();
        assert!(Arc::ptr_eq(&checks(&first), &checks(&next)), "no health name came or went: checks not re-rendered");
        let key = |n: &str| (n.to_owned(), 0);
        let same =
            |a: &TypedResources, b: &TypedResources, n: &str| Arc::ptr_eq(&a.resources[&key(n)], &b.resources[&key(n)]);
        assert!(
            same(&first.clusters, &next.clusters, "app_ns_p499_8080"),
            "an untouched cluster is shared, not copied"
        );
        assert!(!same(&first.clusters, &next.clusters, "app_ns_p500_8080"));
        assert_eq!(first.clusters.resources.diff(&next.clusters.resources).count(), 2);
        let again = r.update_pods([pod(500, "u", "/moved", true)]);
        assert_eq!((r.encoded(), &again.clusters.version), (3002, &next.clusters.version), "an equal pod: nothing");
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
        let c = Cluster::decode(r.clusters.get("good").unwrap().resource.resource.value.as_slice()).unwrap();
        let ep = c.load_assignment.unwrap().endpoints[0].lb_endpoints[0].clone();
        let Some(HostIdentifier::Endpoint(e)) = ep.host_identifier else { panic!() };
        assert_eq!(e.address.unwrap().address, Some(address::Address::Pipe(Pipe { path: "/g".to_owned(), mode: 0 })));
    }

    #[test]
    fn an_unusable_health_socket_is_reported_and_serves_neither_gateway_resource() {
        let opts = RenderOptions { health_socket: Some(format!("/{}", "h".repeat(107))), ..RenderOptions::default() };
        let snap = Snapshot { health_clusters: vec!["health_ns_a".to_owned()], ..Default::default() };
        let r = render(&snap, &opts);
        assert!(r.listeners.resources.is_empty() && r.extension_configs.resources.is_empty());
        let labels: Vec<_> = r.rejected.iter().map(|x| (x.name.as_str(), x.error.label())).collect();
        assert_eq!(labels, vec![(HEALTH_LISTENER_NAME, "pipe-path-too-long")]);
    }

    #[test]
    fn no_health_socket_means_no_listener_and_no_checks() {
        let opts = RenderOptions { health_socket: None, ..RenderOptions::default() };
        let snap = Snapshot { health_clusters: vec!["health_ns_a".to_owned()], ..Default::default() };
        let r = render(&snap, &opts);
        assert!(r.listeners.resources.is_empty());
        assert!(r.extension_configs.resources.is_empty());
        assert_eq!(r.get(LISTENER_TYPE_URL).unwrap().type_url, LISTENER_TYPE_URL);
        assert_eq!(r.get(EXTENSION_CONFIG_TYPE_URL).unwrap().type_url, EXTENSION_CONFIG_TYPE_URL);
        assert!(r.get("type.googleapis.com/other").is_none());
        assert_eq!(r.type_urls(), [CLUSTER_TYPE_URL, LISTENER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL]);
    }
}
