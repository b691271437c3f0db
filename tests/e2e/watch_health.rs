//! A failing watch is visible, against a real kube-apiserver, the real
//! `aether-agent` and a real Envoy pulling its xDS.
//!
//! Each trial runs an agent under its own ServiceAccount token whose RBAC allows `list` but not
//! `watch` on one resource: the EndpointPolicies in one trial, this node's pods in the other. The
//! agent's first list succeeds, then every watch call is refused (403). The trial asserts what an
//! operator sees: `/readyz` 503 once the grace period (`--watch-grace-seconds 3` here) has passed,
//! naming the resource and "forbidden"; `aether_agent_watch_errors_total{reason="forbidden"}`
//! counting every retry; exactly one failure line in the log for the whole outage; the last good
//! state still served (no cluster withdrawn). Then the test grants `watch`: the watch recovers
//! without a restart (on a quiet cluster too: nothing changes in the pod trial), `/readyz` is 200,
//! one recovery line is logged, and a pod targeted by a valid policy gets its pipe in Envoy.
//!
//! The controller's status writer gets the same treatment for its Service watch, except that its
//! `/readyz` stays 200 (the webhook must not leave its Service for a watch failure): the failing
//! watch is listed there, counted in `aether_controller_watch_errors_total`, logged once, and the
//! status writer resumes by itself once `watch` is granted.

mod suite;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use aether_fixtures::{Envoy, pod, policy};
use aether_tests::{Agent, ControlPlane, Controller, Scrape, envoy_bin, eventually, http_get, start_uds_echo};
use anyhow::{Context, ensure};

/// The workloads' namespace.
const NS: &str = "wh";
/// The namespace of the agents' ServiceAccounts.
const AGENTS: &str = "wh-agents";
const POLICIES: &str = "endpointpolicies.config.aether.io";
/// Short, so the trials see the readiness rule act; the default is 30.
const GRACE_SECONDS: &str = "3";
const WAIT: Duration = Duration::from_secs(30);
/// kube-runtime's watch backoff grows to 30 s (jittered) while a watch keeps failing, so the
/// first retry after the RBAC fix can take that long.
const RECOVERY: Duration = Duration::from_secs(90);

struct Env {
    cp: ControlPlane,
    work: tempfile::TempDir,
    echos: Mutex<Vec<Child>>,
    /// The current trial's agent log, for a failed trial's message.
    log: Mutex<Option<PathBuf>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in self.echos.lock().unwrap().iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One trial's agent and Envoy, stopped when dropped.
struct Node {
    agent: Agent,
    envoy: Envoy,
}

impl Node {
    fn readyz(&self) -> anyhow::Result<(u16, String)> {
        http_get(self.agent.admin, "/readyz", &[])
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.agent.log).unwrap_or_default()
    }

    /// Log lines containing `what`.
    fn log_lines(&self, what: &str) -> Vec<String> {
        self.log().lines().filter(|l| l.contains(what)).map(str::to_owned).collect()
    }

    fn errors(&self, resource: &str, reason: &str) -> anyhow::Result<f64> {
        Ok(Scrape::get(self.agent.admin)?
            .value("aether_agent_watch_errors_total", &[("resource", resource), ("reason", reason)]))
    }

    fn failing(&self) -> anyhow::Result<f64> {
        Ok(Scrape::get(self.agent.admin)?.value("aether_agent_watches_failing", &[]))
    }

    /// Whether Envoy's `app_<ns>_<pod>_8080` cluster dials the pipe at `socket`.
    fn dials_pipe(&self, pod: &str, socket: &Path) -> anyhow::Result<bool> {
        let cluster = format!("app_{NS}_{pod}_8080");
        let want = socket.to_string_lossy().into_owned();
        Ok(self.envoy.clusters()?.get(&cluster).is_some_and(|a| a.contains("\"pipe\"") && a.contains(&want)))
    }

    fn wait_pipe(&self, pod: &str, socket: &Path) -> anyhow::Result<()> {
        eventually(&format!("Envoy to dial {pod}'s socket {}", socket.display()), WAIT, || self.dials_pipe(pod, socket))
    }
}

impl Env {
    fn path(&self, p: &str) -> PathBuf {
        self.work.path().join(p)
    }

    /// A kubeconfig for ServiceAccount `AGENTS/sa`: the admin kubeconfig's server and CA, and a
    /// token from the TokenRequest API.
    fn kubeconfig_for(&self, sa: &str) -> anyhow::Result<PathBuf> {
        let view = |field: &str| {
            self.cp.kubectl_ok(&[
                "config",
                "view",
                "--raw",
                "-o",
                &format!("jsonpath={{.clusters[0].cluster.{field}}}"),
            ])
        };
        let (server, ca) = (view("server")?, view("certificate-authority")?);
        let token = self.cp.kubectl_ok(&["create", "token", sa, "-n", AGENTS, "--duration", "2h"])?;
        let path = self.path(&format!("{sa}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{server}\", \
                 certificate-authority: \"{ca}\"}}\nusers:\n- name: {sa}\n  user: {{token: \"{}\"}}\ncontexts:\n- \
                 name: c\n  context: {{cluster: c, user: {sa}}}\ncurrent-context: c\n",
                token.trim()
            ),
        )?;
        Ok(path)
    }

    /// ClusterRole `name` (bound to ServiceAccount `AGENTS/name`) with the chart's agent rules,
    /// except that `no_watch` (`pods` or `endpointpolicies`) gets only get and list.
    fn agent_rbac(&self, name: &str, no_watch: Option<&str>) -> anyhow::Result<()> {
        let verbs = |resource: &str| {
            if no_watch == Some(resource) { r#"["get", "list"]"# } else { r#"["get", "list", "watch"]"# }
        };
        self.cp.apply(&format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: {}
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create"]
  - apiGroups: ["config.aether.io"]
    resources: ["endpointpolicies"]
    verbs: {}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: {AGENTS}}}]
"#,
            verbs("pods"),
            verbs("endpointpolicies")
        ))
    }

    /// The folder of node `node`'s agent and Envoy: short, so the socket paths under its pods
    /// dir fit sun_path (107 bytes).
    fn node_dir(&self, node: &str) -> PathBuf {
        self.path(node.rsplit('-').next().unwrap_or(node))
    }

    /// The kubelet pods dir of node `node` (its agent's `--kubelet-pods-dir`).
    fn pods_dir(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("p")
    }

    /// A managed pod on `node` with ServiceAccount `sa` and an emptyDir `s`, and (playing kubelet
    /// and the app) a UDS echo server at `s/app.sock` in its kubelet directory. Returns the socket.
    fn pod(&self, node: &str, name: &str, sa: &str) -> anyhow::Result<PathBuf> {
        let p = pod(NS, name).sa(sa).node(node).container("app", "registry.example/uds-echo:test").emptydir("s");
        self.cp.apply(&p.manifest())?;
        let uid = self.cp.kubectl_ok(&["get", "pod", "-n", NS, name, "-o", "jsonpath={.metadata.uid}"])?;
        ensure!(uid.len() == 36, "pod uid {uid:?}");
        let dir = self.pods_dir(node).join(&uid).join("volumes/kubernetes.io~empty-dir/s");
        let (child, socket) = start_uds_echo(&dir, "app.sock", name, WAIT)?;
        self.echos.lock().unwrap().push(child);
        Ok(socket)
    }

    /// Starts an agent for node `name` as ServiceAccount `AGENTS/sa`, and an Envoy pulling from it.
    fn node(&self, name: &'static str, sa: &str) -> anyhow::Result<Node> {
        let dir = self.node_dir(name);
        let pods = self.pods_dir(name);
        std::fs::create_dir_all(&pods)?;
        let xds = format!("unix://{}", dir.join("xds.sock").display());
        let (state, health) = (dir.join("state"), dir.join("health.sock"));
        let args = [
            "--node-name",
            name,
            "--kubelet-pods-dir",
            pods.to_str().context("UTF-8 path")?,
            "--state-dir",
            state.to_str().context("UTF-8 path")?,
            "--xds-address",
            &xds,
            "--health-socket",
            health.to_str().context("UTF-8 path")?,
            "--cri-endpoint=",
            "--watch-grace-seconds",
            GRACE_SECONDS,
        ];
        let log = dir.join("agent.log");
        *self.log.lock().unwrap() = Some(log.clone());
        let agent = Agent::start(&self.kubeconfig_for(sa)?, &args, &log)?;
        let envoy = Envoy::builder(dir.join("xds.sock"), name, dir.join("envoy")).binary(envoy_bin()?).start()?;
        Ok(Node { agent, envoy })
    }
}

/// Waits for `/readyz` 503 naming `resource` as failing with "forbidden"; returns the body.
fn wait_degraded(node: &Node, resource: &str) -> anyhow::Result<String> {
    let mut body = String::new();
    eventually(&format!("/readyz 503 naming the failing watch {resource}"), WAIT, || {
        let (code, b) = node.readyz()?;
        body = b;
        Ok(code == 503
            && body.starts_with(&format!("not ready: required watch {resource} failing for longer than"))
            && body.lines().any(|l| {
                l.starts_with(&format!("watch {resource} (required: ")) && l.contains(": forbidden: HTTP 403")
            }))
    })
    .with_context(|| body.clone())?;
    Ok(body)
}

/// The failure and the recovery lines of `resource`'s watch in the agent's log.
fn outage_lines(node: &Node, resource: &str) -> (Vec<String>, Vec<String>) {
    (
        node.log_lines(&format!("watch {resource} failing: ")),
        node.log_lines(&format!("watch {resource} recovered after ")),
    )
}

/// Waits until the counter shows kube-runtime retried (at least 3 refusals), so "one log line"
/// is checked against several retries.
fn wait_retries(node: &Node, label: &str) -> anyhow::Result<()> {
    eventually(&format!("3 forbidden {label} watch attempts counted"), WAIT, || {
        Ok(node.errors(label, "forbidden")? >= 3.0)
    })
}

/// Waits for the recovery: `/readyz` 200 and one recovery line, no new failure line.
fn wait_recovered(node: &Node, resource: &str) -> anyhow::Result<()> {
    eventually(&format!("/readyz 200 after the {resource} watch recovered"), RECOVERY, || {
        Ok(node.readyz()?.0 == 200 && !outage_lines(node, resource).1.is_empty())
    })?;
    let (failed, recovered) = outage_lines(node, resource);
    ensure!(failed.len() == 1, "want one failure line for the outage, got {}: {failed:#?}", failed.len());
    ensure!(recovered.len() == 1, "want one recovery line, got {}: {recovered:#?}", recovered.len());
    ensure!(recovered[0].contains(" INFO "), "the recovery line is not at info: {}", recovered[0]);
    let body = node.readyz()?.1;
    ensure!(
        body.lines().any(|l| l.starts_with(&format!("watch {resource} (required: ")) && l.ends_with("): ok")),
        "readyz: {body}"
    );
    ensure!(node.failing()? == 0.0, "aether_agent_watches_failing is not 0 after the recovery");
    Ok(())
}

// ------------------------------------------------------------------------------------ trials

/// The policy watch may list but not watch: a policy created during the outage does not apply
/// (the old, silent failure), and everything says why; after `watch` is granted it applies.
fn a_policy_watch_refused_by_rbac_degrades_readyz_counts_logs_once_and_recovers(env: &Env) -> anyhow::Result<()> {
    env.agent_rbac("agent-no-policy-watch", Some("endpointpolicies"))?;
    let socket = env.pod("wh-node-a", "web-a-1", "web-a")?;
    let node = env.node("wh-node-a", "agent-no-policy-watch")?;
    eventually("the agent to list the pod (no policy yet: not over its socket)", WAIT, || {
        let s = Scrape::get(node.agent.admin)?;
        Ok(s.value("aether_agent_pods", &[]) == 1.0 && s.value("aether_agent_pods", &[("delivery", "pipe")]) == 0.0)
    })?;
    // The policies were listed and the watch is refused: the failure is counted right away.
    eventually("a forbidden policy watch to be counted", WAIT, || {
        Ok(node.errors("endpointpolicies", "forbidden")? >= 1.0)
    })?;
    env.cp.apply(&policy(NS, "web-a-uds").target("web-a").socket("s/app.sock").manifest())?;

    let body = wait_degraded(&node, POLICIES)?;
    ensure!(body.contains("cannot watch resource \"endpointpolicies\""), "readyz has no API server message: {body}");
    wait_retries(&node, "endpointpolicies")?;
    ensure!(node.failing()? == 1.0, "aether_agent_watches_failing");
    ensure!(node.errors("pods", "forbidden")? == 0.0, "the pod watch was refused too");
    // Meanwhile the policy created during the outage is not applied, and that is no longer silent.
    ensure!(!node.dials_pipe("web-a-1", &socket)?, "a policy arrived through a refused watch");
    let (failed, recovered) = outage_lines(&node, POLICIES);
    ensure!(failed.len() == 1, "want exactly one failure line for the outage, got {}: {failed:#?}", failed.len());
    ensure!(failed[0].contains(" WARN "), "the failure line is not a warning: {}", failed[0]);
    ensure!(
        failed[0].contains(&format!("watch {POLICIES} failing: forbidden: HTTP 403 Forbidden: {POLICIES} is forbidden: User \"system:serviceaccount:{AGENTS}:agent-no-policy-watch\" cannot watch resource \"endpointpolicies\"")),
        "{}",
        failed[0]
    );
    ensure!(recovered.is_empty(), "recovered while still refused: {recovered:#?}");

    env.agent_rbac("agent-no-policy-watch", None)?;
    wait_recovered(&node, POLICIES)?;
    node.wait_pipe("web-a-1", &socket)?;
    eventually("the agent to count the pod as delivered over its socket by the policy", WAIT, || {
        Ok(Scrape::get(node.agent.admin)?.value("aether_agent_pods", &[("delivery", "pipe"), ("source", "policy")])
            == 1.0)
    })
}

/// The pod watch may list but not watch: the pods listed at start stay served (the last good
/// state), `/readyz` says why it is 503, and once `watch` is granted the watch recovers on a quiet
/// cluster (no pod changes, so no event could have healed it) and a new pod gets its pipe.
fn a_pod_watch_refused_by_rbac_keeps_the_last_good_state_and_recovers_on_a_quiet_cluster(
    env: &Env,
) -> anyhow::Result<()> {
    env.agent_rbac("agent-no-pod-watch", Some("pods"))?;
    env.cp.apply(&policy(NS, "web-b-uds").target("web-b").socket("s/app.sock").manifest())?;
    // Before the agent starts: only its first list can deliver a pod.
    let first = env.pod("wh-node-b", "web-b-1", "web-b")?;
    let node = env.node("wh-node-b", "agent-no-pod-watch")?;
    node.wait_pipe("web-b-1", &first)?;

    let body = wait_degraded(&node, "pods")?;
    ensure!(body.contains("cannot watch resource \"pods\""), "readyz has no API server message: {body}");
    wait_retries(&node, "pods")?;
    ensure!(node.dials_pipe("web-b-1", &first)?, "a watch failure withdrew the listed pod's pipe");
    let (failed, _) = outage_lines(&node, "pods");
    ensure!(failed.len() == 1, "want exactly one failure line for the outage, got {}: {failed:#?}", failed.len());
    ensure!(
        failed[0].contains("watch pods failing: forbidden: HTTP 403 Forbidden: pods is forbidden"),
        "{}",
        failed[0]
    );

    // Nothing changes on this node while the RBAC is fixed: only the accepted watch request
    // itself can tell the agent it recovered.
    env.agent_rbac("agent-no-pod-watch", None)?;
    wait_recovered(&node, "pods")?;
    let second = env.pod("wh-node-b", "web-b-2", "web-b")?;
    node.wait_pipe("web-b-2", &second)?;
    ensure!(node.dials_pipe("web-b-1", &first)?, "web-b-1 lost its pipe");
    Ok(())
}

/// The status writer may list Services but not watch them: the failing watch is listed in
/// `/readyz` (still 200), counted and logged once; status writes wait meanwhile (a Service
/// created during the outage is unknown) and resume once `watch` is granted, without a restart.
fn the_status_writers_service_watch_refused_by_rbac_is_visible_and_the_writer_resumes(env: &Env) -> anyhow::Result<()> {
    const SA: &str = "controller-no-service-watch";
    let rbac = |service_verbs: &str| {
        env.cp.apply(&format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {SA}}}
rules:
  - apiGroups: ["config.aether.io"]
    resources: ["endpointpolicies"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["config.aether.io"]
    resources: ["endpointpolicies/status"]
    verbs: ["patch"]
  - apiGroups: [""]
    resources: ["services"]
    verbs: {service_verbs}
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {SA}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {SA}}}
subjects: [{{kind: ServiceAccount, name: {SA}, namespace: {AGENTS}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {SA}, namespace: {AGENTS}}}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create", "get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {SA}, namespace: {AGENTS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {SA}}}
subjects: [{{kind: ServiceAccount, name: {SA}, namespace: {AGENTS}}}]
"#
        ))
    };
    rbac(r#"["list"]"#)?;
    let kubeconfig = env.kubeconfig_for(SA)?;
    let controller = Controller::start(&[
        "--kubeconfig",
        kubeconfig.to_str().context("UTF-8 path")?,
        "--lease-name",
        "wh-status-writer",
        "--lease-namespace",
        AGENTS,
        "--lease-holder",
        "wh-controller",
    ])?;
    let admin: u16 = controller.admin.rsplit(':').next().context("admin port")?.parse()?;
    let errors = || -> anyhow::Result<f64> {
        Ok(Scrape::get(admin)?
            .value("aether_controller_watch_errors_total", &[("resource", "services"), ("reason", "forbidden")]))
    };
    eventually("3 forbidden Service watch attempts counted", WAIT, || Ok(errors()? >= 3.0))?;
    ensure!(Scrape::get(admin)?.value("aether_controller_watches_failing", &[]) == 1.0, "watches_failing");
    let (code, body) = http_get(admin, "/readyz", &[])?;
    ensure!(code == 200, "the webhook must stay ready: {code} {body}");
    ensure!(
        body.lines().any(|l| l.starts_with("watch services: failing for ")
            && l.contains(&format!(": forbidden: HTTP 403 Forbidden: services is forbidden: User \"system:serviceaccount:{AGENTS}:{SA}\" cannot watch resource \"services\""))),
        "readyz: {body}"
    );
    ensure!(body.contains("\nwatch endpointpolicies.config.aether.io: ok\n"), "readyz: {body}");
    // A Service and its policy created during the outage: no status is written meanwhile.
    env.cp.kubectl_ok(&["create", "service", "clusterip", "ctl", "-n", NS, "--tcp=8080:8080"])?;
    env.cp.apply(&policy(NS, "ctl-uds").target("ctl").socket("s/app.sock").manifest())?;
    let accepted = || -> anyhow::Result<String> {
        env.cp.kubectl_ok(&[
            "get",
            "epol",
            "-n",
            NS,
            "ctl-uds",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Accepted\")].reason}",
        ])
    };
    let before = errors()?;
    eventually("another refused attempt after the policy was created", WAIT, || Ok(errors()? > before))?;
    ensure!(accepted()?.is_empty(), "a status was written from a Service cache whose watch is refused");
    let failed = |log: &str| log.lines().filter(|l| l.contains("watch services failing: ")).count();
    ensure!(failed(&controller.log()) == 1, "want one failure line: {}", controller.log());

    rbac(r#"["list", "watch"]"#)?;
    eventually("the status writer to resume and accept the policy", RECOVERY, || Ok(accepted()? == "Accepted"))?;
    let log = controller.log();
    ensure!(failed(&log) == 1, "want one failure line for the outage: {log}");
    let recovered = log.lines().filter(|l| l.contains("watch services recovered after ")).count();
    ensure!(recovered == 1, "want one recovery line: {log}");
    ensure!(Scrape::get(admin)?.value("aether_controller_watches_failing", &[]) == 0.0, "watches_failing");
    let (_, body) = http_get(admin, "/readyz", &[])?;
    ensure!(body.contains("\nwatch services: ok\n") && body.contains("services synced"), "readyz: {body}");
    Ok(())
}

fn logs(env: &Env) -> String {
    let Some(path) = env.log.lock().unwrap().clone() else { return String::new() };
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    format!("\n--- agent log (last lines, newest first):\n{}", tail.join("\n"))
}

fn setup() -> anyhow::Result<Env> {
    let cp = ControlPlane::start()?;
    cp.install_crd()?;
    // A short root keeps the socket paths inside sun_path.
    let work = tempfile::Builder::new().prefix("aw").tempdir_in("/tmp")?;
    for ns in [NS, AGENTS] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    for sa in ["web-a", "web-b"] {
        cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, sa])?;
    }
    for sa in ["agent-no-policy-watch", "agent-no-pod-watch", "controller-no-service-watch"] {
        cp.kubectl_ok(&["create", "serviceaccount", "-n", AGENTS, sa])?;
    }
    Ok(Env { cp, work, echos: Mutex::new(Vec::new()), log: Mutex::new(None) })
}

fn main() {
    suite::run(
        suite::cases![
            a_policy_watch_refused_by_rbac_degrades_readyz_counts_logs_once_and_recovers,
            a_pod_watch_refused_by_rbac_keeps_the_last_good_state_and_recovers_on_a_quiet_cluster,
            the_status_writers_service_watch_refused_by_rbac_is_visible_and_the_writer_resumes,
        ],
        setup,
        logs,
    )
}
