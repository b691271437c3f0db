//! Several real nodes on this machine for the multi-node suite: `AETHER_NODES=N
//! tests/harness/node.sh up DIR` (one control plane on the host; per node its own network, mount
//! and UTS namespaces with containerd, kubelet and kube-proxy; CoreDNS), and `node.sh down DIR` on
//! drop, which restores the host.
//!
//! A node's network is not the host's: its loopback ports (the agent's 9091) are reached with
//! [`ClusterNode::in_netns`], its files (the health gateway's socket, Envoy's admin socket, the
//! pins) under [`ClusterNode::path`], and commands run in it with [`ClusterNode::run`] (`nsenter`).
//!
//! It needs root: a missing prerequisite is an error naming the cause, never a skip.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use aether_fixtures::{EchoApp, echo_app};
use anyhow::{Context, bail};

use crate::Kubectl;
use crate::node::{HostState, Shape, helm, node_script, require_root, tail};

/// One node of a [`RealNodes`] cluster, as `node.sh up` wrote it to `DIR/env`.
#[derive(Clone, Debug)]
pub struct ClusterNode {
    /// The Node's name (`aether-node-<i>`).
    pub name: String,
    /// The node IP (its `eth0` on the host bridge; kubelet and hostNetwork pods listen there).
    pub ip: String,
    /// The PID of the process holding the node's namespaces (`/proc/<pid>/ns/{net,mnt,uts}`).
    pub pid: u32,
    /// containerd's socket, as the host reaches it (through `/proc/<pid>/root`).
    pub containerd_sock: PathBuf,
    /// The node's pod CIDR (`10.244.<64+i>.0/24`).
    pub pod_cidr: String,
}

impl ClusterNode {
    /// `path` of the node's own file system (its `/run`, `/var/lib`), as the host reaches it:
    /// `/proc/<pid>/root<path>`.
    pub fn path(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.pid))
    }

    /// Runs `cmd` in the node's network, mount and UTS namespaces (`nsenter -t <pid> -m -n -u`);
    /// returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with stderr.
    pub fn run(&self, cmd: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-m", "-n", "-u", "--"])
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .context("running nsenter")?;
        if !out.status.success() {
            bail!(
                "{} on {}: {}{}",
                cmd.join(" "),
                self.name,
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The kernel's TCP counters in the node's network namespace (`nstat -asz`: absolute values,
    /// the history file left alone), by name (`TcpRetransSegs`, `TcpExtListenDrops`, ...).
    ///
    /// # Errors
    /// When nstat fails to run there.
    pub fn tcp_counters(&self) -> anyhow::Result<crate::tcp_counters::Counters> {
        Ok(crate::tcp_counters::parse(&self.run(&["nstat", "-asz"])?))
    }

    /// Runs `f` on a thread that has joined the node's network namespace (`setns(2)`): every
    /// socket `f` opens, and every thread it starts (a tokio runtime's), is the node's. The
    /// caller's thread stays in its own.
    ///
    /// # Errors
    /// When the namespace cannot be joined, or what `f` returns.
    pub fn in_netns<T: Send>(&self, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
        let ns = std::fs::File::open(format!("/proc/{}/ns/net", self.pid))
            .with_context(|| format!("opening {}'s network namespace (pid {})", self.name, self.pid))?;
        std::thread::scope(|s| {
            s.spawn(move || {
                rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
                    .context("setns into the node's network namespace")?;
                f()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("a thread in {}'s network namespace panicked", self.name))?
        })
    }

    /// GET `http://127.0.0.1:<port><path>` in the node's network namespace: (status, body).
    ///
    /// # Errors
    /// When nothing answers.
    pub fn http_get(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        self.in_netns(|| crate::http_get(port, path, &[]))
    }

    /// GET `path` on the node Envoy's admin, its Unix socket at the chart's
    /// [`CHART_ADMIN_SOCKET`](aether_fixtures::envoy::CHART_ADMIN_SOCKET) in the node's file
    /// system: (status, body).
    ///
    /// # Errors
    /// When nothing answers.
    pub fn envoy_admin(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::unix_http_get(&self.path(aether_fixtures::envoy::CHART_ADMIN_SOCKET), path)
    }

    /// Runs `ctr -n k8s.io ARGS` against the node's containerd; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with ctr's stderr.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        crate::node::ctr(&self.containerd_sock, args)
    }
}

/// A running cluster of several real nodes; torn down (host restored) when dropped.
pub struct RealNodes {
    dir: PathBuf,
    kubeconfig: PathBuf,
    nodes: Vec<ClusterNode>,
    apiserver: (String, u16),
    before: HostState,
}

impl RealNodes {
    /// Brings `count` (2..=8) nodes up in a new folder under the system temp dir; the script's
    /// output goes to `<dir>/node-up.log`.
    ///
    /// # Errors
    /// Without root, or when `node.sh up` fails (it has torn down what it started); the error
    /// carries the tail of its log.
    pub fn up(count: usize) -> anyhow::Result<Self> {
        Self::up_with(count, Shape::DEFAULT)
    }

    /// As [`RealNodes::up`], with the nodes' containerd ([`Shape`]; one IP family, IPv4, only).
    ///
    /// # Errors
    /// As [`RealNodes::up`]; also when the shape asks for a containerd that was not built.
    pub fn up_with(count: usize, shape: Shape) -> anyhow::Result<Self> {
        require_root("the multi-node suite")?;
        let before = HostState::capture_before_up()?;
        let dir = tempfile::Builder::new().prefix("aether-nodes-").tempdir()?.keep();
        node_script("up", &dir, count, shape)?;
        let (kubeconfig, nodes, apiserver) = read_env(&dir.join("env"))?;
        Ok(RealNodes { dir, kubeconfig, nodes, apiserver, before })
    }

    /// The nodes, in order (`aether-node-1` first).
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// The node named `name`.
    ///
    /// # Errors
    /// When no node has that name.
    pub fn node(&self, name: &str) -> anyhow::Result<&ClusterNode> {
        self.nodes.iter().find(|n| n.name == name).with_context(|| format!("no node named {name}"))
    }

    /// kube-apiserver's address (on the host bridge) and port.
    pub fn apiserver(&self) -> (&str, u16) {
        (&self.apiserver.0, self.apiserver.1)
    }

    /// The cluster's folder (`logs/`, `nodes/<name>/logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// kubectl with the admin kubeconfig.
    pub fn kube(&self) -> Kubectl {
        Kubectl::new(&self.kubeconfig)
    }

    /// Runs `helm ARGS` with the admin kubeconfig; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with helm's stderr and stdout.
    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        helm(&self.kubeconfig, &self.dir, args)
    }

    /// The last `lines` lines of each node's kubelet, containerd and kube-proxy log, for a failing
    /// test's message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            for name in ["kubelet", "containerd", "kube-proxy"] {
                let path = self.dir.join("nodes").join(&n.name).join("logs").join(format!("{name}.log"));
                out.push_str(&format!("\n--- {} (last {lines} lines)\n{}", path.display(), tail(&path, lines)));
            }
        }
        out
    }

    /// Tears the cluster down (`node.sh down`; a second call finds nothing left to stop) and
    /// returns how the host differs from before `up`: empty when everything was restored.
    ///
    /// # Errors
    /// When `node.sh down` fails (with its log) or the host cannot be read.
    pub fn down(&self) -> anyhow::Result<Vec<String>> {
        node_script("down", &self.dir, self.nodes.len(), Shape::DEFAULT)?;
        self.before.diff_settled()
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("{e:#}");
        }
    }
}

/// Parses `export KEY=VALUE` lines: the kubeconfig, `AETHER_NODE_<i>_*` per node, and the API
/// server's address and port.
fn read_env(path: &Path) -> anyhow::Result<(PathBuf, Vec<ClusterNode>, (String, u16))> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let vars: BTreeMap<&str, &str> =
        text.lines().filter_map(|l| l.strip_prefix("export ")).filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| vars.get(k).map(|v| v.to_string()).with_context(|| format!("{} has no {k}", path.display()));
    let count: usize = get("AETHER_NODES")?.parse().context("AETHER_NODES")?;
    let nodes = (1..=count)
        .map(|i| {
            Ok(ClusterNode {
                name: get(&format!("AETHER_NODE_{i}_NAME"))?,
                ip: get(&format!("AETHER_NODE_{i}_IP"))?,
                pid: get(&format!("AETHER_NODE_{i}_PID"))?.parse().context("node PID")?,
                containerd_sock: get(&format!("AETHER_NODE_{i}_CONTAINERD_SOCK"))?.into(),
                pod_cidr: get(&format!("AETHER_NODE_{i}_POD_CIDR"))?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let apiserver =
        (get("AETHER_APISERVER_ADDRESS")?, get("AETHER_APISERVER_PORT")?.parse().context("AETHER_APISERVER_PORT")?);
    Ok((get("KUBECONFIG")?.into(), nodes, apiserver))
}

/// A pod's `securityContext` (JSON, so also YAML flow) that meets the Pod Security `restricted`
/// level with [`RESTRICTED_CONTAINER`]: the several-node cluster enforces that level by default
/// (controlplane.sh's `AETHER_APISERVER_RESTRICTED`), and `uds-echo`'s image runs as a non-root
/// user.
pub const RESTRICTED_POD: &str = r#"{"runAsNonRoot":true,"seccompProfile":{"type":"RuntimeDefault"}}"#;

/// A container's `securityContext` for the Pod Security `restricted` level (see [`RESTRICTED_POD`]).
pub const RESTRICTED_CONTAINER: &str = r#"{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}"#;

/// App `name` of the several-node cluster (namespace `default`; render it with
/// [`EchoApp::deployment_manifest`]): `uds-echo` on `/s/app.sock`, each pod answering with its own
/// pod name (`<pod> over unix:/s/app.sock: GET /x`, or `<pod> over tcp:0.0.0.0:8080: GET /x` with
/// [`EchoApp::over_tcp`]), with kubelet's httpGet readiness probe on 8080 (a socket app passes it
/// only through the inbound listener the node's Envoy binds in the pod's netns), meeting the Pod
/// Security `restricted` level ([`RESTRICTED_POD`], [`RESTRICTED_CONTAINER`]). Not annotated
/// until [`EchoApp::annotated`]: otherwise a policy decides.
pub fn app(name: &str) -> EchoApp {
    echo_app(name).named_by_pod().ready_through_port_8080().restricted()
}
