//! The xDS layer's input: plain data the render step produces and the encoder
//! (`aether_agent_reconciler::xds::encoder`) turns into Envoy protos. [`ClusterSpec::validate`]
//! says, before anything is encoded, whether Envoy would accept a cluster, so one pod's bad value
//! is left out instead of the node's update being NACKed.

use std::net::IpAddr;

use aether_crds::udspath::SUN_PATH_MAX;

/// One delivery or health cluster: what Envoy connects to for one pod port (or one pod's
/// health check). Plain data; [`ClusterSpec::validate`] says whether Envoy would accept it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    /// Envoy cluster name, unique on the node (e.g. `app_<ns>_<pod>_<port>`,
    /// `health_<ns>_<pod>`). 1+ of `[A-Za-z0-9._-]`.
    pub name: String,
    /// Where the single host of the cluster is.
    pub endpoint: Endpoint,
    /// Active health check of that host; `None` = no health checking (the host is always
    /// considered healthy).
    pub health: Option<HealthCheck>,
    /// The upstream speaks HTTP/2 only (h2c with prior knowledge, e.g. a gRPC server): routed
    /// HTTP traffic uses the HTTP/2 codec. `false` = Envoy's default, HTTP/1.1.
    pub http2: bool,
}

/// Address of a cluster's single host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A Unix domain socket (Envoy `pipe`); no `upstream_bind_config`. `path` is absolute and at
    /// most [`SUN_PATH_MAX`] bytes.
    Pipe {
        /// Absolute socket path, as the proxy sees it.
        path: String,
    },
    /// A TCP host. With `netns` set, Envoy creates the upstream socket inside that network
    /// namespace (`upstream_bind_config.source_address.network_namespace_filepath`), so the
    /// caller passes `127.0.0.1` as `address` to reach a port bound on the pod's loopback;
    /// without it, the pod IP.
    Tcp {
        /// Host IP (v4 or v6).
        address: IpAddr,
        /// TCP port, 1..=65535.
        port: u16,
        /// Absolute path of the pod's network namespace file (e.g. `/var/run/netns/cni-...`).
        netns: Option<String>,
    },
}

/// Active health check of a cluster's host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HealthCheck {
    /// `GET <path>` with `Host: localhost`; healthy on 200. `h2` selects the HTTP/2 codec
    /// (for upstreams that speak only h2, such as gRPC servers on sockets).
    Http {
        /// Request path, starting with `/`, printable ASCII without spaces.
        path: String,
        /// Use the HTTP/2 codec instead of HTTP/1.1.
        h2: bool,
    },
    /// TCP (or socket) connect only: healthy when `connect(2)` succeeds.
    Connect,
    /// gRPC's standard health check (`grpc.health.v1.Health/Check`, `:authority localhost`):
    /// healthy while the server answers `SERVING`. Needs the cluster's HTTP/2 codec
    /// ([`ClusterSpec::http2`]); Envoy refuses the cluster otherwise.
    Grpc {
        /// The `service` asked about; empty = the server's overall health. Visible ASCII.
        service: String,
    },
}

/// Why a [`ClusterSpec`] (or the health gateway) was not rendered. Each variant names the
/// offending value; [`RenderError::label`] gives a stable metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The cluster name is empty.
    #[error("cluster name is empty")]
    EmptyName,
    /// The cluster name has a character outside `[A-Za-z0-9._-]`.
    #[error("cluster name {name:?} has a character outside [A-Za-z0-9._-]")]
    InvalidName {
        /// The offending name.
        name: String,
    },
    /// A second cluster with a name already used in the same snapshot (only the first is kept).
    #[error("duplicate cluster name {name:?}")]
    DuplicateName {
        /// The duplicated name.
        name: String,
    },
    /// A Unix socket path longer than [`SUN_PATH_MAX`] bytes (the limit of Envoy and Linux).
    #[error(
        "socket path {path:?} is {len} bytes, over the {max}-byte Unix socket limit",
        max = SUN_PATH_MAX
    )]
    PipePathTooLong {
        /// The offending path.
        path: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A socket or netns path that is not absolute or contains a NUL byte.
    #[error("path {path:?} must be absolute and free of NUL bytes")]
    InvalidPath {
        /// The offending path.
        path: String,
    },
    /// TCP port 0.
    #[error("TCP port 0 is not a valid upstream port")]
    ZeroPort,
    /// A gRPC health check on a cluster without the HTTP/2 codec, or with a service name that is
    /// not visible ASCII.
    #[error(
        "gRPC health check of cluster {name:?} needs the HTTP/2 codec and a visible-ASCII service name (got {service:?})"
    )]
    InvalidGrpcCheck {
        /// The cluster.
        name: String,
        /// The service name.
        service: String,
    },
    /// A health-check path that does not start with `/` or has a space or control character.
    #[error("health-check path {path:?} must start with '/' and be printable ASCII without spaces")]
    InvalidHealthPath {
        /// The offending path.
        path: String,
    },
}

impl RenderError {
    /// A short, stable kebab-case label for logs and metrics (`reason=pipe-path-too-long` and so
    /// on).
    pub fn label(&self) -> &'static str {
        match self {
            RenderError::EmptyName => "empty-name",
            RenderError::InvalidName { .. } => "invalid-name",
            RenderError::DuplicateName { .. } => "duplicate-name",
            RenderError::PipePathTooLong { .. } => "pipe-path-too-long",
            RenderError::InvalidPath { .. } => "invalid-path",
            RenderError::ZeroPort => "zero-port",
            RenderError::InvalidHealthPath { .. } => "invalid-health-path",
            RenderError::InvalidGrpcCheck { .. } => "invalid-grpc-check",
        }
    }
}

/// Checks a Unix socket path the way Envoy will: absolute, no NUL, at most
/// [`SUN_PATH_MAX`] bytes (bytes, not characters; the contract crate's sun_path limit).
///
/// # Errors
/// [`RenderError::InvalidPath`] or [`RenderError::PipePathTooLong`].
pub fn validate_pipe_path(path: &str) -> Result<(), RenderError> {
    validate_abs_path(path)?;
    if path.len() > SUN_PATH_MAX {
        return Err(RenderError::PipePathTooLong { path: path.to_owned(), len: path.len() });
    }
    Ok(())
}

fn validate_abs_path(path: &str) -> Result<(), RenderError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(RenderError::InvalidPath { path: path.to_owned() });
    }
    Ok(())
}

fn validate_name(name: &str) -> Result<(), RenderError> {
    if name.is_empty() {
        return Err(RenderError::EmptyName);
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err(RenderError::InvalidName { name: name.to_owned() });
    }
    Ok(())
}

impl ClusterSpec {
    /// Checks everything Envoy would refuse in this cluster, before anything is rendered, so the
    /// caller can degrade that one pod instead of having the node's update NACKed.
    ///
    /// # Errors
    /// The first problem found, as a [`RenderError`] (never `DuplicateName`: that needs the whole
    /// snapshot).
    pub fn validate(&self) -> Result<(), RenderError> {
        validate_name(&self.name)?;
        match &self.endpoint {
            Endpoint::Pipe { path } => validate_pipe_path(path)?,
            Endpoint::Tcp { port, netns, .. } => {
                if *port == 0 {
                    return Err(RenderError::ZeroPort);
                }
                if let Some(netns) = netns {
                    validate_abs_path(netns)?;
                }
            }
        }
        if let Some(HealthCheck::Http { path, .. }) = &self.health
            && (!path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(RenderError::InvalidHealthPath { path: path.clone() });
        }
        if let Some(HealthCheck::Grpc { service }) = &self.health
            && (!self.http2 || !service.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(RenderError::InvalidGrpcCheck { name: self.name.clone(), service: service.clone() });
        }
        Ok(())
    }
}

/// One inbound listener (bound inside the pod's network namespace, so Services and endpoints
/// keep `<pod IP>:<port>` and clients are unaffected; docs/design-notes.md, "Agent"): Envoy
/// listens on `0.0.0.0:<port>` (and `[::]:<port>` when `ipv6`) in `netns`, without
/// `SO_REUSEPORT`, and hands every connection to `cluster` (TCP proxy; or, when `http`, an HTTP
/// connection manager routing every request there), which dials the app's socket. Plain data; [`ListenerSpec::validate`] says whether Envoy would accept it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListenerSpec {
    /// Envoy listener name, unique on the node: `inbound_<ns>_<pod>_<port>`
    /// (`crate::names::inbound_listener`).
    pub name: String,
    /// Absolute path of the pod's network-namespace file, as the proxy sees it.
    pub netns: String,
    /// The declared TCP port, 1..=65535.
    pub port: u16,
    /// Also listen on `[::]:<port>` (IPv6 only, `IPV6_V6ONLY`): the pod has an IPv6 address.
    pub ipv6: bool,
    /// The delivery cluster connections go to: `app_<ns>_<pod>_<port>`.
    pub cluster: String,
    /// Relay HTTP requests, not bytes (`endpoint.aether.io/inbound-proxy: http`): Envoy's HTTP
    /// connection manager (codec auto: HTTP/1.1 or HTTP/2 as the client speaks) routes every
    /// request to `cluster`, so a draining Envoy ends keep-alive connections between requests.
    pub http: bool,
}

impl ListenerSpec {
    /// Checks what Envoy would refuse before anything is rendered: the name and cluster name
    /// charset, an absolute netns path without NUL, a non-zero port.
    ///
    /// # Errors
    /// The first problem found, as a [`RenderError`].
    pub fn validate(&self) -> Result<(), RenderError> {
        validate_name(&self.name)?;
        validate_name(&self.cluster)?;
        validate_abs_path(&self.netns)?;
        if self.port == 0 {
            return Err(RenderError::ZeroPort);
        }
        Ok(())
    }
}

/// Everything the node's Envoy should have from us, before rendering.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Delivery and health clusters, in any order; names must be unique.
    pub clusters: Vec<ClusterSpec>,
    /// Inbound listeners, one per declared port of each pod delivered over its socket whose
    /// netns is known; names must be unique.
    pub listeners: Vec<ListenerSpec>,
    /// Names of the clusters the health gateway answers for at `/healthz/<name>`: 200 when all
    /// of that cluster's hosts pass their active health check, 503 otherwise, including when the
    /// cluster is missing (rejected or not yet known to Envoy).
    pub health_clusters: Vec<String>,
}
