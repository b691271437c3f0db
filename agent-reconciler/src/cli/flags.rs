//! The flags of `aether-agent` ([`Cli`], its subcommands and their arguments), as clap parses
//! them. Every flag can also be set from the environment variable named in its help.
//! [`crate::cli::dispatch`] runs the parsed subcommand.
//!
//! The flags' doc comments are their `--help` text (clap), where placeholders such as
//! `<pod uid>` are meant literally, so rustdoc's HTML-tag check is off for this module.
#![allow(rustdoc::invalid_html_tags)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use aether_crds::SocketLimit;
use aether_crds::cli::{SocketRulesArgs, SocketRulesHelp};

use crate::logging::LogArgs;

/// aether-agent: the node agent that delivers mesh traffic to pods over Unix sockets.
///
/// It watches this node's managed pods (label aether.io/managed=true) and the EndpointPolicies,
/// decides for each pod whether the node proxy reaches it over its Unix socket (the pod's
/// endpoint.aether.io/uds-socket annotation first, then the policy of its Service, else TCP), and
/// serves the result to the node's Envoy over xDS (ADS: CDS + LDS + ECDS).
#[derive(Parser, Debug)]
#[command(name = "aether-agent", version = aether_process::build_info::VERSION_LINE, about, long_about)]
pub struct Cli {
    /// --log-format and --log-level.
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `--pin-dir`: absolute, UTF-8, and short enough that `<dir>/<uid>.sock` (dir + 42 bytes) fits
/// the 107-byte sun_path.
fn parse_pin_dir(s: &str) -> Result<PathBuf, String> {
    let max = aether_crds::udspath::SUN_PATH_MAX - 42;
    if !s.starts_with('/') {
        return Err(format!("{s:?} must be an absolute path"));
    }
    let trimmed = s.trim_end_matches('/');
    if trimmed.len() > max {
        return Err(format!(
            "{s:?} is {} bytes; at most {max}, so that <dir>/<pod uid>.sock fits the 107-byte sun_path",
            trimmed.len()
        ));
    }
    Ok(PathBuf::from(trimmed))
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Watch pods and policies and serve xDS to the node's Envoy until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// Offline: what each managed pod in a Pod manifest file would get, and why.
    Plan(PlanArgs),
    /// The kubelet's exec probe: GET /healthz or /readyz from a running `run --probe-socket`
    /// over its Unix socket. Exit 0 on a 2xx answer (its body on stdout); 1 otherwise, with the
    /// reason on stderr (shown in the pod's events).
    Probe(aether_serve_policy::probe::ProbeArgs),
}

/// Settings shared by `run` and `plan`.
#[derive(Args, Debug, Clone)]
pub struct DeliveryArgs {
    /// --kubelet-pods-dir and --socket-limit, in the agent's words ([`AgentSocketHelp`]).
    #[command(flatten)]
    pub socket: SocketRulesArgs<AgentSocketHelp>,
    /// false: never deliver over a Unix socket and do not watch EndpointPolicies (the chart's
    /// proxy.udsWorkloads.enabled=false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "AETHER_UDS_WORKLOADS")]
    pub uds_workloads: bool,
}

impl DeliveryArgs {
    /// The rules these flags select: [`aether_crds::Rules::with_limit`] of `--kubelet-pods-dir`
    /// and `--socket-limit`.
    pub fn rules(&self) -> aether_crds::Rules {
        self.socket.rules()
    }
}

/// The agent's `--help` text of `--kubelet-pods-dir` and `--socket-limit` (the flags themselves:
/// [`aether_crds::cli`]).
#[derive(Clone, Debug)]
pub struct AgentSocketHelp;

impl SocketRulesHelp for AgentSocketHelp {
    const KUBELET_PODS_DIR: &'static str = "The kubelet pods dir as the node proxy sees it (the chart's mount path). \
        The socket value budget is 107 - len(dir) - 70 bytes: 16 for /var/lib/kubelet/pods. Must match the \
        controller's --kubelet-pods-dir. A dir too long for any value is reported at start-up and every pod is \
        delivered over TCP";
    const SOCKET_LIMIT: &'static str = "What limits the length of a socket value. sun-path: Envoy dials the pod's \
        own path <pods dir>/<uid>/volumes/kubernetes.io~empty-dir/<volume>/<file>, which must fit in sun_path (107 \
        bytes), so the value gets the budget above. filesystem: only with socket pinning (--pin-dir; `run` refuses to \
        start without it) on every node: Envoy then dials the short pin path, and a value is limited by the file \
        system instead (volume: a DNS-1123 label, at most 63 bytes; file: at most 255 bytes, NAME_MAX), whatever the \
        pods dir's length (a long one such as microk8s' /var/snap/microk8s/common/var/lib/kubelet/pods, which leaves \
        no sun_path budget, becomes usable). Must match the controller's --socket-limit; a mismatch is safe (the \
        stricter limit wins)";
    const SUN_PATH: &'static str =
        "The pod's socket path must fit in sun_path (107 bytes): 107 - len(pods dir) - 70 bytes";
    const FILESYSTEM: &'static str =
        "With --pin-dir on every node: volume at most 63 bytes, file at most 255 (the file system's)";
}

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// This node's name: only pods with spec.nodeName equal to it are watched. Must be a
    /// non-empty DNS-1123 subdomain (an empty one would match unscheduled pods).
    #[arg(long, env = "NODE_NAME", value_parser = parse_node_name)]
    pub node_name: String,
    /// Delivery settings.
    #[command(flatten)]
    pub delivery: DeliveryArgs,
    /// Where pod records (each with the network namespace it was served with) and the last policy
    /// map are kept, so the node's Envoy gets the same clusters and inbound listeners after a
    /// restart while the API server and the container runtime are unreachable. With nothing to
    /// replay here, Envoy's ADS stream is held unanswered (Envoy keeps its last config) until the
    /// first pod list and the socket pods' network namespaces are in.
    #[arg(long, default_value = "/var/lib/aether/agent", env = "AETHER_STATE_DIR")]
    pub state_dir: PathBuf,
    /// Where the xDS (ADS gRPC) server listens: unix://<path> or <ip>:<port>.
    #[arg(long, default_value = "unix:///run/aether/xds.sock", env = "AETHER_XDS_ADDRESS")]
    pub xds_address: String,
    /// Path of the health gateway's pipe listener that Envoy serves (GET /healthz/<health cluster>).
    #[arg(long, default_value = "/run/aether/health.sock", env = "AETHER_HEALTH_SOCKET")]
    pub health_socket: String,
    /// Address of the plain-HTTP admin port (/healthz, /readyz, /metrics). It carries no
    /// per-pod detail. [::]:<port> is one dual-stack socket (IPv4 and IPv6 clients; IPv4 only,
    /// with a warning, on a kernel booted without IPv6); 0.0.0.0:<port> is IPv4 only.
    // `[::]` in the help text above is an address, not a rustdoc link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, default_value = "[::]:9091", env = "AETHER_ADMIN_ADDR")]
    pub admin_addr: SocketAddr,
    /// Address of the debug port: GET /debug/pods and /debug/pods/<namespace>/<name>, the
    /// agent's live decision per pod (with its socket, pin and netns paths). Loopback only (a
    /// non-loopback address is refused): `kubectl aether why` reaches it through the API server's
    /// pods/portforward into the agent pod. Shares the admin port's connection cap and timeouts.
    #[arg(long, default_value = "127.0.0.1:9092", env = "AETHER_DEBUG_ADDR", value_parser = parse_loopback_addr)]
    pub debug_addr: SocketAddr,
    /// Folder of the CNI plugin's <pod uid>.json records ({"netns": "/var/run/netns/..."}): TCP
    /// delivery then dials 127.0.0.1:<port> inside the pod's network namespace instead of its IP.
    /// A pod's record is read on the pod's events and on every --recheck-seconds, not per update.
    /// A record's netns passes the same rules as the runtime's (--netns-host-dir).
    #[arg(long, env = "AETHER_CNI_RECORDS_DIR")]
    pub cni_records_dir: Option<PathBuf>,
    /// The container runtime's CRI socket (containerd; CRI-O: unix:///var/run/crio/crio.sock),
    /// asked for a pod's network namespace when the pod changes (ListPodSandbox and
    /// PodSandboxStatus only). TCP delivery then dials the pod on 127.0.0.1 inside that namespace;
    /// --cni-records-dir stays the fallback. The empty string disables it. The socket is
    /// root-equivalent on the node: mount its directory read-only.
    #[arg(long, default_value = crate::runtime::DEFAULT_CRI_ENDPOINT, env = "AETHER_CRI_ENDPOINT")]
    pub cri_endpoint: crate::runtime::CriEndpoint,
    /// The host directory where the runtime keeps pod network namespaces (containerd and CRI-O:
    /// /run/netns; /var/run/... reads as /run/...). A netns path the runtime or a CNI record
    /// reports anywhere else, or with a file name outside [A-Za-z0-9._-], is refused and never
    /// given to Envoy; so is one replayed from the state dir outside --netns-proxy-dir.
    #[arg(long, default_value = crate::runtime::DEFAULT_NETNS_DIR, env = "AETHER_NETNS_HOST_DIR", value_parser = parse_netns_dir)]
    pub netns_host_dir: PathBuf,
    /// Where the node's Envoy container mounts --netns-host-dir: the netns paths given to Envoy
    /// are this directory joined with the file name. Default: the same path as --netns-host-dir
    /// (the chart mounts it at the same path).
    #[arg(long, env = "AETHER_NETNS_PROXY_DIR", value_parser = parse_netns_dir)]
    pub netns_proxy_dir: Option<PathBuf>,
    /// Socket pinning: a directory only the agent writes, seen at the same path by
    /// Envoy. Each verified socket inode (opened with openat2, no link followed) is bind-mounted
    /// on <DIR>/<pod uid>.sock and Envoy dials that, so a pod swapping its socket for a link
    /// between two checks reaches nothing but its own socket. Needs CAP_SYS_ADMIN and mount
    /// propagation to Envoy. At most 65 bytes, absolute. Unset: the lstat check only. One agent
    /// per directory: at start the agent locks <DIR>/.owner (flock, held while it runs, mtime
    /// renewed every 30 s) and writes its --own-daemonset there; while another DaemonSet's agent
    /// holds it, or left it less than 10 minutes ago, the agent exits at once with an error naming
    /// it, having changed nothing; while this DaemonSet's previous agent holds it, it waits up to
    /// --shutdown-wait-seconds + 30 s.
    #[arg(long, env = "AETHER_PIN_DIR", value_parser = parse_pin_dir)]
    pub pin_dir: Option<PathBuf>,
    /// With --pin-dir: how many pods' volume dirs inotify watches, so a re-created socket is
    /// re-pinned at once, and a pod that fell back to TCP because its socket path held a FIFO, a
    /// file or a directory is served over its socket as soon as a real one is there; pods past
    /// it wait for the next --recheck-seconds. Only events on the socket's own name count, and a
    /// pod is re-checked at most every 20 ms however many it makes. Each watch counts against
    /// the node's fs.inotify.max_user_watches. 0: no watches.
    #[arg(long, default_value_t = crate::socket_watch::DEFAULT_MAX_WATCHES, env = "AETHER_SOCKET_WATCH_MAX")]
    pub socket_watch_max: usize,
    /// The most app_/health_ clusters the node's Envoy is given (its bootstrap clusters not
    /// counted): one per declared port plus one health cluster per pod, a pod's ports capped at
    /// 64. Pods compete for them oldest first and pods admitted first keep theirs: a pod that does
    /// not fit gets no clusters at all and a UdsNodeClusterCapReached Warning Event until room
    /// frees. Envoy holds about 62 KiB per cluster (more with more workers): the default keeps the
    /// chart's Envoy near half its 512Mi limit (docs/workload-requirements.md, "Ports per pod and
    /// clusters per node"); raise both together.
    #[arg(
        long,
        default_value_t = aether_agent_core::settings::DEFAULT_MAX_CLUSTERS,
        value_parser = parse_max_clusters,
        env = "AETHER_MAX_CLUSTERS"
    )]
    pub max_clusters: usize,
    /// Connections each pod's inbound listener holds at once (Envoy's connection_limit filter;
    /// one more is closed at once and counted in connection_limit.<listener>.limited_connections).
    /// All of Envoy's listeners together are also capped by its overload manager (the chart's
    /// proxy.overload.maxConnections, 20,000): below that, this keeps one pod's clients from
    /// taking every connection the node has. 1..=1000000.
    #[arg(
        long,
        default_value_t = crate::xds::DEFAULT_INBOUND_MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000),
        env = "AETHER_INBOUND_MAX_CONNECTIONS"
    )]
    pub inbound_max_connections: u64,
    /// Seconds an inbound connection may carry no byte either way before Envoy closes it (the
    /// TCP relay's idle timeout; the HTTP relay's connection and stream idle timeouts). Long-lived
    /// quiet connections (streams, long polls) need it long. 1..=86400.
    #[arg(
        long,
        default_value_t = crate::xds::DEFAULT_INBOUND_IDLE_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=86_400),
        env = "AETHER_INBOUND_IDLE_TIMEOUT_SECONDS"
    )]
    pub inbound_idle_timeout_seconds: u64,
    /// Seconds between re-checks, with lstat, that no pod's socket path has become a symlink.
    /// The re-check also reads CNI records and retries failed container-runtime lookups whose
    /// per-pod delay (10 s doubling to 5 min) is past.
    #[arg(long, default_value_t = 10, env = "AETHER_RECHECK_SECONDS")]
    pub recheck_seconds: u64,
    /// Milliseconds a changed snapshot waits for further changes before it is pushed to Envoy
    /// (coalesces bursts such as a rollout into one push). Every policy or pod change pays it
    /// once on its way to Envoy. 0 pushes every change at once.
    #[arg(long, default_value_t = crate::xds::publish::DEFAULT_DEBOUNCE.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=10_000), env = "AETHER_XDS_DEBOUNCE_MS")]
    pub xds_debounce_ms: u64,
    /// Make /readyz wait for the node's Envoy: 503 until an Envoy is connected over ADS and has
    /// ACKed the CDS and LDS versions the agent would send now, and 503 again whenever no Envoy
    /// is connected (or it NACKed the current version). Off (the default): /readyz is 200 once
    /// the xDS listener is bound, whatever Envoy does. Either way its body has an "envoy: ..."
    /// line saying where Envoy stands. The bare flag means true.
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        env = "AETHER_READYZ_REQUIRES_ENVOY"
    )]
    pub readyz_requires_envoy: bool,
    /// Seconds a required watch may fail before /readyz turns 503. Both watches are required:
    /// this node's pods (pod changes reach Envoy only through it) and, while the CRD is
    /// installed, the EndpointPolicies (policy changes reach pods only through it). The agent
    /// keeps serving its last good state meanwhile and withdraws nothing; the /readyz body has one
    /// line per watch (ok, syncing, off, or failing since when and why), each failed attempt is
    /// counted in aether_agent_watch_errors_total{resource,reason}, and an outage is logged once
    /// when it starts and once when it ends. The default rides out a brief API-server restart
    /// (the watches retry with kube-runtime's backoff, 0.8 s doubling to 30 s); 0 degrades
    /// readiness at the first failure.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400), env = "AETHER_WATCH_GRACE_SECONDS")]
    pub watch_grace_seconds: u64,
    /// Envoy's admin (plain HTTP): an absolute path is its Unix socket (the chart passes
    /// /run/aether/envoy/admin.sock, mode 0600, which only root reaches), else IP:PORT. After an
    /// LDS NACK the agent reads /config_dump there to learn which inbound listener (one per pod
    /// port, bound in the pod's netns) Envoy could not bind, stops offering it and puts a Warning
    /// Event on the pod. Unset: a listener that cannot bind keeps LDS NACKed until its pod
    /// changes.
    #[arg(long, env = "AETHER_ENVOY_ADMIN")]
    pub envoy_admin: Option<crate::xds::envoy_admin::EnvoyAdmin>,
    /// Seconds to wait on SIGTERM/SIGINT, after the xDS server stops accepting, for every Envoy
    /// to close its ADS stream; then the agent ends the streams still open. The agent's own xDS
    /// socket file is removed either way. Without --own-daemonset the wait also decides what
    /// stays on the host: if every stream closed (Envoy went away too) the socket pins and the
    /// --health-socket file are removed; if an Envoy is still connected they stay for it.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=600), env = "AETHER_SHUTDOWN_WAIT_SECONDS")]
    pub shutdown_wait_seconds: u64,
    /// The agent's own DaemonSet, as <namespace>/<name> (the chart: <release namespace>/<node
    /// DaemonSet>). The agent watches its metadata (RBAC: get, list, watch on that one DaemonSet)
    /// and at SIGTERM/SIGINT removes the socket pins and the --health-socket file only when it is
    /// gone or being deleted (helm uninstall). A restart, a roll or a pod deletion leaves them for
    /// the node's Envoy, which runs in its own pod, and the next agent adopts them; so does an
    /// exit before the DaemonSet could be read. Unset: --shutdown-wait-seconds decides.
    #[arg(long, env = "AETHER_OWN_DAEMONSET", value_parser = crate::watch::owner::parse_ref)]
    pub own_daemonset: Option<(String, String)>,
    /// The admin port's connection policy (docs/listeners.md).
    #[command(flatten)]
    pub admin_listener: aether_serve_policy::cli::AdminListenerArgs,
    /// The xDS server's connection policy (docs/listeners.md).
    #[command(flatten)]
    pub xds_listener: aether_serve_policy::cli::XdsListenerArgs,
    /// `--probe-socket`: the admin routes on a pod-local Unix socket for exec probes.
    #[command(flatten)]
    pub probe: aether_serve_policy::probe::ProbeSocketArgs,
}

impl RunArgs {
    /// `--netns-host-dir` and `--netns-proxy-dir` (defaulting to the host dir), checked.
    pub fn netns_dirs(&self) -> Result<crate::runtime::NetnsDirs, crate::runtime::RuntimeError> {
        crate::runtime::NetnsDirs::new(&self.netns_host_dir, self.netns_proxy_dir.as_deref())
    }
}

impl RunArgs {
    /// The rules `run` judges socket values by ([`DeliveryArgs::rules`]), once `--socket-limit`
    /// is known to fit the rest of the flags.
    ///
    /// # Errors
    /// `--socket-limit filesystem` without `--pin-dir`: Envoy would dial each pod's own socket
    /// path, which must fit in sun_path, so the file system's limits would admit values no Envoy
    /// can reach. The message says why and what to pass.
    pub fn socket_rules(&self) -> Result<aether_crds::Rules, String> {
        if self.delivery.socket.socket_limit == SocketLimit::Filesystem && self.pin_dir.is_none() {
            return Err(format!(
                "--socket-limit filesystem needs socket pinning (--pin-dir): without it Envoy dials each pod's own \
                 socket path ({}/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/<file>), which must fit in the \
                 {}-byte sun_path, so only --socket-limit sun-path is correct; pass --pin-dir or drop --socket-limit",
                self.delivery.socket.kubelet_pods_dir.trim_end_matches('/'),
                aether_crds::udspath::SUN_PATH_MAX
            ));
        }
        Ok(self.delivery.rules())
    }
}

/// Flags of `plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Multi-document YAML of Pod manifests (other kinds are ignored); "-" reads standard input,
    /// e.g. `kubectl get pods -o yaml | aether-agent plan --pods -`.
    #[arg(long)]
    pub pods: PathBuf,
    /// Multi-document YAML of EndpointPolicy manifests (other kinds are ignored); "-" reads
    /// standard input (not both).
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// Delivery settings.
    #[command(flatten)]
    pub delivery: DeliveryArgs,
    /// Output: text, or a JSON array of {namespace, name, uid, source, socket, path, reason, clusters}.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Output of `plan`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Readable text.
    Text,
    /// A JSON array.
    Json,
}

/// Bounds of `--max-clusters`: one pod of one port needs 2; the upper bound only catches typos
/// (at the measured 62 KiB or more of Envoy RSS per cluster, 200,000 clusters need over 12 GiB).
pub const MAX_CLUSTERS_RANGE: std::ops::RangeInclusive<usize> = 2..=200_000;

fn parse_max_clusters(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("{s:?} is not a whole number"))?;
    if MAX_CLUSTERS_RANGE.contains(&n) {
        Ok(n)
    } else {
        let (lo, hi) = (MAX_CLUSTERS_RANGE.start(), MAX_CLUSTERS_RANGE.end());
        Err(format!("{n} is outside {lo}..={hi} (one pod of one port needs 2 clusters)"))
    }
}

fn parse_node_name(s: &str) -> Result<String, String> {
    if crate::record::is_dns1123_subdomain(s) {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not a node name (a non-empty DNS-1123 subdomain, as spec.nodeName is)"))
    }
}

/// `--debug-addr`: a socket address on a loopback IP (127.0.0.0/8 or ::1); any other is refused,
/// since the debug port names every managed pod's paths and has no authentication.
fn parse_loopback_addr(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s.parse().map_err(|e| format!("{s:?} is not an <ip>:<port> address: {e}"))?;
    if addr.ip().is_loopback() {
        Ok(addr)
    } else {
        Err(format!(
            "{addr} is not a loopback address: the debug port lists every managed pod's socket, pin and netns \
             paths without authentication, so it binds 127.0.0.1 or ::1 only (kubectl aether why reaches it \
             through pods/portforward)"
        ))
    }
}

fn parse_netns_dir(s: &str) -> Result<PathBuf, String> {
    let dir = PathBuf::from(s);
    crate::runtime::NetnsDirs::new(&dir, None).map(|_| dir).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(extra: &[&str]) -> RunArgs {
        let args = ["aether-agent", "run", "--node-name", "n1"].iter().chain(extra);
        match Cli::try_parse_from(args).unwrap().command {
            Command::Run(r) => *r,
            other => unreachable!("{other:?}"),
        }
    }

    #[test]
    fn the_probe_socket_is_off_unless_set_and_a_probe_asks_healthz_or_readyz_only() {
        assert_eq!(run_args(&[]).probe.probe_socket, None);
        let set = run_args(&["--probe-socket", "/run/aether-probe/probe.sock"]);
        assert_eq!(set.probe.probe_socket, Some("/run/aether-probe/probe.sock".into()));
        let probe =
            |extra: &[&str]| Cli::try_parse_from(["aether-agent", "probe", "--socket", "/s"].iter().chain(extra));
        assert!(matches!(probe(&[]).unwrap().command, Command::Probe(p) if p.path == "/healthz"));
        assert!(matches!(probe(&["--path", "/readyz"]).unwrap().command, Command::Probe(p) if p.path == "/readyz"));
        let wrong = probe(&["--path", "/metrics"]).unwrap_err().to_string();
        assert!(wrong.contains("--path"), "{wrong}");
    }

    #[test]
    fn the_debug_port_binds_loopback_only() {
        assert_eq!(run_args(&[]).debug_addr, "127.0.0.1:9092".parse().unwrap());
        assert_eq!(run_args(&["--debug-addr", "[::1]:7"]).debug_addr, "[::1]:7".parse().unwrap());
        for addr in ["0.0.0.0:9092", "10.0.0.5:9092", "[::]:9092"] {
            let err = Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--debug-addr", addr])
                .expect_err(addr)
                .to_string();
            assert!(err.contains("not a loopback address") && err.contains("--debug-addr"), "{err}");
        }
    }

    #[test]
    fn pin_dir_is_absolute_and_leaves_room_for_the_pin_name_in_sun_path() {
        assert_eq!(run_args(&[]).pin_dir, None);
        assert_eq!(run_args(&["--pin-dir", "/run/aether/pins/"]).pin_dir, Some(PathBuf::from("/run/aether/pins")));
        let ok = format!("/{}", "p".repeat(64));
        assert!(parse_pin_dir(&ok).is_ok(), "65 bytes + 42 = 107");
        let err = parse_pin_dir(&format!("{ok}q")).unwrap_err();
        assert!(err.contains("66 bytes; at most 65"), "{err}");
        assert!(parse_pin_dir("run/pins").unwrap_err().contains("absolute"));
    }

    #[test]
    fn the_socket_limit_is_sun_path_by_default_and_filesystem_needs_a_pin_dir() {
        use aether_crds::SocketLimit;
        let rules = run_args(&[]).socket_rules().unwrap();
        assert_eq!(rules.limit(), SocketLimit::SunPath);
        assert_eq!(rules.budget().map(|b| b.bytes()), Ok(16));
        let err = run_args(&["--socket-limit", "filesystem"]).socket_rules().unwrap_err();
        assert_eq!(
            err,
            "--socket-limit filesystem needs socket pinning (--pin-dir): without it Envoy dials each pod's own socket \
             path (/var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/<file>), which must fit \
             in the 107-byte sun_path, so only --socket-limit sun-path is correct; pass --pin-dir or drop \
             --socket-limit"
        );
        let microk8s = "/var/snap/microk8s/common/var/lib/kubelet/pods";
        let pinned = ["--socket-limit", "filesystem", "--pin-dir", "/run/aether-pins", "--kubelet-pods-dir", microk8s];
        let rules = run_args(&pinned).socket_rules().unwrap();
        assert_eq!(rules.limit(), SocketLimit::Filesystem);
        assert_eq!(rules.budget().map(|b| b.bytes()), Ok(aether_crds::udspath::FILESYSTEM_VALUE_MAX));
        assert!(Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--socket-limit", "nope"]).is_err());
        let plan =
            Cli::try_parse_from(["aether-agent", "plan", "--pods", "-", "--socket-limit", "filesystem"]).unwrap();
        let Command::Plan(plan) = plan.command else { unreachable!() };
        assert_eq!(plan.delivery.rules().limit(), SocketLimit::Filesystem, "plan takes the flag (no pins offline)");
    }

    #[test]
    fn readyz_requires_envoy_is_off_by_default_and_takes_a_bare_flag_or_a_value() {
        assert!(!run_args(&[]).readyz_requires_envoy);
        assert!(run_args(&["--readyz-requires-envoy"]).readyz_requires_envoy);
        assert!(run_args(&["--readyz-requires-envoy=true"]).readyz_requires_envoy);
        assert!(!run_args(&["--readyz-requires-envoy=false"]).readyz_requires_envoy);
        assert!(
            Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--readyz-requires-envoy=maybe"]).is_err()
        );
    }

    #[test]
    fn the_cri_endpoint_defaults_to_containerd_and_the_empty_string_disables_it() {
        use crate::runtime::CriEndpoint;
        assert_eq!(run_args(&[]).cri_endpoint, CriEndpoint::Unix("/run/containerd/containerd.sock".into()));
        assert_eq!(run_args(&["--cri-endpoint", ""]).cri_endpoint, CriEndpoint::Disabled);
        assert_eq!(run_args(&["--cri-endpoint="]).cri_endpoint, CriEndpoint::Disabled);
        assert_eq!(
            run_args(&["--cri-endpoint", "unix:///var/run/crio/crio.sock"]).cri_endpoint,
            CriEndpoint::Unix("/var/run/crio/crio.sock".into())
        );
        for bad in ["/run/containerd/containerd.sock", "tcp://10.0.0.1:10010"] {
            assert!(Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--cri-endpoint", bad]).is_err());
        }
    }

    #[test]
    fn the_netns_proxy_dir_defaults_to_the_host_dir() {
        let dirs = run_args(&[]).netns_dirs().unwrap();
        assert_eq!((dirs.host(), dirs.proxy()), ("/run/netns", "/run/netns"));
        let dirs = run_args(&["--netns-host-dir", "/var/run/netns"]).netns_dirs().unwrap();
        assert_eq!((dirs.host(), dirs.proxy()), ("/run/netns", "/var/run/netns"));
        let dirs = run_args(&["--netns-proxy-dir", "/host/netns"]).netns_dirs().unwrap();
        assert_eq!((dirs.host(), dirs.proxy()), ("/run/netns", "/host/netns"));
        for bad in [["--netns-host-dir", "netns"], ["--netns-proxy-dir", "/a/../b"]] {
            let args = ["aether-agent", "run", "--node-name", "n1"].into_iter().chain(bad);
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn watch_grace_defaults_to_thirty_seconds_and_is_bounded() {
        assert_eq!(run_args(&[]).watch_grace_seconds, 30);
        assert_eq!(run_args(&["--watch-grace-seconds", "0"]).watch_grace_seconds, 0);
        assert!(
            Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--watch-grace-seconds", "86401"])
                .is_err()
        );
    }

    #[test]
    fn max_clusters_defaults_to_the_cores_constant_and_is_bounded() {
        assert_eq!(run_args(&[]).max_clusters, aether_agent_core::settings::DEFAULT_MAX_CLUSTERS);
        assert_eq!(run_args(&["--max-clusters", "2"]).max_clusters, 2);
        assert_eq!(run_args(&["--max-clusters", "200000"]).max_clusters, 200_000);
        for bad in ["0", "1", "200001", "-5", "lots"] {
            let args = ["aether-agent", "run", "--node-name", "n1", "--max-clusters", bad];
            assert!(Cli::try_parse_from(args).is_err(), "{bad}");
        }
    }

    #[test]
    fn inbound_listener_flags_default_to_the_builders_and_are_bounded() {
        let defaults = run_args(&[]);
        assert_eq!(defaults.inbound_max_connections, crate::xds::BuildOptions::default().inbound_max_connections);
        assert_eq!(
            std::time::Duration::from_secs(defaults.inbound_idle_timeout_seconds),
            crate::xds::BuildOptions::default().inbound_idle_timeout
        );
        let set = run_args(&["--inbound-max-connections", "16384", "--inbound-idle-timeout-seconds", "600"]);
        assert_eq!((set.inbound_max_connections, set.inbound_idle_timeout_seconds), (16384, 600));
        for (flag, bad) in [
            ("--inbound-max-connections", "0"),
            ("--inbound-max-connections", "1000001"),
            ("--inbound-idle-timeout-seconds", "0"),
            ("--inbound-idle-timeout-seconds", "86401"),
        ] {
            let args = ["aether-agent", "run", "--node-name", "n1", flag, bad];
            assert!(Cli::try_parse_from(args).is_err(), "{flag} {bad}");
        }
    }

    #[test]
    fn listener_flags_set_the_admin_and_xds_policies_and_default_to_docs_listeners_md() {
        use aether_serve_policy::ListenerKind;
        let defaults = run_args(&[]);
        assert_eq!(defaults.admin_listener.policy(), ListenerKind::Admin.default_policy());
        assert_eq!(defaults.xds_listener.policy(), ListenerKind::Xds.default_policy());
        let set = run_args(&["--admin-max-connections", "4", "--xds-max-connections", "2"]);
        assert_eq!((set.admin_listener.policy().max_connections, set.xds_listener.policy().max_connections), (4, 2));
        assert!(
            Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--xds-max-connections", "0"]).is_err()
        );
    }

    #[test]
    fn shutdown_wait_defaults_to_five_seconds_and_is_bounded() {
        assert_eq!(run_args(&[]).shutdown_wait_seconds, 5);
        assert_eq!(run_args(&["--shutdown-wait-seconds", "0"]).shutdown_wait_seconds, 0);
        assert!(
            Cli::try_parse_from(["aether-agent", "run", "--node-name", "n1", "--shutdown-wait-seconds", "601"])
                .is_err()
        );
    }
}
