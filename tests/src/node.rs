//! A real single node for the real-node suite: `tests/harness/node.sh up DIR` (containerd, kubelet,
//! kube-controller-manager, kube-scheduler, kube-proxy on top of etcd + kube-apiserver, images
//! imported from `tests/harness/images.sh`), and `node.sh down DIR` on drop, which restores the host.
//!
//! It needs root and changes the host (bridge, iptables chains, sysctls, mounts): a missing
//! prerequisite is an error naming the cause, never a skip.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::{Kubectl, helm_bin, repo_root, tools_bin};

/// `--set` flags that point charts/aether at the images built here (`tests/harness/images.sh`,
/// never pulled), and shorten a handed-over Envoy's drain (60 s by default) so that proxy rollouts
/// in a row take seconds; everything else is a default.
pub const CHART_IMAGE_SETS: &[&str] = &[
    "proxy.handOver.parentShutdownSeconds=15",
    "proxy.handOver.successorWaitSeconds=20",
    "images.controller.repository=localhost/aether/aether-controller",
    "images.controller.tag=dev",
    "images.controller.pullPolicy=Never",
    "images.webhookCerts.repository=localhost/aether/aether-controller",
    "images.webhookCerts.tag=dev",
    "images.webhookCerts.pullPolicy=Never",
    "images.agent.repository=localhost/aether/aether-agent",
    "images.agent.tag=dev",
    "images.agent.pullPolicy=Never",
    "images.proxy.repository=localhost/aether/envoy",
    "images.proxy.tag=dev",
    "images.proxy.pullPolicy=Never",
];

/// The README's command that creates the release namespace before `helm install` (kubectl
/// arguments). The release namespace keeps the cluster's Pod Security level (the controller meets
/// `restricted`); the node side goes to [`README_NODE_NAMESPACE`], which the chart creates and
/// labels. `e2e_charts` checks that the README's Quickstart shows exactly this.
pub fn release_namespace_command(namespace: &str) -> Vec<String> {
    vec!["create".into(), "namespace".into(), namespace.into()]
}

/// The node side's namespace in the README's install (`--set daemonset.namespace=<it>`).
pub const README_NODE_NAMESPACE: &str = "aether-node";

/// docs/install.md's alternative, one namespace for everything: label the release namespace for
/// the Pod Security level the node pods need (host network, hostPath, privileged containers: only
/// `privileged`). kubectl arguments.
pub fn privileged_label_command(namespace: &str) -> Vec<String> {
    vec!["label".into(), "namespace".into(), namespace.into(), "pod-security.kubernetes.io/enforce=privileged".into()]
}

/// The chart `charts/<name>` as `helm package` makes it (what `make charts` ships and the README
/// installs): `<target>/packaged-charts/<pid>/<name>-<version>.tgz`, packaged once per test
/// process. The real-node suites install these, so a packaged chart is what runs.
///
/// # Errors
/// When `helm package` fails (its stderr) or its output names no file.
pub fn packaged_chart(name: &str) -> anyhow::Result<PathBuf> {
    use std::sync::Mutex;
    static DONE: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut done = DONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = done.get(name) {
        return Ok(path.clone());
    }
    let dir = repo_root().join("target/packaged-charts").join(std::process::id().to_string());
    std::fs::create_dir_all(&dir)?;
    let out = Command::new(helm_bin())
        .arg("package")
        .arg(repo_root().join("charts").join(name))
        .arg("--destination")
        .arg(&dir)
        .output()
        .context("running helm package")?;
    if !out.status.success() {
        bail!("helm package charts/{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // "Successfully packaged chart and saved it to: <path>"
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .rsplit_once(": ")
        .map(|(_, p)| PathBuf::from(p.trim()))
        .filter(|p| p.is_file())
        .with_context(|| format!("helm package printed no file: {stdout}"))?;
    done.insert(name.to_owned(), path.clone());
    Ok(path)
}

/// The arguments of `helm install|upgrade RELEASE <packaged charts/aether> -n NAMESPACE` with
/// [`CHART_IMAGE_SETS`] plus `extra` `--set` flags, waiting (300 s at most) for every workload and
/// hook Job; `upgrade` resets the values to the chart's. The namespace must exist (see
/// [`release_namespace_command`]).
///
/// # Errors
/// What [`packaged_chart`] returns; when the path is not UTF-8.
pub fn aether_chart_args(verb: &str, release: &str, namespace: &str, extra: &[&str]) -> anyhow::Result<Vec<String>> {
    let chart = packaged_chart("aether")?;
    let sets: Vec<&str> = CHART_IMAGE_SETS.iter().chain(extra).copied().collect();
    chart_args(verb, release, &chart, namespace, &sets)
}

/// The arguments of `helm install|upgrade RELEASE CHART -n NAMESPACE` with `sets` as `--set`
/// flags, waiting (300 s at most) for every workload and hook Job; `upgrade` resets the values to
/// the chart's. [`aether_chart_args`] with another chart (e.g. a previous release's).
///
/// # Errors
/// When `chart` is not UTF-8.
pub fn chart_args(
    verb: &str,
    release: &str,
    chart: &std::path::Path,
    namespace: &str,
    sets: &[&str],
) -> anyhow::Result<Vec<String>> {
    let chart = chart.to_str().context("chart path is not UTF-8")?;
    let mut args: Vec<String> = [verb, release, chart, "-n", namespace].map(String::from).to_vec();
    if verb != "install" {
        args.push("--reset-values".into());
    }
    args.extend(["--wait", "--wait-for-jobs", "--timeout", "300s"].map(String::from));
    for s in sets {
        args.extend(["--set".to_owned(), (*s).to_owned()]);
    }
    Ok(args)
}

/// The IP families of a node `node.sh up` brings up (its `AETHER_IP_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4 only: pods and Services get an IPv4 address.
    Ipv4,
    /// Dual-stack, IPv4 primary: every pod gets an IPv4 and an IPv6 address (`status.podIPs`
    /// IPv4 first); a Service is IPv4 unless its `spec.ipFamilies` asks for IPv6.
    Dual,
}

impl IpFamily {
    /// The value node.sh takes in `AETHER_IP_FAMILY`.
    pub fn as_env(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Dual => "dual",
        }
    }
}

/// The container runtime a node runs (`node.sh`'s `AETHER_RUNTIME` and `AETHER_CONTAINERD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// Debian's packages: containerd 1.6 (end of life upstream) and runc 1.1, config version 2.
    ContainerdDebian,
    /// The containerd 2.x and runc `tests/harness/build-tools.sh containerd2 runc` built (`make
    /// tools`), config version 3: node.sh's default.
    Containerd2,
    /// CRI-O (`tests/harness/build-tools.sh crio`) with the runc of `make tools`; one node only.
    Crio,
}

impl Runtime {
    /// The runtime the real-node suite is asked for: `AETHER_RUNTIME=crio` is [`Runtime::Crio`],
    /// `AETHER_CONTAINERD=1` [`Runtime::ContainerdDebian`], anything else (unset included)
    /// [`Runtime::Containerd2`].
    ///
    /// # Errors
    /// On an `AETHER_RUNTIME` other than `containerd` or `crio`.
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var("AETHER_RUNTIME").unwrap_or_default().as_str() {
            "crio" => Ok(Runtime::Crio),
            "" | "containerd" if std::env::var("AETHER_CONTAINERD").as_deref() == Ok("1") => {
                Ok(Runtime::ContainerdDebian)
            }
            "" | "containerd" => Ok(Runtime::Containerd2),
            other => bail!("AETHER_RUNTIME={other}: use containerd (the default) or crio"),
        }
    }
}

/// What `node.sh up` is asked for: the nodes' IP families and container runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `AETHER_IP_FAMILY`.
    pub family: IpFamily,
    /// `AETHER_RUNTIME` and `AETHER_CONTAINERD`.
    pub runtime: Runtime,
}

impl Shape {
    /// IPv4 only, containerd 2.x: node.sh's defaults, what `make demo` runs.
    pub const DEFAULT: Shape = Shape { family: IpFamily::Ipv4, runtime: Runtime::Containerd2 };

    /// The environment node.sh reads for this shape.
    pub fn env(self) -> [(&'static str, &'static str); 3] {
        let (runtime, containerd) = match self.runtime {
            Runtime::ContainerdDebian => ("containerd", "1"),
            Runtime::Containerd2 => ("containerd", "2"),
            Runtime::Crio => ("crio", "2"),
        };
        [("AETHER_IP_FAMILY", self.family.as_env()), ("AETHER_RUNTIME", runtime), ("AETHER_CONTAINERD", containerd)]
    }
}

/// What `node.sh up` wrote to `DIR/env`.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The Node's name.
    pub node_name: String,
    /// The node IP (the pod bridge's address; kube-apiserver listens there too).
    pub node_ip: String,
    /// The node's IPv6 address on the pod bridge, on a dual-stack node.
    pub node_ip6: Option<String>,
    /// The runtime's name in `DIR/env` (`containerd` or `crio`).
    pub runtime: String,
    /// containerd's socket (for `ctr`); none on a CRI-O node.
    pub containerd_sock: Option<PathBuf>,
    /// `--set` values charts/aether needs on this node beyond the images (node.sh's
    /// `AETHER_CHART_SETS`: CRI-O's socket as `agent.criSocket`, no priority class where critical
    /// pods cannot start); empty on a containerd node.
    pub chart_sets: Vec<String>,
    /// The kubelet's root dir (`<it>/pods` is the pods dir).
    pub kubelet_root: PathBuf,
}

/// A running real node; torn down (host restored) when dropped.
pub struct RealNode {
    dir: PathBuf,
    facts: NodeFacts,
    before: HostState,
}

impl RealNode {
    /// Brings a node up in a new folder under the system temp dir. The script's output goes to
    /// `<dir>/node-up.log`.
    ///
    /// # Errors
    /// Without root, or when `node.sh up` fails (it has torn down what it started); the error
    /// carries the tail of its log.
    pub fn up() -> anyhow::Result<Self> {
        Self::up_with(Shape::DEFAULT)
    }

    /// As [`RealNode::up`], with the node's IP families and container runtime.
    ///
    /// # Errors
    /// As [`RealNode::up`]; with [`IpFamily::Dual`] also on a host without IPv6, with
    /// [`Runtime::Containerd2`] also when it was not built.
    pub fn up_with(shape: Shape) -> anyhow::Result<Self> {
        require_root("the real-node suite")?;
        let before = HostState::capture_before_up()?;
        let dir = tempfile::Builder::new().prefix("aether-node-").tempdir()?.keep();
        node_script("up", &dir, 1, shape)?;
        let facts = read_env(&dir.join("env"))?;
        Ok(RealNode { dir, facts, before })
    }

    /// The node's facts.
    pub fn facts(&self) -> &NodeFacts {
        &self.facts
    }

    /// The node's folder (logs in `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// kubectl with the admin kubeconfig.
    pub fn kube(&self) -> Kubectl {
        Kubectl::new(&self.facts.kubeconfig)
    }

    /// Runs `helm ARGS` with the admin kubeconfig; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with helm's stderr and stdout.
    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        helm(&self.facts.kubeconfig, &self.dir, args)
    }

    /// Runs `ctr -n k8s.io ARGS` against the node's containerd; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with ctr's stderr.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let sock = self.facts.containerd_sock.as_deref().context("ctr: this node runs CRI-O, not containerd")?;
        ctr(sock, args)
    }

    /// SIGKILLs a container below the API server, as a crash would: `id` is a pod status's
    /// `containerID` (`containerd://<id>` through `ctr tasks kill`, `cri-o://<id>` through the
    /// runc state dir node.sh gave CRI-O).
    ///
    /// # Errors
    /// On an ID of another runtime than the node's, or when the kill fails.
    pub fn kill_container(&self, id: &str) -> anyhow::Result<()> {
        if let Some(id) = id.strip_prefix("containerd://") {
            return self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]).map(|_| ());
        }
        let id = id
            .strip_prefix("cri-o://")
            .with_context(|| format!("container ID {id}: neither containerd:// nor cri-o://"))?;
        let runc = tools_bin().with_file_name("runc").join("bin/runc");
        let out = Command::new(&runc)
            .arg("--root")
            .arg(self.dir.join("crio/runc"))
            .args(["kill", id, "KILL"])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", runc.display()))?;
        if !out.status.success() {
            bail!("runc kill {id} KILL failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// How a pod network namespace's path from this node's runtime begins: containerd's
    /// `/run/netns/cni-<uuid>`, CRI-O's (pinns) `/run/netns/<uuid>`.
    pub fn netns_prefix(&self) -> &'static str {
        if self.facts.runtime == "crio" { "/run/netns/" } else { "/run/netns/cni-" }
    }

    /// The last `lines` lines of each component log (kubelet, the runtime, kube-proxy, ...), for
    /// a failing test's message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let runtime = if self.facts.runtime == "crio" { "crio" } else { "containerd" };
        for name in ["kubelet", runtime, "kube-proxy", "kube-controller-manager", "kube-scheduler"] {
            let path = self.dir.join("logs").join(format!("{name}.log"));
            out.push_str(&format!("\n--- {} (last {lines} lines)\n{}", path.display(), tail(&path, lines)));
        }
        out
    }
}

impl RealNode {
    /// Tears the node down (`node.sh down`; a second call finds nothing left to stop) and
    /// returns how the host differs from before `up`: empty when everything was restored.
    ///
    /// # Errors
    /// When `node.sh down` fails (with its log) or the host cannot be read.
    pub fn down(&self) -> anyhow::Result<Vec<String>> {
        node_script("down", &self.dir, 1, Shape::DEFAULT)?;
        self.before.diff_settled()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("{e:#}");
        }
    }
}

/// What `node.sh` changes on the host, read from the kernel and the file system: sysctls,
/// iptables and ip6tables rules and chains (every table, no counters), links, IPv4 and IPv6
/// routes, mount points, and the host dirs a node creates. Two captures compare equal when the
/// host is as it was.
#[derive(Debug, PartialEq, Eq)]
pub struct HostState {
    items: BTreeSet<String>,
}

/// How long [`HostState::diff_settled`] waits for the host to settle after a teardown: 10 s.
pub const HOST_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Sysctls kubelet, kube-proxy and node.sh may set.
const SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/netfilter/nf_conntrack_max",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Host paths a node may create.
const PATHS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/crio",
    "/run/ipcns",
    "/run/utsns",
    "/run/netns",
    "/run/aether",
    "/run/aether-cni",
    "/var/lib/aether",
    "/sys/fs/cgroup/memory/kubepods",
    "/sys/fs/cgroup/cpu/kubepods",
];

impl HostState {
    /// Installs the node's Debian packages (`scripts/install-deps.sh node`, which `node.sh up`
    /// also runs; idempotent), then reads the host ([`HostState::capture`]). On a fresh machine
    /// `iptables` is one of those packages: reading the host before it is installed fails, and
    /// what installing it changes is the package's, not the node's.
    ///
    /// # Errors
    /// When the install fails (with its output), or as [`HostState::capture`].
    pub fn capture_before_up() -> anyhow::Result<Self> {
        let script = repo_root().join("scripts/install-deps.sh");
        let out = Command::new(&script)
            .arg("node")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} node", script.display()))?;
        if !out.status.success() {
            bail!(
                "scripts/install-deps.sh node failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self::capture()
    }

    /// Reads the host now.
    ///
    /// # Errors
    /// When `ip` or `iptables` cannot be run, or /proc cannot be read.
    pub fn capture() -> anyhow::Result<Self> {
        let mut items = BTreeSet::new();
        for k in SYSCTLS {
            let v = std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_else(|_| "(absent)".into());
            items.insert(format!("sysctl {k} = {}", v.trim()));
        }
        for ipt in ["iptables", "ip6tables"] {
            for table in ["filter", "nat", "mangle", "raw"] {
                for line in run(ipt, &["-t", table, "-S"])?.lines() {
                    items.insert(format!("{ipt} -t {table} {line}"));
                }
            }
        }
        for line in run("ip", &["-o", "link", "show"])?.lines() {
            // "<index>: <name>: <flags> ..." : the name is what matters.
            if let Some(name) = line.split(": ").nth(1) {
                items.insert(format!("link {name}"));
            }
        }
        for family in ["-4", "-6"] {
            for line in run("ip", &[family, "route", "show", "table", "all"])?.lines() {
                items.insert(format!("route {family} {line}"));
            }
        }
        for line in std::fs::read_to_string("/proc/self/mountinfo")?.lines() {
            if let Some(target) = line.split(' ').nth(4) {
                items.insert(format!("mount {target}"));
            }
        }
        for p in PATHS {
            items.insert(format!("path {p} exists: {}", Path::new(p).exists()));
        }
        // Top-level cgroups (kubelet's kubepods, runc's k8s.io, a multi-node kubelet's cgroupRoot).
        for h in ["memory", "cpu", "cpuset", "pids"] {
            for e in std::fs::read_dir(format!("/sys/fs/cgroup/{h}")).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    items.insert(format!("cgroup {h}/{}", e.file_name().to_string_lossy()));
                }
            }
        }
        Ok(HostState { items })
    }

    /// How the host differs from `self` once it has settled: captures again every 200 ms while
    /// it differs, for up to [`HOST_SETTLE`], and returns the last difference (empty when
    /// restored). What a teardown starts can end after it returns: the kernel frees a network
    /// namespace (and a veth of its with it) and a killed process's cgroup asynchronously.
    ///
    /// # Errors
    /// As [`HostState::capture`].
    pub fn diff_settled(&self) -> anyhow::Result<Vec<String>> {
        let deadline = std::time::Instant::now() + HOST_SETTLE;
        loop {
            let diff = self.diff(&HostState::capture()?);
            if diff.is_empty() || std::time::Instant::now() >= deadline {
                return Ok(diff);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// What changed from `self` to `now`: `- item` gone, `+ item` new.
    pub fn diff(&self, now: &HostState) -> Vec<String> {
        let gone = self.items.difference(&now.items).map(|i| format!("- {i}"));
        gone.chain(now.items.difference(&self.items).map(|i| format!("+ {i}"))).collect()
    }
}

/// Runs `cmd` with `args` in this process's namespaces: its stdout.
///
/// # Errors
/// When it cannot start or exits non-zero (with its stderr).
pub(crate) fn run(cmd: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cmd).args(args).output().with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `AETHER_NODES=<nodes> tests/harness/node.sh <action> <dir>` with the shape's
/// environment, its output appended to `<dir>/node-<action>.log` (`down` reads what `up` did from DIR,
/// whatever the shape given).
///
/// # Errors
/// When it fails: the error carries the tail of that log.
pub(crate) fn node_script(action: &str, dir: &Path, nodes: usize, shape: Shape) -> anyhow::Result<()> {
    let log = dir.join(format!("node-{action}.log"));
    // Appended to: the suite's drop runs `down` a second time, which must not hide the first's log.
    let out = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
    let status = Command::new(repo_root().join("tests/harness/node.sh"))
        .arg(action)
        .arg(dir)
        .env("AETHER_NODES", nodes.to_string())
        .envs(shape.env())
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .context("running tests/harness/node.sh")?;
    if !status.success() {
        bail!("AETHER_NODES={nodes} node.sh {action} {} failed ({status}):\n{}", dir.display(), tail(&log, 40));
    }
    Ok(())
}

/// Runs `ctr -a <sock> -n k8s.io ARGS` with the `ctr` of the containerd 2.x `make tools` built
/// (the nodes' default runtime; it also speaks to Debian's 1.6), or the one on PATH when that was
/// not built; returns stdout.
///
/// # Errors
/// On a non-zero exit, with ctr's stderr.
pub(crate) fn ctr(sock: &Path, args: &[&str]) -> anyhow::Result<String> {
    let built = tools_bin().with_file_name("containerd2").join("bin/ctr");
    let program = if built.exists() { built } else { PathBuf::from("ctr") };
    let out = Command::new(&program)
        .arg("-a")
        .arg(sock)
        .args(["-n", "k8s.io"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ctr")?;
    if !out.status.success() {
        bail!("ctr -a {} {} failed: {}", sock.display(), args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Fails, naming `what` and the cause, unless this process runs as root.
pub(crate) fn require_root(what: &str) -> anyhow::Result<()> {
    let uid = Command::new("id").arg("-u").output().context("running id -u")?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        bail!(
            "{what} needs root: it starts containerd and kubelet and changes the host's network \
             (run `make test` as root, as CI does)"
        );
    }
    Ok(())
}

/// Runs `helm ARGS` with `kubeconfig`, its cache, config and data under `dir/helm`; returns stdout.
///
/// # Errors
/// On a non-zero exit, with helm's stderr and stdout.
pub(crate) fn helm(kubeconfig: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(helm_bin())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .stdin(Stdio::null())
        .output()
        .context("running helm")?;
    if !out.status.success() {
        bail!(
            "helm {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last `n` lines of a file (empty if unreadable).
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Parses `export KEY=VALUE` lines.
fn read_env(path: &Path) -> anyhow::Result<NodeFacts> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let vars: BTreeMap<&str, &str> =
        text.lines().filter_map(|l| l.strip_prefix("export ")).filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| vars.get(k).map(|v| v.to_string()).with_context(|| format!("{} has no {k}", path.display()));
    Ok(NodeFacts {
        kubeconfig: get("KUBECONFIG")?.into(),
        node_name: get("AETHER_NODE_NAME")?,
        node_ip: get("AETHER_NODE_IP")?,
        node_ip6: vars.get("AETHER_NODE_IP6").filter(|v| !v.is_empty()).map(|v| v.to_string()),
        runtime: get("AETHER_RUNTIME")?,
        containerd_sock: vars.get("AETHER_CONTAINERD_SOCK").map(PathBuf::from),
        chart_sets: vars
            .get("AETHER_CHART_SETS")
            .map(|v| v.trim_matches('"').split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
        kubelet_root: get("AETHER_KUBELET_ROOT")?.into(),
    })
}
