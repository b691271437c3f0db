//! The real-node suite's shared environment (no trials): the node (`tests/harness/node.sh`) with
//! the charts installed in one namespace, and what every theme reads of it: the release's pods and
//! their restarts, Envoy's view of a cluster (its `/clusters` and config dump), the health gateway
//! on the host, a pod's socket at the kubelet's emptyDir path and its pin, client pods run from the
//! `uds-echo` image, and whether the release settled after an upgrade.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aether_tests::node::{RealNode, aether_chart_args};
use aether_tests::{Kubectl, eventually, unix_get_status};
use anyhow::{Context, bail};
use serde_json::Value;

/// Release namespace and name.
pub(crate) const NS: &str = "aether-system";
pub(crate) const RELEASE: &str = "aether";
/// Where the chart's defaults put the health gateway socket on the host.
pub(crate) const HEALTH_SOCKET: &str = "/run/aether/health.sock";
/// Envoy's admin socket on the host (`/run/aether` is the chart's `proxy.runDirHostPath`).
pub(crate) const ENVOY_ADMIN: &str = aether_fixtures::envoy::CHART_ADMIN_SOCKET;
/// The agent's admin port (`agent.adminPort`), on the host network.
pub(crate) const AGENT_ADMIN: u16 = 9091;
/// The node Envoy's stats listener (`proxy.stats.port`), on the host network.
pub(crate) const STATS_PORT: u16 = 15090;
pub(crate) const WAIT: Duration = Duration::from_secs(90);
/// The chart's default `agent.pinning.hostPath`: Envoy dials `<PINS>/<pod uid>.sock`.
pub(crate) const PINS: &str = "/run/aether-pins";

/// `GET path` on the node Envoy's admin socket: (status, body).
pub(crate) fn envoy_admin(path: &str) -> anyhow::Result<(u16, String)> {
    aether_tests::unix_http_get(Path::new(ENVOY_ADMIN), path)
}

/// Envoy's admin `/stats` answer (a `GET path` on `admin`, e.g. `/stats?filter=...`) as
/// `name -> value`, histograms included (their value starts with `P0(`).
///
/// # Errors
/// When the admin cannot be read.
pub(crate) fn envoy_stats(
    admin: impl FnOnce(&str) -> anyhow::Result<(u16, String)>,
    path: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let (_, body) = admin(path)?;
    Ok(body.lines().filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
}

/// The counters of `after` that differ from `before`, as `name before -> after`; histograms are
/// left out (their quantiles change with every window).
pub(crate) fn stats_changes(
    before: &std::collections::BTreeMap<String, String>,
    after: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v) && !v.starts_with("P0("))
        .map(|(k, v)| format!("{k} {} -> {v}", before.get(k).map_or("(none)", String::as_str)))
        .collect()
}

/// The shared environment: the node, and when the chart was installed.
pub(crate) struct Env {
    pub(crate) node: RealNode,
    pub(crate) installed_at: Instant,
}

impl Env {
    pub(crate) fn kube(&self) -> Kubectl {
        self.node.kube()
    }

    /// `helm install|upgrade` of charts/aether with the image sets, the node's own sets
    /// ([`aether_tests::node::NodeFacts::chart_sets`]) and `extra` sets, waiting for every
    /// workload and hook Job.
    pub(crate) fn helm_aether(&self, verb: &str, extra: &[&str]) -> anyhow::Result<String> {
        let args = aether_chart_args(verb, RELEASE, NS, &self.chart_sets(extra))?;
        self.node.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The node's chart sets ([`aether_tests::node::NodeFacts::chart_sets`]), then `extra`.
    pub(crate) fn chart_sets<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        self.node.facts().chart_sets.iter().map(String::as_str).chain(extra.iter().copied()).collect()
    }

    /// Service `default/<name>`'s ClusterIP with `port`, once the node's kube-proxy translates it
    /// (its nat rule, [`aether_tests::service_rules`]): no connection of a test may go there
    /// before, or a later one that reuses its source port meets its untranslated conntrack entry.
    pub(crate) fn service_target(&self, name: &str, port: u16) -> anyhow::Result<std::net::SocketAddr> {
        let ip = self.kube().ok(&["get", "service", "-n", "default", name, "-o", "jsonpath={.spec.clusterIP}"])?;
        let ip: std::net::IpAddr = ip.trim().parse().with_context(|| format!("Service {name}'s ClusterIP {ip:?}"))?;
        let target = std::net::SocketAddr::new(ip, port);
        aether_tests::service_rules::wait_programmed_here(target)?;
        Ok(target)
    }

    /// Health gateway answer for `cluster` on the host's socket.
    pub(crate) fn health(&self, cluster: &str) -> anyhow::Result<u16> {
        unix_get_status(Path::new(HEALTH_SOCKET), &format!("/healthz/{cluster}"))
    }

    /// Envoy's view of one cluster's first endpoint: (address as `/clusters` prints it, health flags).
    pub(crate) fn endpoint(&self, cluster: &str) -> anyhow::Result<Option<(String, String)>> {
        let (_, body) = envoy_admin("/clusters")?;
        Ok(cluster_endpoint(&body, cluster))
    }

    /// The `network_namespace_filepath` of `cluster`'s upstream bind config in Envoy's config dump.
    pub(crate) fn bind_netns(&self, cluster: &str) -> anyhow::Result<Option<String>> {
        let (_, body) = envoy_admin("/config_dump?resource=dynamic_active_clusters")?;
        let dump: Value = serde_json::from_str(&body).context("config_dump is JSON")?;
        let found = dump["configs"].as_array().into_iter().flatten().find(|c| c["cluster"]["name"] == cluster);
        Ok(found.and_then(|c| {
            c["cluster"]["upstream_bind_config"]["source_address"]["network_namespace_filepath"]
                .as_str()
                .map(str::to_owned)
        }))
    }

    /// Waits until `cluster` dials pod `uid`'s pin, healthy, and the pin (as the host sees it,
    /// through the agent's Bidirectional mount) is the very socket inode at `socket`.
    pub(crate) fn wait_pinned(&self, cluster: &str, uid: &str, socket: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let pin = format!("{PINS}/{uid}.sock");
        self.wait_healthy_at(cluster, &pin, |a| a == pin)?;
        eventually(&format!("{pin} holds the inode of {}", socket.display()), WAIT, || {
            let (p, s) = (std::fs::metadata(&pin)?, std::fs::symlink_metadata(socket)?);
            Ok((p.dev(), p.ino()) == (s.dev(), s.ino()))
        })
    }

    /// Waits until `cluster`'s endpoint address satisfies `addr_ok` and is healthy.
    pub(crate) fn wait_healthy_at(
        &self,
        cluster: &str,
        what: &str,
        addr_ok: impl Fn(&str) -> bool,
    ) -> anyhow::Result<()> {
        let mut last = None;
        eventually(&format!("{cluster} healthy at {what}"), WAIT, || {
            last = self.endpoint(cluster)?;
            Ok(last.as_ref().is_some_and(|(a, flags)| addr_ok(a) && flags == "healthy"))
        })
        .with_context(|| format!("last seen: {last:?}"))
    }

    pub(crate) fn pod_json(&self, ns: &str, name: &str) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.kube().ok(&["get", "pod", "-n", ns, name, "-o", "json"])?)?)
    }

    pub(crate) fn wait_pod_ready(&self, ns: &str, name: &str) -> anyhow::Result<Value> {
        self.kube().ok(&["wait", "-n", ns, "--for=condition=Ready", &format!("pod/{name}"), "--timeout=90s"])?;
        self.pod_json(ns, name)
    }

    /// The kubelet's path of `<volume>/<file>` in the pod's emptyDir.
    pub(crate) fn socket_path(&self, uid: &str, volume: &str, file: &str) -> PathBuf {
        self.node.facts().kubelet_root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/{volume}/{file}"))
    }

    /// Pods of the release's workloads (label app.kubernetes.io/instance), without the
    /// verify-install hook runners (the startup check Job's pod and the `helm test` Pod).
    pub(crate) fn release_pods(&self) -> anyhow::Result<Vec<Value>> {
        let selector = "app.kubernetes.io/instance=aether,app.kubernetes.io/component!=verify-install";
        let out = self.kube().ok(&["get", "pods", "-n", NS, "-l", selector, "-o", "json"])?;
        let v: Value = serde_json::from_str(&out)?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// The agent's pod (DaemonSet aether-node).
    pub(crate) fn node_pod(&self) -> anyhow::Result<Value> {
        self.component_pod("node")
    }

    /// Envoy's pod (DaemonSet aether-proxy).
    pub(crate) fn proxy_pod(&self) -> anyhow::Result<Value> {
        self.component_pod("proxy")
    }

    /// The one release pod labelled `app.kubernetes.io/component=<component>` that is not being
    /// deleted.
    pub(crate) fn component_pod(&self, component: &str) -> anyhow::Result<Value> {
        self.release_pods()?
            .into_iter()
            .find(|p| {
                p["metadata"]["labels"]["app.kubernetes.io/component"] == component
                    && p["metadata"].get("deletionTimestamp").is_none()
            })
            .with_context(|| format!("no {component} DaemonSet pod"))
    }
}

/// `(address, health_flags)` of the first host of `cluster` in Envoy's `/clusters` text
/// (`<cluster>::<address>::health_flags::<flags>`).
fn cluster_endpoint(clusters: &str, cluster: &str) -> Option<(String, String)> {
    clusters.lines().find_map(|l| {
        let mut it = l.split("::");
        let (name, addr, key, value) = (it.next()?, it.next()?, it.next()?, it.next()?);
        (name == cluster && key == "health_flags").then(|| (addr.to_owned(), value.to_owned()))
    })
}

pub(crate) fn uid(pod: &Value) -> anyhow::Result<String> {
    pod["metadata"]["uid"].as_str().map(str::to_owned).context("pod has no uid")
}

pub(crate) fn restarts(pod: &Value) -> Vec<(String, u64)> {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["name"].as_str().unwrap_or("?").to_owned(), c["restartCount"].as_u64().unwrap_or(u64::MAX)))
        .collect()
}

pub(crate) fn pod_name(pod: &Value) -> &str {
    pod["metadata"]["name"].as_str().unwrap_or("?")
}

/// The active dynamic listener `name` in Envoy's config dump: its `network_namespace_filepath`.
pub(crate) fn active_listener_netns(name: &str) -> anyhow::Result<Option<String>> {
    let (_, body) = envoy_admin("/config_dump?resource=dynamic_listeners")?;
    let dump: Value = serde_json::from_str(&body).context("config_dump is JSON")?;
    let found = dump["configs"].as_array().into_iter().flatten().find(|l| l["name"] == name);
    Ok(found.and_then(|l| {
        l["active_state"]["listener"]["address"]["socket_address"]["network_namespace_filepath"]
            .as_str()
            .map(str::to_owned)
    }))
}

impl Env {
    /// `kubectl run <name>` of `uds-echo --get <url>` (restartPolicy Never); waits until the pod
    /// ends and returns (succeeded, its log).
    pub(crate) fn client_get(&self, name: &str, url: &str) -> anyhow::Result<(bool, String)> {
        self.client_run(name, &["--get", url])
    }

    /// `kubectl run <name>` of `uds-echo <args>` (restartPolicy Never); waits until the pod ends
    /// and returns (succeeded, its log).
    pub(crate) fn client_run(&self, name: &str, client_args: &[&str]) -> anyhow::Result<(bool, String)> {
        let image = "--image=localhost/aether/uds-echo:dev";
        let mut args = vec!["run", name, "-n", "default", image, "--image-pull-policy=Never", "--restart=Never", "--"];
        args.extend(client_args);
        self.kube().ok(&args)?;
        let mut phase = String::new();
        eventually(&format!("client pod {name} ends"), WAIT, || {
            phase = self.pod_json("default", name)?["status"]["phase"].as_str().unwrap_or_default().to_owned();
            Ok(phase == "Succeeded" || phase == "Failed")
        })?;
        let log = self.kube().ok(&["logs", "-n", "default", name])?;
        self.kube().ok(&["delete", "pod", "-n", "default", name, "--wait=false"])?;
        Ok((phase == "Succeeded", log))
    }
}

/// After an upgrade (helm --wait returned): every release pod Ready with no restarts.
pub(crate) fn check_release_settled(env: &Env) -> anyhow::Result<()> {
    check_release_settled_with(env, 4)
}

/// Whether pod `p` (its JSON) has the condition `Ready` `True`.
pub(crate) fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The names (`kind/name`) of the objects of `kinds` (e.g. `jobs,pods`) in the release namespace
/// labelled as the startup check's (`app.kubernetes.io/component=verify-install`): empty once a
/// passed check or `helm test` took them away.
pub(crate) fn verify_install_objects(env: &Env, kinds: &str) -> anyhow::Result<String> {
    let names =
        env.kube().ok(&["get", kinds, "-n", NS, "-l", "app.kubernetes.io/component=verify-install", "-o", "name"])?;
    Ok(names.trim().to_owned())
}

/// [`check_release_settled`] for a release of `count` pods (3 with `controller.replicas=1`).
pub(crate) fn check_release_settled_with(env: &Env, count: usize) -> anyhow::Result<()> {
    eventually("release pods Ready with no restarts", WAIT, || {
        let pods = env.release_pods()?;
        let terminating = pods.iter().any(|p| p["metadata"].get("deletionTimestamp").is_some());
        for p in &pods {
            if let Some((c, r)) = restarts(p).into_iter().find(|(_, r)| *r > 0) {
                bail!("{}/{c} restarted {r} times: {}", pod_name(p), p["status"]["containerStatuses"]);
            }
        }
        Ok(!terminating && pods.len() == count && pods.iter().all(is_ready))
    })
}

/// What a failed install needs to be understood, most telling last (CI shows an output's tail):
/// component log tails (without the scheduler's and controller-manager's every-20-s
/// `configmap_cafile_content` noise), the node pod's logs, the node's conditions and taints, the
/// release namespace's pods that are not Running described (events included), all pods, and the
/// newest events.
pub(crate) fn context(env: &Env) -> String {
    let text = |args: &[&str]| match env.kube().run(args) {
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => format!("(kubectl {}: {e:#})", args.join(" ")),
    };
    let tails: String = env
        .node
        .log_tails(15)
        .lines()
        .filter(|l| !l.contains("configmap_cafile_content"))
        .collect::<Vec<_>>()
        .join("\n");
    let node = text(&[
        "get",
        "node",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} taints={.spec.taints}{range .status.conditions[*]}\n  {.type}={.status} {.reason}: {.message}{end}{end}",
    ]);
    let launchers: Vec<String> =
        text(&["logs", "-n", NS, "-l", "app.kubernetes.io/component=proxy", "-c", "envoy", "--tail=-1", "--prefix"])
            .lines()
            .filter(|l| l.contains("aether_proxy_launcher"))
            .map(str::to_owned)
            .collect();
    // Every container of the node pods (agent and proxy), with `extra` flags.
    let node_logs = |extra: &[&str]| {
        let selector = ["logs", "-n", NS, "-l", "app.kubernetes.io/component in (node,proxy)", "--all-containers"];
        text(&[&selector[..], extra, &["--prefix"]].concat())
    };
    let previous = node_logs(&["--previous", "--tail=20"]);
    let events = text(&["get", "events", "-A", "--sort-by=.lastTimestamp"]);
    let events: Vec<&str> = events.lines().rev().take(25).collect();
    format!(
        "{tails}\n--- node pod logs (agent and proxy)\n{}\n--- the proxy launchers' lines\n{}\n--- restarted node containers' previous logs\n{previous}\n--- node conditions\n{node}\n--- kubectl get pods -n {NS} (not Running)\n{}\n--- kubectl get pods -A\n{}\n--- recent events (newest first)\n{}",
        node_logs(&["--tail=15"]),
        launchers.join("\n"),
        text(&["get", "pods", "-n", NS, "--field-selector=status.phase!=Running", "-o", "wide"]),
        text(&["get", "pods", "-A", "-o", "wide"]),
        events.join("\n"),
    )
}

/// The release's revision now (`helm history`).
pub(crate) fn current_revision(env: &Env) -> anyhow::Result<u64> {
    let history: Value = serde_json::from_str(&env.node.helm(&["history", RELEASE, "-n", NS, "-o", "json"])?)?;
    history
        .as_array()
        .and_then(|h| h.last())
        .and_then(|r| r["revision"].as_u64())
        .context("no revision in helm history")
}
