//! What the fold needs to know about a pod and an EndpointPolicy, extracted once from the API
//! objects by pure functions ([`PodRecord::from_pod`], [`PolicyRecord::from_policy`]).
//!
//! Records hold only the fields that decide a delivery or name an Envoy resource, so an update
//! that touches nothing else (a status condition, a label the mesh ignores) yields an equal
//! record and the index re-renders nothing. Both are serde-serializable: the agent persists them
//! in `--state-dir` to serve the same clusters with the API server down (docs/contracts.md, "The
//! state dir").
//!
//! Pod annotations follow docs/contracts.md, "Managed pods and their annotations". A bad
//! `endpoint.aether.io/*` annotation never drops the pod: that annotation falls back to its default
//! and the record carries an [`AnnotationDefect`], which makes the fold deliver the pod over TCP
//! (see [`crate::TcpReason::InvalidEndpointAnnotation`]).
//!
//! Every per-pod input has a size cap (one pod declaring 10,000 ports once took the node's Envoy
//! from 70 to 566 MiB): `endpoint.aether.io/ports` at most [`MAX_PORTS_ANNOTATION_BYTES`]
//! bytes (checked before it is split) and [`MAX_PORTS`] entries, else the record carries
//! [`TooManyPorts`] and the pod is served no clusters at all
//! ([`crate::TcpReason::TooManyPorts`]); `endpoint.aether.io/health-path` at most
//! [`MAX_HEALTH_PATH_BYTES`] bytes, else it is a defect like any unusable value. Names are
//! bounded by the Kubernetes name rules, and the socket value by the fold's byte budget.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use aether_crds::EndpointPolicy;
use aether_crds::pod::{
    DEFAULT_PORT, GRPC_HEALTH_SERVICE_ANNOTATION, HEALTH_PATH_ANNOTATION, INBOUND_PROXY_ANNOTATION, MANAGED_LABEL,
    MANAGED_VALUE, MIRROR_ANNOTATION, PORT_ANNOTATION, PORTS_ANNOTATION, PROTOCOL_ANNOTATION, UDS_SOCKET_ANNOTATION,
};
use aether_crds::tiebreak::ServiceKey;
use aether_crds::udspath::is_dns1123_label;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::settings::Settings;

/// The ServiceAccount a pod runs as when `spec.serviceAccountName` is unset or empty (the API
/// server's ServiceAccount admission plugin defaults it to this name).
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The health-check path used when `endpoint.aether.io/health-path` is absent, empty or invalid.
pub const DEFAULT_HEALTH_PATH: &str = "/";

/// Longest DNS-1123 subdomain (pod names), in bytes (Kubernetes API conventions).
const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Most ports one pod may declare in `endpoint.aether.io/ports`. Each declared port costs the
/// node's Envoy one `app_` cluster (and, over the socket, one inbound listener), so the list is
/// capped: a pod over it is served no clusters at all ([`TooManyPorts`]; docs/workload-requirements.md
/// says why not its first 64). Real multi-port workloads declare a handful (HTTP, gRPC, metrics,
/// admin: Consul and istiod about 6-8, Cassandra 5) and an EndpointSlice carries at most 100 ports
/// (discovery.k8s.io/v1), so 64 leaves room for every real workload while bounding one pod at
/// 65 clusters.
pub const MAX_PORTS: usize = 64;

/// Longest `endpoint.aether.io/ports` value read, in bytes; a longer one is refused as
/// [`TooManyPorts`] before it is split into entries (the API server allows 256 KiB of
/// annotations). [`MAX_PORTS`] entries of the longest form `65535=http1` joined by `", "` take
/// 64 × 11 + 63 × 2 = 830 bytes, so 1024 leaves room for extra spaces.
pub const MAX_PORTS_ANNOTATION_BYTES: usize = 1024;

/// Longest `endpoint.aether.io/health-path` used, in bytes; a longer one is a defect (the pod
/// runs on the defaults over TCP). Envoy copies the path into every health-check request and the
/// cluster's config, so one pod must not hand it an annotation-sized string.
pub const MAX_HEALTH_PATH_BYTES: usize = 1024;

/// Longest `endpoint.aether.io/grpc-health-service` used, in bytes; a longer one is a defect.
/// Envoy copies it into every health-check request; real service names (`package.Service`) are
/// a few dozen bytes.
pub const MAX_GRPC_SERVICE_BYTES: usize = 256;

/// The most bytes of an `endpoint.aether.io/uds-socket` value a record keeps: one more than the
/// longest value any socket limit admits ([`aether_crds::udspath::FILESYSTEM_VALUE_MAX`], 319),
/// so a longer value stays invalid (and is reported as too long) while the record stays small
/// whatever the pod declares (the API server allows 256 KiB of annotations).
pub const MAX_SOCKET_VALUE_BYTES: usize = aether_crds::udspath::FILESYSTEM_VALUE_MAX + 1;

/// `value` cut to at most [`MAX_SOCKET_VALUE_BYTES`] bytes, at a character boundary.
fn capped_socket_value(value: &str) -> String {
    let mut end = value.len().min(MAX_SOCKET_VALUE_BYTES);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_owned()
}

/// Why an API object cannot become a record. Only objects the API server would never serve hit
/// this (a watch event always carries name, namespace and UID); the driver logs and skips them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A required metadata field is absent or empty.
    #[error("{kind} has no {field}")]
    Missing {
        /// `Pod` or `EndpointPolicy`.
        kind: &'static str,
        /// The wire path of the missing field, e.g. `metadata.uid`.
        field: &'static str,
    },
    /// A name breaks the Kubernetes name rule it must follow. The Envoy names of
    /// [`crate::names`] rely on these rules (no `_` in either part), so a record never holds
    /// such a name.
    #[error("{kind} {field} {value:?} is not a {rule}")]
    InvalidName {
        /// `Pod` or `EndpointPolicy`.
        kind: &'static str,
        /// The wire path of the field, e.g. `metadata.namespace`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The rule, e.g. `DNS-1123 label`.
        rule: &'static str,
    },
}

impl RecordError {
    /// A short, stable name of the error, for metric labels.
    pub fn label(&self) -> &'static str {
        match self {
            RecordError::Missing { .. } => "missing-field",
            RecordError::InvalidName { .. } => "invalid-name",
        }
    }
}

/// The identity of one pod in the [`crate::index::DeliveryMap`]: namespace, name and API UID.
///
/// Ordered by namespace, then name, then UID, so the map iterates in a stable, readable order.
/// The UID is part of the key so that a pod deleted and re-created under the same name is never
/// mistaken for its predecessor (its kubelet directory differs).
///
/// The parts are shared strings (`Arc<str>`): the agent keeps a pod's key in several maps (the
/// delivery map, the driver's renderings, the encoder's claims), and a clone copies three
/// pointers instead of three strings. Comparison, hashing and order are those of the strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    /// `metadata.namespace`.
    pub namespace: Arc<str>,
    /// `metadata.name`.
    pub name: Arc<str>,
    /// `metadata.uid`.
    pub uid: Arc<str>,
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// The application protocol of one declared port (`endpoint.aether.io/ports`, `=h2` or `=grpc`
/// suffix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppProtocol {
    /// HTTP/1.1 (the default for a port without a suffix).
    Http1,
    /// HTTP/2 with prior knowledge: the port's cluster uses the HTTP/2 codec, and so does the HTTP
    /// health check when the primary port is `h2` (docs/contracts.md, "Envoy resources and their
    /// names").
    H2,
    /// A gRPC server (HTTP/2 with prior knowledge, like `h2`). When it is the primary port the
    /// health check is gRPC's standard health protocol (`grpc.health.v1.Health/Check`), not an
    /// HTTP `GET`: gRPC servers answer any request that is not gRPC with 415.
    Grpc,
}

impl AppProtocol {
    /// The annotation spelling: `http1`, `h2` or `grpc`.
    pub fn as_str(self) -> &'static str {
        match self {
            AppProtocol::Http1 => "http1",
            AppProtocol::H2 => "h2",
            AppProtocol::Grpc => "grpc",
        }
    }

    /// True when Envoy must speak HTTP/2 to the port: `h2` and `grpc`.
    pub fn is_http2(self) -> bool {
        matches!(self, AppProtocol::H2 | AppProtocol::Grpc)
    }
}

/// One declared service port of a pod: the port clients dial, and its protocol. Over a pipe,
/// every declared port's `app_` cluster dials the same socket (docs/workload-requirements.md, "What
/// the app must do").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortSpec {
    /// The port number, 1–65535.
    pub port: u16,
    /// Its application protocol.
    pub protocol: AppProtocol,
}

/// How the node proxy relays a pod's inbound connections (`endpoint.aether.io/inbound-proxy`,
/// docs/contracts.md, "Managed pods and their annotations").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InboundProxy {
    /// Bytes as they come (Envoy's TCP proxy): any protocol; a replaced Envoy ends the
    /// connections it still holds when it exits, whether or not a request is in flight.
    #[default]
    Tcp,
    /// Envoy parses each request with the codec of the port's declared protocol (HTTP/1.1 for
    /// `http1`, HTTP/2 for `h2` and `grpc`) and routes it to the port's cluster; a replaced Envoy
    /// ends keep-alive connections between requests (`Connection: close` on a response, an
    /// HTTP/2 GOAWAY), so no request in flight is lost.
    Http,
}

impl InboundProxy {
    /// The annotation spelling: `tcp` or `http`.
    pub fn as_str(self) -> &'static str {
        match self {
            InboundProxy::Tcp => "tcp",
            InboundProxy::Http => "http",
        }
    }
}

/// The delegated health check of a pod's `health_` cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum HealthCheck {
    /// An active HTTP check (`Host: localhost`) on `path`, from `endpoint.aether.io/health-path`
    /// (default `/`).
    Http {
        /// The request path: starts with `/`, visible ASCII only.
        path: String,
    },
    /// Connect-only (`endpoint.aether.io/protocol: tcp`); on a pipe: "the socket accepts".
    Connect,
    /// gRPC's standard health check (`grpc.health.v1.Health/Check`, `:authority localhost`):
    /// healthy while the server answers `SERVING` for `service`. The default when the primary
    /// port is declared `=grpc`.
    Grpc {
        /// `endpoint.aether.io/grpc-health-service`: the service asked about; empty = the
        /// server's overall health. Visible ASCII, at most [`MAX_GRPC_SERVICE_BYTES`] bytes.
        service: String,
    },
}

impl HealthCheck {
    /// One line for an operator, e.g. `gRPC Health/Check of service "shop.Cart" over HTTP/2`,
    /// `HTTP GET /ready over HTTP/1.1`, `connect`. `h2` is whether the primary port speaks HTTP/2.
    pub fn describe(&self, h2: bool) -> String {
        let codec = if h2 { "HTTP/2" } else { "HTTP/1.1" };
        match self {
            HealthCheck::Http { path } => format!("HTTP GET {path} over {codec}"),
            HealthCheck::Connect => "connect".to_owned(),
            HealthCheck::Grpc { service } if service.is_empty() => {
                "gRPC Health/Check of the whole server (service \"\") over HTTP/2".to_owned()
            }
            HealthCheck::Grpc { service } => format!("gRPC Health/Check of service {service:?} over HTTP/2"),
        }
    }
}

/// What the agent knows about a static pod's mirror: kubelet names a static pod's directory by its
/// config hash, not by the mirror's API UID, and any pod creator can write that annotation, so
/// such pods are always TCP (docs/design-notes.md, "Agent").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticPod {
    /// The raw `kubernetes.io/config.mirror` value (untrusted: the fold accepts only 32 lowercase
    /// hex digits).
    pub config_hash: String,
    /// `spec.nodeName`, if set.
    pub node_name: Option<String>,
    /// The name of the pod's owner reference of `apiVersion: v1, kind: Node`, if any (kubelet
    /// makes a mirror pod owned by its Node).
    pub owner_node: Option<String>,
}

impl StaticPod {
    /// True when the pod is owned by the Node it is bound to: an owner reference
    /// `v1/Node` whose name equals a non-empty `spec.nodeName`.
    pub fn owned_by_its_node(&self) -> bool {
        matches!((&self.owner_node, &self.node_name), (Some(owner), Some(node)) if owner == node && !node.is_empty())
    }
}

/// An `endpoint.aether.io/*` annotation whose value could not be used; the record holds that
/// annotation's default instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AnnotationDefect {
    /// The annotation key, e.g. `endpoint.aether.io/ports`.
    pub annotation: String,
    /// The rule broken, including the offending value.
    pub message: String,
}

impl fmt::Display for AnnotationDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "annotation {} {}", self.annotation, self.message)
    }
}

/// A pod whose `endpoint.aether.io/ports` asks for more than one pod may: more than
/// [`MAX_PORTS`] entries, or more than [`MAX_PORTS_ANNOTATION_BYTES`] bytes (then the value is
/// not parsed at all). The pod is served no clusters ([`crate::TcpReason::TooManyPorts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TooManyPorts {
    /// Entries in the value: its commas plus one (counted, never split, when over the byte cap).
    /// The API server caps a pod's annotations at 256 KiB, so `u32` holds it (and keeps the
    /// record small).
    pub entries: u32,
    /// Its length in bytes.
    pub bytes: u32,
}

impl TooManyPorts {
    /// The check of one `endpoint.aether.io/ports` value, before it is parsed: `Some` when it is
    /// over [`MAX_PORTS_ANNOTATION_BYTES`] bytes or [`MAX_PORTS`] entries. Counting is one pass
    /// over the bytes; nothing is allocated.
    pub fn check(value: &str) -> Option<TooManyPorts> {
        let entries = value.bytes().filter(|b| *b == b',').count() + 1;
        let over = value.len() > MAX_PORTS_ANNOTATION_BYTES || entries > MAX_PORTS;
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        over.then_some(TooManyPorts { entries: clamp(entries), bytes: clamp(value.len()) })
    }
}

impl fmt::Display for TooManyPorts {
    /// E.g. `annotation endpoint.aether.io/ports is 60000 bytes (10000 entries, not read): a pod
    /// may declare at most 64 ports in at most 1024 bytes`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let TooManyPorts { entries, bytes } = *self;
        if bytes as usize > MAX_PORTS_ANNOTATION_BYTES {
            write!(f, "annotation {PORTS_ANNOTATION} is {bytes} bytes ({entries} entries, not read)")?;
        } else {
            write!(f, "annotation {PORTS_ANNOTATION} declares {entries} ports")?;
        }
        write!(f, ": a pod may declare at most {MAX_PORTS} ports in at most {MAX_PORTS_ANNOTATION_BYTES} bytes")
    }
}

/// The fields of a managed pod that decide its delivery and name its Envoy resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    /// `metadata.uid`: the pod's kubelet directory (unless it is a static pod).
    pub uid: String,
    /// `metadata.namespace`, a DNS-1123 label.
    pub namespace: String,
    /// `metadata.name`, a DNS-1123 subdomain (up to 253 bytes).
    pub name: String,
    /// `spec.serviceAccountName`, or [`DEFAULT_SERVICE_ACCOUNT`]: the name half of the pod's
    /// mesh service key.
    pub service_account: String,
    /// The declared ports, never empty, at most [`MAX_PORTS`]; the first is the primary port.
    /// From `endpoint.aether.io/ports` (`"8080,9090=h2"`), else `endpoint.aether.io/port`, else
    /// `8080/http1` (also when the list is over the cap: see [`PodRecord::too_many_ports`]).
    pub ports: Vec<PortSpec>,
    /// Set when `endpoint.aether.io/ports` is over [`MAX_PORTS`] entries or
    /// [`MAX_PORTS_ANNOTATION_BYTES`] bytes: the pod is served no clusters at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub too_many_ports: Option<TooManyPorts>,
    /// The delegated health check.
    pub health: HealthCheck,
    /// How the node proxy relays inbound connections (`endpoint.aether.io/inbound-proxy`);
    /// records written before the annotation existed read as [`InboundProxy::Tcp`].
    #[serde(default)]
    pub inbound: InboundProxy,
    /// The raw `endpoint.aether.io/uds-socket` value; `None` when absent or empty. Not validated
    /// here: the fold decides (an invalid value still wins over a policy). At most
    /// [`MAX_SOCKET_VALUE_BYTES`] bytes are kept (see `capped_socket_value`).
    pub uds_socket: Option<String>,
    /// `status.podIPs` (else `status.podIP`); empty while the pod has none. Values that do not
    /// parse as an IP address are left out.
    pub pod_ips: Vec<IpAddr>,
    /// The names of the pod's `emptyDir` volumes: only these can carry a socket.
    pub empty_dirs: BTreeSet<String>,
    /// Set for a static pod's mirror (`kubernetes.io/config.mirror` present, even empty).
    pub static_pod: Option<StaticPod>,
    /// Endpoint annotations that were ignored in favour of their defaults; non-empty makes the
    /// fold deliver over TCP.
    pub defects: Vec<AnnotationDefect>,
    /// `metadata.creationTimestamp`, in seconds since the Unix epoch; `None` for a manifest (an
    /// offline plan) and in records written by agents older than the cluster cap. Orders the pods
    /// that compete for the node's cluster cap ([`crate::admission`]): oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<i64>,
}

impl PodRecord {
    /// Extracts the record of a pod, or `None` when the pod is not managed (label
    /// `aether.io/managed` is not exactly `"true"`): unmanaged pods are ignored and their
    /// annotations are inert (docs/contracts.md, "Managed pods and their annotations").
    ///
    /// A finished pod ([`is_finished`]: phase `Succeeded` or `Failed`) also has no record: its
    /// containers are gone and kubelet removes its sockets, so it gets no clusters, exactly like a
    /// deleted pod (the driver treats `None` for a known pod as a delete). A pod with a
    /// `deletionTimestamp` that has not finished is *draining* (kubelet is stopping it; requests
    /// in flight finish): it keeps its record, and its clusters, until it turns terminal or leaves
    /// the API.
    ///
    /// Bad endpoint annotations do not fail: each falls back to its default (port `8080/http1`,
    /// health path `/`, HTTP health check) and is listed in [`PodRecord::defects`]. When both
    /// `ports` and `port` are set, `ports` is used and `port` must be one of its ports. A `ports`
    /// value over the caps ([`TooManyPorts::check`]) is not parsed: the record holds the default
    /// port and [`PodRecord::too_many_ports`].
    ///
    /// # Errors
    /// [`RecordError::Missing`] without `metadata.name`, `metadata.namespace` or `metadata.uid`;
    /// [`RecordError::InvalidName`] when the namespace is not a DNS-1123 label or the name not a
    /// DNS-1123 subdomain (the API server never serves such a pod).
    pub fn from_pod(pod: &Pod) -> Result<Option<PodRecord>, RecordError> {
        let meta = &pod.metadata;
        let label = meta.labels.as_ref().and_then(|l| l.get(MANAGED_LABEL));
        if label.map(String::as_str) != Some(MANAGED_VALUE) || is_finished(pod) {
            return Ok(None);
        }
        let required = |value: &Option<String>, field| {
            value.clone().filter(|v| !v.is_empty()).ok_or(RecordError::Missing { kind: "Pod", field })
        };
        let name = required(&meta.name, "metadata.name")?;
        let namespace = required(&meta.namespace, "metadata.namespace")?;
        let uid = required(&meta.uid, "metadata.uid")?;
        if !is_dns1123_label(&namespace) {
            let rule = "DNS-1123 label";
            return Err(RecordError::InvalidName { kind: "Pod", field: "metadata.namespace", value: namespace, rule });
        }
        if !is_dns1123_subdomain(&name) {
            let rule = "DNS-1123 subdomain";
            return Err(RecordError::InvalidName { kind: "Pod", field: "metadata.name", value: name, rule });
        }

        let annotations = meta.annotations.as_ref();
        let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str).filter(|v| !v.is_empty());
        let mut defects = Vec::new();
        let mut defect = |annotation: &str, message: String| {
            defects.push(AnnotationDefect { annotation: annotation.to_owned(), message });
        };

        let default_ports = || vec![PortSpec { port: DEFAULT_PORT, protocol: AppProtocol::Http1 }];
        let too_many_ports = annotation(PORTS_ANNOTATION).and_then(TooManyPorts::check);
        let ports = match (annotation(PORTS_ANNOTATION), annotation(PORT_ANNOTATION)) {
            _ if too_many_ports.is_some() => default_ports(),
            (Some(list), single) => match (parse_ports(list), single.map(parse_port)) {
                (Err(e), _) => {
                    defect(PORTS_ANNOTATION, e);
                    default_ports()
                }
                (Ok(_), Some(Err(e))) => {
                    defect(PORT_ANNOTATION, e);
                    default_ports()
                }
                (Ok(ports), Some(Ok(port))) if !ports.iter().any(|p| p.port == port) => {
                    defect(PORT_ANNOTATION, format!("{port} is not one of the ports in {PORTS_ANNOTATION} {list:?}"));
                    default_ports()
                }
                (Ok(ports), _) => ports,
            },
            (None, Some(single)) => match parse_port(single) {
                Ok(port) => vec![PortSpec { port, protocol: AppProtocol::Http1 }],
                Err(e) => {
                    defect(PORT_ANNOTATION, e);
                    default_ports()
                }
            },
            (None, None) => default_ports(),
        };

        let path = match annotation(HEALTH_PATH_ANNOTATION) {
            None => DEFAULT_HEALTH_PATH.to_owned(),
            Some(p) if p.len() > MAX_HEALTH_PATH_BYTES => {
                let (len, max) = (p.len(), MAX_HEALTH_PATH_BYTES);
                defect(HEALTH_PATH_ANNOTATION, format!("is {len} bytes, over the cap of {max} bytes"));
                DEFAULT_HEALTH_PATH.to_owned()
            }
            Some(p) if is_health_path(p) => p.to_owned(),
            Some(p) => {
                defect(
                    HEALTH_PATH_ANNOTATION,
                    format!("{p:?} must start with '/' and hold only visible ASCII (no spaces or control characters)"),
                );
                DEFAULT_HEALTH_PATH.to_owned()
            }
        };
        let grpc_primary = ports.first().is_some_and(|p| p.protocol == AppProtocol::Grpc);
        let by_port = |path: String| {
            if grpc_primary { HealthCheck::Grpc { service: String::new() } } else { HealthCheck::Http { path } }
        };
        let mut health = match annotation(PROTOCOL_ANNOTATION) {
            Some("tcp") => HealthCheck::Connect,
            Some("http") => HealthCheck::Http { path },
            None => by_port(path),
            Some(other) => {
                defect(PROTOCOL_ANNOTATION, format!("{} is not \"tcp\" or \"http\"", shown(other)));
                by_port(path)
            }
        };
        match (annotation(GRPC_HEALTH_SERVICE_ANNOTATION), &mut health) {
            (None, _) => {}
            (Some(v), HealthCheck::Grpc { service }) if v.len() <= MAX_GRPC_SERVICE_BYTES && is_grpc_service(v) => {
                v.clone_into(service);
            }
            (Some(v), HealthCheck::Grpc { .. }) => defect(
                GRPC_HEALTH_SERVICE_ANNOTATION,
                format!(
                    "{} must be at most {MAX_GRPC_SERVICE_BYTES} bytes of visible ASCII (a gRPC service name such as \"shop.Cart\")",
                    shown(v)
                ),
            ),
            (Some(_), _) => defect(
                GRPC_HEALTH_SERVICE_ANNOTATION,
                format!(
                    "applies only to a gRPC health check: declare the primary port as \"<port>=grpc\" in {PORTS_ANNOTATION} and leave {PROTOCOL_ANNOTATION} unset"
                ),
            ),
        }

        let inbound = match annotation(INBOUND_PROXY_ANNOTATION) {
            None | Some("tcp") => InboundProxy::Tcp,
            Some("http") => InboundProxy::Http,
            Some(other) => {
                defect(INBOUND_PROXY_ANNOTATION, format!("{} is not \"tcp\" or \"http\"", shown(other)));
                InboundProxy::Tcp
            }
        };

        let spec = pod.spec.as_ref();
        let service_account = spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.to_owned());
        let empty_dirs = spec
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter(|v| v.empty_dir.is_some())
            .map(|v| v.name.clone())
            .collect();

        let status = pod.status.as_ref();
        let listed: Vec<&str> =
            status.and_then(|s| s.pod_ips.as_ref()).into_iter().flatten().map(|ip| ip.ip.as_str()).collect();
        let pod_ips =
            if listed.is_empty() { status.and_then(|s| s.pod_ip.as_deref()).into_iter().collect() } else { listed }
                .into_iter()
                .filter_map(|ip| ip.parse().ok())
                .collect();

        let static_pod = annotations.and_then(|a| a.get(MIRROR_ANNOTATION)).map(|hash| StaticPod {
            config_hash: hash.clone(),
            node_name: spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
            owner_node: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.api_version == "v1" && o.kind == "Node")
                .map(|o| o.name.clone()),
        });

        Ok(Some(PodRecord {
            uid,
            namespace,
            name,
            service_account,
            ports,
            too_many_ports,
            health,
            inbound,
            uds_socket: annotation(UDS_SOCKET_ANNOTATION).map(capped_socket_value),
            pod_ips,
            empty_dirs,
            static_pod,
            defects,
            created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        }))
    }

    /// The pod's key in the delivery map (three new shared strings: clone the key rather than
    /// call this again).
    pub fn key(&self) -> PodKey {
        PodKey {
            namespace: self.namespace.as_str().into(),
            name: self.name.as_str().into(),
            uid: self.uid.as_str().into(),
        }
    }

    /// The pod's mesh service key `<namespace>/<service account>` (docs/endpointpolicy.md, "Which
    /// pods a policy reaches").
    pub fn service_key(&self) -> ServiceKey {
        ServiceKey::new(&self.namespace, &self.service_account)
    }

    /// One line naming the pod's delegated health check ([`HealthCheck::describe`]).
    pub fn health_summary(&self) -> String {
        self.health.describe(self.primary_port().protocol.is_http2())
    }

    /// The primary (first) declared port; its protocol picks the health check's codec.
    pub fn primary_port(&self) -> PortSpec {
        self.ports.first().copied().unwrap_or(PortSpec { port: DEFAULT_PORT, protocol: AppProtocol::Http1 })
    }

    /// The clusters the pod asks the node's Envoy for: one `app_` per declared port and one
    /// `health_`; 0 when it is over the port cap (it is served none). What
    /// [`crate::admission`] counts against `--max-clusters`, whether or not the pod has an
    /// address yet, so a pod getting its IP never changes who else is served.
    pub fn cluster_demand(&self) -> usize {
        if self.too_many_ports.is_some() { 0 } else { self.ports.len() + 1 }
    }
}

/// The pod phases after which no container of a pod runs again (`restartPolicy` is done with
/// it): kubelet has stopped the pod and cleans up its volumes, sockets included.
pub const FINISHED_PHASES: [&str; 2] = ["Succeeded", "Failed"];

/// True when the pod has finished: `status.phase` is `Succeeded` or `Failed` ([`FINISHED_PHASES`]).
/// A finished pod gets no clusters, whatever its labels and annotations say. A `deletionTimestamp`
/// alone does not finish a pod (it is draining until kubelet reports a terminal phase or the pod
/// leaves the API).
pub fn is_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    phase.is_some_and(|p| FINISHED_PHASES.contains(&p))
}

/// True when `s` is a DNS-1123 subdomain (pod names): at most 253 bytes of dot-separated parts,
/// each 1+ of `[a-z0-9-]` starting and ending alphanumeric (Kubernetes `IsDNS1123Subdomain`).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Longest part of a rejected value quoted in a defect message, in bytes.
const SHOWN_BYTES: usize = 64;

/// `value` quoted for a defect message: whole up to [`SHOWN_BYTES`] bytes, else its first bytes
/// (cut at a character boundary) and its length, so that a record never holds an
/// annotation-sized message.
fn shown(value: &str) -> String {
    if value.len() <= SHOWN_BYTES {
        return format!("{value:?}");
    }
    let mut end = SHOWN_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &value[..end], value.len())
}

/// A port number: 1–5 ASCII digits (surrounding spaces ignored) with a value in 1–65535.
fn parse_port(s: &str) -> Result<u16, String> {
    let t = s.trim();
    let digits = !t.is_empty() && t.len() <= 5 && t.bytes().all(|b| b.is_ascii_digit());
    match t.parse::<u32>() {
        Ok(p @ 1..=65535) if digits => Ok(p as u16),
        _ => Err(format!("{} is not a port number (1-65535)", shown(s))),
    }
}

/// `"8080,9090=grpc"`: comma-separated `<port>[=http1|h2|grpc]`, spaces around items tolerated,
/// at least one port, no port twice.
fn parse_ports(s: &str) -> Result<Vec<PortSpec>, String> {
    let mut out: Vec<PortSpec> = Vec::new();
    for item in s.split(',') {
        let (port, protocol) = item.split_once('=').map_or((item, None), |(p, proto)| (p, Some(proto.trim())));
        let port = parse_port(port).map_err(|e| format!("{s:?}: entry {e}"))?;
        let protocol = match protocol {
            None | Some("http1") => AppProtocol::Http1,
            Some("h2") => AppProtocol::H2,
            Some("grpc") => AppProtocol::Grpc,
            Some(other) => {
                return Err(format!("{s:?}: protocol {other:?} of port {port} is not \"http1\", \"h2\" or \"grpc\""));
            }
        };
        if out.iter().any(|p| p.port == port) {
            return Err(format!("{s:?}: port {port} is listed twice"));
        }
        out.push(PortSpec { port, protocol });
    }
    Ok(out)
}

/// A health-check path Envoy accepts in any snapshot: starts with `/`, visible ASCII only
/// (a control character would make Envoy NACK the whole cluster update).
fn is_health_path(p: &str) -> bool {
    p.starts_with('/') && p.bytes().all(|b| b.is_ascii_graphic())
}

/// A gRPC service name Envoy can carry in any snapshot: visible ASCII only (what the health
/// protocol's `service` field holds is the server's choice; a space or control character in an
/// annotation is a mistake, not a name).
fn is_grpc_service(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

/// serde mirror of [`ServiceKey`], which lives in the contract crate without serde derives.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ServiceKey")]
struct ServiceKeyDef {
    namespace: String,
    name: String,
}

/// An EndpointPolicy as the index needs it. "Admitted" means "usable": validity is decided by
/// the same [`aether_crds::validate::validate_spec`] the webhook runs, with the agent's own
/// budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRecord {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`: the tie-break compares these (smallest wins).
    pub name: String,
    /// The service key `<policy namespace>/<spec.targetRef.name>`.
    #[serde(with = "ServiceKeyDef")]
    pub target: ServiceKey,
    /// `spec.udsSocket`, as written.
    pub socket: String,
    /// `None` when the policy passes validation; otherwise the denial message (every violation,
    /// each naming its field and rule).
    pub invalid: Option<String>,
}

impl PolicyRecord {
    /// Extracts the record of a policy and decides its validity with
    /// [`aether_crds::validate::validate_spec`] against `settings`' [`aether_crds::Rules`].
    /// Without a budget (a pods dir too long for any socket) every policy is invalid.
    ///
    /// # Errors
    /// [`RecordError::Missing`] without `metadata.name` or `metadata.namespace`.
    pub fn from_policy(policy: &EndpointPolicy, settings: &Settings) -> Result<PolicyRecord, RecordError> {
        let required = |value: &Option<String>, field| {
            value.clone().filter(|v| !v.is_empty()).ok_or(RecordError::Missing { kind: "EndpointPolicy", field })
        };
        let name = required(&policy.metadata.name, "metadata.name")?;
        let namespace = required(&policy.metadata.namespace, "metadata.namespace")?;
        let invalid = match settings.rules().review_spec(&policy.spec) {
            Err(e) => Some(format!("no socket can be used on this node: {e}")),
            Ok(verdict) => verdict.message(),
        };
        Ok(PolicyRecord {
            target: ServiceKey::new(&namespace, &policy.spec.target_ref.name),
            namespace,
            name,
            socket: policy.spec.uds_socket.clone(),
            invalid,
        })
    }

    /// True when the policy may take part in the tie-break: it passed validation and targets a
    /// Service in its own namespace (attachment is same-namespace by construction).
    pub fn is_valid(&self) -> bool {
        self.invalid.is_none() && self.target.namespace == self.namespace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_list_parses_ports_and_protocols_with_http1_default() {
        let ports = parse_ports("8080, 9090=h2 ,7070=http1").unwrap();
        let want = [(8080, AppProtocol::Http1), (9090, AppProtocol::H2), (7070, AppProtocol::Http1)];
        assert_eq!(ports, want.map(|(port, protocol)| PortSpec { port, protocol }));
    }

    #[test]
    fn ports_list_rejects_bad_entries() {
        for bad in
            ["", "8080,", "0", "65536", "80a", "+80", "-1", "8080=h3", "8080=H2", "8080=gRPC", "8080,8080=h2", "123456"]
        {
            assert!(parse_ports(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn port_accepts_the_full_range_only() {
        assert_eq!(parse_port("1"), Ok(1));
        assert_eq!(parse_port("65535"), Ok(65535));
        assert!(parse_port("0").is_err());
        assert!(parse_port("65536").is_err());
        assert!(parse_port("http").is_err());
    }

    #[test]
    fn a_grpc_primary_port_is_checked_with_grpcs_health_protocol_over_http2() {
        let r = with(&[(PORTS_ANNOTATION, "9090=grpc,8080")]);
        assert_eq!(r.ports[0], PortSpec { port: 9090, protocol: AppProtocol::Grpc });
        assert!(r.ports[0].protocol.is_http2() && !r.ports[1].protocol.is_http2());
        assert_eq!(r.health, HealthCheck::Grpc { service: String::new() });
        assert!(r.defects.is_empty());
        assert_eq!(r.health_summary(), "gRPC Health/Check of the whole server (service \"\") over HTTP/2");

        let r = with(&[(PORTS_ANNOTATION, "9090=grpc"), (GRPC_HEALTH_SERVICE_ANNOTATION, "shop.Cart")]);
        assert_eq!(r.health, HealthCheck::Grpc { service: "shop.Cart".into() });
        // The other kinds stay what they said: connect-only and HTTP win when asked for.
        let r = with(&[(PORTS_ANNOTATION, "9090=grpc"), (PROTOCOL_ANNOTATION, "tcp")]);
        assert_eq!(r.health, HealthCheck::Connect);
        let r =
            with(&[(PORTS_ANNOTATION, "9090=grpc"), (PROTOCOL_ANNOTATION, "http"), (HEALTH_PATH_ANNOTATION, "/hz")]);
        assert_eq!(r.health, HealthCheck::Http { path: "/hz".into() });
        // A grpc port that is not the primary one changes the codec of its cluster only.
        let r = with(&[(PORTS_ANNOTATION, "8080,9090=grpc")]);
        assert_eq!(r.health, HealthCheck::Http { path: "/".into() });
    }

    #[test]
    fn inbound_proxy_is_tcp_unless_the_pod_says_http_and_a_bad_value_is_a_defect() {
        assert_eq!(with(&[]).inbound, InboundProxy::Tcp);
        assert_eq!(with(&[(INBOUND_PROXY_ANNOTATION, "tcp")]).inbound, InboundProxy::Tcp);
        let r = with(&[(INBOUND_PROXY_ANNOTATION, "http")]);
        assert_eq!((r.inbound, r.defects.len()), (InboundProxy::Http, 0));
        for bad in ["HTTP", "h2", "http ", &"x".repeat(100_000)] {
            let r = with(&[(INBOUND_PROXY_ANNOTATION, bad)]);
            assert_eq!(r.inbound, InboundProxy::Tcp, "{bad:.20}: the default stays");
            assert_eq!(r.defects.len(), 1);
            assert_eq!(r.defects[0].annotation, INBOUND_PROXY_ANNOTATION);
            assert!(r.defects[0].message.ends_with("is not \"tcp\" or \"http\""), "{}", r.defects[0]);
            assert!(r.defects[0].message.len() < 200, "the value is shown shortened: {}", r.defects[0]);
        }
        // A record written before the annotation existed (the agent's state dir) reads as TCP.
        let mut old = serde_json::to_value(with(&[(INBOUND_PROXY_ANNOTATION, "http")])).unwrap();
        old.as_object_mut().unwrap().remove("inbound");
        assert_eq!(serde_json::from_value::<PodRecord>(old).unwrap().inbound, InboundProxy::Tcp);
    }

    #[test]
    fn a_grpc_health_service_without_a_grpc_check_or_with_a_bad_name_is_a_defect() {
        let r = with(&[(PORTS_ANNOTATION, "8080"), (GRPC_HEALTH_SERVICE_ANNOTATION, "shop.Cart")]);
        assert_eq!(r.defects.len(), 1);
        assert_eq!(r.defects[0].annotation, GRPC_HEALTH_SERVICE_ANNOTATION);
        assert!(r.defects[0].message.contains("\"<port>=grpc\""), "{}", r.defects[0]);
        for bad in ["shop Cart".to_owned(), "a\tb".to_owned(), "x".repeat(MAX_GRPC_SERVICE_BYTES + 1)] {
            let r = with(&[(PORTS_ANNOTATION, "9090=grpc"), (GRPC_HEALTH_SERVICE_ANNOTATION, &bad)]);
            assert_eq!(r.health, HealthCheck::Grpc { service: String::new() }, "{bad:?}: the default stays");
            assert_eq!(r.defects.len(), 1, "{bad:?}");
            assert!(r.defects[0].message.contains("visible ASCII"), "{}", r.defects[0]);
        }
        let longest = "x".repeat(MAX_GRPC_SERVICE_BYTES);
        assert!(
            with(&[(PORTS_ANNOTATION, "9090=grpc"), (GRPC_HEALTH_SERVICE_ANNOTATION, &longest)]).defects.is_empty()
        );
    }

    #[test]
    fn health_path_must_be_absolute_visible_ascii() {
        assert!(is_health_path("/"));
        assert!(is_health_path("/healthz?full=1"));
        for bad in ["healthz", "/a b", "/a\nb", "/ü", ""] {
            assert!(!is_health_path(bad), "{bad:?}");
        }
    }

    /// The record of a managed pod with `annotations`.
    fn with(annotations: &[(&str, &str)]) -> PodRecord {
        let mut p = aether_fixtures::pod("shop", "cart-1").uid(aether_fixtures::UID);
        for (k, v) in annotations {
            p = p.annotation(k, v);
        }
        PodRecord::from_pod(&p.build()).unwrap().unwrap()
    }

    /// `n` distinct ports from 1, joined by `sep`.
    fn ports(n: usize, sep: &str) -> String {
        (1..=n).map(|p| format!("{p}=http1")).collect::<Vec<_>>().join(sep)
    }

    #[test]
    fn up_to_64_ports_in_up_to_1024_bytes_are_read() {
        let r = with(&[(PORTS_ANNOTATION, &ports(MAX_PORTS, ","))]);
        assert_eq!((r.ports.len(), r.too_many_ports, r.cluster_demand()), (MAX_PORTS, None, MAX_PORTS + 1));
        assert!(r.defects.is_empty());
        // The longest form of 64 entries with ", " fits the byte cap, as its doc says.
        let longest = (0..MAX_PORTS).map(|i| format!("{}=http1", 65535 - i)).collect::<Vec<_>>().join(", ");
        assert_eq!(longest.len(), 830);
        let r = with(&[(PORTS_ANNOTATION, &longest)]);
        assert_eq!((r.ports.len(), r.too_many_ports), (MAX_PORTS, None));
    }

    #[test]
    fn a_pod_over_the_port_cap_keeps_the_count_and_asks_for_no_clusters() {
        let list = ports(MAX_PORTS + 1, ",");
        assert!(list.len() <= MAX_PORTS_ANNOTATION_BYTES, "over the count, not the bytes");
        let r = with(&[(PORTS_ANNOTATION, &list), (PORT_ANNOTATION, "1")]);
        assert_eq!(r.too_many_ports, Some(TooManyPorts { entries: 65, bytes: list.len() as u32 }));
        assert_eq!(r.cluster_demand(), 0);
        assert_eq!(r.ports, [PortSpec { port: DEFAULT_PORT, protocol: AppProtocol::Http1 }], "the default, unused");
        assert!(r.defects.is_empty(), "a cap, not a defect: {:?}", r.defects);
        let says = r.too_many_ports.unwrap().to_string();
        assert_eq!(
            says,
            "annotation endpoint.aether.io/ports declares 65 ports: a pod may declare at most 64 ports in at most 1024 bytes"
        );
    }

    #[test]
    fn a_socket_value_past_any_limit_is_kept_as_its_first_320_bytes_and_stays_invalid() {
        let huge = format!("s/{}", "x".repeat(60_000));
        let r = with(&[(UDS_SOCKET_ANNOTATION, &huge)]);
        assert_eq!(r.uds_socket.as_deref(), Some(&huge[..MAX_SOCKET_VALUE_BYTES]));
        for limit in [aether_crds::SocketLimit::SunPath, aether_crds::SocketLimit::Filesystem] {
            let rules = aether_crds::Rules::with_limit(aether_crds::udspath::DEFAULT_PODS_DIR, limit);
            assert!(rules.budget().unwrap().check(r.uds_socket.as_deref().unwrap()).is_err(), "{limit}");
        }
        // A value within the limits is kept whole; a cut never splits a character.
        assert_eq!(with(&[(UDS_SOCKET_ANNOTATION, "s/app.sock")]).uds_socket.as_deref(), Some("s/app.sock"));
        let wide = format!("a{}", "é".repeat(MAX_SOCKET_VALUE_BYTES));
        assert_eq!(capped_socket_value(&wide).len(), MAX_SOCKET_VALUE_BYTES - 1);
    }

    /// The pod that once took the node's Envoy to 566 MiB: 10,000 ports in a 60 KB annotation. It
    /// is refused by its size, before it is split: its first entry is not even a port, and no
    /// defect says so.
    #[test]
    fn a_60_kb_ports_annotation_is_refused_by_size_without_being_parsed() {
        let list = format!("not-a-port,{}", ports(9_999, ","));
        assert!(list.len() > 60_000 && list.len() < 256 * 1024, "{} bytes", list.len());
        let r = with(&[(PORTS_ANNOTATION, &list)]);
        assert_eq!(r.too_many_ports, Some(TooManyPorts { entries: 10_000, bytes: list.len() as u32 }));
        assert!(r.defects.is_empty(), "parsed: {:?}", r.defects);
        assert_eq!(r.ports.len(), 1);
        let says = r.too_many_ports.unwrap().to_string();
        assert!(says.contains(&format!("is {} bytes (10000 entries, not read)", list.len())), "{says}");
        // Bytes alone: 60 KB of spaces around one port is refused the same way.
        let padded = format!("8080{}", " ".repeat(60_000));
        assert_eq!(TooManyPorts::check(&padded), Some(TooManyPorts { entries: 1, bytes: 60_004 }));
        // And the record it makes is small (the state dir stores it).
        assert!(serde_json::to_string(&r).unwrap().len() < 1_000);
    }

    #[test]
    fn an_over_long_health_path_is_a_defect_and_rejected_values_are_quoted_short() {
        let long = format!("/{}", "a".repeat(MAX_HEALTH_PATH_BYTES));
        let r = with(&[(HEALTH_PATH_ANNOTATION, &long)]);
        assert_eq!(r.health, HealthCheck::Http { path: DEFAULT_HEALTH_PATH.into() });
        assert_eq!(r.defects[0].message, "is 1025 bytes, over the cap of 1024 bytes");
        let r = with(&[(HEALTH_PATH_ANNOTATION, &long[..MAX_HEALTH_PATH_BYTES])]);
        assert!(r.defects.is_empty(), "1024 bytes are fine");
        let r = with(&[(PROTOCOL_ANNOTATION, &"x".repeat(100_000)), (PORT_ANNOTATION, &"9".repeat(100_000))]);
        assert_eq!(r.defects.len(), 2);
        for d in &r.defects {
            assert!(d.message.len() < 200 && d.message.contains("(100000 bytes)"), "{}", d.message);
        }
    }

    #[test]
    fn the_creation_time_is_kept_in_seconds_and_old_records_without_it_still_load() {
        let mut pod = aether_fixtures::pod("shop", "cart-1").uid(aether_fixtures::UID).build();
        let at = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
        let r = PodRecord::from_pod(&pod).unwrap().unwrap();
        assert_eq!(r.created, Some(1_700_000_000));
        let mut old = serde_json::to_value(&r).unwrap();
        let fields = old.as_object_mut().unwrap();
        assert!(fields.remove("created").is_some() && !fields.contains_key("tooManyPorts"));
        let loaded: PodRecord = serde_json::from_value(old).unwrap();
        assert_eq!((loaded.created, loaded.too_many_ports), (None, None));
    }

    #[test]
    fn pod_names_are_dns1123_subdomains_so_they_never_hold_an_underscore() {
        assert!(is_dns1123_subdomain("cart-7d9f.v2"));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        for bad in ["", "a_b", "A", "-a", "a-", "a..b", ".a", &"a".repeat(254)] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
    }
}
