//! Restarts and replacements: `app_container_restart_recovers_without_an_agent_restart`,
//! `agent_restarts_under_load_fail_no_request`, `proxy_replacements_under_load_fail_no_request`,
//! `a_changed_hand_over_dir_costs_one_cold_start_and_nothing_after` and
//! `replaced_node_pod_resumes_delivery`.
//!
//! What they prove: an app restart (new socket inode) and a replaced node pod are followed; under
//! steady load through a Service to a UDS-only pod (`aether_tests::continuity`, no retries), agent
//! restarts and planned replacements of the node's Envoy fail no request, a crashed Envoy is
//! started again in place by its launcher, the suite sees a gap when there is one (the Envoy
//! container killed, a rollout with the hand-over off), and a proxy pod beside an Envoy outside
//! the hand-over stands by instead of binding beside it: one cold start's gap, nothing refused
//! after.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use aether_fixtures::echo_app;
use aether_tests::continuity::{self, Load, Report};
use aether_tests::{eventually, http_get};
use anyhow::{Context, ensure};
use serde_json::Value;

use crate::env::{
    AGENT_ADMIN, Env, NS, PINS, WAIT, active_listener_netns, check_release_settled, envoy_admin, envoy_stats, pod_name,
    restarts, stats_changes, uid,
};

/// A file's status-change time (set when the file is created).
fn ctime(m: &std::fs::Metadata) -> std::time::SystemTime {
    use std::os::unix::fs::MetadataExt;
    let secs = u64::try_from(m.ctime()).unwrap_or(0);
    let nanos = u32::try_from(m.ctime_nsec()).unwrap_or(0);
    std::time::UNIX_EPOCH + Duration::new(secs, nanos)
}

pub(crate) fn app_container_restart_recovers_without_an_agent_restart(env: &Env) -> anyhow::Result<()> {
    let before = env.pod_json("default", "web")?;
    let node_before = env.node_pod()?;
    let id = container_id(&before, "app")?;
    let path = env.socket_path(&uid(&before)?, "s", "app.sock");
    // A re-created socket is a new file: its ctime is after the kill. (Its inode number may be
    // the old one: the file system reuses a freed inode number at once.)
    let killed_at = std::time::SystemTime::now();
    env.node.kill_container(&id)?;
    eventually("web's app container restarted", WAIT, || {
        Ok(restarts(&env.pod_json("default", "web")?).iter().any(|(n, r)| n == "app" && *r >= 1))
    })?;
    eventually("the app to re-create its socket", WAIT, || {
        Ok(std::fs::symlink_metadata(&path).is_ok_and(|m| ctime(&m) > killed_at))
    })?;
    // The new socket is a new inode: the agent re-pins it.
    env.wait_pinned("app_default_web_8080", &uid(&before)?, &path)?;
    eventually("health gateway 200 again", WAIT, || Ok(env.health("health_default_web")? == 200))?;
    let node_after = env.node_pod()?;
    ensure!(uid(&node_after)? == uid(&node_before)?, "the node pod was replaced");
    ensure!(restarts(&node_after) == restarts(&node_before), "node pod restarts changed: {:?}", restarts(&node_after));
    Ok(())
}

/// Runs `event` while [`continuity::run`] keeps the field load on `target` (2 s before it, 3 s
/// after it returns), and returns what the load saw.
pub(crate) fn under_load(
    target: SocketAddr,
    expect: &str,
    event: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Report> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let load = Load::field(target, "/continuity", expect);
    std::thread::scope(|s| {
        let running = s.spawn(move || -> anyhow::Result<Report> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            Ok(rt.block_on(continuity::run(&load, async {
                let _ = stop_rx.await;
            })))
        });
        std::thread::sleep(Duration::from_secs(2));
        let done = event();
        std::thread::sleep(Duration::from_secs(3));
        let _ = stop_tx.send(());
        let report = running.join().map_err(|_| anyhow::anyhow!("the load thread panicked"))??;
        done?;
        Ok(report)
    })
}

/// The container ID of container `name` in `pod`, as its status gives it (`<runtime>://<id>`).
fn container_id(pod: &Value, name: &str) -> anyhow::Result<String> {
    let statuses = pod["status"]["containerStatuses"].as_array().context("no containerStatuses")?;
    let c = statuses.iter().find(|c| c["name"] == name).with_context(|| format!("no container {name}"))?;
    let id = c["containerID"].as_str().context("no containerID")?;
    Ok(id.to_owned())
}

/// The agent's `process_start_time_seconds` on its admin port (host network): which process answers.
fn agent_started_at() -> Option<String> {
    let (_, body) = http_get(AGENT_ADMIN, "/metrics", &[]).ok()?;
    body.lines().find(|l| l.starts_with("process_start_time_seconds ")).map(str::to_owned)
}

/// Waits until an agent process other than the one that started at `before` answers `/readyz` 200
/// (Envoy has applied its CDS and LDS): the container was restarted in place.
fn wait_new_agent_ready(before: &Option<String>) -> anyhow::Result<()> {
    eventually("a restarted agent, ready (Envoy ACKed it)", WAIT, || {
        let now = agent_started_at();
        Ok(now.is_some() && now != *before && http_get(AGENT_ADMIN, "/readyz", &[]).map(|(c, _)| c)? == 200)
    })
}

/// Stops (SIGSTOP) the real node's kube-apiserver, and continues it (SIGCONT) when dropped, on
/// every exit path: the API server is unreachable (connections hang) while this lives.
struct FrozenApiServer(String);

impl FrozenApiServer {
    fn freeze(env: &Env) -> anyhow::Result<FrozenApiServer> {
        let pid = std::fs::read_to_string(env.node.dir().join("cp/apiserver.pid")).context("apiserver.pid")?;
        let pid = pid.trim().to_owned();
        let ok = std::process::Command::new("kill").args(["-STOP", &pid]).status()?.success();
        ensure!(ok, "kill -STOP {pid}");
        Ok(FrozenApiServer(pid))
    }
}

impl Drop for FrozenApiServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

/// Envoy's `listener_manager.listener_removed`: listeners LDS removed since Envoy started.
fn envoy_listeners_removed() -> anyhow::Result<u64> {
    let (_, body) = envoy_admin("/stats?filter=^listener_manager.listener_removed$")?;
    let value = body.trim().rsplit(": ").next().unwrap_or_default();
    value.parse().with_context(|| format!("listener_removed stat: {body:?}"))
}

/// Agent restarts never touch the data plane (steady load from the host through Service `cont` to
/// a UDS-only pod: 50 requests/s each on a new connection plus 3 keep-alive connections, no
/// retries; a refused, reset, timed-out or wrong-responder request fails). The agent runs in its
/// own DaemonSet (aether-node), Envoy in another (aether-proxy):
/// - the agent container killed; the agent pod deleted (a new pod, empty state dir); a `helm
///   upgrade` that changes only the agent (a roll of aether-node), and one back: nothing refused
///   or reset, no keep-alive connection cut, Envoy's pod untouched and no listener removed;
/// - the suite sees a gap when there is one: the Envoy container killed fails requests;
/// - last (kube-proxy lags after an API-server outage), the API server stopped, then the agent
///   container killed while it is down (the agent replays its state dir, netns included): the
///   same as the first events.
pub(crate) fn agent_restarts_under_load_fail_no_request(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("cont").annotated().manifest())?;
    env.wait_pod_ready("default", "cont")?;
    eventually("Envoy's inbound_default_cont_8080 listener is active", WAIT, || {
        Ok(active_listener_netns("inbound_default_cont_8080")?.is_some())
    })?;
    let target = env.service_target("cont", 8080)?;
    let expect = "cont over unix:/s/app.sock";
    eventually("the Service answers from the host", WAIT, || {
        let report = under_load_quick(target, expect)?;
        Ok(report.failed() == 0)
    })?;
    let proxy_before = env.proxy_pod()?;
    let removed_before = envoy_listeners_removed()?;
    let pins_before = pins()?;

    let killed_agent = under_load(target, expect, || {
        let before = agent_started_at();
        env.node.kill_container(&container_id(&env.node_pod()?, "aether-agent")?)?;
        wait_new_agent_ready(&before)
    })?;
    println!("agent container killed: {}", killed_agent.summary());

    let deleted_agent_pod = under_load(target, expect, || {
        let before = agent_started_at();
        let old = env.node_pod()?;
        env.kube().ok(&["delete", "pod", "-n", NS, pod_name(&old), "--wait=false"])?;
        wait_new_agent_ready(&before)?;
        let new = env.node_pod()?;
        ensure!(uid(&new)? != uid(&old)?, "the agent pod was not replaced");
        Ok(())
    })?;
    println!("agent pod deleted: {}", deleted_agent_pod.summary());
    // The leaving agent kept the pins for Envoy (its DaemonSet stays) and the new one adopted them.
    ensure!(
        pins()? == pins_before,
        "pins changed across the agent pod's replacement: {:?} -> {:?}",
        pins_before,
        pins()?
    );

    let upgraded: Vec<(&str, Report)> =
        [("helm upgrade changing only the agent", &["agent.recheckSeconds=9"][..]), ("helm upgrade back", &[][..])]
            .into_iter()
            .map(|(event, sets)| {
                let r = under_load(target, expect, || {
                    let before = agent_started_at();
                    env.helm_aether("upgrade", sets)?;
                    wait_new_agent_ready(&before)
                })?;
                println!("{event}: {}", r.summary());
                Ok((event, r))
            })
            .collect::<anyhow::Result<_>>()?;

    let proxy_after = env.proxy_pod()?;
    let removed_after = envoy_listeners_removed()?;
    let envoy_log = env.kube().ok(&["logs", "-n", NS, pod_name(&proxy_after)])?;
    let lds: Vec<&str> =
        envoy_log.lines().filter(|l| l.contains("lds:") || l.contains("error adding listener")).collect();
    println!("Envoy's log lines on listeners (since its start):\n{}", lds.join("\n"));
    println!(
        "across the agent events: Envoy's pod {} -> {}, restarts {:?} -> {:?}, listener_manager.listener_removed {removed_before} -> {removed_after}",
        uid(&proxy_before)?,
        uid(&proxy_after)?,
        restarts(&proxy_before),
        restarts(&proxy_after)
    );
    ensure!(uid(&proxy_after)? == uid(&proxy_before)?, "an agent event replaced Envoy's pod");
    ensure!(
        restarts(&proxy_after) == restarts(&proxy_before),
        "an agent event restarted Envoy: {:?}",
        restarts(&proxy_after)
    );
    ensure!(
        removed_after == removed_before,
        "Envoy removed {} listener(s) across agent restarts",
        removed_after - removed_before
    );

    let killed_envoy = under_load(target, expect, || {
        env.node.kill_container(&container_id(&env.proxy_pod()?, "envoy")?)?;
        eventually("Envoy back, with the inbound listener", WAIT, || {
            Ok(active_listener_netns("inbound_default_cont_8080").ok().flatten().is_some())
        })
    })?;
    println!("envoy container killed (the suite must see this gap): {}", killed_envoy.summary());

    let agent_id = container_id(&env.node_pod()?, "aether-agent")?;
    let removed_before = envoy_listeners_removed()?;
    let api_down = under_load(target, expect, || {
        let frozen = FrozenApiServer::freeze(env)?;
        std::thread::sleep(Duration::from_secs(2));
        let before = agent_started_at();
        env.node.kill_container(&agent_id)?;
        wait_new_agent_ready(&before)?;
        std::thread::sleep(Duration::from_secs(5));
        drop(frozen);
        Ok(())
    })?;
    println!("API server stopped, agent container killed while it is down: {}", api_down.summary());
    let removed_after = envoy_listeners_removed()?;
    println!("across the API-server event: listener_manager.listener_removed {removed_before} -> {removed_after}");
    ensure!(
        removed_after == removed_before,
        "Envoy removed {} listener(s) with the API server down",
        removed_after - removed_before
    );

    // A withdrawn or restarted listener shows as refused or reset requests and cut keep-alive
    // connections (the Envoy kill above: all refused): none may happen in any agent event, and no
    // request may time out either (continuity::check_planned).
    let agent_events: Vec<(&str, &Report)> =
        [("agent killed", &killed_agent), ("agent pod deleted", &deleted_agent_pod)]
            .into_iter()
            .chain(upgraded.iter().map(|(e, r)| (*e, r)))
            .chain([("API server down, agent killed", &api_down)])
            .collect();
    for (event, r) in &agent_events {
        ensure!(r.keepalive.iter().all(|k| k.cut.is_none()), "{event}: {}", r.summary());
    }
    continuity::check_planned(&agent_events)?;
    ensure!(killed_envoy.failed() > 0, "an Envoy restart must show as failed requests: {}", killed_envoy.summary());
    println!("kubectl get ds,pods -n {NS} -o wide:\n{}", env.kube().ok(&["get", "ds,pods", "-n", NS, "-o", "wide"])?);
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "cont", "--wait=true"])?;
    Ok(())
}

/// `kubectl rollout status` of the proxy DaemonSet: returns once every node runs an updated, Ready
/// proxy pod.
pub(crate) fn proxy_rollout_done(env: &Env) -> anyhow::Result<()> {
    env.kube().ok(&["rollout", "status", "-n", NS, "daemonset/aether-proxy", "--timeout=300s"]).map(|_| ())
}

/// The PID (host namespace) of the newest Envoy process the proxy launcher started.
fn node_envoy_pid() -> anyhow::Result<String> {
    let out = std::process::Command::new("pgrep").args(["-n", "-f", "config-path /etc/envoy/envoy.yaml"]).output()?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    ensure!(!pid.is_empty(), "no Envoy process on the node");
    Ok(pid)
}

/// The launcher's log lines of the proxy pod `pod` (its own, not Envoy's).
pub(crate) fn launcher_lines(env: &Env, pod: &Value) -> anyhow::Result<Vec<String>> {
    let log = env.kube().ok(&["logs", "-n", NS, pod_name(pod), "-c", "envoy"])?;
    Ok(log.lines().filter(|l| l.contains("aether_proxy_launcher")).map(str::to_owned).collect())
}

/// Planned replacements of the node's Envoy hand its listening sockets over (the load of
/// [`agent_restarts_under_load_fail_no_request`]: a UDS-only pod through its Service, no client
/// retries):
/// - a `helm upgrade` that changes only the proxy, to a privileged Envoy container (what releases
///   up to 0.10.0 ran), and one that changes the agent and the proxy (what every release does),
///   back to the chart's Envoy with four capabilities: a hand-over each way between the two;
/// - three `kubectl rollout restart`s in a row, each started when the previous `rollout status`
///   returned (the second and third wait for the generation still draining);
/// - the proxy pod deleted (its launcher keeps Envoy serving until the replacement took over).
///
/// Crashes are measured too: the Envoy process killed twice within a minute is started again in
/// place by the launcher (no container restart), each gap under 5 s.
///
/// Each: 0 failed requests, no request lost on a keep-alive connection: the app is relayed as
/// HTTP (`endpoint.aether.io/inbound-proxy: http`), so the old Envoy ends each keep-alive
/// connection between requests with `Connection: close` once it drains, and the client goes on
/// over a new connection to the new Envoy (every client must see that announcement, also on a
/// window watched until the old pod is gone); the new pod's launcher says it took the sockets
/// over, pins unchanged, no proxy container restarted. Then the suite shows it sees a gap: with `proxy.handOver.enabled=false` the same
/// rollout fails requests; the way back on is a delete-first roll, measured.
pub(crate) fn proxy_replacements_under_load_fail_no_request(env: &Env) -> anyhow::Result<()> {
    let (target, expect) = served_echo_app(env, "cont", "http")?;
    let expect = expect.as_str();
    let pins_before = pins()?;
    let restart = || env.kube().ok(&["rollout", "restart", "-n", NS, "daemonset/aether-proxy"]).map(|_| ());
    let mut planned: Vec<(String, Report)> = Vec::new();
    let mut measure = |event: &str, f: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<()> {
        let before = env.proxy_pod()?;
        let r = under_load(target, expect, f)?;
        let after = env.proxy_pod()?;
        println!("{event}: {}", r.summary());
        ensure!(uid(&after)? != uid(&before)?, "{event}: the proxy pod was not replaced");
        let took = launcher_lines(env, &after)?;
        ensure!(
            took.iter().any(|l| l.contains("took the listening sockets over from epoch")),
            "{event}: the new Envoy did not hot restart from the old one; its launcher said:\n{}",
            took.join("\n")
        );
        ensure!(restarts(&after).iter().all(|(_, n)| *n == 0), "{event}: {:?}", restarts(&after));
        planned.push((event.to_owned(), r));
        Ok(())
    };
    measure("helm upgrade changing only the proxy, to a privileged Envoy", &|| {
        env.helm_aether("upgrade", &["proxy.logLevel=warning", "proxy.securityContext.privileged=true"])?;
        proxy_rollout_done(env)
    })?;
    measure("helm upgrade changing the agent and the proxy, back to Envoy's four capabilities", &|| {
        env.helm_aether("upgrade", &["proxy.logLevel=info", "agent.recheckSeconds=9"])?;
        proxy_rollout_done(env)
    })?;
    for n in 1..=3 {
        measure(&format!("kubectl rollout restart {n} of 3 in a row"), &|| {
            restart()?;
            proxy_rollout_done(env)
        })?;
    }
    measure("proxy pod deleted", &|| {
        let old = env.proxy_pod()?;
        env.kube().ok(&["delete", "pod", "-n", NS, pod_name(&old), "--wait=false"])?;
        eventually("a new Ready proxy pod", WAIT, || {
            let p = env.proxy_pod()?;
            Ok(uid(&p)? != uid(&old)?
                && p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
    })?;
    // The keep-alive connections through the replaced Envoy: kept for the parent shutdown time.
    let drained = under_load(target, expect, || {
        let old = env.proxy_pod()?;
        restart()?;
        proxy_rollout_done(env)?;
        eventually("the replaced proxy pod gone (its Envoy drained and exited)", Duration::from_secs(120), || {
            Ok(env.release_pods()?.iter().all(|p| uid(p).ok() != uid(&old).ok()))
        })
    })?;
    println!("rollout restart, watched until the old pod is gone: {}", drained.summary());
    let checked: Vec<(&str, &Report)> = planned
        .iter()
        .map(|(e, r)| (e.as_str(), r))
        .chain([("rollout restart, watched until the old pod is gone", &drained)])
        .collect();
    continuity::check_planned(&checked)?;
    ensure!(pins()? == pins_before, "pins changed across the proxy replacements");
    // No request lost on a keep-alive connection, and each client's connection through the old
    // Envoy was ended by it between requests, announced.
    for (event, r) in &checked {
        for k in &r.keepalive {
            println!("  {event}: keep-alive client {k:?}");
        }
        let announced = r.keepalive.iter().all(|k| k.cut.is_none() && k.announced >= 1);
        ensure!(
            announced,
            "{event}: a keep-alive request was lost or a connection not ended announced: {}",
            r.summary()
        );
    }

    // Crashes are not planned: Envoy's sockets close with it. The launcher starts a new Envoy in
    // the same container at once (no kubelet back-off), for a second crash within a minute too.
    for crash in 1..=2 {
        let pod = env.proxy_pod()?;
        let r = under_load(target, expect, || {
            let pid = node_envoy_pid()?;
            let ok = std::process::Command::new("kill").args(["-9", &pid]).status()?.success();
            ensure!(ok, "kill -9 {pid}");
            eventually("a new Envoy process serving the inbound listener", WAIT, || {
                Ok(node_envoy_pid().is_ok_and(|p| p != pid)
                    && active_listener_netns("inbound_default_cont_8080").ok().flatten().is_some())
            })
        })?;
        println!("Envoy process killed (crash {crash} of 2 within a minute): {}", r.summary());
        ensure!(
            restarts(&env.proxy_pod()?) == restarts(&pod),
            "crash {crash}: the kubelet restarted the container; the launcher should have restarted Envoy"
        );
        ensure!(r.longest_gap() < Duration::from_secs(5), "crash {crash}: {}", r.summary());
    }

    // The off switch: the same rollout now fails requests (the suite sees a gap when there is one).
    env.helm_aether("upgrade", &["proxy.handOver.enabled=false"])?;
    proxy_rollout_done(env)?;
    check_release_settled(env)?;
    let off = under_load(target, expect, || {
        restart()?;
        proxy_rollout_done(env)
    })?;
    println!("hand-over off, kubectl rollout restart (the suite must see this gap): {}", off.summary());
    let back = under_load(target, expect, || {
        env.helm_aether("upgrade", &[])?;
        proxy_rollout_done(env)
    })?;
    println!("hand-over switched back on (a delete-first roll from an Envoy without it): {}", back.summary());
    check_release_settled(env)?;
    ensure!(off.failed() > 0, "a rollout without the hand-over must fail requests: {}", off.summary());
    println!("kubectl get ds,pods -n {NS} -o wide:\n{}", env.kube().ok(&["get", "ds,pods", "-n", NS, "-o", "wide"])?);
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "cont", "--wait=true"])?;
    Ok(())
}

/// The socket pins on the host now (file names in the pin dir), sorted.
pub(crate) fn pins() -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> =
        std::fs::read_dir(PINS)?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    Ok(names)
}

/// Deploys the uds-echo app `name` served over its socket (pod, Service, ServiceAccount), its
/// inbound connections relayed as `inbound` says (`endpoint.aether.io/inbound-proxy`: `tcp` or
/// `http`), and waits until kube-proxy has programmed its Service, then until it answers from the
/// host under a short load: its ClusterIP target and the body every answer carries.
pub(crate) fn served_echo_app(env: &Env, name: &str, inbound: &str) -> anyhow::Result<(SocketAddr, String)> {
    let app = echo_app(name).annotated().annotation(aether_crds::pod::INBOUND_PROXY_ANNOTATION, inbound);
    env.kube().apply(&app.manifest())?;
    env.wait_pod_ready("default", name)?;
    let target = env.service_target(name, 8080)?;
    let expect = format!("{name} over unix:/s/app.sock");
    eventually("the Service answers from the host", WAIT, || Ok(under_load_quick(target, &expect)?.failed() == 0))?;
    Ok((target, expect))
}

/// One second of the field load on `target`, for a readiness check before measuring.
pub(crate) fn under_load_quick(target: SocketAddr, expect: &str) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let load = Load { keepalive: 0, ..Load::field(target, "/ready", expect) };
    Ok(rt.block_on(async { continuity::run(&load, tokio::time::sleep(Duration::from_secs(1))).await }))
}

/// The 60 s after a roll under the field load to `target` (pod `default/<pod>`'s inbound listener
/// on port 8080): the planned-event rule of [`continuity::check_planned`] (nothing refused, reset,
/// timed out or wrongly answered, no second without a served request).
/// Prints the load's summary and every Envoy counter of `listener_manager.*` and of the pod's
/// listener, TCP proxy and cluster (names with `default_<pod>_`) that changed meanwhile (e.g.
/// `listener.<name>.downstream_cx_total` grows by the requests Envoy accepted), so that a
/// lost request is seen beside a listener event (added, modified, drained) or an upstream one
/// (connect timeout or failure to the pod's socket), or the lack of both.
///
/// # Errors
/// Naming `event` when the rule is broken, or when Envoy's admin cannot be read.
pub(crate) fn the_minute_after(target: SocketAddr, expect: &str, event: &str, pod: &str) -> anyhow::Result<()> {
    quiet_load(target, expect, &format!("the 60 s after {event}"), pod, Duration::from_secs(55))
}

/// `what` (e.g. `the 60 s after <event>`): the field load to `target` with no event for `quiet` (plus
/// the 5 s [`under_load`] adds), checked and printed as [`the_minute_after`] says.
///
/// # Errors
/// Naming `what` when the rule is broken, or when Envoy's admin cannot be read.
fn quiet_load(target: SocketAddr, expect: &str, what: &str, pod: &str, quiet: Duration) -> anyhow::Result<()> {
    // ^listener_manager\.|default_<pod>_, percent-encoded (Envoy decodes the query string).
    let filter = format!("/stats?filter=%5Elistener_manager%5C.%7Cdefault_{pod}_");
    let counters = || envoy_stats(envoy_admin, &filter);
    let before = counters()?;
    // The kernel's side, for a lost request: the client's netns (the host's) and the pod's,
    // where Envoy's inbound listener accepts.
    let pod_netns = active_listener_netns(&format!("inbound_default_{pod}_8080"))?;
    let tcp = || -> anyhow::Result<[aether_tests::tcp_counters::Counters; 2]> {
        Ok([
            aether_tests::tcp_counters::read(None)?,
            aether_tests::tcp_counters::read(pod_netns.as_deref().map(Path::new))?,
        ])
    };
    let tcp_before = tcp()?;
    // A connection that meets an untranslated conntrack entry never reaches Envoy
    // (aether_tests::service_rules): there must be none when the load starts.
    let stale = aether_tests::service_rules::untranslated_here(target)?;
    println!("{what}: {stale} untranslated conntrack entries to {target} before the load");
    ensure!(
        stale == 0,
        "{what}: {stale} conntrack entries to {target} without DNAT before the load (a connection sent before kube-proxy's rule)"
    );
    let after = under_load(target, expect, || {
        std::thread::sleep(quiet);
        Ok(())
    })?;
    let tcp_after = tcp()?;
    for (i, ns) in ["the host's", &format!("{pod}'s")].iter().enumerate() {
        let grew = aether_tests::tcp_counters::deltas(&tcp_before[i], &tcp_after[i]);
        println!("{what}, {ns} netns TCP counters: {grew}");
    }
    let changed = stats_changes(&before, &counters()?);
    println!("{what}: {}; listener counters changed: {changed:?}", after.summary());
    continuity::check_planned(&[(what, &after)])?;
    Ok(())
}

/// `make soak`, not in `make test`: the field load on a UDS-only pod for `AETHER_SOAK_SECS`
/// (default 1200) with no event at all, checked as the minute after an event is (the
/// planned-event rule of [`continuity::check_planned`]) and printed with the kernel's TCP
/// counters and each timed-out request's phases (connected, received by the app, answered; see
/// [`continuity::Late`]): the long quiet run in which a timed-out request would show where its time went.
///
/// # Errors
/// When `AETHER_SOAK_SECS` is not a number of seconds, or as [`the_minute_after`].
pub(crate) fn a_quiet_soak_under_load_fails_no_request(env: &Env) -> anyhow::Result<()> {
    let secs: u64 = match std::env::var("AETHER_SOAK_SECS") {
        Ok(v) => v.parse().with_context(|| format!("AETHER_SOAK_SECS={v:?}: a whole number of seconds"))?,
        Err(_) => 1200,
    };
    let (target, expect) = served_echo_app(env, "soak", "tcp")?;
    quiet_load(target, &expect, &format!("{secs} s with no event"), "soak", Duration::from_secs(secs))
}

/// The hand-over dir [`a_changed_hand_over_dir_costs_one_cold_start_and_nothing_after`] moves to.
const MOVED_HAND_OVER_DIR: &str = "/run/aether-proxy-b";

/// Removes a hand-over dir the kubelet created for a test's hostPath on every exit path, once no
/// launcher uses it: when it holds nothing but the `start.lock` every launcher leaves and an empty
/// `shm/` (a proxy still using it keeps its records there, and `remove_dir` refuses a non-empty
/// dir).
struct EmptyDirGuard(&'static str);

impl Drop for EmptyDirGuard {
    fn drop(&mut self) {
        let names: Vec<String> = std::fs::read_dir(self.0)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if names.iter().all(|n| n == "start.lock" || n == "shm") {
            let _ = std::fs::remove_dir(format!("{}/shm", self.0));
            let _ = std::fs::remove_file(format!("{}/start.lock", self.0));
            let _ = std::fs::remove_dir(self.0);
        }
    }
}

/// A proxy pod that finds an Envoy outside the hand-over (here: a changed
/// `proxy.handOver.hostPath`, so the old Envoy's state dir is not the new pod's) never binds beside
/// it: under the field load through Service `hdir`, `helm upgrade --set
/// proxy.handOver.hostPath=/run/aether-proxy-b` rolls the proxy (surge: the new pod stands by,
/// Ready without serving, until the DaemonSet has deleted the old one), then back to the default
/// path. Each way: the new launcher said it stood by, requests fail in at most one short gap (the
/// cold start after the old Envoy exits), and none fails in the 60 s after the roll
/// ([`the_minute_after`]), with the pod's inbound listener active again (before, every inbound listener was withdrawn for good).
pub(crate) fn a_changed_hand_over_dir_costs_one_cold_start_and_nothing_after(env: &Env) -> anyhow::Result<()> {
    let (target, expect) = served_echo_app(env, "hdir", "tcp")?;
    let expect = expect.as_str();
    let _made = (!Path::new(MOVED_HAND_OVER_DIR).exists()).then_some(EmptyDirGuard(MOVED_HAND_OVER_DIR));
    for (way, sets) in [
        ("to /run/aether-proxy-b", vec![format!("proxy.handOver.hostPath={MOVED_HAND_OVER_DIR}")]),
        ("back to the default", vec![]),
    ] {
        let old = env.proxy_pod()?;
        let roll = under_load(target, expect, || {
            env.helm_aether("upgrade", &sets.iter().map(String::as_str).collect::<Vec<_>>())?;
            proxy_rollout_done(env)?;
            eventually("the old proxy pod gone", Duration::from_secs(180), || {
                Ok(env.release_pods()?.iter().all(|p| uid(p).ok() != uid(&old).ok()))
            })
        })?;
        println!("helm upgrade moving the hand-over dir {way}: {}", roll.summary());
        let new = env.proxy_pod()?;
        let said = launcher_lines(env, &new)?;
        ensure!(
            said.iter().any(|l| l.contains("standing by instead of starting beside it")),
            "{way}: the new launcher did not stand by beside the old Envoy; it said:\n{}",
            said.join("\n")
        );
        ensure!(
            roll.longest_gap() <= Duration::from_secs(3),
            "{way}: more than one cold start's gap (at most 3 s): {}",
            roll.summary()
        );
        eventually("the pod's inbound listener active", WAIT, || {
            Ok(active_listener_netns("inbound_default_hdir_8080")?.is_some())
        })?;
        the_minute_after(target, expect, &format!("moving the hand-over dir {way}"), "hdir")?;
    }
    check_release_settled(env)?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "hdir", "--wait=true"])?;
    Ok(())
}

/// Both node pods deleted (the agent's and Envoy's, as a node's pods are after an eviction): new
/// ones come up Ready with no restarts and serve the pods again. This also replaces the pods the
/// previous case restarted.
pub(crate) fn replaced_node_pod_resumes_delivery(env: &Env) -> anyhow::Result<()> {
    let old = [env.node_pod()?, env.proxy_pod()?];
    let names: Vec<&str> = old.iter().map(pod_name).collect();
    env.kube().ok(&[&["delete", "pod", "-n", NS][..], &names[..], &["--wait=true"][..]].concat())?;
    for (component, before) in ["node", "proxy"].into_iter().zip(&old) {
        let mut new = None;
        eventually(&format!("a new Ready {component} pod"), WAIT, || {
            let p = env.component_pod(component)?;
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let fresh = uid(&p)? != uid(before)?;
            if fresh && ready {
                new = Some(p);
            }
            Ok(fresh && ready)
        })?;
        let new = new.context("new pod")?;
        ensure!(restarts(&new).iter().all(|(_, r)| *r == 0), "new {component} pod restarted: {:?}", restarts(&new));
    }
    eventually("health gateway 200 for web from the new node pods", WAIT, || {
        Ok(env.health("health_default_web").unwrap_or(0) == 200)
    })?;
    Ok(())
}
