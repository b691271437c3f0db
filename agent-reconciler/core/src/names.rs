//! Envoy resource names (docs/contracts.md, "Envoy resources and their names"): delivery clusters
//! `app_<ns>_<pod>_<port>` per declared port, `health_<ns>_<pod>` per pod, and, for a pod
//! delivered over its socket, the inbound listener `inbound_<ns>_<pod>_<port>` per declared port
//! (bound in the pod's netns, handing connections to the `app_` cluster of the same port).
//!
//! A name without the namespace (`app_<pod>_<port>`) would collide across namespaces, so names
//! are namespace-qualified.
//! They are never truncated or hashed: a name is a pure function of namespace, pod name and
//! port, so it is stable across agent restarts and pod re-creation under the same name.
//!
//! Why `_` is an unambiguous separator: Kubernetes validates a namespace as a DNS-1123 label
//! (`ValidateNamespaceName`, at most 63 bytes of `[a-z0-9-]`) and a pod name as a DNS-1123
//! subdomain (`ValidatePodName`, at most 253 bytes of `[a-z0-9.-]`); neither admits `_`, and
//! [`crate::record::PodRecord::from_pod`] rejects any record that would break this. So a name
//! splits on `_` into exactly its parts ([`ClusterName::parse`] is the inverse), and two
//! distinct `(namespace, pod, port)` triples always give distinct names. The longest name is
//! `inbound_` + 63 + `_` + 253 + `_` + 5 = 331 bytes.
//!
//! **Stat names.** Envoy splits its stat names on `.`, and a pod name may hold dots (a
//! Deployment named `api.v2` makes pods `api.v2-<hash>`): `cluster.app_shop_api.v2-7d9_8080.upstream_cx_total`
//! would put the tail of the pod name into the Prometheus metric name and cut the
//! `envoy_cluster_name` label at the first dot. So every resource we render carries a stat name,
//! [`stat_name`]: the resource name with each `.` written `~` (the cluster's `alt_stat_name`, the
//! listener's and its filters' `stat_prefix`). Kubernetes names never hold `~`, and Envoy keeps it
//! in stat names and label values (it rewrites only `:`), so the mapping is one-to-one and
//! reversible: `envoy_cluster_upstream_cx_total{envoy_cluster_name="app_shop_api~v2-7d9_8080"}`,
//! one metric family per kind, the whole pod identity in the label.

use std::fmt;

/// The prefix of per-port delivery clusters.
pub const APP_PREFIX: &str = "app";
/// The prefix of per-pod health-probe clusters.
pub const HEALTH_PREFIX: &str = "health";

/// The pin path of pod `uid` under the agent's pin dir: `<pin_dir>/<uid>.sock`, the path Envoy
/// dials for a pod delivered over its socket when pinning is on (`--pin-dir`): an agent-owned file
/// on which the agent mounts the socket inode it verified. At most `len(pin_dir) + 42` bytes.
pub fn pin_path(pin_dir: &str, uid: &str) -> String {
    format!("{}/{uid}.sock", pin_dir.trim_end_matches('/'))
}

/// What a name's `.` becomes in its [`stat_name`].
pub const STAT_DOT: char = '~';

/// The stat name of an Envoy resource named `name` (see the module doc): each `.` written
/// [`STAT_DOT`]. Same length as `name`; a name without dots is its own stat name.
pub fn stat_name(name: &str) -> String {
    name.chars().map(|c| if c == '.' { STAT_DOT } else { c }).collect()
}

/// The prefix of per-port inbound listeners.
pub const INBOUND_PREFIX: &str = "inbound";

/// The name of the inbound listener of one declared port: `inbound_<ns>_<pod>_<port>`.
pub fn inbound_listener(namespace: &str, pod: &str, port: u16) -> String {
    ClusterName::Inbound { namespace: namespace.to_owned(), pod: pod.to_owned(), port }.to_string()
}

/// The name of the delivery cluster of one declared port: `app_<ns>_<pod>_<port>`.
pub fn app_cluster(namespace: &str, pod: &str, port: u16) -> String {
    ClusterName::App { namespace: namespace.to_owned(), pod: pod.to_owned(), port }.to_string()
}

/// The name of a pod's health-probe cluster: `health_<ns>_<pod>` (the health gateway answers
/// `/healthz/<this name>`).
pub fn health_cluster(namespace: &str, pod: &str) -> String {
    ClusterName::Health { namespace: namespace.to_owned(), pod: pod.to_owned() }.to_string()
}

/// A per-pod Envoy resource name (delivery or health cluster, or inbound listener), parsed.
/// `Display` prints the Envoy name; [`ClusterName::parse`] reads one back (e.g. to map a
/// listener Envoy failed to bind back to its pod and port).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClusterName {
    /// `app_<namespace>_<pod>_<port>`.
    App {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The declared port.
        port: u16,
    },
    /// `inbound_<namespace>_<pod>_<port>`: a listener, not a cluster.
    Inbound {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The declared port.
        port: u16,
    },
    /// `health_<namespace>_<pod>`.
    Health {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
    },
}

impl ClusterName {
    /// Reads a name made by [`app_cluster`], [`health_cluster`] or [`inbound_listener`]. `None` for anything else:
    /// another prefix, an empty part, a part holding `_`, or a port that is not the canonical
    /// decimal of 1–65535.
    pub fn parse(name: &str) -> Option<ClusterName> {
        let parts: Vec<&str> = name.split('_').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        match parts.as_slice() {
            [prefix @ (APP_PREFIX | INBOUND_PREFIX), namespace, pod, port] => {
                let port: u16 = port.parse().ok().filter(|p: &u16| *p != 0 && p.to_string() == *port)?;
                let (namespace, pod) = ((*namespace).to_owned(), (*pod).to_owned());
                Some(if *prefix == APP_PREFIX {
                    ClusterName::App { namespace, pod, port }
                } else {
                    ClusterName::Inbound { namespace, pod, port }
                })
            }
            [HEALTH_PREFIX, namespace, pod] => {
                Some(ClusterName::Health { namespace: (*namespace).to_owned(), pod: (*pod).to_owned() })
            }
            _ => None,
        }
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterName::App { namespace, pod, port } => write!(f, "{APP_PREFIX}_{namespace}_{pod}_{port}"),
            ClusterName::Inbound { namespace, pod, port } => write!(f, "{INBOUND_PREFIX}_{namespace}_{pod}_{port}"),
            ClusterName::Health { namespace, pod } => write!(f, "{HEALTH_PREFIX}_{namespace}_{pod}"),
        }
    }
}
