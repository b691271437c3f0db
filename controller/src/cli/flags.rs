//! The flags of aether-controller ([`Cli`], its subcommands and their arguments), as clap
//! parses them. Every flag can also be set from the environment variable named in its help.
//! [`crate::cli::dispatch`] runs the parsed subcommand.
//!
//! The flags' doc comments are their `--help` text (clap), where placeholders such as
//! `<pod uid>` are meant literally, so rustdoc's HTML-tag check is off for this module.
#![allow(rustdoc::invalid_html_tags)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use aether_crds::cli::{SocketRulesArgs, SocketRulesHelp};

use crate::logging::LogArgs;
use crate::webhook::{DEFAULT_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES};

/// aether-controller: admission webhook and tools for EndpointPolicy (config.aether.io/v1).
///
/// An EndpointPolicy tells the node proxy to deliver a Service's inbound traffic to its pods over a
/// Unix domain socket in an emptyDir volume. The webhook denies policies whose target or socket
/// value is invalid, or whose socket path would not fit in sun_path (107 bytes) with the
/// configured kubelet pods dir (with --socket-limit filesystem: whose file name exceeds the file
/// system's 255 bytes), and says which field broke which rule. Allowed policies get warnings
/// (printed by kubectl as "Warning: ...") when another policy already targets the same Service
/// (and which one wins: the smallest name), when the Service does not exist yet, or when the
/// socket value is within 2 bytes of the sun_path budget.
///
/// The status writer reports on every policy in status.conditions (type Accepted, Gateway API
/// GEP-713 conventions): False with Invalid (fails the webhook's rules, e.g. admitted while the
/// webhook was down) or Conflicted (another valid policy for the Service has a smaller name; the
/// message names it), else True with AcceptedWithoutService (no Service of that name in the
/// namespace: unlike GEP-713, where a missing target is not accepted, the policy is in effect, as
/// the node agents match pods by ServiceAccount) or Accepted. One replica writes, elected through
/// a Lease.
#[derive(Parser, Debug)]
#[command(name = "aether-controller", version = aether_process::build_info::VERSION_LINE, about, long_about)]
pub struct Cli {
    /// --log-format and --log-level.
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the admission webhook (POST /validate, AdmissionReview v1) over TLS, and /healthz,
    /// /readyz, /metrics on the plain admin port; unless --status-writer=false, also watch
    /// EndpointPolicies and Services and write each policy's Accepted condition (one writer among
    /// the replicas, elected through a Lease). Runs until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// Decide EndpointPolicies in YAML files offline, exactly as the webhook would (for GitOps
    /// CI). Exit 0: all allowed; 1: any denied; 2: input unreadable, unparsable or without any document.
    Validate(ValidateArgs),
    /// Print the EndpointPolicy CustomResourceDefinition as YAML.
    Crd,
    /// Prove an installation works (the chart's `helm test` Pod and post-install check Job):
    /// server-side dry runs (nothing is stored) of an over-budget EndpointPolicy, which the
    /// webhook endpointpolicies.config.aether.io itself must deny, and of a valid one, which must
    /// be admitted; then GET /readyz on every node agent pod must answer 200. Prints one line per
    /// check, "PASS <check>: <reason>" or "FAIL <check>: <reason>", then a summary. Uses
    /// KUBECONFIG or ~/.kube/config, else the in-cluster service account. RBAC: create
    /// endpointpolicies in --namespace, list pods in --agent-namespace (and get pods/proxy with
    /// --agent-access api-server-proxy). Exit 0: every check passed; 1: any failed; 2: no
    /// Kubernetes client or a bad --kubelet-pods-dir.
    VerifyInstall(VerifyArgs),
    /// The kubelet's exec probe: GET /healthz or /readyz from a running `run --probe-socket`
    /// over its Unix socket. Exit 0 on a 2xx answer (its body on stdout); 1 otherwise, with the
    /// reason on stderr (shown in the pod's events).
    Probe(aether_serve_policy::probe::ProbeArgs),
}

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Address the HTTPS webhook listens on. [::]:<port> is one dual-stack socket (IPv4 and IPv6
    /// clients; IPv4 only, with a warning, on a kernel booted without IPv6); 0.0.0.0:<port> is
    /// IPv4 only.
    // `[::]` in the help text above is an address, not a rustdoc link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, default_value = "[::]:9443", env = "AETHER_WEBHOOK_ADDR")]
    pub webhook_addr: SocketAddr,
    /// Address of the plain-HTTP admin port (/healthz, /readyz, /metrics). [::]:<port> serves
    /// IPv4 and IPv6, as --webhook-addr.
    // `[::]` in the help text above is an address, not a rustdoc link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, default_value = "[::]:9090", env = "AETHER_ADMIN_ADDR")]
    pub admin_addr: SocketAddr,
    /// Folder holding tls.crt and tls.key (e.g. a mounted kubernetes.io/tls Secret). Use this or
    /// --tls-cert with --tls-key.
    #[arg(long, env = "AETHER_TLS_DIR", conflicts_with_all = ["tls_cert", "tls_key"], required_unless_present_all = ["tls_cert", "tls_key"])]
    pub tls_dir: Option<PathBuf>,
    /// PEM certificate chain served by the webhook.
    #[arg(long, env = "AETHER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "AETHER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// With --tls-dir: seconds between checks of tls.crt/tls.key for a rotated certificate. A
    /// new good pair is served from the next handshake on; a bad one is logged and the last good
    /// one kept. (--tls-cert/--tls-key are loaded once.)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..), env = "AETHER_TLS_RELOAD_SECONDS")]
    pub tls_reload_seconds: u64,
    /// The kubelet pods dir (see --kubelet-pods-dir).
    #[command(flatten)]
    pub pods_dir: PodsDirArg,
    /// Largest AdmissionReview body decided, in bytes; larger ones get 413. The default (1 MiB)
    /// holds an UPDATE of two EndpointPolicy objects at the API server's 256 KiB limit on
    /// annotations; a review is a few KiB. Reviews in flight share a budget of parse memory of
    /// 48 bytes per body byte, at least 64 MiB (one review at this cap fits): raising the cap
    /// past 1.33 MiB raises the memory the webhook may take. At least 65536 (64 KiB,
    /// `webhook::MIN_MAX_BODY_BYTES`).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, env = "AETHER_MAX_BODY_BYTES", value_parser = clap::value_parser!(u64).range(MIN_MAX_BODY_BYTES as u64..).map(|v| v as usize))]
    pub max_body_bytes: usize,
    /// Write EndpointPolicy status (condition Accepted: Accepted, AcceptedWithoutService, Invalid
    /// or Conflicted) and watch policies and Services for the webhook's warnings about other
    /// policies and missing Services. Needs the Kubernetes API (in-cluster service account,
    /// KUBECONFIG or --kubeconfig); start-up fails without one. false: serve the webhook only,
    /// with no Kubernetes client (only the socket-budget warning is given).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "AETHER_STATUS_WRITER")]
    pub status_writer: bool,
    /// Kubeconfig file(s) for the status writer (a ':'-separated list is merged, as kubectl
    /// does). Unset: ~/.kube/config, else the in-cluster service account.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The Lease that elects the one status writer among the replicas (coordination.k8s.io/v1).
    /// The chart's Role grants access to exactly this name.
    #[arg(long, default_value = "aether-controller-status-writer", env = "AETHER_LEASE_NAME")]
    pub lease_name: String,
    /// Namespace of the Lease. Default: the namespace of the kube configuration (in a pod, its
    /// own namespace).
    #[arg(long, env = "AETHER_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease; must differ between replicas. Default: $POD_NAME,
    /// else $HOSTNAME, else "aether-controller-" and the process id.
    #[arg(long, env = "AETHER_LEASE_HOLDER")]
    pub lease_holder: Option<String>,
    /// The webhook's connection policy (docs/listeners.md).
    #[command(flatten)]
    pub webhook_listener: aether_serve_policy::cli::WebhookListenerArgs,
    /// The admin port's connection policy (docs/listeners.md).
    #[command(flatten)]
    pub admin_listener: aether_serve_policy::cli::AdminListenerArgs,
    /// `--probe-socket`: the admin routes on a pod-local Unix socket for exec probes.
    #[command(flatten)]
    pub probe: aether_serve_policy::probe::ProbeSocketArgs,
}

impl RunArgs {
    /// The connection policies of the two listeners from their flags.
    pub fn listeners(&self) -> crate::server::Listeners {
        crate::server::Listeners { webhook: self.webhook_listener.policy(), admin: self.admin_listener.policy() }
    }
}

/// The kubelet pods dir and the socket limit (`--kubelet-pods-dir`, `--socket-limit`), shared by
/// `run`, `validate` and `verify-install`: [`aether_crds::cli::SocketRulesArgs`] in the
/// controller's words ([`ControllerSocketHelp`]).
pub type PodsDirArg = SocketRulesArgs<ControllerSocketHelp>;

/// The controller's `--help` text of `--kubelet-pods-dir` and `--socket-limit` (the flags
/// themselves: [`aether_crds::cli`]).
#[derive(Clone, Debug)]
pub struct ControllerSocketHelp;

impl SocketRulesHelp for ControllerSocketHelp {
    const KUBELET_PODS_DIR: &'static str = "The kubelet pods dir as the node proxy sees it (the chart's mount path). \
        The socket value budget is 107 - len(dir) - 70 bytes: 16 for /var/lib/kubelet/pods (with --socket-limit \
        sun-path). Must match the agents' --kubelet-pods-dir";
    const SOCKET_LIMIT: &'static str = "What limits the length of a socket value (spec.udsSocket). sun-path: its host \
        path <pods dir>/<uid>/volumes/kubernetes.io~empty-dir/<volume>/<file> must fit in sun_path (107 bytes), so \
        the value gets the budget above. filesystem: only when every node's agent pins sockets (aether-agent \
        --pin-dir, the chart's agent.pinning.enabled): Envoy then dials the short pin path, and a value is limited by \
        the file system instead (volume: a DNS-1123 label, at most 63 bytes; file: at most 255 bytes, NAME_MAX), \
        whatever the pods dir's length (a long one such as microk8s' /var/snap/microk8s/common/var/lib/kubelet/pods, \
        which leaves no sun_path budget, becomes usable). Must match the agents' --socket-limit; a mismatch is safe \
        (the stricter limit wins)";
    const SUN_PATH: &'static str =
        "The value's host path must fit in sun_path (107 bytes): 107 - len(pods dir) - 70 bytes";
    const FILESYSTEM: &'static str =
        "Every node pins sockets: volume at most 63 bytes, file at most 255 (the file system's)";
}

/// Flags of `validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// YAML files with one or more documents ("-" reads standard input). Documents that are
    /// not EndpointPolicies are listed as skipped.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// The kubelet pods dir (see --kubelet-pods-dir).
    #[command(flatten)]
    pub pods_dir: PodsDirArg,
    /// Output format: text lines, or a JSON array of {kind, namespace, name, allowed, message,
    /// warnings, skipped, file}.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, env = "AETHER_OUTPUT")]
    pub output: Output,
}

/// Flags of `verify-install`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Namespace of the dry-run EndpointPolicies (must exist; the webhook's namespaceSelector
    /// must match it). Default: the kube configuration's namespace (in a pod, its own).
    #[arg(long, env = "AETHER_VERIFY_NAMESPACE")]
    pub namespace: Option<String>,
    /// Namespace of the node agent pods. Default: the kube configuration's namespace.
    #[arg(long, env = "AETHER_VERIFY_AGENT_NAMESPACE")]
    pub agent_namespace: Option<String>,
    /// Label selector of the node agent pods (the chart's node DaemonSet pods); none found fails.
    #[arg(
        long,
        default_value = "app.kubernetes.io/name=aether,app.kubernetes.io/component=node",
        env = "AETHER_VERIFY_AGENT_SELECTOR"
    )]
    pub agent_selector: String,
    /// Label selector of the node DaemonSets (in --agent-namespace): each must have a pod on
    /// every node it is scheduled to (status.currentNumberScheduled = desiredNumberScheduled);
    /// one that does not fails with its latest FailedCreate Event (Pod Security, a quota). Empty:
    /// not checked.
    #[arg(long, default_value = "app.kubernetes.io/name=aether", env = "AETHER_VERIFY_DAEMONSET_SELECTOR")]
    pub daemonset_selector: String,
    /// The agents' admin port (aether-agent --admin-addr; the chart's agent.adminPort).
    #[arg(long, default_value_t = 9091, env = "AETHER_VERIFY_AGENT_ADMIN_PORT")]
    pub agent_admin_port: u16,
    /// How to reach each agent's /readyz: pod-ip (http://<pod IP>:<port>; the chart's node pod
    /// is on the host network, so this is its node's IP) or api-server-proxy (the API server's
    /// pod proxy, for clusters whose NetworkPolicies or host firewalls keep pods off node ports;
    /// needs get pods/proxy).
    #[arg(long, value_enum, default_value_t = AgentAccess::PodIp, env = "AETHER_VERIFY_AGENT_ACCESS")]
    pub agent_access: AgentAccess,
    /// Retry each failing check with exponential backoff (1 s doubling to 10 s, with jitter)
    /// until it passes or this many seconds have passed since the start. 0: each check once.
    #[arg(long, default_value_t = 0, env = "AETHER_VERIFY_RETRY_FOR_SECONDS")]
    pub retry_for_seconds: u64,
    /// The kubelet pods dir and socket limit the webhook uses (the over-budget value is one byte
    /// over this budget; pass the controller's values).
    #[command(flatten)]
    pub pods_dir: PodsDirArg,
}

/// How `verify-install` reaches each agent's admin port.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentAccess {
    /// `http://<pod IP>:<admin port>/readyz` straight from this pod (the node pod is on the host
    /// network: its pod IP is the node's).
    PodIp,
    /// The API server's pod proxy, `/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/readyz`
    /// (needs `get` on `pods/proxy`).
    ApiServerProxy,
}

/// Output of `validate`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// One line per document and a summary.
    Text,
    /// A JSON array.
    Json,
}

#[cfg(test)]
mod tests {
    use aether_crds::SocketLimit;
    use clap::Parser;

    use super::*;

    fn command(args: &[&str]) -> Command {
        Cli::try_parse_from(["aether-controller"].iter().chain(args)).unwrap().command
    }

    #[test]
    fn socket_limit_is_sun_path_by_default_and_both_run_and_validate_take_it() {
        let Command::Run(run) = command(&["run", "--tls-dir", "/tls"]) else { unreachable!() };
        assert_eq!(run.pods_dir.socket_limit, SocketLimit::SunPath);
        assert_eq!(run.pods_dir.rules(), aether_crds::Rules::new(aether_crds::udspath::DEFAULT_PODS_DIR));
        let Command::Run(run) = command(&["run", "--tls-dir", "/tls", "--socket-limit", "filesystem"]) else {
            unreachable!()
        };
        assert_eq!(run.pods_dir.rules().limit(), SocketLimit::Filesystem);
        let microk8s = "/var/snap/microk8s/common/var/lib/kubelet/pods";
        let Command::Validate(v) =
            command(&["validate", "-f", "-", "--kubelet-pods-dir", microk8s, "--socket-limit", "filesystem"])
        else {
            unreachable!()
        };
        assert_eq!(v.pods_dir.rules().budget().map(|b| b.bytes()), Ok(aether_crds::udspath::FILESYSTEM_VALUE_MAX));
        assert!(Cli::try_parse_from(["aether-controller", "validate", "-f", "-", "--socket-limit", "fs"]).is_err());
    }

    #[test]
    fn verify_install_defaults_find_the_charts_node_pods_and_check_once() {
        let Command::VerifyInstall(v) = command(&["verify-install"]) else { unreachable!() };
        assert_eq!(
            (v.namespace, v.agent_namespace, v.agent_admin_port, v.retry_for_seconds, v.agent_access),
            (None, None, 9091, 0, AgentAccess::PodIp)
        );
        assert_eq!(v.agent_selector, "app.kubernetes.io/name=aether,app.kubernetes.io/component=node");
        assert_eq!(v.pods_dir.rules(), aether_crds::Rules::new(aether_crds::udspath::DEFAULT_PODS_DIR));
        let Command::VerifyInstall(v) =
            command(&["verify-install", "--retry-for-seconds", "60", "--agent-access", "api-server-proxy"])
        else {
            unreachable!()
        };
        assert_eq!((v.retry_for_seconds, v.agent_access), (60, AgentAccess::ApiServerProxy));
        assert!(Cli::try_parse_from(["aether-controller", "verify-install", "--retry-for-seconds", "-1"]).is_err());
    }

    #[test]
    fn listener_flags_set_the_webhook_and_admin_policies_and_default_to_docs_listeners_md() {
        let Command::Run(run) = command(&["run", "--tls-dir", "/tls"]) else { unreachable!() };
        assert_eq!(run.listeners(), crate::server::Listeners::default());
        let Command::Run(run) = command(&[
            "run",
            "--tls-dir",
            "/tls",
            "--webhook-max-connections",
            "8",
            "--webhook-handshake-timeout-seconds",
            "2",
            "--admin-max-connections",
            "4",
        ]) else {
            unreachable!()
        };
        let l = run.listeners();
        assert_eq!((l.webhook.max_connections, l.webhook.first_byte_timeout.as_secs()), (8, 2));
        assert_eq!(l.admin.max_connections, 4);
    }
}
