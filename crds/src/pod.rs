//! The pod-side contract (DESIGN.md "Contracts", spec Phase 1 "Annotation"): label and annotation
//! keys the agent reads, and their defaults.

/// Label that makes a pod managed by the mesh; unmanaged pods are ignored and every
/// `endpoint.aether.io/*` annotation is inert on them.
pub const MANAGED_LABEL: &str = "aether.io/managed";
/// The value of [`MANAGED_LABEL`] that marks a managed pod.
pub const MANAGED_VALUE: &str = "true";
/// `<volume>/<file>`: switch this pod's inbound delivery to the Unix socket.
pub const UDS_SOCKET_ANNOTATION: &str = "endpoint.aether.io/uds-socket";
/// The single service port (default [`DEFAULT_PORT`]).
pub const PORT_ANNOTATION: &str = "endpoint.aether.io/port";
/// Several ports, e.g. `"8080,9090=h2"`.
pub const PORTS_ANNOTATION: &str = "endpoint.aether.io/ports";
/// The HTTP path of the delegated health check (default `/`).
pub const HEALTH_PATH_ANNOTATION: &str = "endpoint.aether.io/health-path";
/// `tcp` makes the health check connect-only.
pub const PROTOCOL_ANNOTATION: &str = "endpoint.aether.io/protocol";
/// The port used when a managed pod declares none.
pub const DEFAULT_PORT: u16 = 8080;
/// kubelet's annotation on a static pod's mirror: the hash naming its directory on disk.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
