//! The real-node suite: a kubelet + containerd node (`tests/harness/node.sh`), the charts installed
//! with `helm install` from images built here (`tests/harness/images.sh`, no registry), and real
//! pods whose app serves HTTP on a Unix socket in an emptyDir.
//!
//! What it proves (issue: a real node): the chart's containers run as configured (command lines,
//! paths, probes) with no restarts; the installed webhook is reached through its Service; `helm
//! install --wait --wait-for-jobs` runs the startup check (`aether-controller verify-install`) and
//! `helm test` passes, while both fail, naming the webhook check, when the webhook is broken; Envoy
//! in the node pod dials the socket an app container made in the kubelet's real emptyDir path
//! (disk and `medium: Memory`), through the chart's read-only HostToContainer mount; a policy
//! switches delivery to the socket and back; an app restart (new socket inode), a replaced node
//! pod and a deleted pod are followed; `helm upgrade` with other values runs (among them
//! `socketLimit=filesystem` and every bounded value at its schema edges); `helm uninstall`
//! leaves no release object and nothing of ours on the host; and `node.sh down` leaves the host as
//! it found it.
//!
//! Needs root (CI runs as root); without it the suite fails, naming the cause.

#[path = "suite.rs"]
mod suite;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use aether_crds::pod::{GRPC_HEALTH_SERVICE_ANNOTATION, PORTS_ANNOTATION};
use aether_fixtures::{echo_app, policy};
use aether_tests::continuity::{self, Load, Report};
use aether_tests::node::{RealNode, aether_chart_args, privileged_label_command, release_namespace_command};
use aether_tests::{Kubectl, eventually, http_get, repo_root, unix_get_status};
use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// Release namespace and name.
const NS: &str = "aether-system";
const RELEASE: &str = "aether";
/// Where the chart's defaults put the health gateway socket on the host.
const HEALTH_SOCKET: &str = "/run/aether/health.sock";
/// Envoy's admin port (the chart default, 127.0.0.1 on the host network).
const ENVOY_ADMIN: u16 = 9901;
/// The agent's admin port (`agent.adminPort`), on the host network.
const AGENT_ADMIN: u16 = 9091;
/// The node Envoy's stats listener (`proxy.stats.port`), on the host network.
const STATS_PORT: u16 = 15090;
const WAIT: Duration = Duration::from_secs(90);
/// The chart's default `agent.pinning.hostPath`: Envoy dials `<PINS>/<pod uid>.sock`.
const PINS: &str = "/run/aether-pins";

/// The shared environment: the node, and when the chart was installed.
struct Env {
    node: RealNode,
    installed_at: Instant,
}

impl Env {
    fn kube(&self) -> Kubectl {
        self.node.kube()
    }

    /// `helm install|upgrade` of charts/aether with the image sets plus `extra` sets, waiting
    /// for every workload and hook Job.
    fn helm_aether(&self, verb: &str, extra: &[&str]) -> anyhow::Result<String> {
        let args = aether_chart_args(verb, RELEASE, NS, extra)?;
        self.node.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Health gateway answer for `cluster` on the host's socket.
    fn health(&self, cluster: &str) -> anyhow::Result<u16> {
        unix_get_status(Path::new(HEALTH_SOCKET), &format!("/healthz/{cluster}"))
    }

    /// Envoy's view of one cluster's first endpoint: (address as `/clusters` prints it, health flags).
    fn endpoint(&self, cluster: &str) -> anyhow::Result<Option<(String, String)>> {
        let (_, body) = http_get(ENVOY_ADMIN, "/clusters", &[])?;
        Ok(cluster_endpoint(&body, cluster))
    }

    /// The `network_namespace_filepath` of `cluster`'s upstream bind config in Envoy's config dump.
    fn bind_netns(&self, cluster: &str) -> anyhow::Result<Option<String>> {
        let (_, body) = http_get(ENVOY_ADMIN, "/config_dump?resource=dynamic_active_clusters", &[])?;
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
    fn wait_pinned(&self, cluster: &str, uid: &str, socket: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let pin = format!("{PINS}/{uid}.sock");
        self.wait_healthy_at(cluster, &pin, |a| a == pin)?;
        eventually(&format!("{pin} holds the inode of {}", socket.display()), WAIT, || {
            let (p, s) = (std::fs::metadata(&pin)?, std::fs::symlink_metadata(socket)?);
            Ok((p.dev(), p.ino()) == (s.dev(), s.ino()))
        })
    }

    /// Waits until `cluster`'s endpoint address satisfies `addr_ok` and is healthy.
    fn wait_healthy_at(&self, cluster: &str, what: &str, addr_ok: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        let mut last = None;
        eventually(&format!("{cluster} healthy at {what}"), WAIT, || {
            last = self.endpoint(cluster)?;
            Ok(last.as_ref().is_some_and(|(a, flags)| addr_ok(a) && flags == "healthy"))
        })
        .with_context(|| format!("last seen: {last:?}"))
    }

    fn pod_json(&self, ns: &str, name: &str) -> anyhow::Result<Value> {
        Ok(serde_json::from_str(&self.kube().ok(&["get", "pod", "-n", ns, name, "-o", "json"])?)?)
    }

    fn wait_pod_ready(&self, ns: &str, name: &str) -> anyhow::Result<Value> {
        self.kube().ok(&["wait", "-n", ns, "--for=condition=Ready", &format!("pod/{name}"), "--timeout=90s"])?;
        self.pod_json(ns, name)
    }

    /// The kubelet's path of `<volume>/<file>` in the pod's emptyDir.
    fn socket_path(&self, uid: &str, volume: &str, file: &str) -> PathBuf {
        self.node.facts().kubelet_root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/{volume}/{file}"))
    }

    /// Pods of the release's workloads (label app.kubernetes.io/instance), without the
    /// verify-install hook runners (the startup check Job's pod and the `helm test` Pod).
    fn release_pods(&self) -> anyhow::Result<Vec<Value>> {
        let selector = "app.kubernetes.io/instance=aether,app.kubernetes.io/component!=verify-install";
        let out = self.kube().ok(&["get", "pods", "-n", NS, "-l", selector, "-o", "json"])?;
        let v: Value = serde_json::from_str(&out)?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// The agent's pod (DaemonSet aether-node).
    fn node_pod(&self) -> anyhow::Result<Value> {
        self.component_pod("node")
    }

    /// Envoy's pod (DaemonSet aether-proxy).
    fn proxy_pod(&self) -> anyhow::Result<Value> {
        self.component_pod("proxy")
    }

    /// The one release pod labelled `app.kubernetes.io/component=<component>` that is not being
    /// deleted.
    fn component_pod(&self, component: &str) -> anyhow::Result<Value> {
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

/// A file's status-change time (set when the file is created).
fn ctime(m: &std::fs::Metadata) -> std::time::SystemTime {
    use std::os::unix::fs::MetadataExt;
    let secs = u64::try_from(m.ctime()).unwrap_or(0);
    let nanos = u32::try_from(m.ctime_nsec()).unwrap_or(0);
    std::time::UNIX_EPOCH + Duration::new(secs, nanos)
}

fn uid(pod: &Value) -> anyhow::Result<String> {
    pod["metadata"]["uid"].as_str().map(str::to_owned).context("pod has no uid")
}

fn restarts(pod: &Value) -> Vec<(String, u64)> {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["name"].as_str().unwrap_or("?").to_owned(), c["restartCount"].as_u64().unwrap_or(u64::MAX)))
        .collect()
}

fn pod_name(pod: &Value) -> &str {
    pod["metadata"]["name"].as_str().unwrap_or("?")
}

/// The active dynamic listener `name` in Envoy's config dump: its `network_namespace_filepath`.
fn active_listener_netns(name: &str) -> anyhow::Result<Option<String>> {
    let (_, body) = http_get(ENVOY_ADMIN, "/config_dump?resource=dynamic_listeners", &[])?;
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
    fn client_get(&self, name: &str, url: &str) -> anyhow::Result<(bool, String)> {
        self.client_run(name, &["--get", url])
    }

    /// `kubectl run <name>` of `uds-echo <args>` (restartPolicy Never); waits until the pod ends
    /// and returns (succeeded, its log).
    fn client_run(&self, name: &str, client_args: &[&str]) -> anyhow::Result<(bool, String)> {
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

// --- trials ------------------------------------------------------------------------------------

fn install_brings_every_release_pod_ready(env: &Env) -> anyhow::Result<()> {
    let pods = env.release_pods()?;
    let mut kinds: Vec<&str> =
        pods.iter().filter_map(|p| p["metadata"]["labels"]["app.kubernetes.io/component"].as_str()).collect();
    kinds.sort();
    ensure!(kinds == ["controller", "controller", "node", "proxy"], "release pods by component: {kinds:?}");
    // helm --wait is not enough for the DaemonSet: with maxUnavailable 1 on a one-node cluster it
    // accepts 0 Ready node pods. So wait (bounded) until every release pod is Ready.
    let ready = |p: &Value| {
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    };
    let mut not_ready = Vec::new();
    eventually("every release pod Ready", WAIT, || {
        not_ready = env.release_pods()?.iter().filter(|p| !ready(p)).map(|p| pod_name(p).to_owned()).collect();
        Ok(not_ready.is_empty())
    })
    .with_context(|| format!("not Ready: {not_ready:?}"))?;
    println!(
        "kubectl get pods -A -o wide after helm install:\n{}",
        env.kube().ok(&["get", "pods", "-A", "-o", "wide"])?
    );
    // The node pod really is on the host network and Envoy's readiness listener answers.
    let (code, _) = http_get(9902, "/ready", &[])?;
    ensure!(code == 200, "Envoy /ready on the readiness listener: {code}");
    Ok(())
}

fn installed_webhook_denies_an_over_budget_policy_with_the_arithmetic(env: &Env) -> anyhow::Result<()> {
    let example = repo_root().join("crds/examples/deny-over-budget.yaml");
    let out = env.kube().run(&["apply", "-n", "default", "-f", example.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "over-budget policy was admitted: {}", String::from_utf8_lossy(&out.stdout));
    for want in ["denied the request", "17 bytes", "the budget is 16 bytes", "/var/lib/kubelet/pods"] {
        ensure!(stderr.contains(want), "denial lacks {want:?}: {stderr}");
    }
    // And a valid one is admitted through the same Service.
    let ok = repo_root().join("crds/examples/ok-echo-uds.yaml");
    env.kube().ok(&["apply", "-n", "default", "--dry-run=server", "-f", ok.to_str().context("path")?])?;
    Ok(())
}

/// `helm test` of the release: (passed, helm's output, the test Pod's log). The Pod is deleted
/// when it passes (hook-delete-policy hook-succeeded), so its log is read while it runs.
fn helm_test(env: &Env) -> anyhow::Result<(bool, String, String)> {
    let mut log = String::new();
    let result = std::thread::scope(|scope| {
        let test = scope.spawn(|| env.node.helm(&["test", RELEASE, "-n", NS, "--timeout", "120s"]));
        // `kubectl logs -f` ends with the container; the Pod may not exist yet at first.
        let started = Instant::now();
        while started.elapsed() < WAIT && !test.is_finished() {
            if let Ok(out) = env.kube().run(&["logs", "-n", NS, "-f", "pod/aether-verify-install-test"]) {
                let text = String::from_utf8_lossy(&out.stdout);
                if out.status.success() && text.contains("checks passed") {
                    log = text.into_owned();
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        test.join().map_err(|_| anyhow::anyhow!("helm test thread panicked"))
    })?;
    Ok(match result {
        Ok(out) => (true, out, log),
        Err(e) => {
            if log.is_empty() {
                log = env.kube().ok(&["logs", "-n", NS, "pod/aether-verify-install-test"]).unwrap_or_default();
            }
            (false, format!("{e:#}"), log)
        }
    })
}

/// Only the PASS/FAIL lines and the summary of a verify-install log (its JSON log lines, the
/// retries, are left out).
fn verdict_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL ") || l.starts_with("verify-install:"))
        .collect()
}

/// The install passed its startup check (setup's `helm install --wait
/// --wait-for-jobs` would have failed otherwise, and the Job is gone: it passed); `helm test`
/// passes, with a PASS line for both webhook checks and for the node's agent; with the webhook's
/// Service pointed at no pod, `helm test` fails and its log names the webhook check and the
/// webhook; restored, it passes again and leaves no hook object behind.
fn helm_test_passes_and_fails_naming_the_webhook_when_its_service_is_broken(env: &Env) -> anyhow::Result<()> {
    let left = env.kube().ok(&[
        "get",
        "jobs,pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=verify-install",
        "-o",
        "name",
    ])?;
    ensure!(left.trim().is_empty(), "the startup check passed, so its Job is deleted: {left}");
    let (ok, out, log) = helm_test(env)?;
    println!("helm test (installed):\n{out}\n--- verify-install log\n{}", verdict_lines(&log).join("\n"));
    ensure!(ok, "helm test failed on a good install: {out}\n{log}");
    let lines = verdict_lines(&log);
    ensure!(lines.len() == 6, "2 webhook checks, 2 DaemonSets, 1 agent and the summary: {lines:#?}");
    ensure!(
        lines[0].starts_with("PASS webhook denies an over-budget policy")
            && lines[0].contains("admission webhook \"endpointpolicies.config.aether.io\" denied the request"),
        "{lines:#?}"
    );
    ensure!(lines[1].starts_with("PASS webhook admits a valid policy"), "{lines:#?}");
    for (line, ds) in [(&lines[2], "aether-node"), (&lines[3], "aether-proxy")] {
        ensure!(*line == format!("PASS DaemonSet {ds} has a pod on each of its nodes: 1 of 1"), "{lines:#?}");
    }
    ensure!(lines[4].starts_with("PASS agent aether-node-") && lines[4].contains(":9091/readyz: 200 OK"), "{lines:#?}");
    ensure!(lines[5] == "verify-install: 5 of 5 checks passed", "{lines:#?}");

    // Break the webhook: its Service selects no pod.
    let patch = |component: &str| {
        let p = format!(r#"{{"spec":{{"selector":{{"app.kubernetes.io/component":"{component}"}}}}}}"#);
        env.kube().ok(&["patch", "service", "-n", NS, "aether-controller", "-p", &p])
    };
    patch("broken-on-purpose")?;
    // The API server keeps its HTTP/2 connection to a webhook pod, which conntrack keeps routing
    // whatever the Service selects: replace the controller pods so that only new connections,
    // which meet the Service with no endpoints, are left.
    let broken = env
        .kube()
        .ok(&["delete", "pods", "-n", NS, "-l", "app.kubernetes.io/component=controller", "--wait=true"])
        .and_then(|_| {
            let example = repo_root().join("crds/examples/deny-over-budget.yaml");
            let example = example.to_str().context("path")?;
            eventually("the API server cannot call the webhook", WAIT, || {
                let out = env.kube().run(&["apply", "-n", "default", "--dry-run=server", "-f", example])?;
                Ok(String::from_utf8_lossy(&out.stderr).contains("failed calling webhook"))
            })
        })
        .and_then(|_| helm_test(env));
    patch("controller")?;
    let (ok, out, log) = broken?;
    println!("helm test (webhook Service broken):\n{out}\n--- verify-install log\n{}", verdict_lines(&log).join("\n"));
    ensure!(!ok, "helm test passed with the webhook's Service selecting no pod: {out}");
    ensure!(out.contains("pod aether-verify-install-test failed"), "helm names the failed test: {out}");
    let fail = verdict_lines(&log).into_iter().find(|l| l.starts_with("FAIL ")).unwrap_or_default().to_owned();
    ensure!(
        fail.starts_with("FAIL webhook denies an over-budget policy")
            && fail.contains("failed calling webhook \"endpointpolicies.config.aether.io\""),
        "the first failure names the webhook check and the webhook: {log}"
    );
    ensure!(log.contains("PASS agent aether-node-"), "the agents are still checked: {log}");

    check_release_settled(env)?;
    let mut last = String::new();
    eventually("helm test passes again with the Service restored", WAIT, || {
        let (ok, out, log) = helm_test(env)?;
        last = format!("{out}\n{log}");
        Ok(ok)
    })
    .with_context(|| format!("last: {last}"))?;
    let left = env.kube().ok(&[
        "get",
        "pods,serviceaccounts,roles,rolebindings",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=verify-install",
        "-o",
        "name",
    ])?;
    ensure!(left.trim().is_empty(), "a passed helm test leaves no hook object: {left}");
    Ok(())
}

/// An upgrade that breaks the webhook (a caBundle that did not sign its serving
/// certificate: the API server's TLS check fails) fails through the startup check Job, whose log
/// names the webhook check; the next good upgrade (its check reaching the agent through the API
/// server's pod proxy) passes and removes the failed Job.
fn upgrade_with_a_broken_webhook_fails_through_the_startup_check(env: &Env) -> anyhow::Result<()> {
    // The cluster's CA (base64 PEM, as a caBundle is given): a real CA, but not the one that
    // signed the webhook's certificate.
    let wrong = env.kube().ok(&[
        "config",
        "view",
        "--raw",
        "--flatten",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority-data}",
    ])?;
    ensure!(wrong.starts_with("LS0tLS1CRUdJTi"), "the kubeconfig's CA is base64 PEM: {wrong}");
    let bundle = format!("webhook.certs.provided.caBundle={wrong}");
    let started = Instant::now();
    let failed = env.helm_aether(
        "upgrade",
        &[
            "webhook.certs.mode=provided",
            "webhook.certs.provided.secretName=aether-webhook-tls",
            &bundle,
            "verifyInstall.timeoutSeconds=30",
        ],
    );
    let took = started.elapsed().as_secs();
    let err = match failed {
        Ok(out) => bail!("helm upgrade with a wrong caBundle passed: {out}"),
        Err(e) => format!("{e:#}"),
    };
    let log = env.kube().ok(&["logs", "-n", NS, "job/aether-verify-install"]).unwrap_or_default();
    println!(
        "helm upgrade with a wrong caBundle ({took} s):\n{err}\n--- startup check log\n{}",
        verdict_lines(&log).join("\n")
    );
    ensure!(err.contains("post-upgrade hooks failed") && err.contains("aether-verify-install"), "{err}");
    let fail = verdict_lines(&log).into_iter().find(|l| l.starts_with("FAIL ")).unwrap_or_default().to_owned();
    ensure!(
        fail.starts_with("FAIL webhook denies an over-budget policy")
            && fail.contains("endpointpolicies.config.aether.io"),
        "the startup check names the webhook check: {log}"
    );

    // The good upgrade's startup check reaches the agent through the API server's pod proxy this
    // time (verifyInstall.agentAccess=apiServerProxy): the upgrade passes only if that check does.
    env.helm_aether("upgrade", &["verifyInstall.agentAccess=apiServerProxy"])?;
    check_release_settled(env)?;
    let left = env.kube().ok(&[
        "get",
        "jobs,pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=verify-install",
        "-o",
        "name",
    ])?;
    ensure!(left.trim().is_empty(), "the good upgrade's startup check passed and took the failed Job away: {left}");
    Ok(())
}

fn annotated_pod_is_served_over_the_kubelets_emptydir_socket(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("web").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "web")?;
    let path = env.socket_path(&uid(&pod)?, "s", "app.sock");
    eventually("the app's socket at the kubelet's emptyDir path", WAIT, || {
        Ok(std::fs::symlink_metadata(&path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())))
    })?;
    env.wait_pinned("app_default_web_8080", &uid(&pod)?, &path)?;
    eventually("health gateway 200 for health_default_web", WAIT, || Ok(env.health("health_default_web")? == 200))?;
    Ok(())
}

fn policy_switches_delivery_to_the_socket_and_delete_switches_back(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("both").tcp_sidecar().manifest())?;
    let pod = env.wait_pod_ready("default", "both")?;
    // TCP delivery dials 127.0.0.1 inside the pod's netns, which the agent learned from containerd
    // over CRI: Envoy (privileged, /run/netns mounted HostToContainer) health-checks the app there.
    let tcp = "127.0.0.1:8080".to_owned();
    env.wait_healthy_at("app_default_both_8080", &tcp, |a| a == tcp)?;
    let netns = env.bind_netns("app_default_both_8080")?.context("no upstream_bind_config netns")?;
    ensure!(netns.starts_with("/run/netns/cni-"), "netns path from the runtime: {netns}");
    env.kube().apply(&policy("default", "both-uds").target("both").socket("s/app.sock").manifest())?;
    let path = env.socket_path(&uid(&pod)?, "s", "app.sock");
    env.wait_pinned("app_default_both_8080", &uid(&pod)?, &path)?;
    // Its app also holds TCP 8080: Envoy cannot bind the inbound listener there; the agent reads
    // that from Envoy's config dump, withdraws that listener and tells the pod.
    let mut events = String::new();
    eventually("a UdsInboundListenerFailed Event on pod both", WAIT, || {
        events = env.kube().ok(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=both,reason=UdsInboundListenerFailed",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        Ok(events.contains("port 8080"))
    })?;
    println!("Event on pod both: {events}");
    eventually("the failed listener is not offered", WAIT, || {
        Ok(active_listener_netns("inbound_default_both_8080")?.is_none())
    })?;
    env.kube().ok(&["delete", "endpointpolicy", "-n", "default", "both-uds"])?;
    env.wait_healthy_at("app_default_both_8080", &tcp, |a| a == tcp)?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "both", "--wait=true"])?;
    Ok(())
}

/// Runs the built `kubectl-aether` with the node's admin kubeconfig; its stdout (it must exit 0).
fn kubectl_aether(env: &Env, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(aether_tests::workspace_bin("kubectl-aether")?)
        .arg("--kubeconfig")
        .arg(&env.node.facts().kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running kubectl-aether")?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "kubectl-aether {args:?} failed ({}): {stderr}{stdout}", out.status);
    Ok(stdout.into_owned())
}

/// On the real node: `kubectl aether why` reads what the node agent decided, through the API
/// server's port-forward to the agent's loopback-only debug port (chart defaults for the agent's
/// namespace, selector and port), for a pod served over its socket, a pod on TCP with its reason
/// and a pod whose Service has two policies (the loser named). Prints the text answers. Nobody
/// else gets the per-pod detail: a pod on the node finds no `/debug/pods` on the admin port and
/// no listener on the debug port at the node IP, and a user without `pods/portforward` gets the
/// offline answer saying so, then the live one once granted what docs/kubectl-plugin.md says.
fn kubectl_aether_why_reads_the_node_agents_live_decision(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("why-uds").annotated().manifest())?;
    // Annotated with a volume the pod does not have: TCP, `volume-not-emptydir`.
    env.kube().apply(&echo_app("why-tcp").annotation_socket("nosuch/app.sock").tcp_sidecar().manifest())?;
    env.kube().apply(&echo_app("why-pol").manifest())?;
    for (name, socket) in [("why-pol-a", "s/app.sock"), ("why-pol-b", "s/other.sock")] {
        env.kube().apply(&policy("default", name).target("why-pol").socket(socket).manifest())?;
    }
    for name in ["why-uds", "why-tcp", "why-pol"] {
        env.wait_pod_ready("default", name)?;
    }
    let why = |name: &str, ok: &dyn Fn(&Value) -> bool| -> anyhow::Result<Value> {
        let mut last = Value::Null;
        eventually(&format!("kubectl aether why pod/{name}: a live answer"), WAIT, || {
            last = serde_json::from_str(&kubectl_aether(
                env,
                &["why", &format!("pod/{name}"), "-n", "default", "-o", "json"],
            )?)?;
            Ok(last["live"] == true && ok(&last["decision"]))
        })
        .with_context(|| format!("last answer: {last:#}"))?;
        println!(
            "$ kubectl aether why pod/{name} -n default\n{}",
            kubectl_aether(env, &["why", &format!("pod/{name}"), "-n", "default"])?
        );
        Ok(last)
    };
    let uds = why("why-uds", &|d| d["delivery"] == "pipe")?;
    let d = &uds["decision"];
    ensure!(d["source"] == "annotation" && d["socket"] == "s/app.sock", "{d:#}");
    ensure!(d["path"].as_str().is_some_and(|p| p.ends_with("/volumes/kubernetes.io~empty-dir/s/app.sock")), "{d:#}");
    ensure!(d["clusters"].as_array().is_some_and(|c| c.iter().any(|c| c == "app_default_why-uds_8080")), "{d:#}");
    let tcp = why("why-tcp", &|d| d["delivery"] == "tcp" && d["reason"] == "volume-not-emptydir")?;
    ensure!(tcp["decision"]["eventReason"] == "UdsVolumeNotEmptyDir", "{tcp:#}");
    let pol =
        why("why-pol", &|d| d["delivery"] == "pipe" && d["conflict"]["losers"] == serde_json::json!(["why-pol-b"]))?;
    ensure!(pol["decision"]["policy"] == "why-pol-a" && pol["decision"]["source"] == "policy", "{pol:#}");
    ensure!(uds["agent"]["port"] == 9092 && uds["agent"]["namespace"] == NS, "{uds:#}");

    // A pod on the node (every pod reaches the node IP) gets no per-pod detail.
    let node_ip = env.node.facts().node_ip.clone();
    let (ok, said) = env.client_get("why-probe-admin", &format!("http://{node_ip}:9091/debug/pods"))?;
    println!("a pod GETs http://{node_ip}:9091/debug/pods (the admin port): {}", said.trim());
    ensure!(!ok && said.contains("HTTP 404") && !said.contains("why-uds"), "{said}");
    let (ok, said) = env.client_get("why-probe-debug", &format!("http://{node_ip}:9092/debug/pods"))?;
    println!("a pod GETs http://{node_ip}:9092/debug/pods (the debug port, loopback only): {}", said.trim());
    ensure!(!ok && !said.contains("why-uds") && !said.contains("HTTP "), "no listener at the node IP: {said}");

    // A user who may read pods but not port-forward: offline, saying why; granted: live.
    let viewer = aether_tests::user_kubeconfig(
        &env.node.dir().join("cp/pki"),
        &env.node.facts().kubeconfig,
        "why-viewer",
        "default",
        env.node.dir(),
    )?;
    env.kube().apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: why-viewer}\n\
         rules: [{apiGroups: [''], resources: [pods], verbs: [get, list]}, \
         {apiGroups: [config.aether.io], resources: [endpointpolicies], verbs: [list]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: why-viewer}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: why-viewer}\n\
         subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: why-viewer}]\n",
    )?;
    let as_viewer = || -> anyhow::Result<Value> {
        let out = std::process::Command::new(aether_tests::workspace_bin("kubectl-aether")?)
            .args(["--kubeconfig", viewer.to_str().context("path")?, "--context", "viewer"])
            .args(["why", "pod/why-uds", "-n", "default", "-o", "json"])
            .stdin(std::process::Stdio::null())
            .output()?;
        ensure!(out.status.success(), "why as why-viewer: {}", String::from_utf8_lossy(&out.stderr));
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let mut last = Value::Null;
    eventually("why-viewer gets an offline answer naming RBAC", WAIT, || {
        last = as_viewer()?;
        Ok(last["offlineReason"].as_str().is_some_and(|r| r.starts_with("RBAC forbids the port-forward")))
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    println!("why-viewer without pods/portforward: OFFLINE: {}", last["offlineReason"]);
    ensure!(last["live"] == false && last["decision"]["delivery"] == "pipe", "{last:#}");
    env.kube().apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: why-viewer, namespace: {NS}}}\n\
         rules: [{{apiGroups: [''], resources: [pods/portforward], verbs: [get, create]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: why-viewer, namespace: {NS}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: why-viewer}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: why-viewer}}]\n"
    ))?;
    eventually("why-viewer gets the live answer once granted pods/portforward", WAIT, || {
        last = as_viewer()?;
        Ok(last["live"] == true)
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    ensure!(last["decision"]["delivery"] == "pipe" && last["decision"]["decidedAt"].is_string(), "{last:#}");
    env.kube().ok(&["delete", "clusterrole,clusterrolebinding", "why-viewer"])?;
    env.kube().ok(&["delete", "role,rolebinding", "-n", NS, "why-viewer"])?;
    env.kube().ok(&["delete", "endpointpolicy", "-n", "default", "why-pol-a", "why-pol-b"])?;
    for name in ["why-uds", "why-tcp", "why-pol"] {
        env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", name, "--wait=true"])?;
    }
    Ok(())
}

fn a_client_pod_reaches_a_uds_only_app_through_its_service_ip(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("inb").annotated().ready_through_port_8080().manifest())?;
    // Ready means kubelet's httpGet probe on pod IP:8080 passed: through the netns-bound listener.
    env.wait_pod_ready("default", "inb")?;
    let mut netns = None;
    eventually("Envoy's inbound_default_inb_8080 listener is active", WAIT, || {
        netns = active_listener_netns("inbound_default_inb_8080")?;
        Ok(netns.is_some())
    })?;
    let netns = netns.context("listener netns")?;
    ensure!(netns.starts_with("/run/netns/cni-"), "listener bound in the pod's netns from the runtime: {netns}");
    let ip = env.kube().ok(&["get", "service", "-n", "default", "inb", "-o", "jsonpath={.spec.clusterIP}"])?;
    let url = format!("http://{}:8080/hello", ip.trim());
    let (ok, body) = env.client_get("client-uds", &url)?;
    println!("client pod: uds-echo --get {url}\n{body}");
    ensure!(ok && body.contains("inb over unix:/s/app.sock: GET /hello"), "through the Service: {body}");
    println!("listener inbound_default_inb_8080 in Envoy's config_dump, bound in {netns}");

    // Back to TCP: the listener goes, the port is free in the pod, a UDS-only app is unreachable.
    env.kube().ok(&["annotate", "pod", "-n", "default", "inb", "endpoint.aether.io/uds-socket-"])?;
    eventually("the inbound listener is withdrawn", WAIT, || {
        Ok(active_listener_netns("inbound_default_inb_8080")?.is_none())
    })?;
    eventually("nothing listens on 8080 in the pod's netns", WAIT, || {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args(["ss", "-Htln", "sport = :8080"])
            .output()
            .context("nsenter ss")?;
        ensure!(out.status.success(), "nsenter: {}", String::from_utf8_lossy(&out.stderr));
        Ok(out.stdout.iter().all(u8::is_ascii_whitespace))
    })?;
    let (ok, body) = env.client_get("client-tcp", &url)?;
    ensure!(!ok, "a UDS-only app delivered over TCP has nothing on its port, yet: {body}");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "inb", "--wait=true"])?;
    Ok(())
}

/// The toggle attack between two real pods (docs/design-notes.md, "Agent"): pod atk's app keeps
/// swapping its socket for a symlink to pod vic's socket (the path Envoy would resolve) every ~2
/// ms; requests to atk's pod IP:8080 (its inbound listener) for 10 s. Envoy dials atk's pin, so
/// none reaches vic.
fn a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("vic").annotated().manifest())?;
    let vic_uid = uid(&env.wait_pod_ready("default", "vic")?)?;
    let vic_socket = env.socket_path(&vic_uid, "s", "app.sock");
    let vic_socket = vic_socket.to_str().context("vic's socket path")?;
    env.kube().apply(&echo_app("atk").annotated().args(&["--swap-link", vic_socket]).manifest())?;
    let atk = env.wait_pod_ready("default", "atk")?;
    let ip = atk["status"]["podIP"].as_str().context("atk's pod IP")?.to_owned();
    // Either Envoy serves atk through its pin, or (inotify makes a swap visible at once, and a link
    // refusal lasts the pod's life) the agent has already put atk on TCP: then nothing listens.
    let refused = || -> anyhow::Result<bool> {
        let field = "involvedObject.name=atk,reason=UdsSymlinkRefused";
        let events = env.kube().ok(&["get", "events", "-n", "default", "--field-selector", field, "-o", "name"])?;
        Ok(!events.trim().is_empty())
    };
    eventually("atk served through its pin, or refused", WAIT, || {
        Ok(active_listener_netns("inbound_default_atk_8080")?.is_some() || refused()?)
    })?;
    let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
    let (mut own, mut victim, mut other) = (0u32, 0u32, 0u32);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        match client.get(format!("http://{ip}:8080/steal")).send().and_then(|r| r.text()) {
            Ok(body) if body.contains("vic over unix") => victim += 1,
            Ok(body) if body.contains("atk over unix") => own += 1,
            _ => other += 1,
        }
    }
    println!(
        "toggle attack on the real node, 10 s: {} requests to atk's pod IP: {own} to atk, {victim} to vic, {other} \
         refused/unhealthy; atk refused (UdsSymlinkRefused Event): {}",
        own + victim + other,
        refused()?
    );
    ensure!(victim == 0, "{victim} requests for atk were delivered to vic's socket");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "atk", "vic", "--wait=true"])?;
    Ok(())
}

/// A gRPC server (`uds-echo --grpc`: tonic with the standard health service) only on its socket,
/// port 9090 declared `=grpc`: Envoy checks it with grpc.health.v1 (kubelet's own gRPC readiness
/// probe goes through the inbound listener), the health gateway follows SERVING / NOT_SERVING,
/// and a gRPC client pod reaches it through its Service.
fn a_grpc_server_on_its_socket_is_promoted_and_answers_a_grpc_client_through_its_service(
    env: &Env,
) -> anyhow::Result<()> {
    let grpc = echo_app("grpc")
        .annotated()
        .annotation(PORTS_ANNOTATION, "9090=grpc")
        .annotation(GRPC_HEALTH_SERVICE_ANNOTATION, "grpc")
        .args(&["--grpc"])
        .grpc_on(9090);
    env.kube().apply(&grpc.manifest())?;
    // Ready: kubelet's gRPC probe on pod IP:9090 passed, through the inbound listener.
    let pod = env.wait_pod_ready("default", "grpc")?;
    let pod_uid = uid(&pod)?;
    env.wait_pinned("app_default_grpc_9090", &pod_uid, &env.socket_path(&pod_uid, "s", "app.sock"))?;
    eventually("health gateway 200 while SERVING", WAIT, || Ok(env.health("health_default_grpc")? == 200))?;
    let check = env.endpoint("health_default_grpc")?;
    println!("health_default_grpc SERVING: gateway 200, Envoy's endpoint {check:?}");

    let flag = env.socket_path(&pod_uid, "s", "not-serving");
    std::fs::write(&flag, b"")?;
    let flipped = Instant::now();
    eventually("health gateway 503 while NOT_SERVING", WAIT, || Ok(env.health("health_default_grpc")? == 503))?;
    println!("NOT_SERVING: gateway 503 after {:.1} s", flipped.elapsed().as_secs_f64());
    // kubelet's gRPC probe sees NOT_SERVING too: the pod leaves the Service's endpoints.
    let ready = || -> anyhow::Result<bool> {
        let pod = env.pod_json("default", "grpc")?;
        let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        Ok(conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    };
    eventually("pod grpc NotReady while NOT_SERVING", WAIT, || Ok(!ready()?))?;
    let ip = env.kube().ok(&["get", "service", "-n", "default", "grpc", "-o", "jsonpath={.spec.clusterIP}"])?;
    let url = format!("http://{}:9090", ip.trim());
    let (ok, out) = env.client_run("grpc-client-down", &["--grpc-check", &url, "--service", "grpc"])?;
    ensure!(!ok, "through the Service while NOT_SERVING (no ready endpoint): {out}");

    std::fs::remove_file(&flag)?;
    let flipped = Instant::now();
    eventually("health gateway 200 when SERVING again", WAIT, || Ok(env.health("health_default_grpc")? == 200))?;
    println!("SERVING again: gateway 200 after {:.1} s", flipped.elapsed().as_secs_f64());
    eventually("pod grpc Ready again", WAIT, ready)?;
    let (ok, out) = env.client_run("grpc-client", &["--grpc-check", &url, "--service", "grpc"])?;
    println!("client pod: uds-echo --grpc-check {url} --service grpc\n{out}");
    ensure!(ok && out.contains("SERVING"), "a gRPC client through the Service: {out}");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "grpc", "--wait=true"])?;
    Ok(())
}

/// A pod named with a dot (as a Deployment `api.v2` makes them): Envoy's Prometheus output keeps
/// one metric family per kind, the whole pod identity in the cluster label.
fn a_dotted_pod_name_keeps_envoys_metric_names(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("dots").pod_name("api.v2").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "api.v2")?;
    let pod_uid = uid(&pod)?;
    env.wait_pinned("app_default_api.v2_8080", &pod_uid, &env.socket_path(&pod_uid, "s", "app.sock"))?;
    let ip = pod["status"]["podIP"].as_str().context("the pod's IP")?.to_owned();
    let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
    for _ in 0..3 {
        let body = client.get(format!("http://{ip}:8080/stats")).send()?.text()?;
        ensure!(body.contains("dots over unix"), "through the inbound listener: {body}");
    }
    let (_, prom) = http_get(ENVOY_ADMIN, "/stats/prometheus", &[])?;
    let ours: Vec<&str> = prom.lines().filter(|l| l.contains("api~v2")).collect();
    println!("/stats/prometheus, series of pod default/api.v2 ({} in all), e.g.:", ours.len());
    for l in ours.iter().filter(|l| l.contains("upstream_cx_total") || l.contains("tcp_downstream_cx_total")) {
        println!("  {l}");
    }
    // Through the inbound listener's TCP proxy: one upstream connection (the client keeps it alive).
    let want = r#"envoy_cluster_upstream_cx_total{envoy_cluster_name="app_default_api~v2_8080"} "#;
    ensure!(prom.lines().any(|l| l.starts_with(want) && !l.ends_with(" 0")), "{want}<n ≥ 1> missing");
    let leaked: Vec<&str> =
        prom.lines().filter(|l| !l.starts_with('#') && l.split('{').next().unwrap_or(l).contains("v2")).collect();
    ensure!(leaked.is_empty(), "metric names carrying part of the pod name: {leaked:?}");
    env.kube().ok(&["delete", "pod", "-n", "default", "api.v2", "--wait=true"])?;
    env.kube().ok(&["delete", "service,serviceaccount", "-n", "default", "dots", "--wait=true"])?;
    Ok(())
}

/// Pod web's socket path is made a FIFO (its socket moved aside): the agent falls back to TCP.
/// The socket put back is served over its pin at once (the socket watch), not at the next
/// periodic re-check (`recheckSeconds`, 10 s by default).
fn a_pod_back_on_its_socket_is_served_at_once(env: &Env) -> anyhow::Result<()> {
    let pod = env.pod_json("default", "web")?;
    let pod_uid = uid(&pod)?;
    let socket = env.socket_path(&pod_uid, "s", "app.sock");
    let aside = socket.with_file_name("app.sock.aside");
    let pin = format!("{PINS}/{pod_uid}.sock");
    env.wait_pinned("app_default_web_8080", &pod_uid, &socket)?;
    std::fs::rename(&socket, &aside)?;
    let made = std::process::Command::new("mkfifo").arg(&socket).status().context("mkfifo")?;
    ensure!(made.success(), "mkfifo {}", socket.display());
    let fell = Instant::now();
    eventually("web falls back to TCP (not a socket)", WAIT, || {
        Ok(env.endpoint("app_default_web_8080")?.is_some_and(|(a, _)| a != pin))
    })?;
    println!("FIFO at the socket path: web on TCP after {:.2} s", fell.elapsed().as_secs_f64());
    std::fs::remove_file(&socket)?;
    std::fs::rename(&aside, &socket)?;
    let back = Instant::now();
    let mut polls = 0u32;
    while env.endpoint("app_default_web_8080")?.is_none_or(|(a, _)| a != pin) {
        polls += 1;
        ensure!(back.elapsed() < WAIT, "web not back on its pin within {} s", WAIT.as_secs());
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = back.elapsed();
    println!("socket back: Envoy dials web's pin again after {:.3} s ({polls} polls of /clusters)", took.as_secs_f64());
    env.wait_pinned("app_default_web_8080", &pod_uid, &socket)?;
    eventually("health gateway 200 again", WAIT, || Ok(env.health("health_default_web")? == 200))?;
    println!("health_default_web 200 again after {:.2} s", back.elapsed().as_secs_f64());
    // Half the periodic re-check: only the socket watch can be this quick.
    ensure!(took < Duration::from_secs(5), "back on the socket after {took:?}: not the socket watch");
    Ok(())
}

fn memory_emptydir_socket_is_reached(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("mem").socket_volume("m").in_memory().annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "mem")?;
    let pod_uid = uid(&pod)?;
    let path = env.socket_path(&pod_uid, "m", "app.sock");
    // The tmpfs was mounted after the node pod started: HostToContainer propagation shows it.
    let volume = format!("{pod_uid}/volumes/kubernetes.io~empty-dir/m ");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")?.lines().any(|l| l.contains(&volume));
    ensure!(mounted, "the Memory emptyDir of pod mem is not a mount on the host");
    env.wait_pinned("app_default_mem_8080", &pod_uid, &path)?;
    Ok(())
}

fn app_container_restart_recovers_without_an_agent_restart(env: &Env) -> anyhow::Result<()> {
    let before = env.pod_json("default", "web")?;
    let node_before = env.node_pod()?;
    let id = before["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("containerd://"))
        .context("web's container id")?
        .to_owned();
    let path = env.socket_path(&uid(&before)?, "s", "app.sock");
    // A re-created socket is a new file: its ctime is after the kill. (Its inode number may be
    // the old one: the file system reuses a freed inode number at once.)
    let killed_at = std::time::SystemTime::now();
    env.node.ctr(&["tasks", "kill", "-s", "SIGKILL", &id])?;
    eventually("web's app container restarted", WAIT, || {
        Ok(restarts(&env.pod_json("default", "web")?).iter().any(|(n, r)| n == "app" && *r >= 1))
    })?;
    eventually("the app to re-create its socket", WAIT, || {
        Ok(std::fs::symlink_metadata(&path).is_ok_and(|m| ctime(&m) > killed_at))
    })?;
    // The new socket is a new inode: the agent re-pins it.
    env.wait_pinned("app_default_web_8080", &uid(&before)?, &path)?;
    eventually("health gateway 200 again", WAIT, || Ok(env.health("health_default_web")? == 200))?;
    let node_after = env.node_pod()?;
    ensure!(uid(&node_after)? == uid(&node_before)?, "the node pod was replaced");
    ensure!(restarts(&node_after) == restarts(&node_before), "node pod restarts changed: {:?}", restarts(&node_after));
    Ok(())
}

fn release_containers_have_no_restarts_two_minutes_after_install(env: &Env) -> anyhow::Result<()> {
    let settle = Duration::from_secs(120).saturating_sub(env.installed_at.elapsed());
    std::thread::sleep(settle);
    let pods = env.release_pods()?;
    for p in &pods {
        for (c, r) in restarts(p) {
            ensure!(r == 0, "{}/{c} restarted {r} times: {}", pod_name(p), p["status"]["containerStatuses"]);
        }
    }
    println!(
        "{} s after install, restart counts: {:?}",
        env.installed_at.elapsed().as_secs(),
        pods.iter().map(|p| (pod_name(p).to_owned(), restarts(p))).collect::<Vec<_>>()
    );
    Ok(())
}

/// Runs `event` while [`continuity::run`] keeps the field load on `target` (2 s before it, 3 s
/// after it returns), and returns what the load saw.
fn under_load(target: SocketAddr, expect: &str, event: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Report> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let load = Load::field(target, "/continuity", expect);
    std::thread::scope(|s| {
        let running = s.spawn(move || -> anyhow::Result<Report> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            Ok(rt.block_on(continuity::run(&load, async {
                let _ = stop_rx.await;
            })))
        });
        std::thread::sleep(Duration::from_secs(2));
        let done = event();
        std::thread::sleep(Duration::from_secs(3));
        let _ = stop_tx.send(());
        let report = running.join().map_err(|_| anyhow::anyhow!("the load thread panicked"))??;
        done?;
        Ok(report)
    })
}

/// The container ID (containerd's) of container `name` in `pod`.
fn container_id(pod: &Value, name: &str) -> anyhow::Result<String> {
    let statuses = pod["status"]["containerStatuses"].as_array().context("no containerStatuses")?;
    let c = statuses.iter().find(|c| c["name"] == name).with_context(|| format!("no container {name}"))?;
    let id = c["containerID"].as_str().context("no containerID")?;
    Ok(id.trim_start_matches("containerd://").to_owned())
}

/// The agent's `process_start_time_seconds` on its admin port (host network): which process answers.
fn agent_started_at() -> Option<String> {
    let (_, body) = http_get(AGENT_ADMIN, "/metrics", &[]).ok()?;
    body.lines().find(|l| l.starts_with("process_start_time_seconds ")).map(str::to_owned)
}

/// SIGKILLs container `id` through containerd (no API server involved), as a crash would.
fn kill_container(env: &Env, id: &str) -> anyhow::Result<()> {
    env.node.ctr(&["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id]).map(|_| ())
}

/// Waits until an agent process other than the one that started at `before` answers `/readyz` 200
/// (Envoy has applied its CDS and LDS): the container was restarted in place.
fn wait_new_agent_ready(before: &Option<String>) -> anyhow::Result<()> {
    eventually("a restarted agent, ready (Envoy ACKed it)", WAIT, || {
        let now = agent_started_at();
        Ok(now.is_some() && now != *before && http_get(AGENT_ADMIN, "/readyz", &[]).map(|(c, _)| c)? == 200)
    })
}

/// Stops (SIGSTOP) the real node's kube-apiserver, and continues it (SIGCONT) when dropped, on
/// every exit path: the API server is unreachable (connections hang) while this lives.
struct FrozenApiServer(String);

impl FrozenApiServer {
    fn freeze(env: &Env) -> anyhow::Result<FrozenApiServer> {
        let pid = std::fs::read_to_string(env.node.dir().join("cp/apiserver.pid")).context("apiserver.pid")?;
        let pid = pid.trim().to_owned();
        let ok = std::process::Command::new("kill").args(["-STOP", &pid]).status()?.success();
        ensure!(ok, "kill -STOP {pid}");
        Ok(FrozenApiServer(pid))
    }
}

impl Drop for FrozenApiServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

/// Envoy's `listener_manager.listener_removed`: listeners LDS removed since Envoy started.
fn envoy_listeners_removed() -> anyhow::Result<u64> {
    let (_, body) = http_get(ENVOY_ADMIN, "/stats?filter=^listener_manager.listener_removed$", &[])?;
    let value = body.trim().rsplit(": ").next().unwrap_or_default();
    value.parse().with_context(|| format!("listener_removed stat: {body:?}"))
}

/// Agent restarts never touch the data plane (steady load from the host through Service `cont` to
/// a UDS-only pod: 50 requests/s each on a new connection plus 3 keep-alive connections, no
/// retries; a refused, reset, timed-out or wrong-responder request fails). The agent runs in its
/// own DaemonSet (aether-node), Envoy in another (aether-proxy):
/// - the agent container killed; the agent pod deleted (a new pod, empty state dir); a `helm
///   upgrade` that changes only the agent (a roll of aether-node), and one back: nothing refused
///   or reset, no keep-alive connection cut, Envoy's pod untouched and no listener removed;
/// - the suite sees a gap when there is one: the Envoy container killed fails requests;
/// - last (kube-proxy lags after an API-server outage), the API server stopped, then the agent
///   container killed while it is down (the agent replays its state dir, netns included): the
///   same as the first events.
fn agent_restarts_under_load_fail_no_request(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("cont").annotated().manifest())?;
    env.wait_pod_ready("default", "cont")?;
    eventually("Envoy's inbound_default_cont_8080 listener is active", WAIT, || {
        Ok(active_listener_netns("inbound_default_cont_8080")?.is_some())
    })?;
    let ip = env.kube().ok(&["get", "service", "-n", "default", "cont", "-o", "jsonpath={.spec.clusterIP}"])?;
    let target: SocketAddr = format!("{}:8080", ip.trim()).parse().context("ClusterIP")?;
    let expect = "cont over unix:/s/app.sock";
    eventually("the Service answers from the host", WAIT, || {
        let report = under_load_quick(target, expect)?;
        Ok(report.failed() == 0)
    })?;
    let proxy_before = env.proxy_pod()?;
    let removed_before = envoy_listeners_removed()?;
    let pins_before = pins()?;

    let killed_agent = under_load(target, expect, || {
        let before = agent_started_at();
        kill_container(env, &container_id(&env.node_pod()?, "aether-agent")?)?;
        wait_new_agent_ready(&before)
    })?;
    println!("agent container killed: {}", killed_agent.summary());

    let deleted_agent_pod = under_load(target, expect, || {
        let before = agent_started_at();
        let old = env.node_pod()?;
        env.kube().ok(&["delete", "pod", "-n", NS, pod_name(&old), "--wait=false"])?;
        wait_new_agent_ready(&before)?;
        let new = env.node_pod()?;
        ensure!(uid(&new)? != uid(&old)?, "the agent pod was not replaced");
        Ok(())
    })?;
    println!("agent pod deleted: {}", deleted_agent_pod.summary());
    // The leaving agent kept the pins for Envoy (its DaemonSet stays) and the new one adopted them.
    ensure!(
        pins()? == pins_before,
        "pins changed across the agent pod's replacement: {:?} -> {:?}",
        pins_before,
        pins()?
    );

    let upgraded: Vec<(&str, Report)> =
        [("helm upgrade changing only the agent", &["agent.recheckSeconds=9"][..]), ("helm upgrade back", &[][..])]
            .into_iter()
            .map(|(event, sets)| {
                let r = under_load(target, expect, || {
                    let before = agent_started_at();
                    env.helm_aether("upgrade", sets)?;
                    wait_new_agent_ready(&before)
                })?;
                println!("{event}: {}", r.summary());
                Ok((event, r))
            })
            .collect::<anyhow::Result<_>>()?;

    let proxy_after = env.proxy_pod()?;
    let removed_after = envoy_listeners_removed()?;
    let envoy_log = env.kube().ok(&["logs", "-n", NS, pod_name(&proxy_after)])?;
    let lds: Vec<&str> =
        envoy_log.lines().filter(|l| l.contains("lds:") || l.contains("error adding listener")).collect();
    println!("Envoy's log lines on listeners (since its start):\n{}", lds.join("\n"));
    println!(
        "across the agent events: Envoy's pod {} -> {}, restarts {:?} -> {:?}, listener_manager.listener_removed {removed_before} -> {removed_after}",
        uid(&proxy_before)?,
        uid(&proxy_after)?,
        restarts(&proxy_before),
        restarts(&proxy_after)
    );
    ensure!(uid(&proxy_after)? == uid(&proxy_before)?, "an agent event replaced Envoy's pod");
    ensure!(
        restarts(&proxy_after) == restarts(&proxy_before),
        "an agent event restarted Envoy: {:?}",
        restarts(&proxy_after)
    );
    ensure!(
        removed_after == removed_before,
        "Envoy removed {} listener(s) across agent restarts",
        removed_after - removed_before
    );

    let killed_envoy = under_load(target, expect, || {
        kill_container(env, &container_id(&env.proxy_pod()?, "envoy")?)?;
        eventually("Envoy back, with the inbound listener", WAIT, || {
            Ok(active_listener_netns("inbound_default_cont_8080").ok().flatten().is_some())
        })
    })?;
    println!("envoy container killed (the suite must see this gap): {}", killed_envoy.summary());

    let agent_id = container_id(&env.node_pod()?, "aether-agent")?;
    let removed_before = envoy_listeners_removed()?;
    let api_down = under_load(target, expect, || {
        let frozen = FrozenApiServer::freeze(env)?;
        std::thread::sleep(Duration::from_secs(2));
        let before = agent_started_at();
        kill_container(env, &agent_id)?;
        wait_new_agent_ready(&before)?;
        std::thread::sleep(Duration::from_secs(5));
        drop(frozen);
        Ok(())
    })?;
    println!("API server stopped, agent container killed while it is down: {}", api_down.summary());
    let removed_after = envoy_listeners_removed()?;
    println!("across the API-server event: listener_manager.listener_removed {removed_before} -> {removed_after}");
    ensure!(
        removed_after == removed_before,
        "Envoy removed {} listener(s) with the API server down",
        removed_after - removed_before
    );

    // A withdrawn or restarted listener shows as refused or reset requests and cut keep-alive
    // connections (the Envoy kill above: all refused): none may happen in any agent event. A lone
    // request that times out (2 s) while every neighbour is served is tolerated up to 1 in 1000
    // over all the agent events: one was seen in 2 of 7 API-server events on this node (1 of 632,
    // 1 of 1487 requests, a 0.04 s longest gap around it), none in 3 runs of that event alone
    // (0 of 713, 2006, 4835), and once 1 s *before* an agent pod was deleted (1 of 336), so with no
    // agent event under way; its cause is not known yet, and the count is printed either way.
    let agent_events: Vec<(&str, &Report)> =
        [("agent killed", &killed_agent), ("agent pod deleted", &deleted_agent_pod)]
            .into_iter()
            .chain(upgraded.iter().map(|(e, r)| (*e, r)))
            .chain([("API server down, agent killed", &api_down)])
            .collect();
    let (mut timeouts, mut requests) = (0, 0);
    for (event, r) in &agent_events {
        let t = r.requests.iter().filter(|o| o.failure == Some(continuity::Failure::Timeout)).count();
        ensure!(r.failed() == t, "{event}: {}", r.summary());
        ensure!(r.longest_gap() < Duration::from_secs(1), "{event}: {}", r.summary());
        ensure!(r.keepalive.iter().all(|k| k.cut.is_none()), "{event}: {}", r.summary());
        timeouts += t;
        requests += r.requests.len();
    }
    println!("agent events: {timeouts} of {requests} new-connection requests timed out, none refused or reset");
    ensure!(timeouts * 1000 <= requests, "more than 1 in 1000 timed out over the agent events");
    ensure!(killed_envoy.failed() > 0, "an Envoy restart must show as failed requests: {}", killed_envoy.summary());
    println!("kubectl get ds,pods -n {NS} -o wide:\n{}", env.kube().ok(&["get", "ds,pods", "-n", NS, "-o", "wide"])?);
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "cont", "--wait=true"])?;
    Ok(())
}

/// `kubectl rollout status` of the proxy DaemonSet: returns once every node runs an updated, Ready
/// proxy pod.
fn proxy_rollout_done(env: &Env) -> anyhow::Result<()> {
    env.kube().ok(&["rollout", "status", "-n", NS, "daemonset/aether-proxy", "--timeout=300s"]).map(|_| ())
}

/// The PID (host namespace) of the newest Envoy process the proxy launcher started.
fn node_envoy_pid() -> anyhow::Result<String> {
    let out = std::process::Command::new("pgrep").args(["-n", "-f", "config-path /etc/envoy/envoy.yaml"]).output()?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    ensure!(!pid.is_empty(), "no Envoy process on the node");
    Ok(pid)
}

/// The launcher's log lines of the proxy pod `pod` (its own, not Envoy's).
fn launcher_lines(env: &Env, pod: &Value) -> anyhow::Result<Vec<String>> {
    let log = env.kube().ok(&["logs", "-n", NS, pod_name(pod), "-c", "envoy"])?;
    Ok(log.lines().filter(|l| l.contains("aether_proxy_launcher")).map(str::to_owned).collect())
}

/// Planned replacements of the node's Envoy hand its listening sockets over (the load of
/// [`agent_restarts_under_load_fail_no_request`]: a UDS-only pod through its Service, no client
/// retries):
/// - a `helm upgrade` that changes only the proxy, and one that changes the agent and the proxy
///   (what every release does);
/// - three `kubectl rollout restart`s in a row, each started when the previous `rollout status`
///   returned (the second and third wait for the generation still draining);
/// - the proxy pod deleted (its launcher keeps Envoy serving until the replacement took over).
///
/// Crashes are measured too: the Envoy process killed twice within a minute is started again in
/// place by the launcher (no container restart), each gap under 5 s.
///
/// Each: 0 failed requests, no keep-alive connection cut during the event (the old Envoy keeps
/// them for `parentShutdownSeconds`, then exits and ends them: shown once, on a longer window),
/// the new pod's launcher says it took the sockets over, pins unchanged, no proxy container
/// restarted. Then the suite shows it sees a gap: with `proxy.handOver.enabled=false` the same
/// rollout fails requests; the way back on is a delete-first roll, measured.
fn proxy_replacements_under_load_fail_no_request(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("cont").annotated().manifest())?;
    env.wait_pod_ready("default", "cont")?;
    let ip = env.kube().ok(&["get", "service", "-n", "default", "cont", "-o", "jsonpath={.spec.clusterIP}"])?;
    let target: SocketAddr = format!("{}:8080", ip.trim()).parse().context("ClusterIP")?;
    let expect = "cont over unix:/s/app.sock";
    eventually("the Service answers from the host", WAIT, || Ok(under_load_quick(target, expect)?.failed() == 0))?;
    let pins_before = pins()?;
    let restart = || env.kube().ok(&["rollout", "restart", "-n", NS, "daemonset/aether-proxy"]).map(|_| ());
    let mut planned: Vec<(String, Report)> = Vec::new();
    let mut measure = |event: &str, f: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<()> {
        let before = env.proxy_pod()?;
        let r = under_load(target, expect, f)?;
        let after = env.proxy_pod()?;
        println!("{event}: {}", r.summary());
        ensure!(uid(&after)? != uid(&before)?, "{event}: the proxy pod was not replaced");
        let took = launcher_lines(env, &after)?;
        ensure!(
            took.iter().any(|l| l.contains("took the listening sockets over from epoch")),
            "{event}: the new Envoy did not hot restart from the old one; its launcher said:\n{}",
            took.join("\n")
        );
        ensure!(restarts(&after).iter().all(|(_, n)| *n == 0), "{event}: {:?}", restarts(&after));
        planned.push((event.to_owned(), r));
        Ok(())
    };
    measure("helm upgrade changing only the proxy", &|| {
        env.helm_aether("upgrade", &["proxy.logLevel=warning"])?;
        proxy_rollout_done(env)
    })?;
    measure("helm upgrade changing the agent and the proxy", &|| {
        env.helm_aether("upgrade", &["proxy.logLevel=info", "agent.recheckSeconds=9"])?;
        proxy_rollout_done(env)
    })?;
    for n in 1..=3 {
        measure(&format!("kubectl rollout restart {n} of 3 in a row"), &|| {
            restart()?;
            proxy_rollout_done(env)
        })?;
    }
    measure("proxy pod deleted", &|| {
        let old = env.proxy_pod()?;
        env.kube().ok(&["delete", "pod", "-n", NS, pod_name(&old), "--wait=false"])?;
        eventually("a new Ready proxy pod", WAIT, || {
            let p = env.proxy_pod()?;
            Ok(uid(&p)? != uid(&old)?
                && p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
    })?;
    // The keep-alive connections through the replaced Envoy: kept for the parent shutdown time.
    let drained = under_load(target, expect, || {
        let old = env.proxy_pod()?;
        restart()?;
        proxy_rollout_done(env)?;
        eventually("the replaced proxy pod gone (its Envoy drained and exited)", Duration::from_secs(120), || {
            Ok(env.release_pods()?.iter().all(|p| uid(p).ok() != uid(&old).ok()))
        })
    })?;
    println!("rollout restart, watched until the old pod is gone: {}", drained.summary());
    for k in &drained.keepalive {
        println!("  keep-alive: served {}, ended {:?}", k.served, k.cut);
    }
    let checked: Vec<(&str, &Report)> = planned
        .iter()
        .map(|(e, r)| (e.as_str(), r))
        .chain([("rollout restart, watched until the old pod is gone", &drained)])
        .collect();
    continuity::check_planned(&checked)?;
    ensure!(
        drained.keepalive.iter().all(|k| k.cut.is_none_or(|(at, _)| at >= Duration::from_secs(16))),
        "a keep-alive connection ended before the old Envoy's drain time (15 s): {}",
        drained.summary()
    );
    ensure!(pins()? == pins_before, "pins changed across the proxy replacements");
    // A keep-alive connection may end only once the old Envoy's drain time (15 s) is up: the
    // event starts at +2 s, the take-over comes after it.
    let drained_only =
        |r: &Report| r.keepalive.iter().all(|k| k.cut.is_none_or(|(at, _)| at >= Duration::from_secs(16)));
    for (event, r) in &planned {
        let ends: Vec<String> = r
            .keepalive
            .iter()
            .filter_map(|k| k.cut.map(|(at, f)| format!("+{:.1} s {f:?}", at.as_secs_f64())))
            .collect();
        println!("  {event}: keep-alive connections ended at {ends:?}");
        ensure!(drained_only(r), "{event}: a keep-alive connection ended before the drain time: {ends:?}");
    }

    // Crashes are not planned: Envoy's sockets close with it. The launcher starts a new Envoy in
    // the same container at once (no kubelet back-off), for a second crash within a minute too.
    for crash in 1..=2 {
        let pod = env.proxy_pod()?;
        let r = under_load(target, expect, || {
            let pid = node_envoy_pid()?;
            let ok = std::process::Command::new("kill").args(["-9", &pid]).status()?.success();
            ensure!(ok, "kill -9 {pid}");
            eventually("a new Envoy process serving the inbound listener", WAIT, || {
                Ok(node_envoy_pid().is_ok_and(|p| p != pid)
                    && active_listener_netns("inbound_default_cont_8080").ok().flatten().is_some())
            })
        })?;
        println!("Envoy process killed (crash {crash} of 2 within a minute): {}", r.summary());
        ensure!(
            restarts(&env.proxy_pod()?) == restarts(&pod),
            "crash {crash}: the kubelet restarted the container; the launcher should have restarted Envoy"
        );
        ensure!(r.longest_gap() < Duration::from_secs(5), "crash {crash}: {}", r.summary());
    }

    // The off switch: the same rollout now fails requests (the suite sees a gap when there is one).
    env.helm_aether("upgrade", &["proxy.handOver.enabled=false"])?;
    proxy_rollout_done(env)?;
    check_release_settled(env)?;
    let off = under_load(target, expect, || {
        restart()?;
        proxy_rollout_done(env)
    })?;
    println!("hand-over off, kubectl rollout restart (the suite must see this gap): {}", off.summary());
    let back = under_load(target, expect, || {
        env.helm_aether("upgrade", &[])?;
        proxy_rollout_done(env)
    })?;
    println!("hand-over switched back on (a delete-first roll from an Envoy without it): {}", back.summary());
    check_release_settled(env)?;
    ensure!(off.failed() > 0, "a rollout without the hand-over must fail requests: {}", off.summary());
    println!("kubectl get ds,pods -n {NS} -o wide:\n{}", env.kube().ok(&["get", "ds,pods", "-n", NS, "-o", "wide"])?);
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "cont", "--wait=true"])?;
    Ok(())
}

/// The socket pins on the host now (file names in the pin dir), sorted.
fn pins() -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> =
        std::fs::read_dir(PINS)?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    Ok(names)
}

/// One second of the field load on `target`, for a readiness check before measuring.
fn under_load_quick(target: SocketAddr, expect: &str) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let load = Load { keepalive: 0, ..Load::field(target, "/ready", expect) };
    Ok(rt.block_on(async { continuity::run(&load, tokio::time::sleep(Duration::from_secs(1))).await }))
}

/// Both node pods deleted (the agent's and Envoy's, as a node's pods are after an eviction): new
/// ones come up Ready with no restarts and serve the pods again. This also replaces the pods the
/// previous case restarted.
fn replaced_node_pod_resumes_delivery(env: &Env) -> anyhow::Result<()> {
    let old = [env.node_pod()?, env.proxy_pod()?];
    let names: Vec<&str> = old.iter().map(pod_name).collect();
    env.kube().ok(&[&["delete", "pod", "-n", NS][..], &names[..], &["--wait=true"][..]].concat())?;
    for (component, before) in ["node", "proxy"].into_iter().zip(&old) {
        let mut new = None;
        eventually(&format!("a new Ready {component} pod"), WAIT, || {
            let p = env.component_pod(component)?;
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let fresh = uid(&p)? != uid(before)?;
            if fresh && ready {
                new = Some(p);
            }
            Ok(fresh && ready)
        })?;
        let new = new.context("new pod")?;
        ensure!(restarts(&new).iter().all(|(_, r)| *r == 0), "new {component} pod restarted: {:?}", restarts(&new));
    }
    eventually("health gateway 200 for web from the new node pods", WAIT, || {
        Ok(env.health("health_default_web").unwrap_or(0) == 200)
    })?;
    Ok(())
}

fn deleted_pod_clusters_are_withdrawn(env: &Env) -> anyhow::Result<()> {
    ensure!(env.endpoint("app_default_mem_8080")?.is_some(), "mem is not served before the delete");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "mem", "--wait=true"])?;
    eventually("app_default_mem_8080 gone from Envoy", WAIT, || Ok(env.endpoint("app_default_mem_8080")?.is_none()))?;
    eventually("health gateway 404 for health_default_mem", WAIT, || Ok(env.health("health_default_mem")? == 404))?;
    Ok(())
}

/// Every other command line and path the chart can give a container, run on the node: a short
/// pods-dir mount path (both binaries' --kubelet-pods-dir), a host state dir, a CNI records dir,
/// plain logs; then UDS delivery disabled; then back to the defaults. Each is a `helm upgrade`.
/// The chart's observability, on the real node: with `metrics.*` on, its PodMonitors,
/// ServiceMonitor, PrometheusRule and dashboard ConfigMap pass the API server's validation
/// against the Prometheus Operator's CRDs (tests/vendor/prometheus-operator; an object off the
/// schema is refused); a real Prometheus, configured as the operator would configure it from the
/// monitors the API server stored (`aether_tests::prometheus`, the operator does not run here),
/// scrapes the agent, the controller and the node Envoy's stats listener (all targets up, and
/// the listener serves nothing but `/stats/prometheus`); it loads the chart's rules, none fails
/// to evaluate and none fires on this healthy node; every metric a rule reads and every query of
/// every dashboard panel returns series; and requests to a pod served over its socket count in
/// Envoy's stats for its cluster.
fn prometheus_scrapes_the_node_and_every_rule_and_panel_has_series(env: &Env) -> anyhow::Result<()> {
    use aether_tests::prometheus::{Prometheus, kubernetes_sd_targets, metric_names, scrape_configs};
    let kube = env.kube();
    kube.apply(&echo_app("scraped").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "scraped")?;
    let socket = env.socket_path(&uid(&pod)?, "s", "app.sock");
    env.wait_pinned("app_default_scraped_8080", &uid(&pod)?, &socket)?;
    let vendor = repo_root().join("tests/vendor/prometheus-operator");
    for crd in ["podmonitors", "servicemonitors", "prometheusrules"] {
        let file = vendor.join(format!("{crd}.yaml"));
        kube.ok(&["apply", "--server-side", "-f", file.to_str().context("path")?])?;
        kube.ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{crd}.monitoring.coreos.com"),
            "--timeout=60s",
        ])?;
    }
    // The schemas are enforced: a PodMonitor endpoint with a port number out of range is refused.
    let bad = "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: bad, namespace: default}\nspec:\n  selector: {matchLabels: {a: b}}\n  podMetricsEndpoints: [{portNumber: 70000}]\n";
    let file = env.node.dir().join("bad-podmonitor.yaml");
    std::fs::write(&file, bad)?;
    let out = kube.run(&["apply", "--dry-run=server", "-f", file.to_str().context("path")?])?;
    ensure!(!out.status.success(), "the operator's schema let portNumber 70000 through");
    println!("schema check: {}", String::from_utf8_lossy(&out.stderr).trim());

    let on = [
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.interval=5s",
        "metrics.podMonitor.scrapeTimeout=5s",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.interval=5s",
        "metrics.serviceMonitor.scrapeTimeout=5s",
        "metrics.prometheusRule.enabled=true",
        "metrics.dashboard.enabled=true",
    ];
    env.helm_aether("upgrade", &on)?;
    check_release_settled(env)?;
    let stored = |kind: &str| -> anyhow::Result<Vec<Value>> {
        let v: Value = serde_json::from_str(&kube.ok(&["get", kind, "-n", NS, "-o", "json"])?)?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    };
    let mut monitors = stored("podmonitors.monitoring.coreos.com")?;
    monitors.extend(stored("servicemonitors.monitoring.coreos.com")?);
    let rules = stored("prometheusrules.monitoring.coreos.com")?;
    let dashboards = stored("configmaps")?
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect::<Vec<_>>();
    ensure!(
        monitors.len() == 3 && rules.len() == 1 && dashboards.len() == 1,
        "stored: {} monitors, {} rules, {} dashboards",
        monitors.len(),
        rules.len(),
        dashboards.len()
    );

    // The stats listener serves only GET /stats/prometheus, without a query string.
    let ip = env.node.facts().node_ip.clone();
    let stats = |path: &str| -> anyhow::Result<(u16, String)> {
        let resp = reqwest::blocking::Client::new().get(format!("http://{ip}:{STATS_PORT}{path}")).send()?;
        Ok((resp.status().as_u16(), resp.text()?))
    };
    let (code, body) = stats("/stats/prometheus")?;
    ensure!(
        code == 200
            && body.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"app_default_scraped_8080\"}"),
        "stats listener: {code}"
    );
    ensure!(
        !body.contains("envoy_cluster_upstream_cx_rx_bytes_total"),
        "the default filter keeps out per-cluster byte counters"
    );
    for path in ["/stats/prometheus?filter=.*", "/config_dump", "/stats", "/quitquitquit"] {
        let (code, _) = stats(path)?;
        ensure!(code == 404, "{path} on the stats listener answered {code}");
    }

    let dir = env.node.dir().join("prometheus");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let groups: Vec<Value> =
        rules.iter().flat_map(|r| r["spec"]["groups"].as_array().cloned().unwrap_or_default()).collect();
    std::fs::write(dir.join("rules.yml"), serde_json::to_string(&serde_json::json!({ "groups": groups }))?)?;
    // Debian's Prometheus has no Kubernetes discovery: the test discovers as it would.
    for m in &monitors {
        let file = dir.join(format!(
            "{}_{}.json",
            m["metadata"]["namespace"].as_str().unwrap_or_default(),
            m["metadata"]["name"].as_str().unwrap_or_default()
        ));
        std::fs::write(file, serde_json::to_string(&kubernetes_sd_targets(&kube, m)?)?)?;
    }
    let config = serde_json::json!({
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [dir.join("rules.yml").display().to_string()],
        "scrape_configs": scrape_configs(&monitors, &dir)?,
    });
    let prom = Prometheus::start(&dir, &config)?;
    let jobs = [format!("{NS}/aether-node"), format!("{NS}/aether-proxy"), "aether-controller".to_owned()];
    let mut last = Vec::new();
    eventually("Prometheus's agent, Envoy and controller targets are up", WAIT, || {
        last = prom.targets()?;
        Ok(jobs.iter().all(|j| last.iter().any(|(job, _, health, _)| job == j && health == "up"))
            && last.iter().all(|(_, _, health, _)| health == "up"))
    })
    .with_context(|| format!("targets: {last:#?}\n{}", prom.log()))?;
    for (job, url, health, _) in &last {
        println!("target {job} {url} {health}");
    }

    // Requests through the pod's inbound listener count in Envoy's stats for its cluster.
    let pod_ip = pod["status"]["podIP"].as_str().context("the pod's IP")?.to_owned();
    for _ in 0..5 {
        let resp = reqwest::blocking::Client::new().get(format!("http://{pod_ip}:8080/hello")).send()?;
        let (status, body) = (resp.status(), resp.text()?);
        ensure!(status.is_success() && body.contains("over unix:/s/app.sock"), "the pod answered {status}: {body}");
    }
    let served = r#"envoy_cluster_upstream_cx_total{envoy_cluster_name="app_default_scraped_8080"} >= 5"#;
    eventually("Prometheus sees the pod's 5 connections in Envoy's stats", WAIT, || {
        Ok(!prom.query(served)?.is_empty())
    })?;

    // Two scrapes' worth of samples for rate() and the rules' first evaluations.
    std::thread::sleep(Duration::from_secs(20));
    let mut missing = Vec::new();
    let mut names_checked = 0;
    for group in &groups {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let (alert, expr) = (rule["alert"].as_str().unwrap_or("?"), rule["expr"].as_str().unwrap_or_default());
            for name in metric_names(expr, &["aether_", "envoy_", "up"]) {
                names_checked += 1;
                if prom.query(&format!("count({name})"))?.is_empty() {
                    missing.push(format!("rule {alert}: {name}"));
                }
            }
        }
    }
    let substitute = |e: &str| {
        e.replace("$__rate_interval", "1m")
            .replace("$job_controller", ".*")
            .replace("$job_node", ".*")
            .replace("$job_proxy", ".*")
            .replace("$node", ".*")
    };
    let mut queries = 0;
    for cm in &dashboards {
        for (file, text) in cm["data"].as_object().into_iter().flatten() {
            let dash: Value =
                serde_json::from_str(text.as_str().unwrap_or_default()).with_context(|| format!("{file} is JSON"))?;
            for panel in dash["panels"].as_array().into_iter().flatten() {
                for target in panel["targets"].as_array().into_iter().flatten() {
                    let expr = substitute(target["expr"].as_str().unwrap_or_default());
                    queries += 1;
                    if prom.query(&expr)?.is_empty() {
                        missing.push(format!("panel {:?}: {expr}", panel["title"]));
                    }
                }
            }
            for var in dash["templating"]["list"].as_array().into_iter().flatten() {
                if let Some(q) = var["query"]["query"].as_str().and_then(|q| q.strip_prefix("label_values(")) {
                    let (metric, label) =
                        q.trim_end_matches(')').split_once(',').context("label_values(metric, label)")?;
                    queries += 1;
                    let values = prom.api(&format!("label/{}/values", label.trim()), &[("match[]", metric.trim())])?;
                    if values.as_array().is_none_or(Vec::is_empty) {
                        missing.push(format!("variable {}: {q}", var["name"]));
                    }
                }
            }
        }
    }
    ensure!(missing.is_empty(), "no series for:\n{}", missing.join("\n"));
    println!("{names_checked} metric names of the rules and {queries} dashboard queries return series");

    let loaded = prom.api("rules", &[])?;
    let mut count = 0;
    for group in loaded["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            count += 1;
            ensure!(rule["health"] == "ok", "rule {} does not evaluate: {}", rule["name"], rule["lastError"]);
            ensure!(rule["state"] != "firing", "alert {} fires on a healthy node: {}", rule["name"], rule["alerts"]);
        }
    }
    ensure!(count > 0, "Prometheus loaded no rule");
    println!("{count} rules loaded, evaluated, none firing");
    drop(prom);

    kube.ok(&["delete", "pod,service,serviceaccount", "-n", "default", "scraped", "--wait=true"])?;
    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    Ok(())
}

fn helm_upgrade_runs_every_chart_variant(env: &Env) -> anyhow::Result<()> {
    let pod = env.pod_json("default", "web")?;
    let web_uid = uid(&pod)?;
    env.helm_aether(
        "upgrade",
        &[
            "proxy.udsWorkloads.mountPath=/k",
            "agent.stateDir=/var/lib/aether/agent",
            "agent.cniRecordsDir=/run/aether-cni",
            "agent.criSocket=",
            "logFormat=plain",
            "proxy.logLevel=debug",
        ],
    )?;
    check_release_settled(env)?;
    // The agent reads the pods dir at /k; Envoy still dials the pin.
    env.wait_pinned("app_default_web_8080", &web_uid, &env.socket_path(&web_uid, "s", "app.sock"))?;

    env.helm_aether("upgrade", &["proxy.udsWorkloads.enabled=false"])?;
    check_release_settled(env)?;
    eventually("web delivered over TCP (in its netns) with UDS disabled", WAIT, || {
        Ok(env.endpoint("app_default_web_8080")?.is_some_and(|(a, _)| a == "127.0.0.1:8080"))
    })?;

    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    env.wait_pinned("app_default_web_8080", &web_uid, &env.socket_path(&web_uid, "s", "app.sock"))?;
    Ok(())
}

/// `socketLimit=filesystem` in both charts (off by default): a pod whose kubelet
/// socket path is past sun_path (a 50-byte volume name: 150 bytes) is served through its pin,
/// the webhook admits a policy value the default CRD refuses, and the defaults come back.
fn socket_limit_filesystem_serves_a_path_past_sun_path_through_its_pin(env: &Env) -> anyhow::Result<()> {
    let crds = aether_tests::node::packaged_chart("aether-crds")?;
    let crds = crds.to_str().context("path")?;
    let volume = format!("v{}", "x".repeat(49));
    let long_policy =
        policy("default", "long-socket").target("longsock").socket(&format!("{volume}/app.sock")).manifest();
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), &long_policy)?;
    let dry_run = || -> anyhow::Result<(bool, String)> {
        let out =
            env.kube().run(&["apply".as_ref(), "--dry-run=server".as_ref(), "-f".as_ref(), file.path().as_os_str()])?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), text))
    };
    let (ok, text) = dry_run()?;
    ensure!(!ok && text.contains("udsSocket"), "the default CRD refuses a 59-byte value: {text}");

    env.node.helm(&["upgrade", "aether-crds", crds, "--set", "socketLimit=filesystem", "--wait"])?;
    env.helm_aether("upgrade", &["socketLimit=filesystem"])?;
    check_release_settled(env)?;
    let (ok, text) = dry_run()?;
    ensure!(ok, "with socketLimit=filesystem the webhook admits a 59-byte value: {text}");

    env.kube().apply(&echo_app("longsock").socket_volume(&volume).annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "longsock")?;
    let path = env.socket_path(&uid(&pod)?, &volume, "app.sock");
    let bytes = path.as_os_str().len();
    ensure!(bytes > 107, "the kubelet's socket path is past sun_path: {bytes} bytes");
    env.wait_pinned("app_default_longsock_8080", &uid(&pod)?, &path)?;
    println!("socketLimit=filesystem: a {bytes}-byte socket path served through its pin");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "longsock", "--wait"])?;

    env.node.helm(&["upgrade", "aether-crds", crds, "--reset-values", "--wait"])?;
    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    let (ok, _) = dry_run()?;
    ensure!(!ok, "back on the defaults the 59-byte value is refused again");
    Ok(())
}

/// After an upgrade (helm --wait returned): every release pod Ready with no restarts.
fn check_release_settled(env: &Env) -> anyhow::Result<()> {
    check_release_settled_with(env, 4)
}

/// [`check_release_settled`] for a release of `count` pods (3 with `controller.replicas=1`).
fn check_release_settled_with(env: &Env, count: usize) -> anyhow::Result<()> {
    let ready = |p: &Value| {
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    };
    eventually("release pods Ready with no restarts", WAIT, || {
        let pods = env.release_pods()?;
        let terminating = pods.iter().any(|p| p["metadata"].get("deletionTimestamp").is_some());
        for p in &pods {
            if let Some((c, r)) = restarts(p).into_iter().find(|(_, r)| *r > 0) {
                bail!("{}/{c} restarted {r} times: {}", pod_name(p), p["status"]["containerStatuses"]);
            }
        }
        Ok(!terminating && pods.len() == count && pods.iter().all(ready))
    })
}

/// The chart runs with every bounded integer value at an edge of its schema bounds
/// (tests/e2e/charts.rs checks each renders there and is refused one past it): one upgrade with
/// the minimums, one with the defaults, one with the maximums (two ports that must differ take
/// opposite edges, so the minimums' Envoy port becomes the maximums' agent port: the defaults in
/// between let the old Envoy go first), then the defaults again. Each time every release pod is Ready with no restarts, the webhook answers through
/// its Service, and the agent's metrics show the cap it was given. A changed
/// `proxy.handOver.baseId` is a cold replacement of Envoy (the launcher logs why). Rendered only:
/// `proxy.adminPort` (this suite reads Envoy's admin there) and the maximum
/// `proxy.handOver.parentShutdownSeconds` and `successorWaitSeconds` (the replaced pod would
/// stay Terminating for up to 70 minutes).
fn chart_values_at_their_edges_run_on_the_real_node(env: &Env) -> anyhow::Result<()> {
    let denied_through_the_service = || -> anyhow::Result<()> {
        let example = repo_root().join("crds/examples/deny-over-budget.yaml");
        let out =
            env.kube().run(&["apply", "-n", "default", "--dry-run=server", "-f", example.to_str().context("path")?])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && stderr.contains("the budget is 16 bytes"), "webhook answer: {stderr}");
        Ok(())
    };
    let clusters_max = |port: u16, want: &str| -> anyhow::Result<()> {
        eventually(&format!("aether_agent_clusters_max {want} on the agent's admin port {port}"), WAIT, || {
            Ok(http_get(port, "/metrics", &[])
                .is_ok_and(|(_, m)| m.lines().any(|l| l == format!("aether_agent_clusters_max {want}"))))
        })
    };
    let min = [
        "controller.replicas=1",
        "controller.webhookPort=1024",
        "controller.adminPort=65535",
        "controller.maxBodyBytes=65536",
        "controller.listeners.webhook.maxConnections=1",
        "controller.listeners.webhook.handshakeTimeoutSeconds=1",
        "controller.listeners.webhook.idleTimeoutSeconds=1",
        "controller.listeners.admin.maxConnections=4",
        "controller.listeners.admin.firstByteTimeoutSeconds=1",
        "controller.listeners.admin.idleTimeoutSeconds=1",
        "webhook.timeoutSeconds=1",
        "webhook.certs.job.backoffLimit=0",
        "webhook.certs.job.activeDeadlineSeconds=30",
        "agent.adminPort=1024",
        "agent.recheckSeconds=1",
        "agent.maxClusters=2",
        "agent.listeners.admin.maxConnections=4",
        "agent.listeners.admin.firstByteTimeoutSeconds=1",
        "agent.listeners.admin.idleTimeoutSeconds=1",
        "agent.listeners.xds.maxConnections=2",
        "agent.listeners.xds.firstByteTimeoutSeconds=1",
        "agent.listeners.xds.keepaliveIntervalSeconds=1",
        "agent.listeners.xds.keepaliveTimeoutSeconds=1",
        "agent.watchGraceSeconds=0",
        "proxy.readinessPort=65535",
        "proxy.stats.port=0",
        "proxy.concurrency=1",
        "proxy.handOver.baseId=1",
        "proxy.handOver.parentShutdownSeconds=1",
        "proxy.handOver.successorWaitSeconds=0",
        "verifyInstall.timeoutSeconds=30",
        "daemonset.minReadySeconds=0",
    ];
    env.helm_aether("upgrade", &min)?;
    check_release_settled_with(env, 3)?;
    denied_through_the_service()?;
    clusters_max(1024, "2")?;
    // Through the defaults: the maximums put the agent's admin on 65535, where the minimums' Envoy
    // keeps its readiness listener until the next Envoy has taken over.
    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;

    let max = [
        "controller.webhookPort=65535",
        "controller.adminPort=1024",
        "controller.listeners.webhook.maxConnections=65536",
        "controller.listeners.webhook.handshakeTimeoutSeconds=3600",
        "controller.listeners.webhook.idleTimeoutSeconds=3600",
        "controller.listeners.admin.maxConnections=65536",
        "controller.listeners.admin.firstByteTimeoutSeconds=3600",
        "controller.listeners.admin.idleTimeoutSeconds=3600",
        "webhook.timeoutSeconds=10",
        "agent.adminPort=65535",
        "agent.maxClusters=200000",
        "agent.listeners.admin.maxConnections=65536",
        "agent.listeners.admin.firstByteTimeoutSeconds=3600",
        "agent.listeners.admin.idleTimeoutSeconds=3600",
        "agent.listeners.xds.maxConnections=65536",
        "agent.listeners.xds.firstByteTimeoutSeconds=3600",
        "agent.listeners.xds.keepaliveIntervalSeconds=3600",
        "agent.listeners.xds.keepaliveTimeoutSeconds=3600",
        "agent.watchGraceSeconds=86400",
        "proxy.readinessPort=1024",
        "proxy.stats.port=65534",
        "proxy.concurrency=64",
        "proxy.handOver.baseId=400000000",
        "verifyInstall.timeoutSeconds=1800",
    ];
    env.helm_aether("upgrade", &max)?;
    check_release_settled(env)?;
    denied_through_the_service()?;
    clusters_max(65535, "200000")?;
    let node_ip = env.node.facts().node_ip.clone();
    eventually("Envoy's stats listener answers on port 65534", WAIT, || {
        Ok(reqwest::blocking::get(format!("http://{node_ip}:65534/stats/prometheus")).is_ok_and(|r| r.status() == 200))
    })?;
    let web = uid(&env.pod_json("default", "web")?)?;
    env.wait_pinned("app_default_web_8080", &web, &env.socket_path(&web, "s", "app.sock"))?;

    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    denied_through_the_service()?;
    env.wait_pinned("app_default_web_8080", &web, &env.socket_path(&web, "s", "app.sock"))?;
    Ok(())
}

fn uninstall_leaves_no_release_object_and_nothing_on_the_host(env: &Env) -> anyhow::Result<()> {
    let uids: Vec<String> = env.release_pods()?.iter().map(uid).collect::<anyhow::Result<_>>()?;
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
    // The host: no sockets in the run dir, no pod dirs of the release's pods, no mounts of ours.
    let run: Vec<_> =
        std::fs::read_dir("/run/aether").map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    ensure!(run.is_empty(), "left in /run/aether: {run:?}");
    // The proxy's hand-over dir: the last launcher removed the node's state; only the (empty) shm
    // directory the kubelet created for the hostPath stays.
    let hand_over: Vec<_> = std::fs::read_dir("/run/aether-proxy")
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| !(p.ends_with("shm") && p.is_dir())).collect())
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
fn node_down_restores_the_host(env: &Env) -> anyhow::Result<()> {
    let diff = env.node.down()?;
    ensure!(diff.is_empty(), "the host differs from before node.sh up:\n{}", diff.join("\n"));
    Ok(())
}

// --- set-up ------------------------------------------------------------------------------------

fn setup() -> anyhow::Result<Env> {
    let t0 = Instant::now();
    let node = RealNode::up()?;
    eprintln!("node up in {} s", t0.elapsed().as_secs());
    let env = Env { node, installed_at: Instant::now() };
    let crds = aether_tests::node::packaged_chart("aether-crds")?;
    env.node.helm(&["install", "aether-crds", crds.to_str().context("path")?, "--wait"])?;
    let t1 = Instant::now();
    // One namespace for everything (docs/install.md's alternative to the README's split): this
    // suite reads the node pods in NS.
    env.kube().ok(&release_namespace_command(NS))?;
    env.kube().ok(&privileged_label_command(NS))?;
    env.helm_aether("install", &[]).with_context(|| context(&env))?;
    eprintln!("helm install --wait in {} s", t1.elapsed().as_secs());
    Ok(Env { installed_at: Instant::now(), ..env })
}

/// What a failed install needs to be understood, most telling last (CI shows an output's tail):
/// component log tails (without the scheduler's and controller-manager's every-20-s
/// `configmap_cafile_content` noise), the node pod's logs, the node's conditions and taints, the
/// release namespace's pods that are not Running described (events included), all pods, and the
/// newest events.
fn context(env: &Env) -> String {
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

fn main() {
    suite::run(
        vec![
            suite::case("install_brings_every_release_pod_ready", install_brings_every_release_pod_ready),
            suite::case(
                "installed_webhook_denies_an_over_budget_policy_with_the_arithmetic",
                installed_webhook_denies_an_over_budget_policy_with_the_arithmetic,
            ),
            suite::case(
                "helm_test_passes_and_fails_naming_the_webhook_when_its_service_is_broken",
                helm_test_passes_and_fails_naming_the_webhook_when_its_service_is_broken,
            ),
            suite::case(
                "annotated_pod_is_served_over_the_kubelets_emptydir_socket",
                annotated_pod_is_served_over_the_kubelets_emptydir_socket,
            ),
            suite::case(
                "policy_switches_delivery_to_the_socket_and_delete_switches_back",
                policy_switches_delivery_to_the_socket_and_delete_switches_back,
            ),
            suite::case(
                "kubectl_aether_why_reads_the_node_agents_live_decision",
                kubectl_aether_why_reads_the_node_agents_live_decision,
            ),
            suite::case(
                "a_client_pod_reaches_a_uds_only_app_through_its_service_ip",
                a_client_pod_reaches_a_uds_only_app_through_its_service_ip,
            ),
            suite::case(
                "a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic",
                a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic,
            ),
            suite::case("memory_emptydir_socket_is_reached", memory_emptydir_socket_is_reached),
            suite::case(
                "a_grpc_server_on_its_socket_is_promoted_and_answers_a_grpc_client_through_its_service",
                a_grpc_server_on_its_socket_is_promoted_and_answers_a_grpc_client_through_its_service,
            ),
            suite::case("a_dotted_pod_name_keeps_envoys_metric_names", a_dotted_pod_name_keeps_envoys_metric_names),
            suite::case("a_pod_back_on_its_socket_is_served_at_once", a_pod_back_on_its_socket_is_served_at_once),
            suite::case(
                "app_container_restart_recovers_without_an_agent_restart",
                app_container_restart_recovers_without_an_agent_restart,
            ),
            suite::case(
                "release_containers_have_no_restarts_two_minutes_after_install",
                release_containers_have_no_restarts_two_minutes_after_install,
            ),
            suite::case("agent_restarts_under_load_fail_no_request", agent_restarts_under_load_fail_no_request),
            suite::case("proxy_replacements_under_load_fail_no_request", proxy_replacements_under_load_fail_no_request),
            suite::case("replaced_node_pod_resumes_delivery", replaced_node_pod_resumes_delivery),
            suite::case("deleted_pod_clusters_are_withdrawn", deleted_pod_clusters_are_withdrawn),
            suite::case(
                "prometheus_scrapes_the_node_and_every_rule_and_panel_has_series",
                prometheus_scrapes_the_node_and_every_rule_and_panel_has_series,
            ),
            suite::case("helm_upgrade_runs_every_chart_variant", helm_upgrade_runs_every_chart_variant),
            suite::case(
                "upgrade_with_a_broken_webhook_fails_through_the_startup_check",
                upgrade_with_a_broken_webhook_fails_through_the_startup_check,
            ),
            suite::case(
                "socket_limit_filesystem_serves_a_path_past_sun_path_through_its_pin",
                socket_limit_filesystem_serves_a_path_past_sun_path_through_its_pin,
            ),
            suite::case(
                "chart_values_at_their_edges_run_on_the_real_node",
                chart_values_at_their_edges_run_on_the_real_node,
            ),
            suite::case(
                "uninstall_leaves_no_release_object_and_nothing_on_the_host",
                uninstall_leaves_no_release_object_and_nothing_on_the_host,
            ),
            suite::case("node_down_restores_the_host", node_down_restores_the_host),
        ],
        setup,
        context,
    )
}
