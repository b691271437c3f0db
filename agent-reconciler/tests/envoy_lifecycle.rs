//! The agent and a real Envoy over their lifetimes (Envoy from `tests/harness/install-envoy.sh`,
//! started by the workspace's one launcher, `aether_fixtures::envoy`, with the chart's bootstrap):
//!
//! - ADS streams are counted from Envoy's first request until it is killed (tracker and the
//!   `aether_xds_connected_streams` gauge), and `/readyz` reports it without changing its code;
//! - `aether-agent run --readyz-requires-envoy`: `/readyz` is 503 until Envoy ACKs, and again
//!   once Envoy is gone;
//! - SIGTERM: the agent removes its xDS socket always, and the health-gateway socket only when
//!   Envoy went away too.
//!
//! Waits are bounded ([`WAIT`]) and poll for the awaited state; no sleep stands in for one.

mod support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use aether_agent_reconciler::admin::{self, AdminState, EnvoyView};
use aether_agent_reconciler::metrics::Metrics;
use aether_agent_reconciler::status::Status;
use aether_agent_reconciler::xds::{BuildOptions, Drained, Snapshot, encode};
use aether_fixtures::envoy::{Envoy, WAIT};
use aether_fixtures::process;
use support::ads::{Fixture, gateway};
use tokio::sync::watch;

fn http() -> reqwest::Client {
    support::client_builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap()
}

/// GET `http://127.0.0.1:<port><path>`: status and body, or `None` if nothing answers.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let resp = http().get(format!("http://127.0.0.1:{port}{path}")).send().await.ok()?;
    let code = resp.status().as_u16();
    Some((code, resp.text().await.ok()?))
}

/// Polls `f` until it returns `Some`, for at most [`WAIT`]; panics with `what` and `context()`.
async fn until<T, Fut: Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> Fut,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}\n{}", context());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The CDS and LDS versions an agent serves for an empty state dir with this health socket.
/// The CDS, LDS and ECDS versions of an empty node with a health gateway on `health_socket`.
fn empty_versions(health_socket: &Path) -> (String, String, String) {
    let opts = BuildOptions { health_socket: Some(health_socket.to_str().unwrap().to_owned()), ..Default::default() };
    let r = encode(&Snapshot::default(), &opts);
    (r.clusters.version, r.listeners.version, r.extension_configs.version)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `aether-agent run` on `<dir>/xds.sock` and `<dir>/health.sock` with an empty state dir and
/// no API server; killed (and reaped) on drop.
struct Agent {
    child: Child,
    admin: u16,
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Starts it with `extra` flags and waits until its admin port answers.
    async fn start(dir: &Path, extra: &[&str]) -> Agent {
        let admin = free_port();
        let log = dir.join("agent.log");
        // A killed test process takes the agent with it.
        let child = process::killed_with_parent(assert_cmd::cargo::cargo_bin!("aether-agent"))
            .args(["run", "--node-name", "n1"])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--xds-address")
            .arg(format!("unix://{}", dir.join("xds.sock").display()))
            .arg("--health-socket")
            .arg(dir.join("health.sock"))
            .args(["--admin-addr", &format!("127.0.0.1:{admin}"), "--xds-debounce-ms", "0"])
            // Any free loopback port: tests run in parallel (the default is 127.0.0.1:9092).
            .args(["--debug-addr", "127.0.0.1:0"])
            .args(extra)
            .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
            .env("RUST_LOG", "info")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("AETHER_READYZ_REQUIRES_ENVOY")
            .env_remove("AETHER_SHUTDOWN_WAIT_SECONDS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn aether-agent");
        let mut agent = Agent { child, admin, log };
        until("the agent's admin port", || get(admin, "/readyz"), || agent.log_text()).await;
        assert!(agent.child.try_wait().unwrap().is_none(), "agent exited: {}", agent.log_text());
        agent
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn readyz(&self) -> (u16, String) {
        get(self.admin, "/readyz").await.unwrap_or_else(|| panic!("no /readyz answer: {}", self.log_text()))
    }

    /// SIGTERM, then waits for the exit; returns how long it took.
    async fn terminate(&mut self) -> Duration {
        let started = Instant::now();
        process::signal(self.child.id(), "TERM").unwrap();
        let status = process::wait_exit(&mut self.child, "aether-agent", WAIT).unwrap();
        assert!(status.success(), "agent exit: {status}\n{}", self.log_text());
        started.elapsed()
    }
}

/// Starts Envoy for node `node` on `<dir>/xds.sock`.
fn start_envoy(dir: &Path, node: &str) -> Envoy {
    Envoy::builder(dir.join("xds.sock"), node, dir).start().unwrap()
}

/// Starts Envoy for node `node` on `dir` and waits until it has applied the initial CDS and LDS.
fn envoy_ready(dir: &Path, node: &str) -> Envoy {
    let mut envoy = start_envoy(dir, node);
    envoy.wait_ready().unwrap();
    envoy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_streams_count_envoy_from_its_first_request_until_it_is_killed() {
    let metrics = Arc::new(Metrics::new());
    let mut f = Fixture::builder("node-s")
        .options(|dir| BuildOptions {
            health_socket: Some(dir.join("health.sock").to_str().unwrap().to_owned()),
            ..Default::default()
        })
        .debounce(Duration::ZERO)
        .metrics(metrics.xds.clone())
        .without_envoy()
        .snapshot(Snapshot::default())
        .await;
    let (health, tracker, resources) = (f.health_socket(), f.tracker().clone(), f.resources.clone());
    // The admin port as `run` wires it, without --readyz-requires-envoy.
    let (_status_tx, status_rx) = watch::channel(Status::default());
    let envoy_view = EnvoyView { tracker: tracker.clone(), resources: resources.clone(), required: false };
    let app = admin::router(
        AdminState::new(Arc::new(AtomicBool::new(true)), status_rx)
            .with_metrics(metrics.clone())
            .with_envoy(envoy_view),
    );
    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_port = admin_listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(admin_listener, app).await });
    let gauge = || async {
        let (_, text) = get(admin_port, "/metrics").await.expect("/metrics");
        text.lines().find_map(|l| l.strip_prefix("aether_xds_connected_streams ")).map(str::to_owned)
    };

    assert_eq!(tracker.connected_total(), 0);
    assert_eq!(gauge().await.as_deref(), Some("0"));
    let (code, body) = get(admin_port, "/readyz").await.unwrap();
    eprintln!("/readyz before Envoy: {code}\n{body}");
    assert_eq!(code, 200, "without the flag Envoy does not gate readiness: {body}");
    assert!(body.ends_with("envoy: not connected\n"), "{body}");

    f.start_envoy().await;
    assert!(tracker.wait_for(WAIT, |t| t.connected("node-s") == 1).await, "no stream:\n{}", f.envoy_log());
    assert_eq!(tracker.connected_total(), 1);
    assert_eq!(gauge().await.as_deref(), Some("1"));
    let (cds, lds, ecds) = empty_versions(&health);
    let want = format!(
        "envoy: 1 stream(s) connected (node node-s); CDS version {cds} acked; LDS version {lds} acked; ECDS version {ecds} acked\n"
    );
    let body = until(
        "/readyz to report the ACKs",
        || async { get(admin_port, "/readyz").await.filter(|(_, b)| b.ends_with(&want)) },
        || f.envoy_log(),
    )
    .await;
    eprintln!("/readyz with Envoy: {}\n{}", body.0, body.1);
    assert_eq!(body.0, 200);

    f.envoy_mut().kill();
    assert!(
        tracker.wait_for(WAIT, |t| t.connected_total() == 0).await,
        "stream still counted after Envoy died: {:?}",
        tracker.streams()
    );
    assert_eq!(gauge().await.as_deref(), Some("0"));
    let (code, body) = get(admin_port, "/readyz").await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("envoy: not connected\n"), "{body}");
    // The node's history stays: what it ACKed last.
    assert_eq!(tracker.nodes(), vec!["node-s".to_owned()]);

    let (_, drained) = f.stop_server().await;
    assert_eq!(drained, Drained { left_open: 0 });
    assert!(!f.path("xds.sock").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_requires_envoy_is_503_until_envoy_acks_and_again_once_it_is_gone() {
    let dir = tempfile::Builder::new().prefix("alc").tempdir().unwrap();
    let agent = Agent::start(dir.path(), &["--readyz-requires-envoy"]).await;
    let (code, body) = agent.readyz().await;
    eprintln!("/readyz before Envoy: {code}\n{body}");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("envoy: not connected\n"), "{body}");

    let mut envoy = envoy_ready(dir.path(), "node-r");
    let (code, body) = until(
        "/readyz 200 once Envoy ACKed",
        || async { get(agent.admin, "/readyz").await.filter(|(c, _)| *c == 200) },
        || format!("{}\n{}", agent.log_text(), envoy.log_tail()),
    )
    .await;
    eprintln!("/readyz after the ACKs: {code}\n{body}");
    let (cds, lds, ecds) = empty_versions(&dir.path().join("health.sock"));
    assert!(
        body.contains(&format!(
            "envoy: 1 stream(s) connected (node node-r); CDS version {cds} acked; LDS version {lds} acked; ECDS version {ecds} acked\n"
        )),
        "{body}"
    );

    envoy.kill();
    let (code, body) = until(
        "/readyz 503 once Envoy is gone",
        || async { get(agent.admin, "/readyz").await.filter(|(c, _)| *c == 503) },
        || agent.log_text(),
    )
    .await;
    eprintln!("/readyz after Envoy was killed: {code}\n{body}");
    assert!(body.contains("envoy: not connected\n"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_after_envoy_goes_away_leaves_no_socket_files() {
    let dir = tempfile::Builder::new().prefix("alc").tempdir().unwrap();
    let (xds, health) = (dir.path().join("xds.sock"), dir.path().join("health.sock"));
    let mut agent = Agent::start(dir.path(), &["--shutdown-wait-seconds", "10"]).await;
    let mut envoy = envoy_ready(dir.path(), "node-t");
    until("Envoy to bind the health socket", || async { gateway(&health, "/x").await }, || envoy.log_tail()).await;

    // As at pod deletion: Envoy and the agent are both told to stop.
    envoy.terminate().unwrap();
    agent.terminate().await;
    envoy.wait_exit().unwrap();
    let log = agent.log_text();
    assert!(!xds.exists(), "xDS socket left behind:\n{log}");
    assert!(health.symlink_metadata().is_err(), "health socket left behind:\n{log}");
    assert!(log.contains("xDS socket removed"), "{log}");
    assert!(log.contains("health socket removed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_envoy_still_connected_keeps_the_health_socket_envoy_serves() {
    let dir = tempfile::Builder::new().prefix("alc").tempdir().unwrap();
    let (xds, health) = (dir.path().join("xds.sock"), dir.path().join("health.sock"));
    let mut agent = Agent::start(dir.path(), &["--shutdown-wait-seconds", "1"]).await;
    let mut envoy = envoy_ready(dir.path(), "node-u");
    until("Envoy to bind the health socket", || async { gateway(&health, "/x").await }, || envoy.log_tail()).await;

    // Only the agent container restarts: Envoy stays connected through the whole wait.
    let took = agent.terminate().await;
    let log = agent.log_text();
    assert!(took >= Duration::from_secs(1), "the agent waited for Envoy's stream ({took:?}):\n{log}");
    assert!(!xds.exists(), "xDS socket left behind:\n{log}");
    assert!(log.contains("health socket left: an Envoy is still connected"), "{log}");
    assert!(envoy.try_wait().unwrap().is_none(), "Envoy keeps running:\n{}", envoy.log_tail());
    // Envoy still answers on the health listener (404: no such health cluster).
    assert_eq!(gateway(&health, "/healthz/none").await, Some(404), "{}", envoy.log_tail());
}

/// Envoy's count of listeners removed by LDS since it started (`listener_manager.listener_removed`).
fn listeners_removed(envoy: &Envoy) -> u64 {
    let (_, body) = envoy.admin_get("/stats?filter=^listener_manager.listener_removed$").unwrap();
    let value = body.trim().rsplit(": ").next().unwrap_or_default();
    value.parse().unwrap_or_else(|_| panic!("listener_removed stat: {body:?}"))
}

/// An agent killed (SIGKILL) and started again with the API server unreachable (here: no client
/// configuration at all) serves Envoy, from its state dir alone, the inbound listener it served
/// before: Envoy removes no listener, and a client in the pod's netns is answered before and after.
/// The first agent learns the pod's netns (from a CNI record, at its first re-check) and keeps it
/// with the pod's record; the record is gone before the second starts, so only the state dir has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_without_the_api_server_offers_envoy_every_listener_it_served() {
    use aether_agent_reconciler::store::{StateStore, StoredPodRef};
    let pod_netns = support::netns_with_lo("rst");
    // Short paths: the socket value's budget is 107 - len(pods dir) - 70 bytes.
    let dir = tempfile::Builder::new().prefix("ar").tempdir_in("/tmp").unwrap();
    let pods = dir.path().join("p");
    let uid = support::UID;
    let socket = pods.join(format!("{uid}/volumes/kubernetes.io~empty-dir/sockets/a.sock"));
    let _app = support::start_echo(&socket, "app-a");
    // What a previous agent kept of the pod before any netns was known.
    let record = support::pod_with_socket("shop", "a", uid, "a", "sockets/a.sock");
    let store = StateStore::open(dir.path().join("state")).unwrap();
    store.save_pod(uid, &StoredPodRef { record: &record, netns: None }).unwrap();
    let cni = dir.path().join("cni");
    std::fs::create_dir_all(&cni).unwrap();
    let cni_record = cni.join(format!("{uid}.json"));
    std::fs::write(&cni_record, serde_json::json!({ "netns": pod_netns.path() }).to_string()).unwrap();
    let pods_flag = pods.display().to_string();
    let cni_flag = cni.display().to_string();
    let flags = |recheck: &'static str| {
        vec![
            "--kubelet-pods-dir".to_owned(),
            pods_flag.clone(),
            "--cri-endpoint=".to_owned(),
            "--cni-records-dir".to_owned(),
            cni_flag.clone(),
            "--recheck-seconds".to_owned(),
            recheck.to_owned(),
            "--readyz-requires-envoy".to_owned(),
        ]
    };
    let first_flags = flags("1");
    let first = Agent::start(dir.path(), &first_flags.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let envoy = start_envoy(dir.path(), "node-rst");
    let served = until(
        "the inbound listener in the pod's netns",
        || async { pod_netns.get(8080, "/before").ok() },
        || format!("{}\n{}", first.log_text(), envoy.log_tail()),
    )
    .await;
    assert_eq!(served, "app-a HTTP/1.1 GET /before");
    let removed = listeners_removed(&envoy);

    std::fs::remove_file(&cni_record).unwrap();
    drop(first); // SIGKILL: no shutdown path runs
    let second_flags = flags("3600");
    let second = Agent::start(dir.path(), &second_flags.iter().map(String::as_str).collect::<Vec<_>>()).await;
    until(
        "Envoy to apply the restarted agent's CDS and LDS",
        || async { second.readyz().await.0.eq(&200).then_some(()) },
        || format!("{}\n{}", second.log_text(), envoy.log_tail()),
    )
    .await;
    let log = second.log_text();
    assert!(log.contains("netns_replayed=1"), "the pod's netns came from the state dir:\n{log}");
    assert_eq!(listeners_removed(&envoy), removed, "no listener removed across the restart:\n{}", envoy.log_tail());
    assert_eq!(pod_netns.get(8080, "/after").as_deref(), Ok("app-a HTTP/1.1 GET /after"));
}
