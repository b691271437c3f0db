//! The multi-node suite: two real nodes on this machine (`AETHER_NODES=2 tests/harness/node.sh`:
//! each node its own network, mount and UTS namespaces, containerd, kubelet and kube-proxy; one
//! control plane; CoreDNS), both charts installed with `helm install`, and UDS-only apps
//! (`uds-echo` on a socket in an emptyDir) called by their Service's DNS name from pods on the
//! other node.
//!
//! What it proves: every node DaemonSet pod runs Ready on both nodes; one EndpointPolicy reaches
//! a Service's pods on both nodes while each node's agent and Envoy hold only that node's pods; a
//! client on one node reaches a UDS-only Service whose pod runs on the other, over the pod's
//! socket, counted by the serving node's inbound listener (both directions), and the same app over
//! TCP answers too; a rolling upgrade of both node DaemonSets across both nodes under steady load
//! fails no request; an agent restarted while its node cannot reach the API server keeps its
//! node serving, the other node unaffected; `kubectl drain` moves a UDS pod to the other node,
//! where it is served over its socket, and leaves nothing of it on the drained node; `node.sh
//! down` leaves the host as it found it.
//!
//! The nodes run containerd 2.x and runc built by `make tools` (node.sh's default, config
//! version 3).
//!
//! Needs root (CI runs as root); without it the suite fails, naming the cause.

#[path = "suite.rs"]
mod suite;

use std::net::SocketAddr;
use std::time::Duration;

use aether_fixtures::policy;
use aether_tests::continuity::{self, Load, Report};
use aether_tests::node::{
    IpFamily, README_NODE_NAMESPACE, Runtime, Shape, aether_chart_args, release_namespace_command,
};
use aether_tests::nodes::{ClusterNode, RESTRICTED_CONTAINER, RESTRICTED_POD, RealNodes, app};
use aether_tests::{Kubectl, eventually};
use anyhow::{Context, ensure};
use serde_json::Value;

/// Release namespace and name, and the node side's namespace (the README's install).
const NS: &str = "aether-system";
const NODE_NS: &str = README_NODE_NAMESPACE;
const RELEASE: &str = "aether";
/// The agent's admin port and its debug port (chart defaults; 0.0.0.0 and 127.0.0.1 of each
/// node). Envoy's admin is a Unix socket: `ClusterNode::envoy_admin`.
const AGENT_ADMIN: u16 = 9091;
const AGENT_DEBUG: u16 = 9092;
/// The chart's default `agent.pinning.hostPath`, in each node's own file system.
const PINS: &str = "/run/aether-pins";
const WAIT: Duration = Duration::from_secs(120);
const NODE1: &str = "aether-node-1";
const NODE2: &str = "aether-node-2";

struct Env {
    nodes: RealNodes,
}

fn pod_name(pod: &Value) -> &str {
    pod["metadata"]["name"].as_str().unwrap_or("?")
}

fn node_name(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or("?")
}

fn uid(pod: &Value) -> anyhow::Result<&str> {
    pod["metadata"]["uid"].as_str().context("pod has no uid")
}

fn is_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn restarts(pod: &Value) -> u64 {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["restartCount"].as_u64().unwrap_or(0))
        .sum()
}

impl Env {
    fn kube(&self) -> Kubectl {
        self.nodes.kube()
    }

    fn node(&self, name: &str) -> &ClusterNode {
        self.nodes.node(name).expect("the suite's nodes are aether-node-1 and aether-node-2")
    }

    fn helm_aether(&self, verb: &str, extra: &[&str]) -> anyhow::Result<String> {
        // The README's install: the node side in its own namespace (kept on every upgrade).
        let node_ns = format!("daemonset.namespace={NODE_NS}");
        let sets: Vec<&str> = std::iter::once(node_ns.as_str()).chain(extra.iter().copied()).collect();
        let args = aether_chart_args(verb, RELEASE, NS, &sets)?;
        self.nodes.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn pods(&self, ns: &str, selector: &str) -> anyhow::Result<Vec<Value>> {
        let out = self.kube().ok(&["get", "pods", "-n", ns, "-l", selector, "-o", "json"])?;
        let list: Value = serde_json::from_str(&out)?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until Deployment `name` has `count` Ready pods (none terminating) and returns them.
    fn wait_app_ready(&self, name: &str, count: usize) -> anyhow::Result<Vec<Value>> {
        let mut pods = Vec::new();
        eventually(&format!("{count} Ready pod(s) of {name}"), WAIT, || {
            pods = self.pods("default", &format!("app={name}"))?;
            Ok(pods.len() == count && pods.iter().all(is_ready))
        })
        .with_context(|| {
            format!(
                "pods of {name}: {:?}",
                pods.iter().map(|p| (pod_name(p), node_name(p), &p["status"]["phase"])).collect::<Vec<_>>()
            )
        })?;
        Ok(pods)
    }

    /// Waits until a TCP connection from `node`'s network namespace to Service `name`'s ClusterIP
    /// port 8080 opens, once every node's kube-proxy has programmed it ([`Env::service_target`]):
    /// the pod is Ready and its EndpointSlice published (Ready alone races both).
    fn wait_service_reachable(&self, name: &str, node: &str) -> anyhow::Result<()> {
        let target = self.service_target(name)?;
        let from = self.node(node);
        eventually(&format!("Service {name} ({target}) reachable from {node}"), WAIT, || {
            from.in_netns(move || Ok(std::net::TcpStream::connect_timeout(&target, Duration::from_secs(1)).is_ok()))
        })
    }

    /// A client pod on `node` running `uds-echo --get <url>` (restartPolicy Never); waits until it
    /// ends and returns (succeeded, its log).
    fn client_get(&self, pod: &str, node: &str, url: &str) -> anyhow::Result<(bool, String)> {
        // Strategic merge: the container keeps kubectl run's image and args. Restricted: the
        // cluster enforces that Pod Security level by default.
        let overrides = format!(
            r#"{{"spec":{{"nodeName":"{node}","securityContext":{RESTRICTED_POD},"containers":[{{"name":"{pod}","securityContext":{RESTRICTED_CONTAINER}}}]}}}}"#
        );
        self.kube().ok(&[
            "run",
            pod,
            "-n",
            "default",
            "--image=localhost/aether/uds-echo:dev",
            "--image-pull-policy=Never",
            "--restart=Never",
            "--override-type=strategic",
            &format!("--overrides={overrides}"),
            "--",
            "--get",
            url,
        ])?;
        let mut phase = String::new();
        eventually(&format!("client pod {pod} ends"), WAIT, || {
            let out = self.kube().ok(&["get", "pod", "-n", "default", pod, "-o", "jsonpath={.status.phase}"])?;
            phase = out.trim().to_owned();
            Ok(phase == "Succeeded" || phase == "Failed")
        })?;
        let log = self.kube().ok(&["logs", "-n", "default", pod])?;
        self.kube().ok(&["delete", "pod", "-n", "default", pod, "--wait=false"])?;
        Ok((phase == "Succeeded", log))
    }

    /// The Envoy `/clusters` text of `node`.
    fn clusters(&self, node: &str) -> anyhow::Result<String> {
        Ok(self.node(node).envoy_admin("/clusters")?.1)
    }

    /// The names of `node`'s Envoy dynamic listeners.
    fn listeners(&self, node: &str) -> anyhow::Result<Vec<String>> {
        let (_, body) = self.node(node).envoy_admin("/listeners?format=json")?;
        let v: Value = serde_json::from_str(&body).context("/listeners is JSON")?;
        Ok(v["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// The value of counter `stat` in `node`'s Envoy (0 when absent).
    fn counter(&self, node: &str, stat: &str) -> anyhow::Result<u64> {
        let (_, body) = self.node(node).envoy_admin(&format!("/stats?filter=^{}$", stat.replace('.', "\\.")))?;
        Ok(body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{stat}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    }

    /// `node`'s agent `/debug/pods`: (the node it names, the pods it lists as `namespace/name`).
    fn agent_pods(&self, node: &str) -> anyhow::Result<(String, Vec<(String, String)>)> {
        let (code, body) = self.node(node).http_get(AGENT_DEBUG, "/debug/pods")?;
        ensure!(code == 200, "{node}'s agent /debug/pods: {code} {body}");
        let v: Value = serde_json::from_str(&body).context("/debug/pods is JSON")?;
        let pods = v["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    format!("{}/{}", p["namespace"].as_str().unwrap_or("?"), p["name"].as_str().unwrap_or("?")),
                    p["delivery"].to_string(),
                )
            })
            .collect();
        Ok((v["node"].as_str().unwrap_or_default().to_owned(), pods))
    }

    /// The live agent pod (component node) on `node`.
    fn agent_on(&self, node: &str) -> anyhow::Result<Value> {
        self.pods(NODE_NS, "app.kubernetes.io/component=node")?
            .into_iter()
            .find(|p| node_name(p) == node && p["metadata"]["deletionTimestamp"].is_null())
            .with_context(|| format!("no agent pod on {node}"))
    }

    /// Waits until `node` has a Ready agent pod other than `old`. The DaemonSet controller retries
    /// a refused creation with a growing backoff; an annotation on the DaemonSet (not its pod
    /// template) makes it look again at once, so the wait measures the fix, not the backoff.
    fn agent_replaced_on(&self, node: &str, old: &str) -> anyhow::Result<()> {
        let nudge = format!("test.aether.io/nudge={}", chrono_now());
        self.kube().ok(&["annotate", "daemonset", "-n", NODE_NS, "aether-node", &nudge, "--overwrite"])?;
        eventually(&format!("a new Ready agent pod on {node}"), WAIT, || {
            let pod = self.agent_on(node);
            Ok(pod.is_ok_and(|p| pod_name(&p) != old && is_ready(&p)))
        })
    }

    /// The node pods (agent: component node; Envoy: component proxy) of the release.
    fn node_pods(&self) -> anyhow::Result<Vec<Value>> {
        self.pods(NODE_NS, "app.kubernetes.io/component in (node,proxy)")
    }

    fn service_ip(&self, name: &str) -> anyhow::Result<String> {
        Ok(self
            .kube()
            .ok(&["get", "service", "-n", "default", name, "-o", "jsonpath={.spec.clusterIP}"])?
            .trim()
            .to_owned())
    }

    /// Service `name`'s ClusterIP port 8080, once the kube-proxy of every node has programmed it:
    /// a load sent before that leaves untranslated conntrack entries that later connections of the
    /// same load can meet (`aether_tests::service_rules`).
    fn service_target(&self, name: &str) -> anyhow::Result<SocketAddr> {
        let target: SocketAddr = format!("{}:8080", self.service_ip(name)?).parse()?;
        for node in [NODE1, NODE2] {
            let on = self.node(node);
            aether_tests::service_rules::wait_programmed(|cmd| on.run(&[cmd]), target)?;
        }
        Ok(target)
    }

    /// Waits until both node DaemonSets are rolled out on every node.
    fn node_daemonsets_rolled_out(&self) -> anyhow::Result<()> {
        for ds in ["daemonset/aether-node", "daemonset/aether-proxy"] {
            self.kube().ok(&["rollout", "status", "-n", NODE_NS, ds, "--timeout=300s"])?;
        }
        eventually("every node pod Ready, one per DaemonSet per node", WAIT, || {
            let pods = self.node_pods()?;
            Ok(pods.len() == 4 && pods.iter().all(is_ready))
        })
    }
}

/// Runs `event` while the field load ([`continuity::run`]) runs from `from`'s network namespace to
/// each of `targets` (a Service's ClusterIP, through `from`'s kube-proxy): 2 s before it, 3 s
/// after it returns. Returns one report per target.
fn under_load_from(
    from: &ClusterNode,
    targets: &[(SocketAddr, &str)],
    event: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Report>> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let loads: Vec<Load> = targets.iter().map(|(t, expect)| Load::field(*t, "/continuity", expect)).collect();
    std::thread::scope(|s| {
        let running = s.spawn(move || {
            from.in_netns(move || {
                let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
                Ok(rt.block_on(async {
                    let runs = loads.iter().map(|load| {
                        let mut stop = stop_rx.clone();
                        continuity::run(load, async move {
                            let _ = stop.wait_for(|s| *s).await;
                        })
                    });
                    futures::future::join_all(runs).await
                }))
            })
        });
        std::thread::sleep(Duration::from_secs(2));
        let done = event();
        std::thread::sleep(Duration::from_secs(3));
        let _ = stop_tx.send(true);
        let reports = running.join().map_err(|_| anyhow::anyhow!("the load thread panicked"))??;
        done?;
        Ok(reports)
    })
}

// --- trials ------------------------------------------------------------------------------------

fn two_nodes_run_every_node_daemonset_pod_ready(env: &Env) -> anyhow::Result<()> {
    println!("$ kubectl get nodes -o wide\n{}", env.kube().ok(&["get", "nodes", "-o", "wide"])?);
    // The runtime the suite asked for (setup: containerd 2.x), as each kubelet reports it.
    let runtimes =
        env.kube().ok(&["get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.containerRuntimeVersion}"])?;
    let runtimes: Vec<&str> = runtimes.split_whitespace().collect();
    ensure!(
        runtimes.len() == 2 && runtimes.iter().all(|r| r.starts_with("containerd://2.")),
        "both nodes run containerd 2.x: {runtimes:?}"
    );
    let pods = env.node_pods()?;
    let mut seen: Vec<(String, String)> = pods
        .iter()
        .map(|p| {
            (
                p["metadata"]["labels"]["app.kubernetes.io/component"].as_str().unwrap_or("?").to_owned(),
                node_name(p).to_owned(),
            )
        })
        .collect();
    seen.sort();
    let want: Vec<(String, String)> =
        ["node", "proxy"].iter().flat_map(|c| [NODE1, NODE2].map(|n| (c.to_string(), n.to_owned()))).collect();
    ensure!(seen == want, "node pods by (component, node): {seen:?}");
    for p in &pods {
        ensure!(
            is_ready(p) && restarts(p) == 0,
            "{} on {}: ready {}, restarts {}",
            pod_name(p),
            node_name(p),
            is_ready(p),
            restarts(p)
        );
    }
    for ns in [NS, NODE_NS] {
        println!("$ kubectl get pods -n {ns} -o wide\n{}", env.kube().ok(&["get", "pods", "-n", ns, "-o", "wide"])?);
    }
    Ok(())
}

/// Deploys `spread` (one pod per node, relayed as HTTP so that the roll holds its keep-alive
/// clients to no lost request) and its policy `spread-uds`, as they are or again, and returns its
/// pods once both are Ready: kubelet's probe passed through the inbound listener, so the policy
/// applied there.
fn deploy_spread(env: &Env) -> anyhow::Result<Vec<Value>> {
    let spread = app("spread").one_per_node().annotation(aether_crds::pod::INBOUND_PROXY_ANNOTATION, "http");
    env.kube().apply(&spread.deployment_manifest(2))?;
    env.kube().apply(&policy("default", "spread-uds").target("spread").socket("s/app.sock").manifest())?;
    env.wait_app_ready("spread", 2)
}

fn one_policy_reaches_pods_on_both_nodes_and_each_agent_serves_only_its_own(env: &Env) -> anyhow::Result<()> {
    let pods = deploy_spread(env)?;
    let mut nodes: Vec<&str> = pods.iter().map(node_name).collect();
    nodes.sort();
    ensure!(nodes == [NODE1, NODE2], "one pod of spread per node: {nodes:?}");
    for node in [NODE1, NODE2] {
        let (named, listed) = env.agent_pods(node)?;
        ensure!(named == node, "{node}'s agent says it serves node {named}");
        let own: Vec<&Value> = pods.iter().filter(|p| node_name(p) == node).collect();
        let other: Vec<&Value> = pods.iter().filter(|p| node_name(p) != node).collect();
        for p in &own {
            let key = format!("default/{}", pod_name(p));
            ensure!(
                listed.iter().any(|(k, d)| *k == key && d == "\"pipe\""),
                "{node}'s agent lists {key} on its socket: {listed:?}"
            );
        }
        let clusters = env.clusters(node)?;
        for p in &other {
            let key = format!("default/{}", pod_name(p));
            ensure!(
                !listed.iter().any(|(k, _)| *k == key),
                "{node}'s agent lists {key}, a pod of the other node: {listed:?}"
            );
            let cluster = format!("app_default_{}_8080", pod_name(p));
            ensure!(
                !clusters.contains(&format!("{cluster}::")),
                "{node}'s Envoy has {cluster}, a pod of the other node"
            );
        }
        let every_listed_is_own = listed.iter().all(|(k, _)| {
            !k.starts_with("default/spread-") || own.iter().any(|p| *k == format!("default/{}", pod_name(p)))
        });
        ensure!(every_listed_is_own, "{node}'s agent lists: {listed:?}");
        println!(
            "{node}: agent /debug/pods {listed:?}; Envoy has app_default_{}_8080",
            own.first().map(|p| pod_name(p)).unwrap_or("?")
        );
        // `kubectl aether why` with its defaults finds that node's agent in the README's node
        // namespace and reads its decision through a port-forward (kubelet of that node).
        let p = own.first().context("a spread pod on this node")?;
        let out = std::process::Command::new(aether_tests::workspace_bin("kubectl-aether")?)
            .arg("--kubeconfig")
            .arg(env.nodes.kubeconfig())
            .args(["why", &format!("pod/{}", pod_name(p)), "-n", "default", "-o", "json"])
            .stdin(std::process::Stdio::null())
            .output()?;
        ensure!(out.status.success(), "kubectl aether why: {}", String::from_utf8_lossy(&out.stderr));
        let why: Value = serde_json::from_slice(&out.stdout)?;
        ensure!(why["live"] == true && why["agent"]["namespace"] == NODE_NS && why["node"] == node, "{why:#}");
        ensure!(why["decision"]["delivery"] == "pipe" && why["decision"]["policy"] == "spread-uds", "{why:#}");
    }
    Ok(())
}

fn a_client_on_each_node_calls_a_uds_only_service_on_the_other_by_name(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&app("web-1").annotated().only_on_node(NODE1).deployment_manifest(1))?;
    env.kube().apply(&app("web-2").annotated().only_on_node(NODE2).deployment_manifest(1))?;
    for (service, client_node) in [("web-2", NODE1), ("web-1", NODE2)] {
        let server = env.wait_app_ready(service, 1)?.remove(0);
        let (server_pod, server_node) = (pod_name(&server).to_owned(), node_name(&server).to_owned());
        ensure!(server_node != client_node, "the server of {service} runs on {server_node}, the client's node");
        env.wait_service_reachable(service, client_node)?;
        let stat = format!("tcp.inbound_default_{server_pod}_8080.downstream_cx_total");
        let before = env.counter(&server_node, &stat)?;
        let url = format!("http://{service}.default.svc.cluster.local:8080/cross");
        let client = format!("client-of-{service}");
        let (ok, body) = env.client_get(&client, client_node, &url)?;
        println!("client pod {client} on {client_node}: uds-echo --get {url}\n{}", body.trim_end());
        ensure!(ok, "the call failed: {body}");
        ensure!(
            body.contains(&format!("{server_pod} over unix:/s/app.sock: GET /cross")),
            "answer over the socket of {server_pod}: {body}"
        );
        let after = env.counter(&server_node, &stat)?;
        println!("{server_node}'s Envoy {stat}: {before} -> {after}");
        ensure!(after > before, "{server_node}'s inbound listener counted no connection ({stat}: {before} -> {after})");
    }
    Ok(())
}

fn the_same_app_answers_over_its_socket_and_over_tcp_from_the_other_node(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&app("tcp-2").over_tcp().only_on_node(NODE2).deployment_manifest(1))?;
    env.wait_app_ready("tcp-2", 1)?;
    env.wait_app_ready("web-2", 1)?;
    for (service, over) in [("web-2", "over unix:/s/app.sock"), ("tcp-2", "over tcp:0.0.0.0:8080")] {
        env.service_target(service)?;
        let url = format!("http://{service}.default.svc.cluster.local:8080/both");
        let (ok, body) = env.client_get(&format!("both-{service}"), NODE1, &url)?;
        println!("from {NODE1}: {url}: {}", body.trim_end());
        ensure!(ok && body.contains(over), "{url}: {body}");
    }
    Ok(())
}

/// `AETHER_ROLLS` (default 1): how many rolls [`a_rolling_upgrade_of_every_node_daemonset_fails_no_request`]
/// runs in a row (`make test-roll-loop` runs 20).
const ROLLS_VAR: &str = "AETHER_ROLLS";

/// A `helm upgrade` that rolls both node DaemonSets on both nodes, under the field load from node
/// 1 through Service `spread` (relayed as HTTP): no request refused or wrongly answered, no second
/// without a served one, no request lost on a keep-alive connection (each replaced Envoy ends
/// its keep-alive connections between requests, announced). One roll (the default) is held to
/// [`continuity::check_planned`]; several in a row (`AETHER_ROLLS`, alternating two sets of values
/// so that each is a roll) likewise: every request of every roll must be served.
fn a_rolling_upgrade_of_every_node_daemonset_fails_no_request(env: &Env) -> anyhow::Result<()> {
    let rolls: u32 = match std::env::var(ROLLS_VAR) {
        Ok(v) => {
            v.parse().ok().filter(|n| (1..=100).contains(n)).with_context(|| format!("{ROLLS_VAR}={v:?}: 1 to 100"))?
        }
        Err(_) => 1,
    };
    deploy_spread(env)?;
    let target: SocketAddr = env.service_target("spread")?;
    let mut reports = Vec::new();
    for n in 1..=rolls {
        let values: &[&str] = if n % 2 == 1 {
            &["proxy.logLevel=warning", "agent.recheckSeconds=9"]
        } else {
            &["proxy.logLevel=info", "agent.recheckSeconds=10"]
        };
        let r = one_roll(env, target, values)?;
        println!("roll {n} of {rolls}: {}", r.summary());
        let what = format!("roll {n} of {rolls}");
        continuity::check_planned(&[(what.as_str(), &r)])?;
        ensure!(
            r.keepalive.iter().all(|k| k.cut.is_none() && k.announced >= 1),
            "roll {n} of {rolls}: a keep-alive request was lost or a connection not ended announced: {}",
            r.summary()
        );
        reports.push(r);
    }
    if rolls > 1 {
        let requests: usize = reports.iter().map(|r| r.requests.len()).sum();
        let served: u64 = reports.iter().flat_map(|r| &r.keepalive).map(|k| k.served).sum();
        println!(
            "{rolls} rolls in a row: 0 of {requests} new-connection requests and 0 of {served} keep-alive requests failed"
        );
    }
    Ok(())
}

/// One roll of both node DaemonSets by `helm upgrade` with `values`, under the field load on
/// `target` from node 1; prints what to read a failure against.
fn one_roll(env: &Env, target: SocketAddr, values: &[&str]) -> anyhow::Result<Report> {
    let expect = "over unix:/s/app.sock";
    let before: Vec<(String, String)> =
        env.node_pods()?.iter().map(|p| (pod_name(p).to_owned(), node_name(p).to_owned())).collect();
    let counters = || -> anyhow::Result<Vec<_>> { [NODE1, NODE2].iter().map(|n| env.node(n).tcp_counters()).collect() };
    let tcp_before = counters()?;
    println!("load starts at {} (UTC)", chrono_now());
    let reports = under_load_from(env.node(NODE1), &[(target, expect)], || {
        env.helm_aether("upgrade", values)?;
        env.node_daemonsets_rolled_out()
    })?;
    // What a lost request would be read against: the kernel's drops, retransmissions and resets
    // in each node's netns over the roll (the client's SYNs and retransmissions are node 1's).
    for ((node, before), after) in [NODE1, NODE2].iter().zip(&tcp_before).zip(&counters()?) {
        println!("{node}'s netns TCP counters over the roll: {}", aether_tests::tcp_counters::deltas(before, after));
    }
    let after: Vec<(String, String)> =
        env.node_pods()?.iter().map(|p| (pod_name(p).to_owned(), node_name(p).to_owned())).collect();
    ensure!(before.iter().all(|b| !after.contains(b)), "every node pod replaced: before {before:?}, after {after:?}");
    let r = reports.into_iter().next().context("no report")?;
    println!(
        "helm upgrade of both node DaemonSets on both nodes, load from {NODE1} through Service spread: {}",
        r.summary()
    );
    for k in &r.keepalive {
        println!("  keep-alive client {k:?}");
    }
    if r.failed() > 0 {
        // What to read a failure against: each node's listener churn and hand-over epoch, and any
        // readiness probe of the app that failed (an endpoint removed under the load).
        for node in [NODE1, NODE2] {
            let (_, stats) = env.node(node).envoy_admin(
                "/stats?filter=listener_manager.listener_(added|modified|removed|in_place_updated)|server.hot_restart_epoch",
            )?;
            println!("{node}'s Envoy: {}", stats.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        let unhealthy =
            env.kube().ok(&["get", "events", "-n", "default", "--field-selector", "reason=Unhealthy", "-o", "wide"])?;
        println!("readiness failures in default:\n{unhealthy}");
        for (i, o) in r.requests.iter().enumerate().filter(|(_, o)| o.failure.is_some()) {
            println!("  request {i} at +{:.3} s: {:?}", o.at.as_secs_f64(), o.failure);
        }
    }
    Ok(r)
}

/// Blocks `node`'s route to the API server (a blackhole route to its address in the node's netns:
/// the node's kubelet and agent see an outage, pods on other nodes still reach its pods); the
/// route is removed when dropped, on every exit path.
struct CutFromApiServer<'a>(&'a ClusterNode, String);

impl<'a> CutFromApiServer<'a> {
    fn cut(node: &'a ClusterNode, apiserver: &str) -> anyhow::Result<Self> {
        node.run(&["ip", "route", "add", "blackhole", &format!("{apiserver}/32")])?;
        Ok(CutFromApiServer(node, apiserver.to_owned()))
    }
}

impl Drop for CutFromApiServer<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.run(&["ip", "route", "del", "blackhole", &format!("{}/32", self.1)]) {
            eprintln!("restoring {}'s route to the API server: {e:#}", self.0.name);
        }
    }
}

fn an_agent_restarted_while_its_node_cannot_reach_the_api_server_keeps_serving(env: &Env) -> anyhow::Result<()> {
    let web1: SocketAddr = env.service_target("web-1")?;
    let web2: SocketAddr = env.service_target("web-2")?;
    let agent = env
        .pods(NODE_NS, "app.kubernetes.io/component=node")?
        .into_iter()
        .find(|p| node_name(p) == NODE1)
        .context("node 1's agent pod")?;
    let id = agent["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "aether-agent")
        .and_then(|c| c["containerID"].as_str())
        .context("the agent container's ID")?
        .trim_start_matches("containerd://")
        .to_owned();
    let (apiserver, port) = env.nodes.apiserver();
    let node1 = env.node(NODE1);
    let started = |n: &ClusterNode| -> Option<String> {
        let (_, body) = n.http_get(AGENT_ADMIN, "/metrics").ok()?;
        body.lines().find(|l| l.starts_with("process_start_time_seconds ")).map(str::to_owned)
    };
    let first = started(node1);
    let reports =
        under_load_from(env.node(NODE2), &[(web1, "over unix:/s/app.sock"), (web2, "over unix:/s/app.sock")], || {
            let _cut = CutFromApiServer::cut(node1, apiserver)?;
            let refused = node1.run(&[
                "sh",
                "-c",
                &format!("timeout 2 bash -c '</dev/tcp/{apiserver}/{port}' && echo reached || echo cut"),
            ]);
            println!(
                "{NODE1} to the API server while cut: {}",
                refused.map(|s| s.trim().to_owned()).unwrap_or_else(|e| format!("{e:#}"))
            );
            node1.ctr(&["tasks", "kill", "-s", "SIGKILL", &id])?;
            eventually("node 1's agent restarted in place and ready (Envoy ACKed its replayed state)", WAIT, || {
                let now = started(node1);
                Ok(now.is_some() && now != first && node1.http_get(AGENT_ADMIN, "/readyz").map(|(c, _)| c)? == 200)
            })?;
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        })?;
    println!("agent of {NODE1} killed while {NODE1} was cut from the API server; load from {NODE2}:");
    println!("  to web-1 (its pod on {NODE1}): {}", reports[0].summary());
    println!("  to web-2 (its pod on {NODE2}): {}", reports[1].summary());
    for (r, what) in reports.iter().zip(["web-1", "web-2"]) {
        ensure!(r.failed() == 0 && r.keepalive.iter().all(|k| k.cut.is_none()), "{what}: {}", r.summary());
    }
    Ok(())
}

/// Uncordons a node when dropped, on every exit path.
struct Cordoned<'a>(&'a Env, &'a str);

impl Drop for Cordoned<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.kube().ok(&["uncordon", self.1]) {
            eprintln!("kubectl uncordon {}: {e:#}", self.1);
        }
    }
}

fn a_drained_nodes_uds_pod_is_served_over_its_socket_on_the_other_node(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&app("mover").annotated().prefer_node(NODE2).deployment_manifest(1))?;
    let old = env.wait_app_ready("mover", 1)?.remove(0);
    ensure!(node_name(&old) == NODE2, "mover prefers {NODE2}, yet runs on {}", node_name(&old));
    let (old_name, old_uid) = (pod_name(&old).to_owned(), uid(&old)?.to_owned());
    let drained = Cordoned(env, NODE2);
    let out = env.kube().ok(&["drain", NODE2, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s"])?;
    println!("$ kubectl drain {NODE2} --ignore-daemonsets --delete-emptydir-data\n{}", out.trim_end());
    let new = env.wait_app_ready("mover", 1)?.remove(0);
    let (new_name, new_uid) = (pod_name(&new).to_owned(), uid(&new)?.to_owned());
    ensure!(node_name(&new) == NODE1 && new_uid != old_uid, "mover's new pod {new_name} runs on {}", node_name(&new));
    let pin = format!("{PINS}/{new_uid}.sock");
    let cluster = format!("app_default_{new_name}_8080");
    eventually(&format!("{NODE1}'s Envoy dials {cluster} at its pin, healthy"), WAIT, || {
        Ok(env.clusters(NODE1)?.lines().any(|l| l == format!("{cluster}::{pin}::health_flags::healthy")))
    })?;
    let url = "http://mover.default.svc.cluster.local:8080/moved";
    let (ok, body) = env.client_get("client-of-mover", NODE1, url)?;
    println!("after the drain, from {NODE1}: {url}: {}", body.trim_end());
    ensure!(ok && body.contains(&format!("{new_name} over unix:/s/app.sock")), "{body}");
    let old_cluster = format!("app_default_{old_name}_8080");
    let old_listener = format!("inbound_default_{old_name}_8080");
    let old_pin = env.node(NODE2).path(&format!("{PINS}/{old_uid}.sock"));
    eventually(&format!("nothing of {old_name} left on {NODE2}"), WAIT, || {
        Ok(!env.clusters(NODE2)?.contains(&format!("{old_cluster}::"))
            && !env.listeners(NODE2)?.contains(&old_listener)
            && !old_pin.exists())
    })?;
    let (_, listed) = env.agent_pods(NODE2)?;
    ensure!(!listed.iter().any(|(k, _)| k.ends_with(&old_name)), "{NODE2}'s agent still lists {old_name}: {listed:?}");
    println!("{NODE2}: no cluster {old_cluster}, no listener {old_listener}, no pin {}", old_pin.display());
    drop(drained);
    Ok(())
}

/// The wall clock (UTC, `date +%T.%3N`), to read a load's `+N s` against component logs.
fn chrono_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%T.%3N"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The cluster enforces Pod Security `restricted` by default and limits the critical priority
/// classes to namespaces with a quota scoped to them (controlplane.sh's
/// `AETHER_APISERVER_RESTRICTED`, as GKE): installed as the README says, the controller runs in the
/// release namespace under `restricted` (no label there), the node pods at system-node-critical
/// in the chart's own namespace, labelled `privileged` (only that label lets them run), counted
/// by the chart's quota. Taking either away, the DaemonSet cannot replace an agent pod, and `helm
/// test` (the install check) names the cause from its FailedCreate Event; restoring it brings the
/// pod back.
fn node_pods_need_the_privileged_label_and_the_charts_quota_and_the_install_check_names_what_is_missing(
    env: &Env,
) -> anyhow::Result<()> {
    let labels = |ns: &str| -> anyhow::Result<Value> {
        let out = env.kube().ok(&["get", "namespace", ns, "-o", "jsonpath={.metadata.labels}"])?;
        Ok(serde_json::from_str(&out)?)
    };
    let (release, node) = (labels(NS)?, labels(NODE_NS)?);
    ensure!(release.get("pod-security.kubernetes.io/enforce").is_none(), "{NS} keeps the default: {release}");
    ensure!(node["pod-security.kubernetes.io/enforce"] == "privileged", "namespace {NODE_NS} labels: {node}");
    let controllers = env.pods(NS, "app.kubernetes.io/component=controller")?;
    ensure!(controllers.len() == 2 && controllers.iter().all(is_ready), "2 controller replicas Ready under restricted");
    for pod in env.node_pods()? {
        ensure!(pod["spec"]["priorityClassName"] == "system-node-critical", "{}: {}", pod_name(&pod), pod["spec"]);
    }
    let used = env.kube().ok(&["get", "resourcequota", "-n", NODE_NS, QUOTA, "-o", "jsonpath={.status.used.pods}"])?;
    ensure!(used.trim() == "4", "quota {QUOTA} counts the 4 node pods: used {used:?}");
    // The level is enforced: a host-network pod outside a labelled namespace is refused.
    let refused = env.kube().run(&[
        "run",
        "psa-probe",
        "-n",
        "default",
        "--image=localhost/aether/uds-echo:dev",
        "--dry-run=server",
        "--overrides={\"spec\":{\"hostNetwork\":true}}",
    ])?;
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    ensure!(
        !refused.status.success() && said.contains("violates PodSecurity \"restricted"),
        "default namespace: {said}"
    );
    println!("a host-network pod in namespace default: {}", said.trim());

    let label = "pod-security.kubernetes.io/enforce";
    let without_label = refused_replacement_is_named(env, "violates PodSecurity", || {
        env.kube().ok(&["label", "namespace", NODE_NS, &format!("{label}-")]).map(drop)
    })?;
    env.kube().ok(&["label", "namespace", NODE_NS, &format!("{label}=privileged")])?;
    env.agent_replaced_on(NODE1, &without_label)?;

    let without_quota = refused_replacement_is_named(env, "insufficient quota to match these scopes", || {
        env.kube().ok(&["delete", "resourcequota", "-n", NODE_NS, QUOTA]).map(drop)
    })?;
    // helm upgrade puts the chart's quota back (and its startup check passes once the pod is back).
    env.helm_aether("upgrade", &[])?;
    env.agent_replaced_on(NODE1, &without_quota)?;
    Ok(())
}

/// The chart's ResourceQuota for the node pods' priority class.
const QUOTA: &str = "aether-node-critical-pods";

/// Runs `take_away`, deletes node 1's agent pod, and checks that the DaemonSet cannot replace it
/// and that `helm test` fails naming `cause` (from the FailedCreate Event). Returns the deleted
/// pod's name.
fn refused_replacement_is_named(
    env: &Env,
    cause: &str,
    take_away: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    take_away()?;
    let old = env.agent_on(NODE1)?;
    let old = pod_name(&old).to_owned();
    env.kube().ok(&["delete", "pod", "-n", NODE_NS, &old, "--wait=true", "--timeout=60s"])?;
    eventually(&format!("a FailedCreate Event of DaemonSet aether-node naming {cause:?}"), WAIT, || {
        let events = env.kube().ok(&[
            "get",
            "events",
            "-n",
            NODE_NS,
            "--field-selector",
            "involvedObject.name=aether-node,reason=FailedCreate",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        Ok(events.contains(cause))
    })?;
    let test = env.nodes.helm(&["test", RELEASE, "-n", NS, "--logs", "--timeout", "120s"]);
    let said = match test {
        Ok(out) => anyhow::bail!("helm test passed with node 1's agent pod refused ({cause}):\n{out}"),
        Err(e) => format!("{e:#}"),
    };
    let line = said.lines().find(|l| l.contains("FAIL DaemonSet aether-node")).unwrap_or_default().to_owned();
    ensure!(line.contains("FailedCreate") && line.contains(cause), "helm test should name {cause:?}:\n{said}");
    println!("helm test: {line}");
    Ok(old)
}

/// `controller.hostNetwork=true` with webhook port 10260: the controller replicas run on the
/// nodes' network (one per node), kube-apiserver calls the webhook at a node IP, and it denies an
/// over-budget policy. A host-network pod meets only the Pod Security `privileged` level, so, as
/// docs/install.md says, the release namespace is labelled so first. Then back to the default (pod
/// network, 10250, the label removed).
fn the_webhook_answers_from_the_host_network_on_a_port_that_is_not_the_kubelets(env: &Env) -> anyhow::Result<()> {
    let host = ["controller.hostNetwork=true", "controller.webhookPort=10260"];
    env.kube().ok(&["label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged"])?;
    env.helm_aether("upgrade", &host)?;
    let result = (|| -> anyhow::Result<()> {
        let pods = env.pods(NS, "app.kubernetes.io/component=controller")?;
        let pods: Vec<&Value> = pods.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
        ensure!(pods.len() == 2, "two controller replicas: {}", pods.len());
        let mut nodes: Vec<&str> = pods.iter().map(|p| node_name(p)).collect();
        nodes.sort();
        ensure!(nodes == [NODE1, NODE2], "one replica per node: {nodes:?}");
        for p in &pods {
            ensure!(p["spec"]["hostNetwork"] == true, "{} is on the host network", pod_name(p));
            ensure!(p["status"]["podIP"] == p["status"]["hostIP"], "{}: pod IP is the node IP", pod_name(p));
        }
        let endpoints = env.kube().ok(&[
            "get",
            "endpointslices",
            "-n",
            NS,
            "-l",
            "kubernetes.io/service-name=aether-controller",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]} {.items[*].ports[*].port}",
        ])?;
        ensure!(endpoints.contains("10260"), "the Service's endpoints are on 10260: {endpoints}");
        let denied = over_budget_denial(env)?;
        println!("webhook on the host network (endpoints {endpoints}): {denied}");
        Ok(())
    })();
    env.helm_aether("upgrade", &[])?;
    env.kube().ok(&["label", "namespace", NS, "pod-security.kubernetes.io/enforce-"])?;
    result
}

/// A server-side dry run of an EndpointPolicy one byte over the budget: the webhook's denial.
fn over_budget_denial(env: &Env) -> anyhow::Result<String> {
    let policy = r#"{"apiVersion":"config.aether.io/v1","kind":"EndpointPolicy","metadata":{"name":"over","namespace":"default"},
        "spec":{"targetRef":{"kind":"Service","name":"over"},"udsSocket":"s/0123456789abcdef"}}"#;
    let path = std::env::temp_dir().join(format!("aether-over-budget-{}.json", std::process::id()));
    std::fs::write(&path, policy)?;
    let out = env.kube().run(&["apply", "--dry-run=server", "-f", path.to_str().context("path")?]);
    let _ = std::fs::remove_file(&path);
    let out = out?;
    let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    ensure!(
        !out.status.success() && said.contains("admission webhook \"endpointpolicies.config.aether.io\" denied"),
        "the webhook should deny a 17-byte socket value (budget 16): {said}"
    );
    Ok(said)
}

fn node_down_restores_the_host(env: &Env) -> anyhow::Result<()> {
    let diff = env.nodes.down()?;
    ensure!(diff.is_empty(), "the host differs after node.sh down:\n{}", diff.join("\n"));
    Ok(())
}

// --- set-up and context --------------------------------------------------------------------------

fn setup() -> anyhow::Result<Env> {
    // containerd 2.x (config version 3; docs/compatibility.md, "Container runtimes").
    let env = Env { nodes: RealNodes::up_with(2, Shape { family: IpFamily::Ipv4, runtime: Runtime::Containerd2 })? };
    let crds = aether_tests::node::packaged_chart("aether-crds")?;
    env.nodes.helm(&["install", "aether-crds", crds.to_str().context("path")?, "--wait"])?;
    // The README's install: only the release namespace by hand; the chart makes NODE_NS.
    env.kube().ok(&release_namespace_command(NS))?;
    env.helm_aether("install", &[]).map_err(|e| anyhow::anyhow!("{e:#}{}", context(&env)))?;
    env.node_daemonsets_rolled_out().map_err(|e| anyhow::anyhow!("{e:#}{}", context(&env)))?;
    Ok(env)
}

fn context(env: &Env) -> String {
    let text = |args: &[&str]| match env.kube().run(args) {
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => format!("(kubectl {}: {e:#})", args.join(" ")),
    };
    let events = text(&["get", "events", "-A", "--sort-by=.lastTimestamp"]);
    let events: Vec<&str> = events.lines().rev().take(25).collect();
    format!(
        "{}\n--- node pod logs\n{}\n--- kubectl get nodes\n{}\n--- kubectl get pods -A\n{}\n--- recent events (newest first)\n{}",
        env.nodes.log_tails(10),
        text(&[
            "logs",
            "-n",
            NODE_NS,
            "-l",
            "app.kubernetes.io/component in (node,proxy)",
            "--all-containers",
            "--prefix",
            "--tail=15"
        ]),
        text(&["get", "nodes", "-o", "wide"]),
        text(&["get", "pods", "-A", "-o", "wide"]),
        events.join("\n"),
    )
}

fn main() {
    suite::run(
        suite::cases![
            two_nodes_run_every_node_daemonset_pod_ready,
            one_policy_reaches_pods_on_both_nodes_and_each_agent_serves_only_its_own,
            a_client_on_each_node_calls_a_uds_only_service_on_the_other_by_name,
            the_same_app_answers_over_its_socket_and_over_tcp_from_the_other_node,
            a_rolling_upgrade_of_every_node_daemonset_fails_no_request,
            an_agent_restarted_while_its_node_cannot_reach_the_api_server_keeps_serving,
            a_drained_nodes_uds_pod_is_served_over_its_socket_on_the_other_node,
            node_pods_need_the_privileged_label_and_the_charts_quota_and_the_install_check_names_what_is_missing,
            the_webhook_answers_from_the_host_network_on_a_port_that_is_not_the_kubelets,
            node_down_restores_the_host,
        ],
        setup,
        context,
    )
}
