//! Delivery end to end: a real kube-apiserver, the real `aether-agent`, a real Envoy pulling our
//! xDS, and UDS echo workloads listening on kubelet-style paths of Pods created in the API server
//! (no kubelet runs: the test plays its part by creating the emptyDir directories).
//!
//! Trials run one at a time in the order listed: the first installs the CRD after the agent
//! started, the last restarts the agent and Envoy with the API server stopped.
//!
//! Finished pods (phase `Succeeded`/`Failed`, written by the test as kubelet would) lose their
//! clusters and leave the metrics; a pod being deleted keeps its clusters until it finishes.
//!
//! Pod Events and metrics: an over-budget annotation gets exactly one Warning Event however often
//! the pod is resynced (label patches, a policy change, an agent restart, an API-server outage),
//! and the agent's `/metrics` parses as Prometheus text with its counters moving.

mod suite;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use aether_fixtures::{Envoy, pod, policy};
use aether_tests::{
    Agent, ControlPlane, Scrape, envoy_bin, eventually, start_uds_echo, unix_get_status, workspace_bin,
};
use anyhow::{Context, ensure};

const NS: &str = "e2e";
const NS_B: &str = "e2e-b";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(20);

struct Env {
    cp: ControlPlane,
    work: tempfile::TempDir,
    agent: Mutex<Option<Agent>>,
    envoy: Mutex<Option<Envoy>>,
    echos: Mutex<Vec<Child>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in self.echos.lock().unwrap().iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        eprintln!("e2e env: stopping, unmounting under {}", self.work.path().display());
        // The agent's socket pins are mounts under the work dir: stop the agent and Envoy, then
        // detach every mount below the work dir, so the temp dir can go and nothing stays mounted.
        *self.agent.lock().unwrap() = None;
        *self.envoy.lock().unwrap() = None;
        let work = self.work.path().to_string_lossy().into_owned();
        for _ in 0..3 {
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut targets: Vec<&str> =
                mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|t| t.starts_with(work.as_str())).collect();
            if targets.is_empty() {
                break;
            }
            targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
            for t in targets {
                let _ = Command::new("umount").args(["-l", t]).status();
            }
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
    /// `--pin-dir`: Envoy dials `<pins>/<uid>.sock`, where the agent mounts the verified socket.
    fn pins_dir(&self) -> PathBuf {
        self.path("run/pins")
    }
    /// The path Envoy dials for the socket at `socket` (`<pods>/<uid>/volumes/...`): its pin.
    fn dialed(&self, socket: &Path) -> String {
        let rel = socket.strip_prefix(self.pods_dir()).expect("a socket under the pods dir");
        let uid = rel.components().next().expect("the pod uid").as_os_str().to_string_lossy();
        format!("{}/{uid}.sock", self.pins_dir().display())
    }
    fn volume_dir(&self, uid: &str, volume: &str) -> PathBuf {
        self.pods_dir().join(uid).join("volumes/kubernetes.io~empty-dir").join(volume)
    }

    fn start_agent(&self) -> anyhow::Result<()> {
        let xds = format!("unix://{}", self.path("run/xds.sock").display());
        let (pods, state, health) = (self.pods_dir(), self.path("state"), self.path("run/health.sock"));
        let pins = self.pins_dir();
        let args = [
            "--node-name",
            NODE,
            "--kubelet-pods-dir",
            pods.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--xds-address",
            &xds,
            "--health-socket",
            health.to_str().unwrap(),
            "--recheck-seconds",
            "1",
            "--pin-dir",
            pins.to_str().unwrap(),
        ];
        let agent = Agent::start(&self.cp.kubeconfig(), &args, &self.path("agent.log"))?;
        *self.agent.lock().unwrap() = Some(agent);
        Ok(())
    }

    fn start_envoy(&self) -> anyhow::Result<()> {
        let dir = self.path("envoy");
        std::fs::create_dir_all(&dir)?;
        let envoy = Envoy::builder(self.path("run/xds.sock"), NODE, dir).inbound().binary(envoy_bin()?).start()?;
        *self.envoy.lock().unwrap() = Some(envoy);
        Ok(())
    }

    fn envoy<T>(&self, f: impl FnOnce(&Envoy) -> anyhow::Result<T>) -> anyhow::Result<T> {
        f(self.envoy.lock().unwrap().as_ref().context("envoy not running")?)
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.path("agent.log")).unwrap_or_default()
    }

    /// Creates a managed Pod on this node and returns its UID.
    fn pod(&self, ns: &str, name: &str, sa: &str, socket: Option<&str>) -> anyhow::Result<String> {
        let mut p = pod(ns, name).sa(sa).node(NODE).container("app", "registry.example/uds-echo:test").emptydir("s");
        if let Some(s) = socket {
            p = p.annotation_socket(s);
        }
        self.cp.apply(&p.manifest())?;
        let uid = self.cp.kubectl_ok(&["get", "pod", "-n", ns, name, "-o", "jsonpath={.metadata.uid}"])?;
        ensure!(uid.len() == 36, "pod uid {uid:?}");
        Ok(uid)
    }

    /// Plays kubelet and the app: the emptyDir dir and a UDS echo server in it.
    fn serve(&self, uid: &str, volume: &str, file: &str, name: &str) -> anyhow::Result<PathBuf> {
        let (child, socket) = start_uds_echo(&self.volume_dir(uid, volume), file, name, WAIT)?;
        self.echos.lock().unwrap().push(child);
        Ok(socket)
    }

    /// Like [`Env::serve`], but the volume dir appears at once with the socket in it (bound in a
    /// staging dir, then renamed into place): no socket watch was ever set on it.
    fn serve_at_once(&self, uid: &str, volume: &str, file: &str, name: &str) -> anyhow::Result<PathBuf> {
        let dir = self.volume_dir(uid, volume);
        let staging = dir.with_file_name(format!(".{volume}-staging"));
        let (child, _) = start_uds_echo(&staging, file, name, WAIT)?;
        self.echos.lock().unwrap().push(child);
        std::fs::rename(&staging, &dir).with_context(|| format!("renaming {} into place", staging.display()))?;
        Ok(dir.join(file))
    }

    fn policy(&self, name: &str, target: &str, socket: &str) -> anyhow::Result<()> {
        self.cp.apply(&policy(NS, name).target(target).socket(socket).manifest())
    }

    fn delete_policy(&self, name: &str) -> anyhow::Result<()> {
        self.cp.kubectl_ok(&["delete", "epol", "-n", NS, name, "--wait=true"]).map(|_| ())
    }

    /// Waits until Envoy's cluster `name` dials the pipe of the socket at `path` (its pin).
    fn wait_pipe(&self, cluster: &str, path: &Path) -> anyhow::Result<()> {
        let want = self.dialed(path);
        eventually(&format!("{cluster} dialing pipe {want}"), WAIT, || {
            self.envoy(|e| Ok(e.clusters()?.get(cluster).is_some_and(|a| a.contains("\"pipe\"") && a.contains(&want))))
        })
    }

    /// Waits until Envoy's cluster `name` no longer dials a pipe (TCP, or not rendered).
    fn wait_not_pipe(&self, cluster: &str) -> anyhow::Result<()> {
        eventually(&format!("{cluster} not dialing a pipe"), WAIT, || {
            self.envoy(|e| Ok(!e.clusters()?.get(cluster).is_some_and(|a| a.contains("\"pipe\""))))
        })
    }

    fn wait_served(&self, cluster: &str, by: &str) -> anyhow::Result<()> {
        eventually(&format!("200 from {by} through {cluster}"), WAIT, || {
            self.envoy(|e| {
                let (status, body) = e.via(cluster, "/hello")?;
                Ok(status == 200 && body.contains(&format!("{by} over unix:")) && body.contains("GET /hello"))
            })
        })
    }

    fn agent_admin(&self) -> anyhow::Result<u16> {
        self.agent.lock().unwrap().as_ref().map(|a| a.admin).context("agent not running")
    }

    /// The events.k8s.io Events the agent published about pod `ns/name`.
    fn agent_events(&self, ns: &str, name: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let out = self.cp.kubectl_ok(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"])?;
        let list: serde_json::Value = serde_json::from_str(&out).context("events list is JSON")?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["name"] == name && e["reportingController"] == "aether-agent")
            .cloned()
            .collect())
    }

    /// A kube client of the test API server (admin).
    fn client(&self) -> anyhow::Result<(tokio::runtime::Runtime, kube::Client)> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Runtime::new()?;
        let kubeconfig = kube::config::Kubeconfig::read_from(self.cp.kubeconfig())?;
        let client = rt.block_on(async {
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
            anyhow::Ok(kube::Client::try_from(config)?)
        })?;
        Ok((rt, client))
    }

    /// Exactly one Event about `ns/name` with `reason`, never repeated as a series; returns it.
    fn one_event(&self, ns: &str, name: &str, reason: &str) -> anyhow::Result<serde_json::Value> {
        let events = self.agent_events(ns, name)?;
        ensure!(events.len() == 1, "want exactly one Event on {ns}/{name}, got {}: {events:#?}", events.len());
        let e = events.into_iter().next().unwrap_or_default();
        ensure!(e["reason"] == reason && e["type"] == "Warning", "{e:#}");
        let count = e["series"]["count"].as_u64().or(e["deprecatedCount"].as_u64()).unwrap_or(1);
        ensure!(count <= 1, "the Event was repeated (count {count}): {e:#}");
        Ok(e)
    }

    /// Sets (overwrites) pod `name`'s `endpoint.aether.io/uds-socket` annotation in [`NS`].
    fn set_socket_annotation(&self, name: &str, value: &str) -> anyhow::Result<()> {
        let annotation = format!("endpoint.aether.io/uds-socket={value}");
        self.cp.kubectl_ok(&["annotate", "pod", "-n", NS, name, &annotation, "--overwrite"])?;
        Ok(())
    }

    fn log_has(&self, what: &str) -> anyhow::Result<()> {
        eventually(&format!("the agent log to mention {what:?}"), WAIT, || Ok(self.agent_log().contains(what)))
    }

    /// Waits until one line of the agent log mentions both `pod` and `what`.
    fn log_has_line(&self, pod: &str, what: &str) -> anyhow::Result<()> {
        eventually(&format!("an agent log line on {pod} saying {what:?}"), WAIT, || {
            Ok(self.agent_log().lines().any(|l| l.contains(pod) && l.contains(what)))
        })
    }

    fn health(&self, cluster: &str) -> anyhow::Result<u16> {
        unix_get_status(&self.path("run/health.sock"), &format!("/healthz/{cluster}"))
    }
}

// ------------------------------------------------------------------------------------ trials

/// A kernel without the calls socket pinning needs (docs/compatibility.md, "Kernel") cannot be had
/// on this machine, so the agent's check cannot fail here (its rule is unit-tested); what the agent
/// publishes for one can be proven against the real API server: one Warning Event regarding its
/// Node, reported by `aether-agent` on that node, whose note names the calls, the Linux release that
/// has them and the kernel.
fn p_a_kernel_gap_is_published_as_one_warning_on_the_node(env: &Env) -> anyhow::Result<()> {
    use aether_agent_reconciler::kernel::{GAP_ACTION, GAP_REASON, Gap, OPENAT2};
    let gap = Gap { feature: &OPENAT2, kernel: "5.4.0-200-generic".into(), error: rustix::io::Errno::NOSYS };
    let (rt, client) = env.client()?;
    let _in_runtime = rt.enter();
    rt.block_on(aether_agent_reconciler::recorder::spawn_node_warning(
        client,
        NODE,
        GAP_REASON,
        GAP_ACTION,
        gap.to_string(),
    ))?;
    let out = env.cp.kubectl_ok(&["get", "events.events.k8s.io", "-n", "default", "-o", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&out).context("events list is JSON")?;
    let on_node: Vec<&serde_json::Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == NODE && e["reason"] == GAP_REASON)
        .collect();
    ensure!(on_node.len() == 1, "one {GAP_REASON} Event on Node {NODE}: {on_node:#?}");
    let e = on_node[0];
    println!("Event on Node {NODE}: {} {}: {}", e["type"], e["reason"], e["note"]);
    ensure!(e["type"] == "Warning" && e["action"] == GAP_ACTION, "{e:#}");
    ensure!(e["reportingController"] == "aether-agent" && e["reportingInstance"] == NODE, "{e:#}");
    let note = e["note"].as_str().unwrap_or_default();
    ensure!(
        note.contains("kernel 5.4.0-200-generic lacks openat2(2)") && note.contains("Linux 5.6 and later"),
        "the note names the kernel, the calls and the release: {note}"
    );
    Ok(())
}

fn e_crd_installed_after_the_agent_started_takes_effect_without_a_restart(env: &Env) -> anyhow::Result<()> {
    let readyz = env.agent.lock().unwrap().as_ref().map(Agent::readyz).unwrap_or_default();
    ensure!(readyz.contains("EndpointPolicy CRD not installed"), "readyz: {readyz}");
    let uid = env.pod(NS, "late-1", "late", None)?;
    let socket = env.serve(&uid, "s", "app.sock", "late-1")?;
    env.cp.install_crd()?;
    eventually("the policy to be admitted once the CRD is served", WAIT, || {
        Ok(env.policy("late-uds", "late", "s/app.sock").is_ok())
    })?;
    env.wait_pipe("app_e2e_late-1_8080", &socket)?;
    env.wait_served("app_e2e_late-1_8080", "late-1")?;
    // Uninstalling the CRD reverts those pods to TCP, and installing it again works.
    env.cp.kubectl_ok(&["delete", "crd", "endpointpolicies.config.aether.io", "--wait=true"])?;
    env.wait_not_pipe("app_e2e_late-1_8080")?;
    env.cp.install_crd()?;
    let readyz = env.agent.lock().unwrap().as_ref().map(Agent::readyz).unwrap_or_default();
    eventually("readyz to say the CRD is installed", WAIT, || {
        Ok(env
            .agent
            .lock()
            .unwrap()
            .as_ref()
            .map(Agent::readyz)
            .unwrap_or_default()
            .contains("EndpointPolicy CRD installed"))
    })
    .with_context(|| readyz)?;
    Ok(())
}

fn a_annotated_pod_is_served_over_its_socket_through_envoy(env: &Env) -> anyhow::Result<()> {
    let uid = env.pod(NS, "ann-1", "ann", Some("s/app.sock"))?;
    // Rendered over its pin before the app binds the socket, but not logged as delivered yet.
    env.wait_pipe("app_e2e_ann-1_8080", &env.volume_dir(&uid, "s").join("app.sock"))?;
    let delivered =
        |log: &str| log.lines().any(|l| l.contains("e2e/ann-1") && l.contains("delivering over the pod's Unix socket"));
    ensure!(!delivered(&env.agent_log()), "ann-1 logged as delivered before its socket exists");
    let socket = env.serve(&uid, "s", "app.sock", "ann-1")?;
    env.wait_pipe("app_e2e_ann-1_8080", &socket)?;
    env.wait_served("app_e2e_ann-1_8080", "ann-1")?;
    eventually("ann-1 logged as delivered once its socket is verified", WAIT, || Ok(delivered(&env.agent_log())))?;
    eventually("health gateway 200 for health_e2e_ann-1", WAIT, || Ok(env.health("health_e2e_ann-1")? == 200))?;
    ensure!(env.health("health_e2e_nosuch")? != 200, "unknown health cluster answered 200");
    ensure!(unix_get_status(&env.path("run/health.sock"), "/other")? == 404, "non-healthz path is not 404");
    Ok(())
}

fn b_policy_on_the_pods_service_key_serves_over_the_socket(env: &Env) -> anyhow::Result<()> {
    let uid = env.pod(NS, "pol-1", "pol", None)?;
    let socket = env.serve(&uid, "s", "app.sock", "pol-1")?;
    env.wait_not_pipe("app_e2e_pol-1_8080")?;
    env.policy("pol-uds", "pol", "s/app.sock")?;
    env.wait_pipe("app_e2e_pol-1_8080", &socket)?;
    env.wait_served("app_e2e_pol-1_8080", "pol-1")
}

fn c_annotation_precedence_over_policy(env: &Env) -> anyhow::Result<()> {
    env.policy("prec-pol", "prec", "x/bogus.sock")?;
    let uid1 = env.pod(NS, "prec-1", "prec", Some("s/app.sock"))?;
    let sock1 = env.serve(&uid1, "s", "app.sock", "prec-1")?;
    env.wait_pipe("app_e2e_prec-1_8080", &sock1)?;
    env.wait_served("app_e2e_prec-1_8080", "prec-1")?;
    let uid2 = env.pod(NS, "prec-2", "prec", Some("../x.sock"))?;
    let sock2 = env.serve(&uid2, "s", "app.sock", "prec-2")?;
    // The marker that the agent applied the policy change below: a pod of the same Service
    // without an annotation moves to the policy's socket in the same decision.
    let uid3 = env.pod(NS, "prec-3", "prec", None)?;
    let sock3 = env.serve(&uid3, "s", "app.sock", "prec-3")?;
    env.policy("prec-pol", "prec", "s/app.sock")?;
    env.wait_pipe("app_e2e_prec-3_8080", &sock3).context("the policy change is in effect")?;
    env.wait_not_pipe("app_e2e_prec-2_8080").context("an invalid annotation must never fall back to the policy")?;
    env.cp.kubectl_ok(&["annotate", "pod", "-n", NS, "prec-2", "endpoint.aether.io/uds-socket-"])?;
    env.wait_pipe("app_e2e_prec-2_8080", &sock2).context("removing the annotation falls back to the policy")?;
    env.wait_served("app_e2e_prec-2_8080", "prec-2")?;
    env.delete_policy("prec-pol")?;
    env.wait_not_pipe("app_e2e_prec-2_8080").context("removing the policy returns to TCP")?;
    env.wait_pipe("app_e2e_prec-1_8080", &sock1).context("the annotated pod keeps its socket")?;
    Ok(())
}

fn d_drifted_policy_unpromotes_only_its_service_and_envoy_never_nacks(env: &Env) -> anyhow::Result<()> {
    let rejected_before = env.envoy(|e| e.stat("cluster_manager.cds.update_rejected"))?;
    let uid = env.pod(NS, "drift-1", "drift", None)?;
    let socket = env.serve(&uid, "s", "app.sock", "drift-1")?;
    env.policy("drift-pol", "drift", "nosuch/app.sock")?;
    eventually("agent names the drift", WAIT, || Ok(env.agent_log().contains("volume-not-emptydir")))?;
    eventually("health_e2e_drift-1 unpromoted", WAIT, || Ok(env.health("health_e2e_drift-1")? == 503))?;
    ensure!(env.health("health_e2e_ann-1")? == 200, "another service's health changed");
    env.wait_served("app_e2e_ann-1_8080", "ann-1")?;
    let rejected = env.envoy(|e| e.stat("cluster_manager.cds.update_rejected"))?;
    ensure!(rejected == rejected_before, "Envoy rejected a CDS update ({rejected_before} -> {rejected})");
    env.delete_policy("drift-pol")?;
    env.policy("drift-pol", "drift", "s/app.sock")?;
    env.wait_pipe("app_e2e_drift-1_8080", &socket)?;
    eventually("health_e2e_drift-1 promoted after the fix", WAIT, || Ok(env.health("health_e2e_drift-1")? == 200))?;
    Ok(())
}

fn g_symlinked_socket_or_volume_dir_is_refused(env: &Env) -> anyhow::Result<()> {
    let victim =
        env.volume_dir(&env.cp.kubectl_ok(&["get", "pod", "-n", NS, "ann-1", "-o", "jsonpath={.metadata.uid}"])?, "s");
    // The socket file is a symlink to another pod's socket.
    let uid = env.pod(NS, "sym-1", "sym", Some("s/app.sock"))?;
    let dir = env.volume_dir(&uid, "s");
    std::fs::create_dir_all(&dir)?;
    std::os::unix::fs::symlink(victim.join("app.sock"), dir.join("app.sock"))?;
    // The volume dir itself is a symlink to another pod's volume.
    let uid2 = env.pod(NS, "sym-2", "sym", Some("s/app.sock"))?;
    let dir2 = env.volume_dir(&uid2, "s");
    std::fs::create_dir_all(dir2.parent().unwrap())?;
    std::os::unix::fs::symlink(&victim, &dir2)?;
    eventually("both refusals logged", WAIT, || {
        let log = env.agent_log();
        Ok(log.contains(&format!("{}", dir.join("app.sock").display()))
            && log.contains(&format!("{} is a symlink", dir2.display())))
    })?;
    for c in ["app_e2e_sym-1_8080", "app_e2e_sym-2_8080"] {
        env.wait_not_pipe(c)?;
        let (status, body) = env.envoy(|e| e.via(c, "/steal"))?;
        ensure!(!body.contains("ann-1"), "{c} reached another pod's socket: {status} {body}");
    }
    // A real socket replaces the link: the refusal sticks (the pod could swap again after every
    // clean check) until the pod is re-created.
    std::fs::remove_file(dir.join("app.sock"))?;
    env.serve(&uid, "s", "app.sock", "sym-1")?;
    // The marker that the agent's periodic re-check has looked at every pod since: a pod whose
    // volume dir appears only now, with its socket in it, out of the socket watch's reach (there
    // was no dir to watch), so that only this re-check finds the socket and logs the pod delivered.
    let sentinel = env.pod(NS, "sym-3", "sym", Some("s/app.sock"))?;
    env.wait_pipe("app_e2e_sym-3_8080", &env.volume_dir(&sentinel, "s").join("app.sock"))?;
    env.serve_at_once(&sentinel, "s", "app.sock", "sym-3")?;
    env.log_has_line("e2e/sym-3", "delivering over the pod's Unix socket")?;
    env.wait_not_pipe("app_e2e_sym-1_8080").context("a link refusal sticks while the pod lives")?;
    // No kubelet here to confirm the termination: delete at once.
    env.cp.kubectl_ok(&["delete", "pod", "-n", NS, "sym-1", "--grace-period=0", "--force", "--wait=true"])?;
    let uid = env.pod(NS, "sym-1", "sym", Some("s/app.sock"))?;
    let socket = env.serve(&uid, "s", "app.sock", "sym-1")?;
    env.wait_pipe("app_e2e_sym-1_8080", &socket).context("a re-created pod starts clean")?;
    env.wait_served("app_e2e_sym-1_8080", "sym-1")
}

/// The toggle attack (docs/design-notes.md, "Agent"): pod atk-1 keeps swapping its socket for a
/// symlink to vic-1's socket and back, ~every 2 ms, for `AETHER_ATTACK_SECS` (10; `make attack`:
/// 60), against the agent's 1 s re-check, while requests go to atk-1's cluster through Envoy. Envoy
/// dials atk-1's pin, the inode the agent verified, so no request may reach vic-1 (without pinning:
/// 2656 did here); once a check sees the link, atk-1 stays on TCP until it is re-created.
fn k_a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic(env: &Env) -> anyhow::Result<()> {
    // Its own victim, so `make attack` can run this trial alone.
    let victim_uid = env.pod(NS, "vic-1", "vic", Some("s/app.sock"))?;
    let victim = env.serve(&victim_uid, "s", "app.sock", "vic-1")?;
    env.wait_served("app_e2e_vic-1_8080", "vic-1")?;
    let secs: u64 = std::env::var("AETHER_ATTACK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let uid = env.pod(NS, "atk-1", "atk", Some("s/app.sock"))?;
    let socket = env.serve(&uid, "s", "app.sock", "atk-1")?;
    env.wait_pipe("app_e2e_atk-1_8080", &socket)?;
    env.wait_served("app_e2e_atk-1_8080", "atk-1")?;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let toggler = {
        let (stop, socket, real) = (stop.clone(), socket.clone(), socket.with_file_name("real.sock"));
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Link for ~2 ms, the real socket for ~2 ms.
                if std::fs::rename(&socket, &real).is_ok() && std::os::unix::fs::symlink(&victim, &socket).is_ok() {
                    swaps += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
                let _ = std::fs::remove_file(&socket);
                let _ = std::fs::rename(&real, &socket);
                std::thread::sleep(Duration::from_millis(2));
            }
            swaps
        })
    };
    let (mut attacker, mut victim_hits, mut other) = (0u32, 0u32, 0u32);
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        match env.envoy(|e| e.via("app_e2e_atk-1_8080", "/steal")) {
            Ok((200, body)) if body.contains("vic-1") => victim_hits += 1,
            Ok((200, body)) if body.contains("atk-1") => attacker += 1,
            _ => other += 1,
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = toggler.join().map_err(|_| anyhow::anyhow!("toggler panicked"))?;
    println!(
        "toggle attack, {secs} s, re-check 1 s: {swaps} swaps; {} requests: {attacker} to atk-1, {victim_hits} to \
         the victim vic-1, {other} refused/unhealthy",
        attacker + victim_hits + other
    );
    ensure!(swaps > 100, "the toggler barely ran ({swaps} swaps)");
    ensure!(victim_hits == 0, "{victim_hits} requests for atk-1 were delivered to vic-1's socket");
    // Once a check catches the link, the pod stays on TCP until it is re-created.
    env.log_has("held a link: TCP until the pod is re-created")?;
    env.wait_not_pipe("app_e2e_atk-1_8080")?;
    Ok(())
}

/// A FIFO in place of pod fifo-1's socket sends it to TCP; a real socket bound there again is
/// served over its pin at once: the pod stays watched while it is on TCP for that reason.
fn o_a_pod_fallen_back_for_a_fifo_is_served_over_its_socket_once_one_is_bound_again(env: &Env) -> anyhow::Result<()> {
    let uid = env.pod(NS, "fifo-1", "fifo", Some("s/app.sock"))?;
    let dir = env.volume_dir(&uid, "s");
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("app.sock");
    let made = Command::new("mkfifo").arg(&socket).status().context("mkfifo")?;
    ensure!(made.success(), "mkfifo {}", socket.display());
    env.log_has(&format!("{} exists but is not a Unix socket (it is a fifo)", socket.display()))?;
    env.wait_not_pipe("app_e2e_fifo-1_8080")?;
    let metrics = || -> anyhow::Result<f64> {
        let scrape = Scrape::get(env.agent_admin()?)?;
        Ok(scrape.value("aether_agent_socket_watch_events_total", &[("outcome", "socket")]))
    };
    let before = metrics()?;
    std::fs::remove_file(&socket)?;
    let socket = env.serve(&uid, "s", "app.sock", "fifo-1")?;
    env.wait_pipe("app_e2e_fifo-1_8080", &socket)?;
    env.wait_served("app_e2e_fifo-1_8080", "fifo-1")?;
    let after = metrics()?;
    ensure!(after >= before + 2.0, "the socket watch saw the FIFO go and the socket come: {before} → {after}");
    Ok(())
}

fn h_cluster_names_are_unique_across_namespaces(env: &Env) -> anyhow::Result<()> {
    let a = env.pod(NS, "twin", "twin", Some("s/app.sock"))?;
    let b = env.pod(NS_B, "twin", "twin", Some("s/app.sock"))?;
    let sa = env.serve(&a, "s", "app.sock", "twin-in-e2e")?;
    let sb = env.serve(&b, "s", "app.sock", "twin-in-e2e-b")?;
    env.wait_pipe("app_e2e_twin_8080", &sa)?;
    env.wait_pipe("app_e2e-b_twin_8080", &sb)?;
    env.wait_served("app_e2e_twin_8080", "twin-in-e2e")?;
    env.wait_served("app_e2e-b_twin_8080", "twin-in-e2e-b")
}

/// An over-budget annotation: one Warning Event with the reason, never one per resync; the
/// metrics parse and move.
fn i_over_budget_annotation_gets_one_event_not_one_per_resync_and_metrics_move(env: &Env) -> anyhow::Result<()> {
    env.cp.install_crd()?; // already there after trial e; this trial also runs alone
    let admin = env.agent_admin()?;
    let before = Scrape::get(admin)?;
    let total = |s: &Scrape, name: &str| s.value(name, &[]);
    let (pushes0, acks0, timed0) = (
        total(&before, "aether_xds_pushes_total"),
        total(&before, "aether_xds_acks_total"),
        total(&before, "aether_xds_change_to_ack_seconds_count"),
    );
    // 26 bytes; the budget with this pods dir (/tmp/aeXXXXXX/pods, 18 bytes) is 107 - 18 - 70 = 19.
    let value = "sockets/app1234567890.sock";
    env.pod(NS, "over-1", "over", Some(value))?;
    eventually("a pod Event on e2e/over-1", WAIT, || Ok(!env.agent_events(NS, "over-1")?.is_empty()))?;
    let e = env.one_event(NS, "over-1", "UdsPathTooLong")?;
    let note = e["note"].as_str().unwrap_or_default();
    let budget = 107 - env.pods_dir().to_str().unwrap().len() - 70;
    ensure!(
        note.contains("pod e2e/over-1")
            && note.contains(value)
            && note.contains("is 26 bytes")
            && note.contains(&format!("- 70 (/<uid>/volumes/kubernetes.io~empty-dir/) = {budget} bytes"))
            && note.ends_with("delivering over TCP"),
        "note: {note}"
    );
    ensure!(e["reportingInstance"] == NODE && e["action"] == "DeliverOverTcp", "{e:#}");
    ensure!(e["regarding"]["kind"] == "Pod" && e["regarding"]["uid"].as_str().is_some_and(|u| u.len() == 36), "{e:#}");

    // The metrics parse (Scrape fails otherwise) and move.
    eventually("the metrics to show the fallback, the Event and the push it caused", WAIT, || {
        let s = Scrape::get(admin)?;
        Ok(s.value("aether_agent_tcp_fallbacks", &[("reason", "path-too-long")]) == 1.0
            && s.value("aether_agent_pods", &[("source", "annotation"), ("delivery", "waiting")]) >= 1.0
            && s.value("aether_agent_pod_events_total", &[("reason", "path-too-long"), ("result", "created")]) == 1.0
            && total(&s, "aether_xds_pushes_total") > pushes0
            && total(&s, "aether_xds_acks_total") > acks0
            && total(&s, "aether_xds_change_to_ack_seconds_count") > timed0)
    })?;
    let s = Scrape::get(admin)?;
    ensure!(s.value("aether_xds_nacks_total", &[]) == 0.0, "Envoy NACKed something");
    ensure!(s.has("aether_agent_policy_conflicts") && s.has("aether_agent_policy_crd_installed"));

    // Resync triggers: unrelated label patches, then a new over-budget value (same cause) as a
    // sentinel that the pod watch delivered everything before it, then a policy on its service.
    for round in 0..3 {
        env.cp.kubectl_ok(&["label", "pod", "-n", NS, "over-1", &format!("round={round}"), "--overwrite"])?;
    }
    let value2 = "sockets/app1234567890.soc2";
    env.set_socket_annotation("over-1", value2)?;
    env.log_has(value2)?;
    env.policy("over-pol", "over", "s/app.sock")?;
    env.log_has("EndpointPolicy e2e/over-pol is not used")?;
    env.one_event(NS, "over-1", "UdsPathTooLong").context("after label patches, a new value and a policy")?;

    // An agent restart (the API server stays up): it boots from the state dir and relists.
    *env.agent.lock().unwrap() = None;
    env.start_agent()?;
    eventually("the restarted agent to have listed the pods", WAIT, || {
        Ok(!env.agent.lock().unwrap().as_ref().map(Agent::readyz).unwrap_or_default().contains("no complete pod list"))
    })?;
    let value3 = "sockets/app1234567890.soc3";
    env.set_socket_annotation("over-1", value3)?;
    env.log_has(value3)?;
    env.one_event(NS, "over-1", "UdsPathTooLong").context("after an agent restart")?;
    let s = Scrape::get(env.agent_admin()?)?;
    ensure!(
        s.value("aether_agent_tcp_fallbacks", &[("reason", "path-too-long")]) == 1.0,
        "fallback gauge after restart"
    );
    ensure!(s.value("aether_agent_pod_events_total", &[]) == 0.0, "the restarted agent published an Event");
    Ok(())
}

/// Finished pods get nothing, like deleted ones; a pod being deleted drains (keeps its clusters)
/// until it finishes. No kubelet runs here, so the test writes the phases kubelet would.
fn j_a_finished_pod_loses_its_clusters_and_is_not_counted_while_a_draining_pod_keeps_them(
    env: &Env,
) -> anyhow::Result<()> {
    let admin = env.agent_admin()?;
    let counted = || -> anyhow::Result<f64> { Ok(Scrape::get(admin)?.value("aether_agent_pods", &[])) };
    let mut sockets = Vec::new();
    for name in ["fin-1", "fin-2"] {
        let uid = env.pod(NS, name, "fin", Some("s/app.sock"))?;
        sockets.push(env.serve(&uid, "s", "app.sock", name)?);
    }
    for (name, socket) in ["fin-1", "fin-2"].iter().zip(&sockets) {
        let cluster = format!("app_e2e_{name}_8080");
        env.wait_pipe(&cluster, socket)?;
        env.wait_served(&cluster, name)?;
    }
    let before = counted()?;
    let gone = |name: &str| -> anyhow::Result<()> {
        let (app, health) = (format!("app_e2e_{name}_8080"), format!("health_e2e_{name}"));
        eventually(&format!("Envoy to drop {app} and {health}"), WAIT, || {
            env.envoy(|e| {
                let clusters = e.clusters()?;
                Ok(!clusters.contains_key(&app) && !clusters.contains_key(&health))
            })
        })?;
        ensure!(env.health(&health)? != 200, "the health gateway still promotes {health}");
        Ok(())
    };
    let finish = |name: &str, phase: &str| -> anyhow::Result<()> {
        let patch = format!(r#"{{"status":{{"phase":"{phase}"}}}}"#);
        env.cp.kubectl_ok(&["patch", "pod", "-n", NS, name, "--subresource=status", "--type=merge", "-p", &patch])?;
        Ok(())
    };

    // fin-2 is deleted: with a node name and a grace period the API server keeps it, with a
    // deletionTimestamp, until kubelet reports it stopped. It drains: still served.
    env.cp.kubectl_ok(&["delete", "pod", "-n", NS, "fin-2", "--wait=false"])?;
    let deleting =
        env.cp.kubectl_ok(&["get", "pod", "-n", NS, "fin-2", "-o", "jsonpath={.metadata.deletionTimestamp}"])?;
    ensure!(!deleting.is_empty(), "fin-2 has no deletionTimestamp");
    // fin-1 finishes. Its event comes after fin-2's on the same watch, so once fin-1 is gone
    // the agent has seen fin-2 draining too.
    finish("fin-1", "Succeeded")?;
    gone("fin-1")?;
    env.log_has("the pod finished; removing its clusters")?;
    env.wait_pipe("app_e2e_fin-2_8080", &sockets[1]).context("a draining pod keeps its clusters")?;
    env.wait_served("app_e2e_fin-2_8080", "fin-2").context("a draining pod is still served")?;
    eventually("aether_agent_pods to stop counting fin-1", WAIT, || Ok(counted()? == before - 1.0))?;

    // kubelet would now report fin-2 stopped: it loses its clusters before it leaves the API.
    finish("fin-2", "Failed")?;
    gone("fin-2")?;
    eventually("aether_agent_pods to stop counting fin-2", WAIT, || Ok(counted()? == before - 2.0))?;
    // Play kubelet's final delete; fin-1 stays in the API (finished) for the next trial's restart.
    env.cp.kubectl_ok(&["delete", "pod", "-n", NS, "fin-2", "--grace-period=0", "--force", "--wait=true"])?;
    Ok(())
}

/// The agent alone crashes (SIGKILL) and comes back while Envoy keeps running: the pins are mounts,
/// so every new connection during the outage still reaches the verified socket, and the restarted
/// agent keeps the same pins (same inode: no re-pin) and serves the same clusters.
fn l_new_connections_keep_working_while_the_agent_restarts(env: &Env) -> anyhow::Result<()> {
    let before = env.envoy(|e| e.clusters())?;
    env.wait_served("app_e2e_ann-1_8080", "ann-1")?;
    let uid = env.cp.kubectl_ok(&["get", "pod", "-n", NS, "ann-1", "-o", "jsonpath={.metadata.uid}"])?;
    let pin = format!("{}/{uid}.sock", env.pins_dir().display());
    let inode = |p: &str| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let pinned = inode(&pin)?;
    let killed = std::time::Instant::now();
    *env.agent.lock().unwrap() = None;
    // Through Envoy (its pooled upstream connections), and new connections to the pin itself,
    // which is what Envoy's next upstream connect does.
    let fresh = || -> anyhow::Result<bool> {
        use std::io::{Read, Write};
        let mut c = std::os::unix::net::UnixStream::connect(&pin)?;
        c.write_all(b"GET /fresh HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut reply = String::new();
        c.read_to_string(&mut reply)?;
        Ok(reply.contains("ann-1 over unix:"))
    };
    let (mut ok, mut failed, mut new_ok, mut new_failed) = (0u32, 0u32, 0u32, 0u32);
    while killed.elapsed() < Duration::from_secs(2) {
        match env.envoy(|e| e.via("app_e2e_ann-1_8080", "/during")) {
            Ok((200, body)) if body.contains("ann-1 over unix:") => ok += 1,
            _ => failed += 1,
        }
        if fresh().unwrap_or(false) {
            new_ok += 1;
        } else {
            new_failed += 1;
        }
    }
    env.start_agent()?;
    let back = killed.elapsed();
    let (mut ok_after, mut failed_after) = (0u32, 0u32);
    for _ in 0..200 {
        match env.envoy(|e| e.via("app_e2e_ann-1_8080", "/after")) {
            Ok((200, body)) if body.contains("ann-1 over unix:") => ok_after += 1,
            _ => failed_after += 1,
        }
    }
    println!(
        "agent killed, Envoy kept: during the 2 s outage {ok} of {} requests through Envoy and {new_ok} of {} new \
         connections to the pin served; agent ready again {:.1} s after the kill; then {ok_after} of 200 served",
        ok + failed,
        new_ok + new_failed,
        back.as_secs_f64()
    );
    ensure!(failed == 0 && ok > 0, "{failed} requests failed while the agent was down");
    ensure!(new_failed == 0 && new_ok > 0, "{new_failed} new connections to the pin failed while the agent was down");
    ensure!(failed_after == 0, "{failed_after} requests failed after the restart");
    ensure!(inode(&pin)? == pinned, "the restarted agent replaced a pin that still held the same socket");
    eventually("the restarted agent serves the same clusters", WAIT, || Ok(env.envoy(|e| e.clusters())? == before))
}

/// `--socket-limit filesystem`: a pod whose socket path on the host is longer
/// than sun_path (a 50-byte volume name: 150 bytes here) is served through its pin by an agent
/// running with the file system's limit; under the default limit the same pod falls back to TCP
/// with the budget reason; and the agent refuses the file system's limit without `--pin-dir`.
/// Its own agent and Envoy, on another node name, so the suite's agent never sees the pod.
fn m_a_socket_path_longer_than_sun_path_is_served_through_its_pin_under_the_file_system_limit(
    env: &Env,
) -> anyhow::Result<()> {
    const NODE_B: &str = "node-b";
    let (pods, pins) = (env.pods_dir(), env.path("run/pins-b"));
    let xds = env.path("run/xds-b.sock");
    let (state, health, log) = (env.path("state-b"), env.path("run/health-b.sock"), env.path("agent-b.log"));
    let xds_address = format!("unix://{}", xds.display());
    let base: Vec<&str> = vec![
        "--node-name",
        NODE_B,
        "--kubelet-pods-dir",
        pods.to_str().context("UTF-8 pods dir")?,
        "--state-dir",
        state.to_str().context("UTF-8 state dir")?,
        "--xds-address",
        &xds_address,
        "--health-socket",
        health.to_str().context("UTF-8 health socket")?,
        "--recheck-seconds",
        "1",
    ];

    // Without --pin-dir the file system's limit would admit paths Envoy cannot dial: refused.
    let out = Command::new(workspace_bin("aether-agent")?)
        .arg("run")
        .args(&base)
        .args(["--socket-limit", "filesystem", "--admin-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", env.cp.kubeconfig())
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the agent started with --socket-limit filesystem and no --pin-dir: {stderr}");
    ensure!(
        stderr.contains("--socket-limit filesystem needs socket pinning (--pin-dir)") && stderr.contains("sun_path"),
        "the refusal does not say why: {stderr}"
    );

    // The pod: a 50-byte volume, so its socket path is 150 bytes, past the 107 of sun_path.
    let volume = format!("sockets-{}", "x".repeat(42));
    let value = format!("{volume}/app.sock");
    ensure!(volume.len() == 50 && value.len() == 59);
    env.cp.kubectl(&["create", "serviceaccount", "-n", NS, "longpath"])?;
    let manifest = pod(NS, "long-1")
        .sa("longpath")
        .node(NODE_B)
        .container("app", "registry.example/uds-echo:test")
        .emptydir(&volume)
        .annotation_socket(&value)
        .manifest();
    env.cp.apply(&manifest)?;
    let uid = env.cp.kubectl_ok(&["get", "pod", "-n", NS, "long-1", "-o", "jsonpath={.metadata.uid}"])?;
    let dir = env.volume_dir(&uid, &volume);
    let socket = dir.join("app.sock");
    ensure!(socket.as_os_str().len() > 107, "{} is {} bytes", socket.display(), socket.as_os_str().len());
    // The app binds its socket by a relative name (in a real pod its own path is short).
    std::fs::create_dir_all(&dir)?;
    let child = Command::new(workspace_bin("uds-echo")?)
        .args(["--socket", "app.sock", "--name", "long-1"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    env.echos.lock().unwrap().push(child);
    eventually("the long-path echo socket", WAIT, || Ok(socket.exists()))?;

    let envoy_dir = env.path("envoy-b");
    std::fs::create_dir_all(&envoy_dir)?;
    let envoy = Envoy::builder(&xds, NODE_B, &envoy_dir).inbound().binary(envoy_bin()?).start()?;
    let cluster = "app_e2e_long-1_8080";
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // Default limit (sun-path): the 59-byte value is over the budget: TCP with the budget reason.
    let mut args = base.clone();
    let pins_arg = pins.to_str().context("UTF-8 pin dir")?;
    args.extend(["--pin-dir", pins_arg]);
    let agent = Agent::start(&env.cp.kubeconfig(), &args, &log)?;
    eventually("the budget fallback of e2e/long-1 logged", WAIT, || {
        Ok(agent_log().lines().any(|l| l.contains("long-1") && l.contains("path-too-long")))
    })?;
    let events = env.agent_events(NS, "long-1")?;
    ensure!(
        events.iter().any(|e| e["reason"] == "UdsPathTooLong" && e["reportingInstance"] == NODE_B),
        "no UdsPathTooLong Event from {NODE_B}: {events:#?}"
    );
    ensure!(!envoy.clusters()?.get(cluster).is_some_and(|a| a.contains("\"pipe\"")), "a pipe under the sun_path limit");
    drop(agent);

    // The file system's limit, with the pins: served through <pins>/<uid>.sock.
    args.extend(["--socket-limit", "filesystem"]);
    let agent = Agent::start(&env.cp.kubeconfig(), &args, &log)?;
    let pin = format!("{}/{uid}.sock", pins.display());
    eventually(&format!("{cluster} dialing its pin {pin}"), WAIT, || {
        Ok(envoy.clusters()?.get(cluster).is_some_and(|a| a.contains("\"pipe\"") && a.contains(&pin)))
    })?;
    eventually(&format!("200 from long-1 through {cluster}"), WAIT, || {
        let (status, body) = envoy.via(cluster, "/hello")?;
        Ok(status == 200 && body.contains("long-1 over unix:app.sock") && body.contains("GET /hello"))
    })?;
    eventually("health gateway 200 for health_e2e_long-1", WAIT, || {
        Ok(unix_get_status(&health, "/healthz/health_e2e_long-1")? == 200)
    })?;
    let inode = |p: &Path| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    ensure!(inode(Path::new(&pin))? == inode(&socket)?, "the pin holds another inode than the app's socket");
    ensure!(
        agent_log().contains("socket value limit: the file system's"),
        "the start-up line names the limit: {}",
        agent_log()
    );
    drop(agent);
    drop(envoy);
    env.cp.kubectl_ok(&["delete", "pod", "-n", NS, "long-1", "--grace-period=0", "--force", "--wait=true"])?;
    Ok(())
}

/// Runs last: agent and Envoy restart while the API server is down. A finished pod (fin-1,
/// still in the API) is not resurrected from the state dir: the clusters compare equal.
fn f_restarted_agent_serves_identical_clusters_from_its_state_dir_without_the_api_server(
    env: &Env,
) -> anyhow::Result<()> {
    let before = env.envoy(|e| e.clusters())?;
    ensure!(before.contains_key("app_e2e_ann-1_8080"), "{before:?}");
    *env.agent.lock().unwrap() = None;
    *env.envoy.lock().unwrap() = None;
    env.cp.stop_apiserver()?;
    env.start_agent()?;
    env.start_envoy()?;
    eventually("a fresh Envoy to get the same clusters from the restarted agent", WAIT, || {
        Ok(env.envoy(|e| e.clusters())? == before)
    })?;
    env.wait_served("app_e2e_ann-1_8080", "ann-1")?;
    // The watches survived the outage: once the API server is back, a new pod takes effect.
    env.cp.start_apiserver()?;
    // kube-runtime's watch backoff grows to 30 s while the API server is down, so allow longer.
    let uid = eventually_uid(env)?;
    let socket = env.serve(&uid, "s", "app.sock", "after-1")?;
    let cluster = "app_e2e_after-1_8080";
    eventually("the restarted watch to deliver the new pod", Duration::from_secs(90), || {
        env.envoy(|e| Ok(e.clusters()?.get(cluster).is_some_and(|a| a.contains(&env.dialed(&socket)))))
    })?;
    env.wait_served(cluster, "after-1")?;
    // The outage and the fresh list after it did not repeat the over-budget pod's Event.
    env.one_event(NS, "over-1", "UdsPathTooLong").context("after the API-server outage")?;
    Ok(())
}

fn eventually_uid(env: &Env) -> anyhow::Result<String> {
    let mut uid = String::new();
    eventually("creating a pod after the API server restart", WAIT, || {
        env.cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "after"]).ok();
        match env.pod(NS, "after-1", "after", Some("s/app.sock")) {
            Ok(u) => {
                uid = u;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    })?;
    Ok(uid)
}

/// The agent's and Envoy's last log lines, for a failed trial.
fn logs(env: &Env) -> String {
    let log = env.agent_log();
    let tail: Vec<&str> = log.lines().rev().take(25).collect();
    let envoy = env.envoy.lock().unwrap().as_ref().map(Envoy::log_tail).unwrap_or_default();
    format!("\n--- agent log (last lines, newest first):\n{}\n--- envoy log:\n{envoy}", tail.join("\n"))
}

/// The node's Envoy runs in its own DaemonSet, so what the agent leaves on the host for it (the
/// health socket, the socket pins) outlives the agent unless the release goes: with
/// `--own-daemonset` the agent keeps them at SIGTERM while its DaemonSet exists (a restart, a
/// roll, a pod deletion) and removes them once it is deleted (`helm uninstall`). A real API server
/// holds the DaemonSet; no controller runs it, so it has no pods.
fn n_the_agent_leaves_envoys_host_state_until_its_daemonset_is_deleted(env: &Env) -> anyhow::Result<()> {
    const OWNER: &str = "own";
    let dir = env.work.path().join("own");
    std::fs::create_dir_all(&dir)?;
    let health = dir.join("h.sock");
    let start = |log: &str| {
        // As Envoy leaves it: a socket file nobody listens on any more.
        drop(std::os::unix::net::UnixListener::bind(&health));
        let state = dir.join(format!("{log}-state")).to_string_lossy().into_owned();
        let xds = format!("unix://{}", dir.join(format!("{log}-x.sock")).display());
        let owner = format!("{NS}/{OWNER}");
        let health = health.to_string_lossy().into_owned();
        let args = [
            "--node-name",
            "node-own",
            "--state-dir",
            &state,
            "--xds-address",
            &xds,
            "--health-socket",
            &health,
            "--own-daemonset",
            &owner,
        ];
        Agent::start(&env.cp.kubeconfig(), &args, &dir.join(format!("{log}.log")))
    };
    let log_has = |agent: &Agent, text: &str| std::fs::read_to_string(&agent.log).is_ok_and(|l| l.contains(text));
    env.cp.kube().apply(&format!(
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: {OWNER}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: own}}}}
  template:
    metadata: {{labels: {{app: own}}}}
    spec: {{containers: [{{name: c, image: none}}]}}
"#
    ))?;

    let mut kept = start("kept")?;
    eventually("the agent sees its DaemonSet", WAIT, || Ok(log_has(&kept, "the agent's own DaemonSet exists")))?;
    kept.terminate()?;
    let log = std::fs::read_to_string(&kept.log)?;
    ensure!(health.symlink_metadata().is_ok(), "the health socket went with a restart:\n{log}");
    ensure!(log.contains("health socket left: the agent's DaemonSet stays"), "{log}");

    let mut gone = start("gone")?;
    eventually("the agent sees its DaemonSet", WAIT, || Ok(log_has(&gone, "the agent's own DaemonSet exists")))?;
    env.cp.kubectl_ok(&["delete", "daemonset", "-n", NS, OWNER, "--wait=true"])?;
    eventually("the agent sees its DaemonSet deleted", WAIT, || {
        Ok(log_has(&gone, "the agent's own DaemonSet is gone"))
    })?;
    gone.terminate()?;
    let log = std::fs::read_to_string(&gone.log)?;
    ensure!(health.symlink_metadata().is_err(), "the health socket outlived the release:\n{log}");
    ensure!(log.contains("health socket removed"), "{log}");
    Ok(())
}

fn setup() -> anyhow::Result<Env> {
    let cp = ControlPlane::start()?;
    // A short root keeps the socket paths inside sun_path.
    let work = tempfile::Builder::new().prefix("ae").tempdir_in("/tmp")?;
    std::fs::create_dir_all(work.path().join("run"))?;
    std::fs::create_dir_all(work.path().join("pods"))?;
    for ns in [NS, NS_B] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    for sa in ["late", "ann", "pol", "prec", "drift", "sym", "atk", "vic", "twin", "over", "fin", "fifo"] {
        cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, sa])?;
    }
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS_B, "twin"])?;
    let env = Env { cp, work, agent: Mutex::new(None), envoy: Mutex::new(None), echos: Mutex::new(Vec::new()) };
    env.start_agent()?;
    env.start_envoy()?;
    Ok(env)
}

fn main() {
    suite::run(
        suite::cases![
            e_crd_installed_after_the_agent_started_takes_effect_without_a_restart,
            a_annotated_pod_is_served_over_its_socket_through_envoy,
            b_policy_on_the_pods_service_key_serves_over_the_socket,
            c_annotation_precedence_over_policy,
            d_drifted_policy_unpromotes_only_its_service_and_envoy_never_nacks,
            g_symlinked_socket_or_volume_dir_is_refused,
            k_a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic,
            o_a_pod_fallen_back_for_a_fifo_is_served_over_its_socket_once_one_is_bound_again,
            h_cluster_names_are_unique_across_namespaces,
            i_over_budget_annotation_gets_one_event_not_one_per_resync_and_metrics_move,
            j_a_finished_pod_loses_its_clusters_and_is_not_counted_while_a_draining_pod_keeps_them,
            n_the_agent_leaves_envoys_host_state_until_its_daemonset_is_deleted,
            l_new_connections_keep_working_while_the_agent_restarts,
            m_a_socket_path_longer_than_sun_path_is_served_through_its_pin_under_the_file_system_limit,
            f_restarted_agent_serves_identical_clusters_from_its_state_dir_without_the_api_server,
            p_a_kernel_gap_is_published_as_one_warning_on_the_node,
        ],
        setup,
        logs,
    )
}
