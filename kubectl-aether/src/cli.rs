//! The command line: kubectl-like global flags (`--kubeconfig`, `--context`, `-n`, `-o`), and
//! the subcommands `why`, `validate`, `budget` and `completion`. Global flags may come before or
//! after the subcommand, as with kubectl (`kubectl aether why pod/cart-1 -n shop -o json`).
//!
//! The flags' doc comments are their `--help` text (clap), where placeholders such as
//! `<pod uid>` are meant literally, so rustdoc's HTML-tag check is off for this module.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The chart's DaemonSet namespace in the documented install (`helm install -n aether-system`).
pub const DEFAULT_AGENT_NAMESPACE: &str = "aether-node,aether-system";
/// The labels every agent pod of the chart carries, whatever the release name
/// (`charts/aether/templates/_helpers.tpl`, `aether.node.selector`, without the instance label).
pub const DEFAULT_AGENT_SELECTOR: &str = "app.kubernetes.io/name=aether,app.kubernetes.io/component=node";
/// The chart's `agent.adminPort` default (`charts/aether/values.yaml`).
pub const DEFAULT_AGENT_DEBUG_PORT: u16 = 9092;

/// `kubectl aether`: why the node agent delivers a pod the way it does, the webhook's decision
/// offline, and the socket-path budget.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-aether",
    bin_name = "kubectl-aether",
    version = aether_process::build_info::VERSION_LINE,
    about,
    long_about = None
)]
pub struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace of the pod (default: the context's namespace, else "default").
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `-o`: text for people, JSON or YAML for scripts (the same fields).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Aligned lines.
    Text,
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// What the node agent actually decided for a pod, and why.
    ///
    /// Reads the agent's live decision (`GET /debug/pods/<ns>/<name>` on its loopback-only debug
    /// port) through the API server's port-forward to the agent pod on the pod's node. When the
    /// agent cannot be reached (no agent pod there, the port refused, RBAC forbids `create
    /// pods/portforward`), runs the
    /// agent's fold offline on the pod and its namespace's EndpointPolicies, and says so: the
    /// answer is labelled OFFLINE with the reason, and lists what offline cannot know (the
    /// node's pods dir, on-disk refusals, pins, the pod's netns). Exit code 0 with an answer,
    /// 1 when the pod cannot be read.
    Why(WhyArgs),
    /// The admission webhook's decision for EndpointPolicy manifests, offline (no cluster
    /// needed): the same rules as the webhook (shape, socket grammar, budget, duplicates among
    /// the files). Exit code 0 all allowed, 1 any denied, 2 unreadable input.
    Validate(ValidateArgs),
    /// The socket-value budget: how many bytes a `<volume>/<file>` value may have on a node
    /// with this pods dir, and why (107 - len(pods dir) - 70). Given VALUEs are checked against
    /// it (exit code 1 if any does not fit).
    Budget(BudgetArgs),
    /// Prints a shell completion script for kubectl-aether (bash, zsh or fish).
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The node's pods dir and socket limit, as configured on the agents and the webhook.
#[derive(Args, Debug, Clone)]
pub struct RulesArgs {
    /// The kubelet pods dir as the node proxy sees it (the chart's mount path; the agents'
    /// --kubelet-pods-dir).
    #[arg(long = "kubelet-pods-dir", visible_alias = "pods-dir", default_value = aether_crds::udspath::DEFAULT_PODS_DIR, env = "AETHER_KUBELET_PODS_DIR")]
    pub pods_dir: String,
    /// What limits a socket value: sun-path (its host path must fit in 107 bytes) or
    /// filesystem (only with socket pinning on every node).
    #[arg(long, value_enum, default_value_t = Limit::SunPath, env = "AETHER_SOCKET_LIMIT")]
    pub socket_limit: Limit,
}

impl RulesArgs {
    /// The rules these flags select.
    pub fn rules(&self) -> aether_crds::Rules {
        aether_crds::Rules::with_limit(&self.pods_dir, self.socket_limit.into())
    }
}

/// `--socket-limit`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// The value's host path must fit in sun_path: 107 - len(pods dir) - 70 bytes.
    SunPath,
    /// The file system's limits (volume at most 63 bytes, file at most 255): pinning only.
    Filesystem,
}

impl From<Limit> for aether_crds::SocketLimit {
    fn from(l: Limit) -> Self {
        match l {
            Limit::SunPath => aether_crds::SocketLimit::SunPath,
            Limit::Filesystem => aether_crds::SocketLimit::Filesystem,
        }
    }
}

/// Flags of `why`.
#[derive(Args, Debug)]
pub struct WhyArgs {
    /// The pod: `pod/NAME`, `pods/NAME` or `NAME`.
    #[arg(value_parser = parse_pod_ref)]
    pub pod: String,
    /// Namespaces to look for the agent pod in, in order, comma-separated: the chart's
    /// daemonset.namespace (aether-node in the README's install), then its release namespace
    /// (where the node side lives when daemonset.namespace is empty). The first with an agent pod
    /// on the pod's node is used.
    #[arg(long, default_value = DEFAULT_AGENT_NAMESPACE, value_delimiter = ',', env = "AETHER_AGENT_NAMESPACE")]
    pub agent_namespace: Vec<String>,
    /// Label selector of the agent pods (the chart's node labels).
    #[arg(long, default_value = DEFAULT_AGENT_SELECTOR, env = "AETHER_AGENT_SELECTOR")]
    pub agent_selector: String,
    /// The agent's debug port (the chart's agent.debugPort; aether-agent --debug-addr), reached
    /// through pods/portforward.
    #[arg(long, default_value_t = DEFAULT_AGENT_DEBUG_PORT, env = "AETHER_AGENT_DEBUG_PORT")]
    pub agent_debug_port: u16,
    /// Seconds to wait for the agent's answer through the port-forward before answering offline.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300), env = "AETHER_AGENT_TIMEOUT_SECONDS")]
    pub agent_timeout_seconds: u64,
    /// Skip the agent: answer from the offline fold only.
    #[arg(long)]
    pub offline: bool,
    /// The rules the offline fold assumes (the agents' flags).
    #[command(flatten)]
    pub rules: RulesArgs,
}

/// Flags of `validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// YAML files with one or more documents ("-" reads standard input). Documents that are
    /// not EndpointPolicies are listed as skipped.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// The rules the webhook runs with (its --kubelet-pods-dir and --socket-limit).
    #[command(flatten)]
    pub rules: RulesArgs,
}

/// Flags of `budget`.
#[derive(Args, Debug)]
pub struct BudgetArgs {
    /// The node's pods dir and socket limit.
    #[command(flatten)]
    pub rules: RulesArgs,
    /// Socket values (`<volume>/<file>`) to check against the budget.
    pub values: Vec<String>,
}

/// Reads `pod/NAME`, `pods/NAME`, `po/NAME` or `NAME` into `NAME`.
///
/// # Errors
/// Another resource type (e.g. `svc/x`) or an empty name.
pub fn parse_pod_ref(s: &str) -> Result<String, String> {
    let name = match s.split_once('/') {
        Some(("pod" | "pods" | "po", name)) => name,
        Some((kind, _)) => return Err(format!("{s:?}: only pods can be asked about (pod/NAME), not {kind:?}")),
        None => s,
    };
    if name.is_empty() || name.contains('/') {
        return Err(format!("{s:?}: expected pod/NAME or NAME"));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["kubectl-aether"].iter().chain(args))
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn version_names_the_release_and_the_commit() {
        let Err(err) = parse(&["--version"]) else { panic!("--version exits through clap") };
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        let shown = err.to_string();
        let want = format!("{} (git {})", env!("CARGO_PKG_VERSION"), aether_process::build_info::GIT_SHA);
        assert!(shown.contains(&want), "--version printed {shown:?}, not {want:?}");
    }

    #[test]
    fn why_takes_pod_slash_name_or_a_bare_name_and_global_flags_after_the_subcommand() {
        let cli = parse(&["why", "pod/cart-1", "-n", "shop", "-o", "json", "--context", "kind"]).unwrap();
        let Command::Why(why) = cli.command else { panic!("why") };
        assert_eq!(why.pod, "cart-1");
        assert_eq!(
            (cli.namespace.as_deref(), cli.output, cli.context.as_deref()),
            (Some("shop"), Output::Json, Some("kind"))
        );
        assert_eq!(why.agent_namespace, ["aether-node", "aether-system"]);
        assert_eq!(why.agent_selector, DEFAULT_AGENT_SELECTOR);
        assert_eq!((why.agent_debug_port, why.agent_timeout_seconds, why.offline), (9092, 5, false));
        let cli = parse(&["--kubeconfig", "/k", "why", "cart-1", "--agent-debug-port", "9999"]).unwrap();
        let Command::Why(why) = cli.command else { panic!("why") };
        assert_eq!((why.pod.as_str(), why.agent_debug_port), ("cart-1", 9999));
        assert_eq!(cli.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(cli.output, Output::Text, "text by default");
    }

    #[test]
    fn why_refuses_other_resource_types() {
        let err = parse(&["why", "svc/cart"]).unwrap_err().to_string();
        assert!(err.contains("only pods can be asked about"), "{err}");
        assert!(parse(&["why", "pod/"]).is_err());
        assert!(parse(&["why", "pod/a/b"]).is_err());
    }

    #[test]
    fn validate_needs_files_and_budget_takes_the_pods_dir_and_limit() {
        assert!(parse(&["validate"]).is_err(), "-f is required");
        let cli = parse(&["validate", "-f", "a.yaml", "b.yaml", "-o", "yaml"]).unwrap();
        let Command::Validate(v) = cli.command else { panic!("validate") };
        assert_eq!(v.files.len(), 2);
        let cli = parse(&["budget", "--pods-dir", "/k", "--socket-limit", "filesystem", "s/a.sock"]).unwrap();
        let Command::Budget(b) = cli.command else { panic!("budget") };
        assert_eq!(
            (b.rules.pods_dir.as_str(), b.rules.socket_limit, b.values.as_slice()),
            ("/k", Limit::Filesystem, &["s/a.sock".to_owned()][..])
        );
    }

    #[test]
    fn completion_knows_the_three_shells() {
        for shell in ["bash", "zsh", "fish"] {
            assert!(parse(&["completion", shell]).is_ok(), "{shell}");
        }
        assert!(parse(&["completion", "tcsh"]).is_err());
    }
}
