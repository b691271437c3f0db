//! The upgrade from the previous release, under load (`make test-upgrade`; outside `make test`:
//! the previous release is built from its commit first, about 10 minutes once, then cached).
//!
//! What it proves: a cluster running the previous release (aether 0.10.0, charts aether 0.11.0
//! and aether-crds 0.4.0, built from commit ab16da0 by `scripts/prev-release.sh`) with a UDS-only
//! app switched to its socket by an EndpointPolicy goes to this tree's release with `helm upgrade`
//! (the CRD chart first, as docs/upgrade.md says) and back with `helm rollback`, each under the
//! field load through the app's Service, with no request refused, reset, timed out or wrongly
//! answered and no second without a served request (the planned-event rule of
//! `aether_tests::continuity::check_planned`; on the rollback, resets are allowed only while the
//! previous release's agent, starting, re-pins the app: its bug, fixed in this tree), nothing
//! failing in the minute after, the policy's
//! conditions unchanged and the pod still served over its socket. Each step prints the figures
//! docs/upgrade.md quotes ("From the previous release"): requests failed, the longest gap and the
//! keep-alive clients cut.
//!
//! The node is the real-node suite's (dual-stack, containerd 2.x), its shared environment and
//! helpers included from `node/` as they are; the release is installed as that suite installs it
//! (one namespace, the images built here), the previous one from its own images, tagged with its
//! version beside the current `dev` ones. Needs root.

#[path = "suite.rs"]
mod suite;

// The real-node suite's environment and its load helpers, shared as files: this suite uses a part
// of them.
#[allow(dead_code)]
#[path = "node/env.rs"]
mod env;
#[allow(dead_code)]
#[path = "node/restarts.rs"]
mod restarts;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use aether_fixtures::{echo_app, policy};
use aether_tests::continuity::{self, Report};
use aether_tests::node::{CHART_IMAGE_SETS, IpFamily, RealNode, Runtime, Shape, privileged_label_command};
use aether_tests::{eventually, node::release_namespace_command};
use anyhow::{Context, ensure};
use serde_json::Value;

use crate::env::{
    Env, NS, RELEASE, WAIT, active_listener_netns, check_release_settled, current_revision, envoy_stats, stats_changes,
    uid,
};
use crate::restarts::{proxy_rollout_done, under_load};

/// The previous release as `scripts/prev-release.sh` built it.
struct Prev {
    /// Its version, the tag of its images (`localhost/aether/<name>:<tag>`).
    tag: String,
    /// Its image tarballs (`<name>.tar`).
    images: PathBuf,
    /// Its packaged aether chart.
    aether_chart: PathBuf,
    /// Its packaged aether-crds chart.
    crds_chart: PathBuf,
}

impl Prev {
    /// Builds (or finds cached) the previous release: `scripts/prev-release.sh`'s `KEY=VALUE` lines.
    fn build() -> anyhow::Result<Prev> {
        let repo = aether_tests::repo_root();
        let out = std::process::Command::new(repo.join("scripts/prev-release.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("scripts/prev-release.sh")?;
        ensure!(out.status.success(), "scripts/prev-release.sh failed (its log is above)");
        let vars: BTreeMap<String, String> = String::from_utf8(out.stdout)?
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let get = |k: &str| vars.get(k).cloned().with_context(|| format!("scripts/prev-release.sh printed no {k}"));
        Ok(Prev {
            tag: get("AETHER_PREV_TAG")?,
            images: get("AETHER_PREV_IMAGES")?.into(),
            aether_chart: get("AETHER_PREV_AETHER_CHART")?.into(),
            crds_chart: get("AETHER_PREV_CRDS_CHART")?.into(),
        })
    }

    /// The `--set` values that point its chart at its images (the current ones with its tag).
    fn chart_sets(&self) -> Vec<String> {
        CHART_IMAGE_SETS.iter().map(|s| s.replace(".tag=dev", &format!(".tag={}", self.tag))).collect()
    }
}

/// The suite's environment: the real-node suite's, and the previous release.
struct Upgrade {
    env: Env,
    prev: Prev,
}

fn setup() -> anyhow::Result<Upgrade> {
    let prev = Prev::build()?;
    let t0 = Instant::now();
    let node = RealNode::up_with(Shape { family: IpFamily::Dual, runtime: Runtime::Containerd2 })?;
    eprintln!("node up in {} s", t0.elapsed().as_secs());
    let sock = node.facts().containerd_sock.clone().context("a containerd node has a containerd socket")?;
    let imported = std::process::Command::new(aether_tests::repo_root().join("tests/harness/images.sh"))
        .args(["import".as_ref(), sock.as_os_str()])
        .env("AETHER_IMAGES_DIR", &prev.images)
        .env("AETHER_IMAGE_TAG", &prev.tag)
        .status()
        .context("tests/harness/images.sh import")?;
    ensure!(imported.success(), "importing release {}'s images from {} failed", prev.tag, prev.images.display());
    let env = Env { node, installed_at: Instant::now() };
    let path = |p: &PathBuf| p.to_str().map(str::to_owned).context("chart path is not UTF-8");
    env.node.helm(&["install", "aether-crds", &path(&prev.crds_chart)?, "--wait"])?;
    env.kube().ok(&release_namespace_command(NS))?;
    env.kube().ok(&privileged_label_command(NS))?;
    let prev_sets = prev.chart_sets();
    let sets: Vec<&str> = prev_sets.iter().map(String::as_str).chain(env.chart_sets(&[])).collect();
    let args = aether_tests::node::chart_args("install", RELEASE, &prev.aether_chart, NS, &sets)?;
    let t1 = Instant::now();
    env.node.helm(&args.iter().map(String::as_str).collect::<Vec<_>>()).with_context(|| env::context(&env))?;
    eprintln!("release {} installed (helm install --wait) in {} s", prev.tag, t1.elapsed().as_secs());
    Ok(Upgrade { env: Env { installed_at: Instant::now(), ..env }, prev })
}

/// The app of the case: a UDS-only echo app that an EndpointPolicy switches to its socket.
const APP: &str = "upg";
/// Its policy.
const POLICY: &str = "upg-uds";

/// The policy's conditions as `(type, status, reason, observedGeneration)`, sorted.
fn policy_conditions(env: &Env) -> anyhow::Result<Vec<(String, String, String, i64)>> {
    let p: Value =
        serde_json::from_str(&env.kube().ok(&["get", "endpointpolicy", "-n", "default", POLICY, "-o", "json"])?)?;
    let mut conditions: Vec<_> = p["status"]["conditions"]
        .as_array()
        .context("the policy has no status.conditions")?
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("type"), s("status"), s("reason"), c["observedGeneration"].as_i64().unwrap_or(-1))
        })
        .collect();
    conditions.sort();
    Ok(conditions)
}

/// The previous release's Envoy admin, on TCP (its chart's `proxy.adminPort`); this tree's is on
/// a Unix socket ([`env::envoy_admin`]).
const PREV_ENVOY_ADMIN_PORT: u16 = 9901;

/// `GET path` on the previous release's Envoy admin (TCP).
fn prev_envoy_admin(path: &str) -> anyhow::Result<(u16, String)> {
    aether_tests::http_get(PREV_ENVOY_ADMIN_PORT, path, &[])
}

/// The node Envoy's `listener_manager.*` counters and those of the app's listener, cluster and TCP
/// proxy (names with `default_upg_`), from whichever admin answers (this tree's socket, else the
/// previous release's port); empty when neither does.
fn envoy_counters() -> BTreeMap<String, String> {
    let filter = format!("/stats?filter=%5Elistener_manager%5C.%7Cdefault_{APP}_");
    envoy_stats(env::envoy_admin, &filter).or_else(|_| envoy_stats(prev_envoy_admin, &filter)).unwrap_or_default()
}

/// Samples the node Envoys' counters of the app's cluster and listener ([`envoy_counters`]: this
/// tree's admin socket and the previous release's admin port, each Envoy by itself) every 100 ms
/// until `stop`, and returns each change as `+seconds since start: admin name before -> after`:
/// the timeline an event's failed request is read against (an upstream connect failure, a host
/// turned unhealthy, a listener replaced).
fn sample_counters(started: Instant, stop: &std::sync::atomic::AtomicBool) -> Vec<String> {
    let filter = format!(
        "/stats?filter=%5Elistener_manager%5C.listener_%7Cdefault_{APP}_.*(fail%7Chealth%7Cnone%7Creset%7Cdestroy_remote%7Cdrain%7Cmodified%7Coverflow)"
    );
    let read = |which: &str| -> BTreeMap<String, String> {
        let stats = match which {
            "socket" => envoy_stats(env::envoy_admin, &filter),
            _ => envoy_stats(prev_envoy_admin, &filter),
        };
        // Counters only (a histogram with no sample reads "No recorded values").
        let mut stats = stats.unwrap_or_default();
        stats.retain(|_, v| !v.starts_with("P0(") && !v.contains("No recorded values"));
        stats
    };
    let mut last: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    let mut timeline = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for which in ["socket", "port"] {
            let now = read(which);
            let at = started.elapsed().as_secs_f64();
            let before = last.entry(which).or_default();
            if !before.is_empty() || !now.is_empty() {
                for line in stats_changes(before, &now) {
                    timeline.push(format!("+{at:.2} s {which}: {line}"));
                }
            }
            *before = now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    timeline
}

/// The time of day of `at` in UTC with milliseconds (`HH:MM:SS.mmm`), to line the load's `+s` up
/// with the components' logs.
fn utc(at: SystemTime) -> String {
    let t = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let s = t.as_secs();
    format!("{:02}:{:02}:{:02}.{:03} UTC", s / 3600 % 24, s / 60 % 60, s % 60, t.subsec_millis())
}

/// When the agent of the node pod running now first logged a line whose message is `message`
/// and whose text contains `about` (its JSON log's RFC 3339 `timestamp`).
fn agent_logged(env: &Env, message: &str, about: &str) -> anyhow::Result<SystemTime> {
    let pod = env.node_pod()?;
    let logs = env.kube().ok(&["logs", "-n", NS, env::pod_name(&pod), "-c", "aether-agent"])?;
    let line = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == message && l.to_string().contains(about))
        .with_context(|| format!("the agent logged no {message:?} about {about:?}"))?;
    let at = line["timestamp"].as_str().context("a log line without a timestamp")?;
    let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .with_context(|| format!("timestamp {at:?}"))?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(at.unix_timestamp_nanos()).unwrap_or(0)))
}

/// The rule for a rollback to the previous release (0.10.0): its agent, starting with an empty
/// state dir, lists the pods before the policies and meanwhile removes the pin of every pod whose
/// socket a policy names, so the node's Envoy cannot connect to such a pod until the agent pins
/// it again (fixed in this tree: the pin waits for the policy list; see
/// `a_replaced_agent_keeps_a_policy_pods_pin_until_the_policies_are_listed`). A request may fail
/// only as a reset inside that window (from the agent's "listed this node's pods" to its
/// "delivering over the pod's Unix socket" for the app, 0.2 s either side for the clocks);
/// anything else breaks the planned-event rule.
fn prev_agent_pin_gap_only(env: &Env, what: &str, report: &Report, load_start: SystemTime) -> anyhow::Result<()> {
    let failed: Vec<&continuity::Outcome> = report.requests.iter().filter(|o| o.failure.is_some()).collect();
    if failed.is_empty() {
        return continuity::check_planned(&[(what, report)]).map(|_| ());
    }
    let slack = Duration::from_millis(200);
    let listed = agent_logged(env, "listed this node's pods", "")? - slack;
    let pinned = agent_logged(env, "delivering over the pod's Unix socket", &format!("default/{APP} "))? + slack;
    let offset = |t: SystemTime| t.duration_since(load_start).map_or(-1.0, |d| d.as_secs_f64());
    println!(
        "{what}: the previous release's agent re-pinned the app between +{:.2} s and +{:.2} s of the load",
        offset(listed),
        offset(pinned)
    );
    for o in &failed {
        let at = load_start + o.at;
        ensure!(
            o.failure == Some(continuity::Failure::Reset) && at >= listed && at <= pinned,
            "{what}: a request failed ({:?} at +{:.2} s) outside the previous release's agent's pin gap \
             (+{:.2} s to +{:.2} s): {}",
            o.failure,
            o.at.as_secs_f64(),
            offset(listed),
            offset(pinned),
            report.summary()
        );
    }
    ensure!(report.longest_gap() < Duration::from_secs(1), "{what}: {}", report.summary());
    println!("{what}: {} failed, each inside the previous release's agent's pin gap", failed.len());
    Ok(())
}

/// Which release a step ends on, which says how it is checked.
#[derive(Clone, Copy)]
enum Lands {
    /// This tree's: the planned-event rule, and the 60 s after with Envoy's counters (its admin
    /// socket).
    ThisTree,
    /// The previous release's (its agent starts): [`prev_agent_pin_gap_only`], and the 60 s after
    /// by the planned-event rule alone (its admin is on TCP, which the helpers do not read).
    Previous,
}

/// One planned operation `what` under the field load to `target`: `event`, then the proxy
/// DaemonSet's rollout and the old proxy pod gone; checked as `lands` says, printed as
/// docs/upgrade.md quotes it, then the 60 s after it under the same load.
fn step(
    env: &Env,
    target: std::net::SocketAddr,
    expect: &str,
    what: &str,
    lands: Lands,
    event: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let old = env.proxy_pod()?;
    let started = Instant::now();
    let counters = envoy_counters();
    let load_start = SystemTime::now();
    println!("{what}: the load starts at {} (+0 s; the event at +2 s)", utc(load_start));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (report, timeline) = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample_counters(started, &stop));
        let report = under_load(target, expect, || {
            event()?;
            proxy_rollout_done(env)?;
            eventually("the old proxy pod gone", Duration::from_secs(180), || {
                Ok(env.release_pods()?.iter().all(|p| uid(p).ok() != uid(&old).ok()))
            })
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (report, sampler.join().unwrap_or_default())
    });
    let report = report?;
    println!("{what} ({} s): {}", started.elapsed().as_secs(), report.summary());
    if report.failed() > 0 {
        println!("{what}: the node Envoys' counters, every 100 ms:\n  {}", timeline.join("\n  "));
    }
    println!("{what}: Envoy's counters changed: {:?}", stats_changes(&counters, &envoy_counters()));
    match lands {
        Lands::ThisTree => continuity::check_planned(&[(what, &report)]).map(|_| ())?,
        Lands::Previous => prev_agent_pin_gap_only(env, what, &report, load_start)?,
    }
    if let Lands::ThisTree = lands {
        eventually("the pod's inbound listener active", WAIT, || {
            Ok(active_listener_netns(&format!("inbound_default_{APP}_8080"))?.is_some())
        })?;
        restarts::the_minute_after(target, expect, what, APP)
    } else {
        let after = under_load(target, expect, || {
            std::thread::sleep(Duration::from_secs(55));
            Ok(())
        })?;
        let minute = format!("the 60 s after {what}");
        println!("{minute}: {}", after.summary());
        continuity::check_planned(&[(minute.as_str(), &after)]).map(|_| ())
    }
}

/// Under the field load through Service `upg` (a UDS-only app switched to its socket by policy
/// `upg-uds`), from the previous release: `helm upgrade` of both charts to this tree's, `helm
/// rollback` of the aether release to the previous revision (the CRD chart stays: docs/upgrade.md),
/// and `helm upgrade` again. Both upgrades refuse, reset and time out no request and leave no
/// second without a served request; the rollback may only reset requests while the previous
/// release's agent re-pins the app ([`prev_agent_pin_gap_only`]: a bug of 0.10.0, fixed here).
/// Nothing fails in the 60 s after any of them; the policy's conditions and the app's pod are the
/// same throughout, and every answer says it came over the socket.
fn an_upgrade_from_the_previous_release_and_its_rollback_fail_no_request(u: &Upgrade) -> anyhow::Result<()> {
    let env = &u.env;
    env.kube().apply(&echo_app(APP).manifest())?;
    env.kube().apply(&policy("default", POLICY).target(APP).socket("s/app.sock").manifest())?;
    let pod = uid(&env.wait_pod_ready("default", APP)?)?;
    let target = env.service_target(APP, 8080)?;
    let expect = format!("{APP} over unix:/s/app.sock");
    eventually("the Service answers over the socket from the host", WAIT, || {
        Ok(restarts::under_load_quick(target, &expect)?.failed() == 0)
    })?;
    let conditions = policy_conditions(env)?;
    println!("release {}: policy {POLICY}'s conditions {conditions:?}", u.prev.tag);
    ensure!(
        conditions.iter().any(|(t, s, _, _)| t == "Accepted" && s == "True"),
        "policy {POLICY} is not Accepted under release {}: {conditions:?}",
        u.prev.tag
    );
    let unchanged = |when: &str| -> anyhow::Result<()> {
        let now = policy_conditions(env)?;
        for c in &conditions {
            ensure!(now.contains(c), "{when}: policy {POLICY}'s condition {c:?} changed; now {now:?}");
        }
        let now_pod = uid(&env.pod_json("default", APP)?)?;
        ensure!(now_pod == pod, "{when}: pod {APP} was replaced ({pod} -> {now_pod})");
        Ok(())
    };
    let previous = current_revision(env)?;
    let crds = aether_tests::node::packaged_chart("aether-crds")?;
    let crds = crds.to_str().context("chart path is not UTF-8")?;
    let upgrade = || -> anyhow::Result<()> {
        env.node.helm(&["upgrade", "aether-crds", crds, "--wait"])?;
        env.helm_aether("upgrade", &[]).map(|_| ())
    };
    let what = format!("helm upgrade from release {} to this tree's", u.prev.tag);
    step(env, target, &expect, &what, Lands::ThisTree, upgrade)?;
    check_release_settled(env)?;
    unchanged(&what)?;

    let what = format!("helm rollback to release {} (revision {previous})", u.prev.tag);
    step(env, target, &expect, &what, Lands::Previous, || {
        env.node
            .helm(&["rollback", RELEASE, &previous.to_string(), "-n", NS, "--wait", "--timeout", "300s"])
            .map(|_| ())
    })?;
    unchanged(&what)?;

    let what = format!("helm upgrade from release {} again, after the rollback", u.prev.tag);
    step(env, target, &expect, &what, Lands::ThisTree, || env.helm_aether("upgrade", &[]).map(|_| ()))?;
    check_release_settled(env)?;
    unchanged(&what)?;

    env.kube().ok(&["delete", "endpointpolicy", "-n", "default", POLICY])?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", APP, "--wait=true"])?;
    Ok(())
}

fn main() {
    let cases = suite::cases![an_upgrade_from_the_previous_release_and_its_rollback_fail_no_request]
        .into_iter()
        .map(suite::Case::ignored)
        .collect();
    suite::run(cases, setup, |u: &Upgrade| env::context(&u.env))
}
