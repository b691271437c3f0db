//! `kubectl aether` against a real kube-apiserver, without a kubelet.
//!
//! One control plane, the EndpointPolicy CRD, and the agent's Pod object (the chart's labels, on
//! `node-a`, with a pod IP) but no kubelet: `why` finds the agent pod, and the API server's
//! `pods/portforward` to its debug port cannot open (no node runs it), so every answer here is
//! the offline fold, labelled with the reason. This suite proves that path: a TCP-fallback pod's
//! reason, a conflict's loser, no agent pod where the flags look, RBAC refusing the port-forward
//! (and the grant the docs give lifting that refusal); `validate -f` on the shipped examples (exit
//! codes); and `budget`. The live answer through a port-forward to the real agent is proven on
//! the real node (`e2e_node`, `kubectl_aether_why_reads_the_node_agents_live_decision`).

mod suite;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use aether_fixtures::{pod, policy};
use aether_tests::{ControlPlane, eventually, repo_root, workspace_bin};
use anyhow::{Context, ensure};
use serde_json::Value;

const NS: &str = "why";
const AGENT_NS: &str = "aether-system";
const AGENT_POD: &str = "aether-node-a1b2c";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(30);
/// Over the budget of the test's pods dir (`/tmp/ae??????/pods`: 107 - 18 - 70 = 19 bytes).
const TOO_LONG: &str = "s/far-too-long-for-the-budget.sock";

struct Env {
    cp: ControlPlane,
    work: tempfile::TempDir,
}

impl Env {
    fn path(&self, p: &str) -> PathBuf {
        self.work.path().join(p)
    }

    fn pods_dir(&self) -> PathBuf {
        self.path("pods")
    }

    /// Runs the built `kubectl-aether` with this control plane's kubeconfig.
    fn plugin(&self, args: &[&str]) -> anyhow::Result<Output> {
        Command::new(workspace_bin("kubectl-aether")?)
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running kubectl-aether")
    }

    /// `kubectl aether why pod/NAME -n why -o json` (`--agent-namespace` pointing at the agent
    /// pod unless `extra` sets it): the parsed answer.
    fn why(&self, name: &str, extra: &[&str]) -> anyhow::Result<Value> {
        let pods_dir = self.pods_dir().to_string_lossy().into_owned();
        let target = format!("pod/{name}");
        let mut args = vec!["why", target.as_str(), "-n", NS, "-o", "json", "--kubelet-pods-dir", pods_dir.as_str()];
        if !extra.contains(&"--agent-namespace") {
            args.extend(["--agent-namespace", AGENT_NS]);
        }
        args.extend(extra);
        let out = self.plugin(&args)?;
        ensure!(
            out.status.success(),
            "kubectl-aether why failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .with_context(|| format!("why output: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// Creates a managed pod on `node-a` with emptyDir `s` and `socket` as its annotation, and
    /// gives it `ip` as its pod IP (the kubelet's part); returns its UID.
    fn pod(&self, name: &str, sa: &str, socket: Option<&str>, ip: &str) -> anyhow::Result<String> {
        let mut p = pod(NS, name).sa(sa).node(NODE).container("app", "registry.example/uds-echo:test").emptydir("s");
        if let Some(s) = socket {
            p = p.annotation_socket(s);
        }
        self.cp.apply(&p.manifest())?;
        set_pod_ip(&self.cp, NS, name, ip)?;
        let uid = self.cp.kubectl_ok(&["get", "pod", "-n", NS, name, "-o", "jsonpath={.metadata.uid}"])?;
        ensure!(uid.len() == 36, "pod uid {uid:?}");
        Ok(uid)
    }
}

/// This host's first global IPv4 address: the agent pod's IP (a pod IP the API server would dial).
fn host_ip() -> anyhow::Result<String> {
    let out = Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ip = text
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|cidr| cidr.split('/').next())
        .next()
        .context("no global IPv4 address on this host: a pod IP must not be loopback")?;
    Ok(ip.to_owned())
}

/// Sets `status.podIP` (and `phase: Running`), as the kubelet would.
fn set_pod_ip(cp: &ControlPlane, ns: &str, name: &str, ip: &str) -> anyhow::Result<()> {
    let patch = serde_json::json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}).to_string();
    cp.kubectl_ok(&["patch", "pod", "-n", ns, name, "--subresource=status", "--type=merge", "-p", &patch])?;
    Ok(())
}

fn setup() -> anyhow::Result<Env> {
    let ip = host_ip()?;
    let cp = ControlPlane::start()?;
    cp.install_crd()?;
    // A short root keeps the socket paths inside sun_path (the budget is 19 bytes here).
    let work = tempfile::Builder::new().prefix("ae").tempdir_in("/tmp")?;
    for d in ["run", "pods", "state"] {
        std::fs::create_dir_all(work.path().join(d))?;
    }
    for ns in [NS, AGENT_NS] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    for sa in ["uds", "fallback", "contested", "plain"] {
        cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, sa])?;
    }
    cp.kubectl_ok(&["create", "serviceaccount", "-n", AGENT_NS, "aether-node"])?;
    // The agent's Pod object, with the chart's DaemonSet labels (no kubelet runs it: the process
    // below plays it) and this host's address as its pod IP.
    let agent_pod = pod(AGENT_NS, AGENT_POD)
        .unmanaged()
        .sa("aether-node")
        .node(NODE)
        .label("app.kubernetes.io/name", "aether")
        .label("app.kubernetes.io/instance", "aether")
        .label("app.kubernetes.io/component", "node")
        .container("aether-agent", "registry.example/aether-agent:test");
    cp.apply(&agent_pod.manifest())?;
    set_pod_ip(&cp, AGENT_NS, AGENT_POD, &ip)?;
    Ok(Env { cp, work })
}

/// The port-forward the answer would come through, as `why` names it.
fn forward_via() -> String {
    format!("the port-forward to agent {AGENT_NS}/{AGENT_POD}:9092")
}

fn a_tcp_fallback_pod_gets_the_offline_fold_with_its_reason_and_why_it_is_offline(env: &Env) -> anyhow::Result<()> {
    env.pod("fallback-1", "fallback", Some(TOO_LONG), "10.244.0.12")?;
    let a = env.why("fallback-1", &[])?;
    ensure!(a["live"] == false && a["node"] == NODE && a["pod"] == format!("{NS}/fallback-1"), "{a:#}");
    ensure!(a["agent"]["name"] == AGENT_POD && a["agent"]["port"] == 9092, "the agent it tried: {a:#}");
    let reason = a["offlineReason"].as_str().context("an offline reason")?;
    ensure!(reason.starts_with(&forward_via()), "{reason}");
    let d = &a["decision"];
    ensure!(d["delivery"] == "tcp" && d["source"] == "annotation" && d["eventReason"] == "UdsPathTooLong", "{d:#}");
    ensure!(d["reason"] == "path-too-long" && d["decidedAt"].is_null() && d["path"].is_null(), "{d:#}");
    ensure!(d["detail"].as_str().is_some_and(|s| s.contains(TOO_LONG)), "{d:#}");
    ensure!(a["offlineUnknowns"].as_array().is_some_and(|u| u.len() == 5), "{a:#}");
    // The text form is labelled OFFLINE and lists what it cannot know.
    let out = env.plugin(&["why", "pod/fallback-1", "-n", NS, "--agent-namespace", AGENT_NS])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ensure!(text.contains("answer:    OFFLINE (the agent's fold on API objects only): "), "{text}");
    ensure!(text.contains("offline cannot know:\n") && text.contains("on-disk refusals"), "{text}");
    ensure!(!text.contains("LIVE"), "{text}");
    Ok(())
}

fn a_pod_whose_service_has_two_policies_names_the_one_that_lost_and_no_agent_pod_is_said(
    env: &Env,
) -> anyhow::Result<()> {
    env.cp.apply(&policy(NS, "a-first").target("contested").socket("s/a.sock").manifest())?;
    env.cp.apply(&policy(NS, "b-second").target("contested").socket("s/b.sock").manifest())?;
    env.pod("contested-1", "contested", None, "10.244.0.13")?;
    let a = env.why("contested-1", &[])?;
    let d = &a["decision"];
    ensure!(d["source"] == "policy" && d["policy"] == "a-first" && d["socket"] == "s/a.sock", "{d:#}");
    ensure!(
        d["conflict"]["winner"] == "a-first" && d["conflict"]["losers"] == serde_json::json!(["b-second"]),
        "{d:#}"
    );
    ensure!(d["conflict"]["service"] == "why/contested", "{d:#}");
    // No agent pod where the flags look: offline too, saying so; the conflict is still named.
    let a = env.why("contested-1", &["--agent-namespace", "kube-system"])?;
    ensure!(a["live"] == false, "{a:#}");
    let reason = a["offlineReason"].as_str().context("an offline reason")?;
    ensure!(reason.starts_with(&format!("no agent pod on node {NODE} in namespace kube-system")), "{reason}");
    ensure!(a["decision"]["conflict"]["losers"] == serde_json::json!(["b-second"]), "{a:#}");
    Ok(())
}

fn without_portforward_rbac_the_answer_says_rbac_and_the_documented_grant_lifts_it(env: &Env) -> anyhow::Result<()> {
    let kubeconfig = aether_tests::user_kubeconfig(
        &env.cp.dir().join("pki"),
        &env.cp.kubeconfig(),
        "dev-viewer",
        NS,
        env.work.path(),
    )?;
    // What the docs grant a reader: pods and EndpointPolicies in the workload namespace, and
    // the agent pods' list, but not yet `get`/`create` on `pods/portforward` in the agent's namespace.
    env.cp.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{{"name":"why-reader","namespace":"{NS}"}},
          "rules":[{{"apiGroups":[""],"resources":["pods"],"verbs":["get"]}},
                   {{"apiGroups":["config.aether.io"],"resources":["endpointpolicies"],"verbs":["list"]}}]}},
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"why-reader","namespace":"{NS}"}},
          "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"why-reader"}},
          "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"dev-viewer"}}]}},
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{{"name":"agent-finder","namespace":"{AGENT_NS}"}},
          "rules":[{{"apiGroups":[""],"resources":["pods"],"verbs":["list"]}}]}},
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"agent-finder","namespace":"{AGENT_NS}"}},
          "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"agent-finder"}},
          "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"dev-viewer"}}]}}]}}"#
    ))?;
    let why = |extra: &[&str]| -> anyhow::Result<Value> {
        let kc = kubeconfig.to_str().context("utf-8 path")?;
        let mut args = vec!["--kubeconfig", kc, "--context", "viewer", "why", "pod/fallback-1", "-o", "json"];
        args.extend(["--agent-namespace", AGENT_NS]);
        args.extend(extra);
        let out = Command::new(workspace_bin("kubectl-aether")?).args(&args).output()?;
        ensure!(out.status.success(), "why as dev-viewer: {}", String::from_utf8_lossy(&out.stderr));
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let mut last = Value::Null;
    eventually("an offline answer naming RBAC", WAIT, || {
        last = why(&[])?;
        Ok(last["offlineReason"].as_str().is_some_and(|r| r.starts_with("RBAC forbids the port-forward")))
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    ensure!(last["live"] == false && last["decision"]["reason"] == "path-too-long", "{last:#}");
    ensure!(
        last["offlineReason"].as_str().is_some_and(|r| r.contains("`get` and `create` on `pods/portforward`")),
        "{last:#}"
    );
    // docs/kubectl-plugin.md's grant: the API server now lets the port-forward through to the
    // node (none runs here, so the answer stays offline, for that reason instead).
    env.cp.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{{"name":"agent-debug","namespace":"{AGENT_NS}"}},
          "rules":[{{"apiGroups":[""],"resources":["pods/portforward"],"verbs":["get","create"]}}]}},
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"agent-debug","namespace":"{AGENT_NS}"}},
          "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"agent-debug"}},
          "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"dev-viewer"}}]}}]}}"#
    ))?;
    eventually("an offline answer no longer naming RBAC once pods/portforward is granted", WAIT, || {
        last = why(&[])?;
        Ok(last["offlineReason"].as_str().is_some_and(|r| r.starts_with(&forward_via()) && !r.contains("RBAC")))
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    println!("granted, no node to forward to: {}", last["offlineReason"]);
    Ok(())
}

fn an_unknown_pod_is_an_error_and_an_unmanaged_pod_gets_a_note(env: &Env) -> anyhow::Result<()> {
    let out = env.plugin(&["why", "pod/nope", "-n", NS])?;
    ensure!(out.status.code() == Some(1), "exit {:?}", out.status.code());
    ensure!(String::from_utf8_lossy(&out.stderr).contains("cannot read pod why/nope"), "{out:?}");
    env.cp.apply(&pod(NS, "plain-1").sa("plain").node(NODE).unmanaged().container("app", "x").manifest())?;
    let a = env.why("plain-1", &[])?;
    ensure!(a["decision"].is_null() && a["note"].as_str().is_some_and(|n| n.contains("not managed")), "{a:#}");
    Ok(())
}

fn validate_gives_the_webhooks_exit_codes_on_the_shipped_examples(env: &Env) -> anyhow::Result<()> {
    let examples = repo_root().join("crds/examples");
    for (file, code) in [("ok-echo-uds.yaml", 0), ("ok-core-group.yaml", 0), ("deny-over-budget.yaml", 1)] {
        let f = examples.join(file);
        let out = env.plugin(&["validate", "-f", f.to_str().context("utf-8 path")?])?;
        ensure!(
            out.status.code() == Some(code),
            "{file}: exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let f = examples.join("deny-traversal.yaml");
    let out = env.plugin(&["validate", "-f", f.to_str().context("utf-8 path")?, "-o", "json"])?;
    let outcomes: Value = serde_json::from_slice(&out.stdout)?;
    ensure!(outcomes[0]["allowed"] == false && outcomes[0]["message"].is_string(), "{outcomes:#}");
    let out = env.plugin(&["validate", "-f", "/nonexistent.yaml"])?;
    ensure!(out.status.code() == Some(2), "unreadable input: exit {:?}", out.status.code());
    Ok(())
}

fn budget_states_the_arithmetic(env: &Env) -> anyhow::Result<()> {
    let out =
        env.plugin(&["budget", "--pods-dir", "/var/lib/kubelet/pods", "sockets/app.sock", "sockets/app1.sock"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.code() == Some(1), "one value does not fit: exit {:?}", out.status.code());
    ensure!(text.contains("budget:       16 bytes for <volume>/<file>"), "{text}");
    ensure!(text.contains("107 - 21 - 70 = 16 bytes"), "{text}");
    ensure!(text.contains("fits:         \"sockets/app.sock\" (16 bytes)"), "{text}");
    ensure!(text.contains("does not fit: \"sockets/app1.sock\""), "{text}");
    Ok(())
}

fn logs(env: &Env) -> String {
    let pods = env.cp.kubectl_ok(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_else(|e| format!("{e:#}"));
    format!("\n--- kubectl get pods -A\n{pods}")
}

fn main() {
    suite::run(
        suite::cases![
            a_tcp_fallback_pod_gets_the_offline_fold_with_its_reason_and_why_it_is_offline,
            a_pod_whose_service_has_two_policies_names_the_one_that_lost_and_no_agent_pod_is_said,
            without_portforward_rbac_the_answer_says_rbac_and_the_documented_grant_lifts_it,
            an_unknown_pod_is_an_error_and_an_unmanaged_pod_gets_a_note,
            validate_gives_the_webhooks_exit_codes_on_the_shipped_examples,
            budget_states_the_arithmetic,
        ],
        setup,
        logs,
    )
}
