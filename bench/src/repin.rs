//! Section 3b of `make bench`: the re-pin latency.
//!
//! The release `aether-agent` with `--pin-dir` (root: it mounts the pins), a real Envoy on its
//! ADS, and one managed pod whose app (`uds-echo`) serves on its socket. Each repetition plays a
//! container restart: the app is killed, Envoy's health check marks the pod unhealthy, and a new
//! app re-creates the socket (a new inode). From the moment the new inode is at the pod's path,
//! three intervals: until the pin (`<pin-dir>/<uid>.sock`) holds the new inode (the agent's
//! inotify watch, the re-verification with `openat2`, the mount); until a request through Envoy
//! reaches the new app; until Envoy's active health check passes again (the health gateway
//! answers 200), which waits for Envoy's next check (the agent renders a 2 s interval plus up to 50 % jitter).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aether_fixtures::{Envoy, pod};
use aether_tests::{ControlPlane, envoy_bin, free_port, http_get_status, unix_get_status};
use anyhow::{Context, ensure};

use crate::processes::{Proc, workspace_bin};
use crate::stats::{Spread, md_table, percentile, show_secs};
use crate::{Goal, Opts, Report};

const NS: &str = "bench-repin";
const NODE: &str = "bench-repin-node";
const POD: &str = "app-1";
/// How long one step may take before the repetition fails.
const STEP: Duration = Duration::from_secs(30);

/// Lazily unmounts every mount below `dir` when dropped (the agent's pins outlive it: they are
/// mounts). Declared before the processes, so it runs after they are stopped.
pub(crate) struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let dir = self.0.to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut targets: Vec<&str> =
            mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|t| t.starts_with(dir.as_str())).collect();
        targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
        for t in targets {
            let _ = Command::new("umount").args(["-l", t]).stdin(Stdio::null()).status();
        }
    }
}

pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|u| u.split_whitespace().next() == Some("0")))
        .unwrap_or(false)
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Polls `f` (every `every`) until it is true; the instant it first was.
pub(crate) fn until(what: &str, every: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + STEP;
    loop {
        if f() {
            return Ok(Instant::now());
        }
        ensure!(Instant::now() < deadline, "{what}: not within {} s", STEP.as_secs());
        std::thread::sleep(every);
    }
}

/// `uds-echo` named `name` on `socket`, not waited for (the caller watches the socket's inode).
pub(crate) fn app(work: &Path, name: &str, socket: &Path) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(workspace_bin("uds-echo")?);
    cmd.arg("--socket").arg(socket).args(["--name", name]);
    Proc::spawn(cmd, work.join(format!("{name}.log")), 0)
}

/// `agent_bin run` for node `node` in `work` (`--kubelet-pods-dir <work>/pods`, state dir, xDS
/// and health sockets under `<work>/run`, and `--pin-dir` when `pins` is given, defaults
/// otherwise), waited for until `/readyz` answers 200 (`what` names it in an error). Returns the
/// agent, its xDS socket and its health socket.
pub(crate) fn start_agent(
    cp: &ControlPlane,
    node: &str,
    agent_bin: &Path,
    work: &Path,
    pins: Option<&Path>,
    what: &str,
) -> anyhow::Result<(Proc, PathBuf, PathBuf)> {
    let run = work.join("run");
    std::fs::create_dir_all(&run)?;
    let (xds, health) = (run.join("xds.sock"), run.join("health.sock"));
    let agent_admin = free_port();
    let mut cmd = Command::new(agent_bin);
    cmd.arg("run")
        .args(["--node-name", node, "--admin-addr", &format!("127.0.0.1:{agent_admin}")])
        // Any free loopback debug port, by env: an earlier release under comparison has no such flag.
        .env("AETHER_DEBUG_ADDR", "127.0.0.1:0")
        .arg("--kubelet-pods-dir")
        .arg(work.join("pods"))
        .arg("--state-dir")
        .arg(work.join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", xds.display()))
        .arg("--health-socket")
        .arg(&health)
        .env("KUBECONFIG", cp.kubeconfig());
    if let Some(pins) = pins {
        cmd.arg("--pin-dir").arg(pins);
    }
    let mut agent = Proc::spawn(cmd, work.join("agent.log"), agent_admin)?;
    agent.wait_until(&format!("aether-agent ({what})"), || http_get_status(agent_admin, "/readyz") == Some(200))?;
    Ok((agent, xds, health))
}

/// One node's pinning agent and its Envoy, on a pods dir in a temp dir: the stage of sections 3b
/// and 3c. Dropping it stops Envoy and the agent, then detaches the pins, then removes the dir.
pub(crate) struct Stage {
    pub(crate) envoy: Envoy,
    pub(crate) agent: Proc,
    _unmount: Unmount,
    /// `--kubelet-pods-dir`.
    pub(crate) pods: PathBuf,
    /// `--pin-dir`.
    pub(crate) pins: PathBuf,
    /// `--health-socket`.
    pub(crate) health: PathBuf,
    pub(crate) work: tempfile::TempDir,
}

impl Stage {
    /// Starts `agent_bin` (`--pin-dir`, defaults otherwise) for node `node` and an Envoy on its
    /// ADS with the inbound test listener.
    pub(crate) fn start(cp: &ControlPlane, node: &str, agent_bin: &Path) -> anyhow::Result<Stage> {
        ensure!(is_root(), "the pinning agent needs root: it mounts each pin (CAP_SYS_ADMIN)");
        let work = tempfile::Builder::new().prefix("aebr").tempdir_in("/tmp")?;
        let unmount = Unmount(work.path().to_owned());
        let (pods, pins) = (work.path().join("pods"), work.path().join("run/pins"));
        std::fs::create_dir_all(&pods)?;
        let (agent, xds, health) = start_agent(cp, node, agent_bin, work.path(), Some(&pins), "pinning")?;
        let envoy_dir = work.path().join("envoy");
        std::fs::create_dir_all(&envoy_dir)?;
        let envoy = Envoy::builder(&xds, node, &envoy_dir).inbound().binary(envoy_bin()?).start()?;
        Ok(Stage { envoy, agent, _unmount: unmount, pods, pins, health, work })
    }

    /// Creates managed pod `ns/name` (ServiceAccount `app`, emptyDir `s`, socket `s/app.sock`)
    /// on `node`, then, as kubelet does, its volume dir and then its pod IP (volumes are set up
    /// before the sandbox that gets the IP; the IP is the pod update after which the agent finds
    /// the volume dir to watch); returns (its UID, its socket path).
    pub(crate) fn pod(&self, cp: &ControlPlane, ns: &str, name: &str, node: &str) -> anyhow::Result<(String, PathBuf)> {
        cp.apply(
            &pod(ns, name)
                .node(node)
                .sa("app")
                .container("app", "registry.example/uds-echo:bench")
                .emptydir("s")
                .annotation_socket("s/app.sock")
                .manifest(),
        )?;
        let uid = cp.kubectl_ok(&["get", "pod", "-n", ns, name, "-o", "jsonpath={.metadata.uid}"])?;
        let volume = self.pods.join(&uid).join("volumes/kubernetes.io~empty-dir/s");
        std::fs::create_dir_all(&volume)?;
        let ip = r#"{"status":{"podIP":"10.0.0.2","podIPs":[{"ip":"10.0.0.2"}]}}"#;
        cp.kubectl_ok(&["patch", "pod", "-n", ns, name, "--subresource=status", "--type=merge", "-p", ip])?;
        Ok((uid, volume.join("app.sock")))
    }

    /// True when a request through Envoy's `cluster` is answered 200 by the app named `name`.
    pub(crate) fn served_by(&self, cluster: &str, name: &str) -> bool {
        let who = format!("{name} ");
        self.envoy.via(cluster, "/bench").is_ok_and(|(status, body)| status == 200 && body.starts_with(&who))
    }

    /// The agent's log, for an error's context.
    pub(crate) fn agent_log(&self) -> String {
        std::fs::read_to_string(&self.agent.log).unwrap_or_default()
    }
}

/// The section: `opts.repins` re-creations of the pod's socket.
pub(crate) fn section_repin(r: &mut Report, opts: &Opts, cp: &ControlPlane) -> anyhow::Result<()> {
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "app"])?;
    let stage = Stage::start(cp, NODE, &workspace_bin("aether-agent")?)?;
    let (uid, socket) = stage.pod(cp, NS, POD, NODE)?;
    let pin = stage.pins.join(format!("{uid}.sock"));
    let work = stage.work.path().to_owned();
    let mut current = app(&work, "gen-0", &socket)?;
    until("the first app's socket", Duration::from_millis(5), || socket.exists())?;
    let (cluster, health_cluster) = (format!("app_{NS}_{POD}_8080"), format!("health_{NS}_{POD}"));
    let healthz = format!("/healthz/{health_cluster}");
    let healthy = || unix_get_status(&stage.health, &healthz).is_ok_and(|s| s == 200);
    let served_by = |name: &str| stage.served_by(&cluster, name);
    until("Envoy serving gen-0 through the pin", Duration::from_millis(20), || served_by("gen-0") && healthy())
        .with_context(|| stage.agent_log())?;

    let (mut to_pin, mut to_served, mut to_healthy, mut down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 1..=opts.repins {
        let old = inode(&socket).context("the app's socket")?;
        let killed = Instant::now();
        drop(current);
        // A container restart takes seconds: Envoy's health check sees the pod go (503).
        let unhealthy = until("Envoy marking the killed app unhealthy", Duration::from_millis(20), || !healthy())?;
        down.push((unhealthy - killed).as_secs_f64());
        let name = format!("gen-{i}");
        current = app(&work, &name, &socket)?;
        let t0 = until("the new socket's inode", Duration::from_micros(50), || {
            inode(&socket).is_some_and(|ino| ino != old)
        })?;
        let new = inode(&socket).context("the new socket")?;
        let pinned = until("the pin holding the new inode", Duration::from_micros(50), || inode(&pin) == Some(new))
            .with_context(|| stage.agent_log())?;
        let (mut served, mut passed) = (None, None);
        until("Envoy serving the new app and passing its health check", Duration::from_micros(500), || {
            let now = Instant::now();
            if served.is_none() && served_by(&name) {
                served = Some(now);
            }
            if passed.is_none() && healthy() {
                passed = Some(now);
            }
            served.is_some() && passed.is_some()
        })?;
        to_pin.push((pinned - t0).as_secs_f64());
        to_served.push((served.unwrap_or(pinned) - t0).as_secs_f64());
        to_healthy.push((passed.unwrap_or(pinned) - t0).as_secs_f64());
    }
    drop(stage);
    drop(current);

    r.line("### 3b. Re-pin: the app re-creates its socket → the pin → Envoy\n");
    r.line(&format!(
        "The release `aether-agent` with `--pin-dir` (defaults otherwise: `--recheck-seconds` 10, inotify on each \
         pinned pod's volume dir), a real Envoy on its ADS, one pod delivered over its socket through the pin. Each \
         of {} repetitions plays a container restart: the app (`uds-echo`) is killed, Envoy's health check marks the \
         pod unhealthy (after {} median), and a new app re-creates the socket (a new inode at the pod's path). From \
         the first poll (every 50 µs) that sees the new inode: until `stat` of `<pin-dir>/<uid>.sock` shows that \
         inode (inotify event, re-verification with `openat2`, the bind mount); until the send time of the first \
         request through Envoy's listener that the new app answers (one request every ~0.5 ms: Envoy keeps dialing \
         the same pin path, so no xDS push is involved); until the health gateway answers 200 again, which waits \
         for Envoy's next active check (every 2–3 s: 2 s plus up to 50 % jitter). With {} repetitions the p99 is the slowest one.\n",
        opts.repins,
        percentile(&down, 50.0).map_or("n/a".into(), show_secs),
        opts.repins
    ));
    let mut rows = Vec::new();
    for (what, v) in [
        ("the pin holds the new inode", &to_pin),
        ("a request through Envoy reaches the new app", &to_served),
        ("Envoy's health check passes (gateway 200)", &to_healthy),
    ] {
        rows.push(vec![
            what.to_owned(),
            percentile(v, 50.0).map_or("n/a".into(), show_secs),
            percentile(v, 99.0).map_or("n/a".into(), show_secs),
            Spread::of(v).map_or("n/a".into(), |s| format!("{}–{}", show_secs(s.min), show_secs(s.max))),
            v.len().to_string(),
        ]);
    }
    r.add(&md_table(&["new socket (new inode) → ", "p50", "p99", "min–max", "n"], &rows));
    r.line("");
    let (p50, p99) = (percentile(&to_pin, 50.0), percentile(&to_pin, 99.0));
    r.goals.push(Goal {
        goal: "make bench reports the re-pin latency",
        figure: format!(
            "new inode → pin p50 {}, p99 {}; → served through Envoy p50 {}",
            p50.map_or("n/a".into(), show_secs),
            p99.map_or("n/a".into(), show_secs),
            percentile(&to_served, 50.0).map_or("n/a".into(), show_secs)
        ),
        met: Some(p99.is_some()),
        limit: "not measured (no repetition finished)".into(),
    });
    Ok(())
}
