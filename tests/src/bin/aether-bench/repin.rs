//! Section 3b of `make bench`: the re-pin latency (issue 13 item 2, "make bench reports the
//! re-pin latency").
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

use crate::stats::{Spread, md_table, percentile, show_secs};
use crate::{Goal, Opts, Proc, Report, workspace_bin};

const NS: &str = "bench-repin";
const NODE: &str = "bench-repin-node";
const POD: &str = "app-1";
/// How long one step may take before the repetition fails.
const STEP: Duration = Duration::from_secs(30);

/// Lazily unmounts every mount below `dir` when dropped (the agent's pins outlive it: they are
/// mounts). Declared before the processes, so it runs after they are stopped.
struct Unmount(PathBuf);

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

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|u| u.split_whitespace().next() == Some("0")))
        .unwrap_or(false)
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Polls `f` (every `every`) until it is true; the instant it first was.
fn until(what: &str, every: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<Instant> {
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
fn app(work: &Path, name: &str, socket: &Path) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(workspace_bin("uds-echo")?);
    cmd.arg("--socket").arg(socket).args(["--name", name]);
    Proc::spawn(cmd, work.join(format!("{name}.log")), 0)
}

/// The section: `opts.repins` re-creations of the pod's socket.
pub(crate) fn section_repin(r: &mut Report, opts: &Opts, cp: &ControlPlane) -> anyhow::Result<()> {
    ensure!(is_root(), "the re-pin section needs root: the agent mounts each pin (CAP_SYS_ADMIN)");
    let work = tempfile::Builder::new().prefix("aebr").tempdir_in("/tmp")?;
    let _unmount = Unmount(work.path().to_owned());
    let (pods, run, pins) = (work.path().join("pods"), work.path().join("run"), work.path().join("run/pins"));
    std::fs::create_dir_all(&pods)?;
    std::fs::create_dir_all(&run)?;
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "app"])?;
    cp.apply(
        &pod(NS, POD)
            .node(NODE)
            .sa("app")
            .container("app", "registry.example/uds-echo:bench")
            .emptydir("s")
            .annotation_socket("s/app.sock")
            .manifest(),
    )?;
    let uid = cp.kubectl_ok(&["get", "pod", "-n", NS, POD, "-o", "jsonpath={.metadata.uid}"])?;
    let volume = pods.join(&uid).join("volumes/kubernetes.io~empty-dir/s");
    std::fs::create_dir_all(&volume)?;
    let socket = volume.join("app.sock");
    let pin = pins.join(format!("{uid}.sock"));
    let mut current = app(work.path(), "gen-0", &socket)?;
    until("the first app's socket", Duration::from_millis(5), || socket.exists())?;

    let (xds, health) = (run.join("xds.sock"), run.join("health.sock"));
    let agent_admin = free_port();
    let mut cmd = Command::new(workspace_bin("aether-agent")?);
    cmd.arg("run")
        .args(["--node-name", NODE, "--admin-addr", &format!("127.0.0.1:{agent_admin}")])
        .arg("--kubelet-pods-dir")
        .arg(&pods)
        .arg("--pin-dir")
        .arg(&pins)
        .arg("--state-dir")
        .arg(work.path().join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", xds.display()))
        .arg("--health-socket")
        .arg(&health)
        .env("KUBECONFIG", cp.kubeconfig());
    let mut agent = Proc::spawn(cmd, work.path().join("agent.log"), agent_admin)?;
    agent.wait_until("aether-agent (re-pin)", || http_get_status(agent_admin, "/readyz") == Some(200))?;
    let envoy_dir = work.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir)?;
    let envoy = Envoy::builder(&xds, NODE, &envoy_dir).inbound().binary(envoy_bin()?).start()?;
    let (cluster, health_cluster) = (format!("app_{NS}_{POD}_8080"), format!("health_{NS}_{POD}"));
    let healthz = format!("/healthz/{health_cluster}");
    let healthy = || unix_get_status(&health, &healthz).is_ok_and(|s| s == 200);
    let served_by = |name: &str| {
        envoy.via(&cluster, "/repin").is_ok_and(|(status, body)| status == 200 && body.starts_with(&format!("{name} ")))
    };
    until("Envoy serving gen-0 through the pin", Duration::from_millis(20), || served_by("gen-0") && healthy())
        .with_context(|| std::fs::read_to_string(&agent.log).unwrap_or_default())?;

    let (mut to_pin, mut to_served, mut to_healthy, mut down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 1..=opts.repins {
        let old = inode(&socket).context("the app's socket")?;
        let killed = Instant::now();
        drop(current);
        // A container restart takes seconds: Envoy's health check sees the pod go (503).
        let unhealthy = until("Envoy marking the killed app unhealthy", Duration::from_millis(20), || !healthy())?;
        down.push((unhealthy - killed).as_secs_f64());
        let name = format!("gen-{i}");
        current = app(work.path(), &name, &socket)?;
        let t0 = until("the new socket's inode", Duration::from_micros(50), || {
            inode(&socket).is_some_and(|ino| ino != old)
        })?;
        let new = inode(&socket).context("the new socket")?;
        let pinned = until("the pin holding the new inode", Duration::from_micros(50), || inode(&pin) == Some(new))
            .with_context(|| std::fs::read_to_string(&agent.log).unwrap_or_default())?;
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
    drop(envoy);
    drop(agent);
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
