//! Section 6 of `make bench`: what replacing or losing the node's Envoy does to traffic, with the
//! hand-over on and off side by side in one run.
//!
//! The node's two proxy pods are played by two `aether-proxy-launcher` processes sharing a state
//! dir and this host's `/dev/shm`, each running a real Envoy with an LDS listener (from a file,
//! `enable_reuse_port: false`, `tcp_proxy` to a `uds-echo` app on a Unix socket: the shape of an
//! inbound listener of a UDS pod) and the admin bound with `SO_REUSEPORT`, as the chart's. The
//! load is the one `e2e_node` uses (`aether_tests::continuity`: 50 new-connection requests/s, 3
//! keep-alive connections, no retries). Events:
//! - **replacement**: with the hand-over, the new launcher starts, takes the sockets over, then
//!   the old one gets SIGTERM (a surge roll); without it (`--no-hot-restart`), the old one gets
//!   SIGTERM and the new one starts once it is gone (a delete-first roll);
//! - **crash**: `kill -9` of the serving Envoy; its launcher starts a new one in place.
//!
//! The real node's figures (a Service, kube-proxy, the chart) are `e2e_node`'s,
//! `proxy_replacements_under_load_fail_no_request`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aether_tests::continuity::{self, Load, Report as LoadReport};
use aether_tests::{envoy_bin, free_port};
use anyhow::{Context, ensure};

use crate::Report;
use crate::processes::workspace_bin;
use crate::stats::md_table;

/// How long a handed-over Envoy keeps its connections here (the chart's default is 60 s).
const PARENT_SHUTDOWN_S: u64 = 5;

struct Node {
    dir: tempfile::TempDir,
    launcher: PathBuf,
    envoy: PathBuf,
    base_id: u32,
    admin: u16,
    port: u16,
    _app: Killed,
}

/// A child killed (and reaped) on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Launcher {
    child: Killed,
    marker: PathBuf,
}

impl Node {
    fn start() -> anyhow::Result<Node> {
        let dir = tempfile::Builder::new().prefix("aether-bench-continuity-").tempdir()?;
        let app_sock = dir.path().join("app.sock");
        let app = Command::new(workspace_bin("uds-echo")?)
            .args(["--socket", app_sock.to_str().context("path")?, "--name", "app"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let (admin, port) = (free_port(), free_port());
        let lds = dir.path().join("lds.json");
        let listener = serde_json::json!({"resources": [{
            "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
            "name": "inbound_bench_app_8080",
            "enable_reuse_port": false,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "app", "cluster": "app"
                }
            }]}]
        }]});
        std::fs::write(&lds, listener.to_string())?;
        let bootstrap = serde_json::json!({
            "node": {"id": "bench", "cluster": "aether"},
            "admin": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}},
                "socket_options": [{"level": 1, "name": 15, "int_value": 1, "state": "STATE_PREBIND"}]
            },
            "dynamic_resources": {"lds_config": {
                "resource_api_version": "V3", "initial_fetch_timeout": "0s",
                "path_config_source": {"path": lds}
            }},
            "static_resources": {"clusters": [{
                "name": "app", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "app", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"pipe": {"path": app_sock}}}}
                ]}]}
            }]}
        });
        std::fs::write(dir.path().join("envoy.json"), bootstrap.to_string())?;
        Ok(Node {
            launcher: workspace_bin("aether-proxy-launcher")?,
            envoy: envoy_bin()?,
            base_id: 200_000 + std::process::id() % 50_000,
            admin,
            port,
            dir,
            _app: Killed(app),
        })
    }

    fn launch(&self, name: &str, hand_over: bool) -> anyhow::Result<Launcher> {
        let marker = self.dir.path().join(format!("{name}.ready"));
        let _ = std::fs::remove_file(&marker);
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.launcher);
        cmd.arg("run")
            .arg(format!("--state-dir={}", self.dir.path().join("state").display()))
            .arg(format!("--base-id={}", self.base_id))
            .arg(format!("--admin=127.0.0.1:{}", self.admin))
            .arg(format!("--marker={}", marker.display()))
            .arg(format!("--parent-shutdown-seconds={PARENT_SHUTDOWN_S}"))
            .arg("--successor-wait-seconds=0");
        if !hand_over {
            cmd.arg("--no-hot-restart");
        }
        let child = cmd
            .arg("--")
            .arg(&self.envoy)
            .arg("--config-path")
            .arg(self.dir.path().join("envoy.json"))
            .args(["--concurrency", "2", "--log-level", "warn", "--drain-strategy", "immediate"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()?;
        let l = Launcher { child: Killed(child), marker };
        l.wait_serving()?;
        Ok(l)
    }
}

impl Launcher {
    fn wait_serving(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.marker.exists() {
            ensure!(Instant::now() < deadline, "no readiness marker {} after 30 s", self.marker.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn envoy_pid(&self) -> anyhow::Result<String> {
        let out = Command::new("pgrep").args(["-P", &self.child.0.id().to_string()]).output()?;
        let pid = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_owned();
        ensure!(!pid.is_empty(), "no Envoy under the launcher");
        Ok(pid)
    }

    /// SIGTERM, then wait (at most 2 × the parent shutdown + 10 s) for the exit.
    fn stop(mut self) -> anyhow::Result<()> {
        let id = self.child.0.id().to_string();
        ensure!(Command::new("kill").args(["-TERM", &id]).status()?.success(), "kill -TERM {id}");
        let deadline = Instant::now() + Duration::from_secs(2 * PARENT_SHUTDOWN_S + 10);
        while self.child.0.try_wait()?.is_none() {
            ensure!(Instant::now() < deadline, "the launcher did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// Runs `event` under the load (1 s before, 1 s after), returning what the load saw.
fn under_load(port: u16, event: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<LoadReport> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let load = Load::field(format!("127.0.0.1:{port}").parse()?, "/bench", "app");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = rt.spawn(async move {
        continuity::run(&load, async {
            let _ = rx.await;
        })
        .await
    });
    std::thread::sleep(Duration::from_secs(1));
    let done = event();
    std::thread::sleep(Duration::from_secs(1));
    let _ = tx.send(());
    let report = rt.block_on(running)?;
    done?;
    Ok(report)
}

fn cell(r: &LoadReport) -> String {
    let cut = r.keepalive.iter().filter(|k| k.cut.is_some()).count();
    let idle: u64 = r.keepalive.iter().map(|k| k.closed_idle).sum();
    format!(
        "{} of {} failed; gap {:.2} s; keep-alive: a request lost on {cut} of {}, {idle} connections closed while idle",
        r.failed(),
        r.requests.len(),
        r.longest_gap().as_secs_f64(),
        r.keepalive.len()
    )
}

/// One mode: a replacement, then a crash of the replacement's Envoy.
fn mode(node: &Node, hand_over: bool) -> anyhow::Result<(LoadReport, LoadReport)> {
    let tag = if hand_over { "on" } else { "off" };
    let old = node.launch(&format!("{tag}-old"), hand_over)?;
    let mut new = None;
    let replaced = under_load(node.port, || {
        if hand_over {
            new = Some(node.launch(&format!("{tag}-new"), true)?);
            old.stop()
        } else {
            old.stop()?;
            new = Some(node.launch(&format!("{tag}-new"), false)?);
            Ok(())
        }
    })?;
    let new = new.context("no new launcher")?;
    // Let the handed-over Envoy finish draining before the crash.
    std::thread::sleep(Duration::from_secs(PARENT_SHUTDOWN_S + 1));
    let pid = new.envoy_pid()?;
    let crashed = under_load(node.port, || {
        ensure!(Command::new("kill").args(["-9", &pid]).status()?.success(), "kill -9 {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while new.envoy_pid().map(|p| p == pid).unwrap_or(true) || !new.marker.exists() {
            ensure!(Instant::now() < deadline, "no new Envoy 30 s after the crash");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    })?;
    new.stop()?;
    Ok((replaced, crashed))
}

/// Section 6.
pub fn section(r: &mut Report) -> anyhow::Result<()> {
    let node = Node::start()?;
    let (on_replace, on_crash) = mode(&node, true).context("hand-over on")?;
    let (off_replace, off_crash) = mode(&node, false).context("hand-over off")?;
    let _ = std::fs::remove_file(aether_proxy_launcher::shm::segment(Path::new("/dev/shm"), node.base_id));
    r.line("## 6. Node proxy continuity: replacement and crash, hand-over on and off\n");
    r.line(&format!(
        "Two `aether-proxy-launcher` processes as a node's two proxy pods, real Envoys with an LDS `tcp_proxy` \
         listener to a `uds-echo` app on a Unix socket; the field load (50 new-connection requests/s, 3 keep-alive \
         connections, 2 s timeout, no retries), 1 s before and after each event. A handed-over Envoy keeps its \
         connections {PARENT_SHUTDOWN_S} s here (the chart: `proxy.handOver.parentShutdownSeconds`, 60) and the \
         replacement waits for the old launcher to exit, so with the hand-over the keep-alive connections end \
         inside the event, at the end of that drain; without it, at once. The real node's figures are `e2e_node`'s (docs/upgrade.md, \"Replacing the node proxy\").\n"
    ));
    r.line(&md_table(
        &["event", "hand-over on", "hand-over off (`--no-hot-restart`)"],
        &[
            vec!["replacement (surge roll / delete-first roll)".into(), cell(&on_replace), cell(&off_replace)],
            vec!["`kill -9` of Envoy (started again in place)".into(), cell(&on_crash), cell(&off_crash)],
        ],
    ));
    r.line("");
    Ok(())
}
