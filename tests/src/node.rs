//! A real single node for the real-node suite: `tests/harness/node.sh up DIR` (containerd, kubelet,
//! kube-controller-manager, kube-scheduler, kube-proxy on top of etcd + kube-apiserver, images
//! imported from `tests/harness/images.sh`), and `node.sh down DIR` on drop, which restores the host.
//!
//! It needs root and changes the host (bridge, iptables chains, sysctls, mounts): a missing
//! prerequisite is an error naming the cause, never a skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::{Kubectl, repo_root, tools_bin};

/// What `node.sh up` wrote to `DIR/env`.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The Node's name.
    pub node_name: String,
    /// The node IP (the pod bridge's address; kube-apiserver listens there too).
    pub node_ip: String,
    /// containerd's socket (for `ctr`).
    pub containerd_sock: PathBuf,
    /// The kubelet's root dir (`<it>/pods` is the pods dir).
    pub kubelet_root: PathBuf,
}

/// A running real node; torn down (host restored) when dropped.
pub struct RealNode {
    dir: PathBuf,
    facts: NodeFacts,
}

impl RealNode {
    /// Brings a node up in a new folder under the system temp dir. The script's output goes to
    /// `<dir>/node-up.log`.
    ///
    /// # Errors
    /// Without root, or when `node.sh up` fails (it has torn down what it started); the error
    /// carries the tail of its log.
    pub fn up() -> anyhow::Result<Self> {
        let uid = Command::new("id").arg("-u").output().context("running id -u")?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            bail!(
                "the real-node suite needs root: it starts containerd and kubelet and changes the host's network \
                 (run `make test` as root, as CI does)"
            );
        }
        let dir = tempfile::Builder::new().prefix("aether-node-").tempdir()?.keep();
        let log = dir.join("node-up.log");
        let status = Command::new(script())
            .arg("up")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::OpenOptions::new().append(true).open(&log)?)
            .status()
            .context("running tests/harness/node.sh")?;
        if !status.success() {
            bail!("node.sh up {} failed ({status}):\n{}", dir.display(), tail(&log, 40));
        }
        let facts = read_env(&dir.join("env"))?;
        Ok(RealNode { dir, facts })
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
        let out = Command::new(tools_bin().join("helm"))
            .args(args)
            .env("KUBECONFIG", &self.facts.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"))
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

    /// Runs `ctr -n k8s.io ARGS` against the node's containerd; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with ctr's stderr.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("ctr")
            .arg("-a")
            .arg(&self.facts.containerd_sock)
            .args(["-n", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running ctr")?;
        if !out.status.success() {
            bail!("ctr {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The last `lines` lines of each component log (kubelet, containerd, kube-proxy, ...), for
    /// a failing test's message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for name in ["kubelet", "containerd", "kube-proxy", "kube-controller-manager", "kube-scheduler"] {
            let path = self.dir.join("logs").join(format!("{name}.log"));
            out.push_str(&format!("\n--- {} (last {lines} lines)\n{}", path.display(), tail(&path, lines)));
        }
        out
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        let log = self.dir.join("node-down.log");
        let ok = std::fs::File::create(&log).ok().and_then(|f| {
            let err = f.try_clone().ok()?;
            Command::new(script()).arg("down").arg(&self.dir).stdout(f).stderr(err).status().ok()
        });
        if !ok.is_some_and(|s| s.success()) {
            eprintln!("node.sh down {} failed:\n{}", self.dir.display(), tail(&log, 20));
        }
    }
}

fn script() -> PathBuf {
    repo_root().join("tests/harness/node.sh")
}

/// The last `n` lines of a file (empty if unreadable).
fn tail(path: &Path, n: usize) -> String {
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
        containerd_sock: get("AETHER_CONTAINERD_SOCK")?.into(),
        kubelet_root: get("AETHER_KUBELET_ROOT")?.into(),
    })
}
