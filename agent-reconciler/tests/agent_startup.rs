//! `aether-agent run` start-up, as an operator meets it: a pods dir that leaves no socket budget is
//! reported loudly and the agent still serves (every pod TCP); a bad flag fails naming the flag.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned()))
}

#[test]
fn a_pods_dir_without_budget_is_reported_at_start_up_and_the_agent_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let admin = free_port();
    let log = dir.path().join("agent.log");
    let mut child = Command::new(assert_cmd::cargo::cargo_bin!("aether-agent"))
        .args(["run", "--node-name", "n1", "--kubelet-pods-dir", "/var/snap/microk8s/common/var/lib/kubelet/pods"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", dir.path().join("xds.sock").display()))
        .arg("--health-socket")
        .arg(dir.path().join("health.sock"))
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        // Any free loopback port: the tests of this file run in parallel (the default is 9092).
        .args(["--debug-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        if let Some(r) = get(admin, "/readyz") {
            break r;
        }
        assert!(child.try_wait().unwrap().is_none(), "agent exited: {}", std::fs::read_to_string(&log).unwrap());
        assert!(Instant::now() < deadline, "agent not up: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(ready.0, 200, "{ready:?}");
    assert!(text.contains("EVERY POD IS DELIVERED OVER TCP"), "{text}");
    assert!(text.contains("budget of -9 bytes"), "the arithmetic is shown: {text}");
}

#[test]
fn a_bad_xds_address_fails_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(assert_cmd::cargo::cargo_bin!("aether-agent"))
        .args(["run", "--node-name", "n1", "--xds-address", "tcp:nonsense", "--admin-addr", "127.0.0.1:0"])
        .args(["--debug-addr", "127.0.0.1:0"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("KUBECONFIG", dir.path().join("none"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--xds-address"), "{err}");
}
