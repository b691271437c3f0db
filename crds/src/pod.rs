//! The pod-side contract (docs/workload-requirements.md, "What the app must do"): label and
//! annotation keys the agent reads, and their defaults.

/// Label that makes a pod managed by the mesh; unmanaged pods are ignored and every
/// `endpoint.aether.io/*` annotation is inert on them.
pub const MANAGED_LABEL: &str = "aether.io/managed";
/// The value of [`MANAGED_LABEL`] that marks a managed pod.
pub const MANAGED_VALUE: &str = "true";
/// `<volume>/<file>`: switch this pod's inbound delivery to the Unix socket.
pub const UDS_SOCKET_ANNOTATION: &str = "endpoint.aether.io/uds-socket";
/// The single service port (default [`DEFAULT_PORT`]).
pub const PORT_ANNOTATION: &str = "endpoint.aether.io/port";
/// Several ports, e.g. `"8080,9090=grpc"`: each `<port>[=http1|h2|grpc]`.
pub const PORTS_ANNOTATION: &str = "endpoint.aether.io/ports";
/// The HTTP path of the delegated health check (default `/`).
pub const HEALTH_PATH_ANNOTATION: &str = "endpoint.aether.io/health-path";
/// The health check's kind: `tcp` (connect-only) or `http` (`GET <health-path>`). Unset: a gRPC
/// health check when the primary port is declared `=grpc`, else `http`.
pub const PROTOCOL_ANNOTATION: &str = "endpoint.aether.io/protocol";
/// The `service` a gRPC health check asks about (`grpc.health.v1.HealthCheckRequest.service`);
/// unset or empty: the server's overall health. Only with a gRPC health check.
pub const GRPC_HEALTH_SERVICE_ANNOTATION: &str = "endpoint.aether.io/grpc-health-service";
/// How the node proxy relays the pod's inbound connections: `tcp` (the default: bytes as they
/// come, Envoy's TCP proxy) or `http` (Envoy parses each request with the codec of the port's
/// declared protocol and, when it is replaced, ends keep-alive connections between requests;
/// docs/contracts.md, "Managed pods and their annotations").
pub const INBOUND_PROXY_ANNOTATION: &str = "endpoint.aether.io/inbound-proxy";
/// The port used when a managed pod declares none.
pub const DEFAULT_PORT: u16 = 8080;
/// kubelet's annotation on a static pod's mirror: the hash naming its directory on disk.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
