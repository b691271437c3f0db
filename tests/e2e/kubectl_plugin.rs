//! `kubectl aether` (issue 16, item 5) against a real kube-apiserver and a real agent process.
//!
//! One control plane, the EndpointPolicy CRD, and one `aether-agent run` for node `node-a`
//! whose admin port listens on 0.0.0.0. No kubelet runs, so the test plays its part: the agent's
//! Pod object (the chart's labels, on `node-a`) gets this host's non-loopback address as
//! `status.podIP` (kube-apiserver refuses to proxy to loopback or link-local pod IPs), and the
//! API server's pod proxy then reaches the agent's real admin port. The built `kubectl-aether`
//! binary is run as a user would: `why` for a pod served over its socket, a TCP-fallback pod and
//! a pod whose policy lost a conflict (live, through the proxy), then with the agent unreachable
//! (offline, labelled with the reason); `validate -f` on the shipped examples (exit codes); and
//! `budget`.

mod suite;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aether_fixtures::{pod, policy};
use aether_tests::{ControlPlane, eventually, free_port, http_get_status, repo_root, start_uds_echo, workspace_bin};
use anyhow::{Context, bail, ensure};
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
    /// The agent's admin port (0.0.0.0).
    admin: u16,
    agent: Mutex<Option<Child>>,
    echos: Mutex<Vec<Child>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        let mut children: Vec<Child> = self.echos.lock().unwrap().drain(..).collect();
        children.extend(self.agent.lock().unwrap().take());
        for mut c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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

    /// `kubectl aether why pod/NAME -n why -o json` against the agent (`--agent-namespace`
    /// and `--agent-admin-port` pointing at it unless `extra` sets them): the parsed answer.
    fn why(&self, name: &str, extra: &[&str]) -> anyhow::Result<Value> {
        let port = self.admin.to_string();
        let pods_dir = self.pods_dir().to_string_lossy().into_owned();
        let target = format!("pod/{name}");
        let mut args = vec!["why", target.as_str(), "-n", NS, "-o", "json", "--kubelet-pods-dir", pods_dir.as_str()];
        for (flag, value) in [("--agent-namespace", AGENT_NS), ("--agent-admin-port", port.as_str())] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
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

    /// Waits until `why` gives a live answer whose decision satisfies `ok`; returns it.
    fn live_until(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        let mut last = Value::Null;
        let waited = eventually(&format!("a live answer for {name}: {what}"), WAIT, || {
            last = self.why(name, &[])?;
            Ok(last["live"] == true && ok(&last["decision"]))
        });
        waited.with_context(|| format!("last answer: {last:#}"))?;
        Ok(last)
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

    /// Plays kubelet and the app: the emptyDir and a UDS echo server on `file` in it.
    fn serve(&self, uid: &str, file: &str) -> anyhow::Result<PathBuf> {
        let dir = self.pods_dir().join(uid).join("volumes/kubernetes.io~empty-dir/s");
        let (child, socket) = start_uds_echo(&dir, file, uid, WAIT)?;
        self.echos.lock().unwrap().push(child);
        Ok(socket)
    }
}

/// This host's first global IPv4 address: what the API server proxies to (not loopback).
fn host_ip() -> anyhow::Result<String> {
    let out = Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ip = text
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|cidr| cidr.split('/').next())
        .next()
        .context("no global IPv4 address on this host: kube-apiserver cannot proxy to a loopback pod IP")?;
    Ok(ip.to_owned())
}

/// Sets `status.podIP` (and `phase: Running`), as the kubelet would.
fn set_pod_ip(cp: &ControlPlane, ns: &str, name: &str, ip: &str) -> anyhow::Result<()> {
    let patch = serde_json::json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}).to_string();
    cp.kubectl_ok(&["patch", "pod", "-n", ns, name, "--subresource=status", "--type=merge", "-p", &patch])?;
    Ok(())
}

fn start_agent(cp: &ControlPlane, work: &Path, admin: u16) -> anyhow::Result<Child> {
    let log = work.join("agent.log");
    let mut child = Command::new(workspace_bin("aether-agent")?)
        .arg("run")
        // No container runtime: this host's containerd belongs to the real-node suite.
        .args(["--node-name", NODE, "--recheck-seconds", "1", "--cri-endpoint", ""])
        .arg("--kubelet-pods-dir")
        .arg(work.join("pods"))
        .arg("--state-dir")
        .arg(work.join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", work.join("run/xds.sock").display()))
        .arg("--health-socket")
        .arg(work.join("run/health.sock"))
        .arg("--admin-addr")
        .arg(format!("0.0.0.0:{admin}"))
        .env("KUBECONFIG", cp.kubeconfig())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let deadline = Instant::now() + WAIT;
    while http_get_status(admin, "/readyz") != Some(200) {
        if let Some(status) = child.try_wait()? {
            bail!("aether-agent exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("aether-agent not ready: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(child)
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
    let admin = free_port();
    let agent = start_agent(&cp, work.path(), admin)?;
    Ok(Env { cp, work, admin, agent: Mutex::new(Some(agent)), echos: Mutex::new(Vec::new()) })
}

fn a_pod_served_over_its_socket_is_answered_live_through_the_pod_proxy(env: &Env) -> anyhow::Result<()> {
    let uid = env.pod("uds-1", "uds", Some("s/app.sock"), "10.244.0.11")?;
    let socket = env.serve(&uid, "app.sock")?;
    let a = env.live_until("uds-1", "pipe", |d| d["delivery"] == "pipe")?;
    ensure!(a["agent"]["name"] == AGENT_POD && a["agent"]["namespace"] == AGENT_NS, "{a:#}");
    ensure!(a["node"] == NODE && a["pod"] == format!("{NS}/uds-1"), "{a:#}");
    let d = &a["decision"];
    ensure!(d["uid"] == uid.as_str() && d["source"] == "annotation" && d["socket"] == "s/app.sock", "{d:#}");
    ensure!(d["path"] == socket.to_string_lossy().as_ref(), "path {} is not {}", d["path"], socket.display());
    ensure!(d["reason"].is_null() && d["decidedAt"].is_string(), "{d:#}");
    let clusters: Vec<&str> = d["clusters"].as_array().context("clusters")?.iter().filter_map(Value::as_str).collect();
    ensure!(clusters == ["app_why_uds-1_8080", "health_why_uds-1"], "{clusters:?}");
    // The text form says where the answer came from.
    let port = env.admin.to_string();
    let out = env.plugin(&["why", "uds-1", "-n", NS, "--agent-namespace", AGENT_NS, "--agent-admin-port", &port])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ensure!(text.contains(&format!("answer:    LIVE from agent {AGENT_NS}/{AGENT_POD} (port {port})")), "{text}");
    ensure!(text.contains("delivery:  pipe (Envoy dials the pod's Unix socket)"), "{text}");
    ensure!(!text.contains("OFFLINE"), "{text}");
    Ok(())
}

fn a_tcp_fallback_pod_is_answered_live_with_its_reason(env: &Env) -> anyhow::Result<()> {
    env.pod("fallback-1", "fallback", Some(TOO_LONG), "10.244.0.12")?;
    let a = env.live_until("fallback-1", "tcp, path-too-long", |d| d["reason"] == "path-too-long")?;
    let d = &a["decision"];
    ensure!(d["delivery"] == "tcp" && d["source"] == "annotation" && d["eventReason"] == "UdsPathTooLong", "{d:#}");
    ensure!(d["detail"].as_str().is_some_and(|s| s.contains(TOO_LONG)), "{d:#}");
    ensure!(d["path"].is_null(), "{d:#}");
    Ok(())
}

fn a_pod_whose_service_has_two_policies_names_the_one_that_lost(env: &Env) -> anyhow::Result<()> {
    env.cp.apply(&policy(NS, "a-first").target("contested").socket("s/a.sock").manifest())?;
    env.cp.apply(&policy(NS, "b-second").target("contested").socket("s/b.sock").manifest())?;
    env.pod("contested-1", "contested", None, "10.244.0.13")?;
    let a = env.live_until("contested-1", "conflict a-first over b-second", |d| {
        d["conflict"]["losers"] == serde_json::json!(["b-second"])
    })?;
    let d = &a["decision"];
    ensure!(d["source"] == "policy" && d["policy"] == "a-first" && d["socket"] == "s/a.sock", "{d:#}");
    ensure!(d["conflict"]["winner"] == "a-first" && d["conflict"]["service"] == "why/contested", "{d:#}");
    Ok(())
}

fn the_agent_unreachable_gives_the_offline_fold_labelled_with_the_reason(env: &Env) -> anyhow::Result<()> {
    // Nothing listens on this port of the agent pod's address: the proxy cannot connect.
    let closed = free_port().to_string();
    let a = env.why("fallback-1", &["--agent-admin-port", &closed])?;
    ensure!(a["live"] == false, "{a:#}");
    let reason = a["offlineReason"].as_str().context("an offline reason")?;
    ensure!(reason.contains(&format!("the pod proxy to agent {AGENT_NS}/{AGENT_POD}:{closed}")), "{reason}");
    let d = &a["decision"];
    ensure!(d["reason"] == "path-too-long" && d["delivery"] == "tcp" && d["decidedAt"].is_null(), "{d:#}");
    ensure!(a["offlineUnknowns"].as_array().is_some_and(|u| u.len() == 5), "{a:#}");
    // No agent pod where the flags look: offline too, saying so; the conflict is still named.
    let a = env.why("contested-1", &["--agent-namespace", "kube-system"])?;
    ensure!(a["live"] == false, "{a:#}");
    let reason = a["offlineReason"].as_str().context("an offline reason")?;
    ensure!(reason.starts_with(&format!("no agent pod on node {NODE} in namespace kube-system")), "{reason}");
    ensure!(a["decision"]["conflict"]["losers"] == serde_json::json!(["b-second"]), "{a:#}");
    // The text form is labelled OFFLINE and lists what it cannot know.
    let out =
        env.plugin(&["why", "pod/fallback-1", "-n", NS, "--agent-namespace", AGENT_NS, "--agent-admin-port", &closed])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(text.contains("answer:    OFFLINE (the agent's fold on API objects only): "), "{text}");
    ensure!(text.contains("offline cannot know:\n") && text.contains("on-disk refusals"), "{text}");
    Ok(())
}

/// Writes a kubeconfig with the admin's context and a `viewer` context for user `dev-viewer`
/// (a client certificate signed by the control plane's CA); returns its path.
fn viewer_kubeconfig(env: &Env) -> anyhow::Result<PathBuf> {
    let pki = env.cp.dir().join("pki");
    let (key, csr, crt) = (env.path("viewer.key"), env.path("viewer.csr"), env.path("viewer.crt"));
    let openssl = |args: &[&std::ffi::OsStr]| -> anyhow::Result<()> {
        let out = Command::new("openssl").args(args).output()?;
        ensure!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    openssl(&[
        os("req"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-subj"),
        os("/CN=dev-viewer"),
        os("-keyout"),
        key.as_os_str(),
        os("-out"),
        csr.as_os_str(),
    ])?;
    let ca = pki.join("ca.crt");
    let ca_key = pki.join("ca.key");
    let ext = env.path("viewer.ext");
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n")?;
    openssl(&[
        os("x509"),
        os("-req"),
        os("-in"),
        csr.as_os_str(),
        os("-CA"),
        ca.as_os_str(),
        os("-CAkey"),
        ca_key.as_os_str(),
        os("-CAcreateserial"),
        os("-days"),
        os("1"),
        // An X.509 v3 client certificate (rustls refuses v1).
        os("-extfile"),
        ext.as_os_str(),
        os("-out"),
        crt.as_os_str(),
    ])?;
    let admin = std::fs::read_to_string(env.cp.kubeconfig())?;
    let server = admin.lines().find_map(|l| l.trim().strip_prefix("server: ")).context("server in kubeconfig")?;
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: dev-viewer\n  user:\n    client-certificate: {crt}\n    \
         client-key: {key}\ncontexts:\n- name: viewer\n  context: {{cluster: c, user: dev-viewer, namespace: {NS}}}\n\
         current-context: none\n",
        ca = ca.display(),
        crt = crt.display(),
        key = key.display(),
    );
    let path = env.path("viewer.kubeconfig");
    std::fs::write(&path, config)?;
    Ok(path)
}

fn without_pods_proxy_rbac_the_answer_is_offline_and_says_so_and_with_it_live(env: &Env) -> anyhow::Result<()> {
    let kubeconfig = viewer_kubeconfig(env)?;
    // What the docs grant a reader: pods and EndpointPolicies in the workload namespace, and
    // the agent pods' list, but not yet `get pods/proxy` in the agent's namespace.
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
    let port = env.admin.to_string();
    let why = |extra: &[&str]| -> anyhow::Result<Value> {
        let kc = kubeconfig.to_str().context("utf-8 path")?;
        let mut args = vec!["--kubeconfig", kc, "--context", "viewer", "why", "pod/fallback-1", "-o", "json"];
        args.extend(["--agent-namespace", AGENT_NS, "--agent-admin-port", port.as_str()]);
        args.extend(extra);
        let out = Command::new(workspace_bin("kubectl-aether")?).args(&args).output()?;
        ensure!(out.status.success(), "why as dev-viewer: {}", String::from_utf8_lossy(&out.stderr));
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let mut last = Value::Null;
    eventually("an offline answer naming RBAC", WAIT, || {
        last = why(&[])?;
        Ok(last["offlineReason"].as_str().is_some_and(|r| r.starts_with("RBAC forbids the pod proxy")))
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    ensure!(last["live"] == false && last["decision"]["reason"] == "path-too-long", "{last:#}");
    ensure!(last["offlineReason"].as_str().is_some_and(|r| r.contains("pods/proxy")), "{last:#}");
    env.cp.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{{"name":"agent-proxy","namespace":"{AGENT_NS}"}},
          "rules":[{{"apiGroups":[""],"resources":["pods/proxy"],"verbs":["get"]}}]}},
        {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{{"name":"agent-proxy","namespace":"{AGENT_NS}"}},
          "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"agent-proxy"}},
          "subjects":[{{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"dev-viewer"}}]}}]}}"#
    ))?;
    eventually("a live answer once pods/proxy is granted", WAIT, || {
        last = why(&[])?;
        Ok(last["live"] == true)
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    ensure!(last["decision"]["reason"] == "path-too-long" && last["decision"]["decidedAt"].is_string(), "{last:#}");
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
    let log = std::fs::read_to_string(env.path("agent.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(25).collect();
    format!("\n--- agent log (last lines, newest first):\n{}", tail.join("\n"))
}

fn main() {
    suite::run(
        vec![
            suite::case(
                "a_pod_served_over_its_socket_is_answered_live_through_the_pod_proxy",
                a_pod_served_over_its_socket_is_answered_live_through_the_pod_proxy,
            ),
            suite::case(
                "a_tcp_fallback_pod_is_answered_live_with_its_reason",
                a_tcp_fallback_pod_is_answered_live_with_its_reason,
            ),
            suite::case(
                "a_pod_whose_service_has_two_policies_names_the_one_that_lost",
                a_pod_whose_service_has_two_policies_names_the_one_that_lost,
            ),
            suite::case(
                "the_agent_unreachable_gives_the_offline_fold_labelled_with_the_reason",
                the_agent_unreachable_gives_the_offline_fold_labelled_with_the_reason,
            ),
            suite::case(
                "without_pods_proxy_rbac_the_answer_is_offline_and_says_so_and_with_it_live",
                without_pods_proxy_rbac_the_answer_is_offline_and_says_so_and_with_it_live,
            ),
            suite::case(
                "an_unknown_pod_is_an_error_and_an_unmanaged_pod_gets_a_note",
                an_unknown_pod_is_an_error_and_an_unmanaged_pod_gets_a_note,
            ),
            suite::case(
                "validate_gives_the_webhooks_exit_codes_on_the_shipped_examples",
                validate_gives_the_webhooks_exit_codes_on_the_shipped_examples,
            ),
            suite::case("budget_states_the_arithmetic", budget_states_the_arithmetic),
        ],
        setup,
        logs,
    )
}
