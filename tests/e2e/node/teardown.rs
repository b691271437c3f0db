//! The last trials, in this order: `uninstall_leaves_no_release_object_and_nothing_on_the_host`
//! and `node_down_restores_the_host`.
//!
//! What they prove: `helm uninstall` leaves no release object and nothing of ours on the host (no
//! socket, pin, hand-over state, pod dir or mount; the CRD is kept by design); and `node.sh down`
//! leaves the host as it found it.

use aether_tests::eventually;
use anyhow::{Context, ensure};

use crate::env::{Env, NS, PINS, RELEASE, WAIT, uid};

pub(crate) fn uninstall_leaves_no_release_object_and_nothing_on_the_host(env: &Env) -> anyhow::Result<()> {
    let uids: Vec<String> = env.release_pods()?.iter().map(uid).collect::<anyhow::Result<_>>()?;
    // While the release runs, its hand-over state and the Envoys' shared memory are root-only.
    for dir in ["/run/aether-proxy", "/run/aether-proxy/shm"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir).with_context(|| dir.to_owned())?.permissions().mode() & 0o7777;
        ensure!(mode == 0o700, "{dir} is mode {mode:04o}, not 0700");
    }
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "web", "--wait=true"])?;
    env.node.helm(&["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "180s"])?;
    let kinds = "all,configmaps,secrets,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets,jobs";
    eventually("no object left in the release namespace", WAIT, || {
        let left = env.kube().ok(&["get", kinds, "-n", NS, "-o", "name"])?;
        // The namespace's own default ServiceAccount and kube-root-ca.crt are controller-manager's.
        let ours: Vec<&str> =
            left.lines().filter(|l| !matches!(*l, "serviceaccount/default" | "configmap/kube-root-ca.crt")).collect();
        if !ours.is_empty() {
            eprintln!("left in {NS}: {ours:?}");
        }
        Ok(ours.is_empty())
    })?;
    let cluster = env.kube().ok(&[
        "get",
        "clusterroles,clusterrolebindings,validatingwebhookconfigurations",
        "-l",
        "app.kubernetes.io/instance=aether",
        "-o",
        "name",
    ])?;
    ensure!(cluster.trim().is_empty(), "cluster-scoped objects left: {cluster}");
    env.kube().ok(&["get", "crd", "endpointpolicies.config.aether.io"]).context("the CRD is kept by design")?;
    // The host: nothing in the run dir, Envoy's admin dir included (the node's last launcher
    // removes its socket and the dir once no launcher holds it: docs/upgrade.md, "Uninstalling").
    let run: Vec<_> =
        std::fs::read_dir("/run/aether").map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    ensure!(run.is_empty(), "left in /run/aether: {run:?}");
    // The proxy's hand-over dir: the last launcher removed the node's state; only the (empty) shm
    // directory the kubelet created for the hostPath stays, and `start.lock`, which the launcher
    // never unlinks (a launcher may wait on it: proxy-launcher/src/state_dir.rs).
    let hand_over: Vec<_> = std::fs::read_dir("/run/aether-proxy")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| !(p.ends_with("start.lock") || (p.ends_with("shm") && p.is_dir())))
                .collect()
        })
        .unwrap_or_default();
    ensure!(hand_over.is_empty(), "left in /run/aether-proxy: {hand_over:?}");
    let shm: Vec<_> =
        std::fs::read_dir("/run/aether-proxy/shm").map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    ensure!(shm.is_empty(), "left in /run/aether-proxy/shm: {shm:?}");
    // No socket pins: the agent removed them at exit because its DaemonSet was deleted (only the
    // harness's shared bind mount of the dir itself stays, until `node.sh down`).
    let pins: Vec<_> = std::fs::read_dir(PINS).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    ensure!(pins.is_empty(), "left in {PINS}: {pins:?}");
    let root = env.node.facts().kubelet_root.join("pods");
    eventually("the release pods' dirs removed by the kubelet", WAIT, || {
        Ok(uids.iter().all(|u| !root.join(u).exists()))
    })?;
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .filter(|l| {
            uids.iter().any(|u| l.contains(u.as_str())) || l.contains("/run/aether/") || l.contains(&format!("{PINS}/"))
        })
        .map(str::to_owned)
        .collect();
    ensure!(mounts.is_empty(), "mounts left: {mounts:#?}");
    Ok(())
}

/// Last: `node.sh down`, then the host as it was before `up` (sysctls, iptables, links, routes,
/// mounts, created dirs). The suite's drop runs `down` again, which finds nothing to do.
pub(crate) fn node_down_restores_the_host(env: &Env) -> anyhow::Result<()> {
    let diff = env.node.down()?;
    ensure!(diff.is_empty(), "the host differs from before node.sh up:\n{}", diff.join("\n"));
    Ok(())
}
