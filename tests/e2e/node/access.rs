//! What a user's grant reaches on the node: `the_why_grant_reaches_no_envoy_admin`.
//!
//! What it proves: the `pods/portforward` Role that docs/kubectl-plugin.md gives `kubectl aether
//! why` users reaches the node's loopback TCP ports (the node pods run on the host network), and
//! Envoy's admin, which can stop every listener of the node, is not among them: it is a Unix
//! socket only root reaches.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aether_fixtures::echo_app;
use aether_tests::{eventually, tools_bin};
use anyhow::{Context, bail, ensure};
use serde_json::Value;

use crate::env::{Env, NS, WAIT, envoy_admin, pod_name, restarts};

/// The TCP ports the node's components listen on (chart defaults): Envoy's former admin (0.10.0),
/// its readiness and stats listeners, the agent's admin and debug ports.
const NODE_PORTS: [u16; 5] = [9901, 9902, 15090, 9091, 9092];

/// A `kubectl port-forward` as the user of `kubeconfig`; killed on drop.
struct Forward {
    child: Child,
    local: u16,
}

impl Forward {
    /// Forwards a free local port to `port` of `pod` in the node namespace; waits (at most 30 s)
    /// for kubectl to say which local port.
    fn start(kubeconfig: &std::path::Path, pod: &str, port: u16) -> anyhow::Result<Forward> {
        let mut child = Command::new(tools_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--context", "viewer", "port-forward", "-n", NS, &format!("pod/{pod}"), &format!(":{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl port-forward")?;
        let stdout = child.stdout.take().context("kubectl's stdout")?;
        let stderr = child.stderr.take().context("kubectl's stderr")?;
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let said_w = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                said_w.lock().map(|mut v| v.push(line)).ok();
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // "Forwarding from 127.0.0.1:40123 -> 9092"
                if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                    let _ = tx.send(rest.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()));
                }
            }
        });
        let mut forward = Forward { child, local: 0 };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(local)) => forward.local = local,
            _ => bail!(
                "kubectl port-forward to {pod}:{port} as why-pf said no local port within 30 s; its stderr: {:?}",
                said.lock().map(|v| v.join("\n")).unwrap_or_default()
            ),
        }
        Ok(forward)
    }

    /// Sends `request` (a whole HTTP/1.1 request) through the forward: the answer's first line,
    /// or what became of the connection.
    fn send(&self, request: &str) -> String {
        let answer = (|| -> std::io::Result<String> {
            let mut s = TcpStream::connect(("127.0.0.1", self.local))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(request.as_bytes())?;
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf);
            Ok(String::from_utf8_lossy(&buf).lines().next().unwrap_or("").to_owned())
        })();
        match answer {
            Ok(line) if line.is_empty() => "closed without an answer".to_owned(),
            Ok(line) => line,
            Err(e) => format!("error: {e}"),
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Envoy's admin socket: `/server_info` (state, epoch) and `listener_manager.listener_stopped`.
fn envoy_state() -> anyhow::Result<(String, u64, u64)> {
    let (_, info) = envoy_admin("/server_info")?;
    let info: Value = serde_json::from_str(&info).context("/server_info is JSON")?;
    let (_, stats) = envoy_admin("/stats?filter=^listener_manager.listener_stopped$")?;
    let stopped = stats
        .lines()
        .find_map(|l| l.strip_prefix("listener_manager.listener_stopped: "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no listener_stopped in {stats:?}"))?;
    Ok((
        info["state"].as_str().unwrap_or("?").to_owned(),
        info["command_line_options"]["restart_epoch"].as_u64().unwrap_or(u64::MAX),
        stopped,
    ))
}

/// As a user holding only the documented `why` Role (`pods/portforward` get and create) and what
/// `kubectl port-forward pod/NAME` itself needs (`pods` get; `pods` list, which `why` uses to find
/// the agent pod), in the node namespace, a port-forward to the proxy pod on each of [`NODE_PORTS`] and a
/// `POST /drain_listeners` and `POST /quitquitquit` through it change nothing: Envoy is LIVE at
/// the same epoch with no listener stopped, the proxy pod has the same restarts and is Ready, and
/// a pod served over its socket still answers through the node. The grant does reach the node's
/// loopback (the agent's debug port answers `/debug/pods` through it), so the test is not
/// vacuous; the former admin port answers nothing (no Envoy listens there).
pub(crate) fn the_why_grant_reaches_no_envoy_admin(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("pf-uds").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "pf-uds")?;
    let ip = pod["status"]["podIP"].as_str().context("the pod's IP")?.to_owned();
    let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
    let answers = || -> anyhow::Result<()> {
        let body = client.get(format!("http://{ip}:8080/stats")).send()?.text()?;
        ensure!(body.contains("pf-uds over unix"), "through the node's Envoy: {body}");
        Ok(())
    };
    eventually("pf-uds answers over its socket", WAIT, || Ok(answers().is_ok()))?;

    let viewer = aether_tests::user_kubeconfig(
        &env.node.dir().join("cp/pki"),
        &env.node.facts().kubeconfig,
        "why-pf",
        "default",
        env.node.dir(),
    )?;
    env.kube().apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: why-pf, namespace: {NS}}}\n\
         rules: [{{apiGroups: [''], resources: [pods/portforward], verbs: [get, create]}}, \
         {{apiGroups: [''], resources: [pods], verbs: [get, list]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: why-pf, namespace: {NS}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: why-pf}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: why-pf}}]\n"
    ))?;

    let proxy = env.proxy_pod()?;
    let proxy_name = pod_name(&proxy).to_owned();
    let before = (envoy_state()?, restarts(&proxy));
    ensure!(before.0.0 == "LIVE" && before.0.2 == 0, "Envoy before: {:?}", before.0);

    let mut reached_debug = false;
    for port in NODE_PORTS {
        let forward = eventually_forward(&viewer, &proxy_name, port)?;
        if port == 9092 {
            let got = forward.send("GET /debug/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            println!("why-pf, port-forward to {proxy_name}:{port}, GET /debug/pods: {got}");
            reached_debug = got.starts_with("HTTP/1.1 200");
        }
        for path in ["/drain_listeners", "/quitquitquit"] {
            let got = forward
                .send(&format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
            println!("why-pf, port-forward to {proxy_name}:{port}, POST {path}: {got}");
            ensure!(!got.contains("200 OK"), "POST {path} through port {port} was accepted: {got}");
        }
    }
    ensure!(reached_debug, "the grant reached nothing: the test would prove nothing");

    // What the launcher's readiness would show (it checks Envoy each second) has had time to.
    std::thread::sleep(Duration::from_secs(3));
    let proxy_after = env.pod_json(NS, &proxy_name)?;
    let after = (envoy_state()?, restarts(&proxy_after));
    println!("Envoy (state, epoch, listeners stopped) and proxy restarts: before {before:?}, after {after:?}");
    ensure!(after == before, "Envoy or its pod changed: before {before:?}, after {after:?}");
    let ready = proxy_after["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    ensure!(ready, "the proxy pod is not Ready: {:#}", proxy_after["status"]["conditions"]);
    answers()?;

    env.kube().ok(&["delete", "role,rolebinding", "-n", NS, "why-pf"])?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "pf-uds", "--wait=true"])?;
    Ok(())
}

/// [`Forward::start`], tried again until RBAC has caught up with the new Role (at most [`WAIT`]).
fn eventually_forward(kubeconfig: &std::path::Path, pod: &str, port: u16) -> anyhow::Result<Forward> {
    let mut last = None;
    eventually(&format!("a port-forward to {pod}:{port} as why-pf"), WAIT, || {
        match Forward::start(kubeconfig, pod, port) {
            Ok(f) => last = Some(f),
            Err(e) => eprintln!("{e:#}"),
        }
        Ok(last.is_some())
    })?;
    last.context("no forward")
}
