//! Rollbacks and GitOps across the proxy hand-over:
//! `a_rollback_either_way_across_the_hand_over_costs_one_cold_start_and_nothing_after` and
//! `a_second_release_on_the_node_changes_nothing_of_the_first`.
//!
//! What it proves: `helm rollback` replays a revision's stored manifest, update strategy
//! included, and a GitOps tool applies what `helm template` renders without seeing the cluster,
//! whatever the proxy running now can do. Turning the hand-over off, both ways between a revision
//! with it (a surge roll) and one without it (`proxy.handOver.enabled=false`, a delete-first
//! roll), and a GitOps apply over an Envoy without it, each cost at most one cold start's gap, and
//! nothing fails in the minute after (docs/upgrade.md, "Rollback and GitOps"). A second release
//! on the node, as a GitOps render installs it (no install check), changes nothing of the first:
//! its agent exits naming the first release's, its proxy stands by, and its uninstall leaves the
//! first release's pins and traffic alone (docs/install.md, "One release per cluster").

use std::time::Duration;

use aether_tests::eventually;
use anyhow::{Context, ensure};

use crate::env::{Env, NS, PINS, RELEASE, WAIT, active_listener_netns, check_release_settled, current_revision, uid};
use crate::restarts::{launcher_lines, pins, proxy_rollout_done, served_echo_app, the_minute_after, under_load};

/// What a GitOps tool syncing the chart does to the node proxy: `helm template` (no cluster: its
/// `lookup` finds nothing, so the proxy DaemonSet renders a surge whatever runs now) of the proxy
/// DaemonSet and its bootstrap with the chart's defaults, then `kubectl apply`.
/// One planned operation the case measures: what the operator does, the action itself, and
/// whether the new launcher must stand by beside the old Envoy (a surge roll) or not (delete-first).
type Event<'a> = (&'a str, &'a dyn Fn() -> anyhow::Result<()>, bool);

fn gitops_apply(env: &Env) -> anyhow::Result<()> {
    let mut args = aether_tests::node::aether_chart_args("install", RELEASE, NS, &env.chart_sets(&[]))?;
    args[0] = "template".to_owned();
    args.extend(
        ["--show-only", "templates/proxy-daemonset.yaml", "--show-only", "templates/proxy-bootstrap-configmap.yaml"]
            .map(String::from),
    );
    let rendered = env.node.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    ensure!(rendered.contains("maxSurge: 1"), "helm template rendered no surge:\n{rendered}");
    env.kube().apply(&rendered)
}

/// How revision `rev` renders the proxy DaemonSet: (its `aether.io/proxy-hand-over` annotation,
/// whether its update strategy is a surge).
fn proxy_strategy(env: &Env, rev: u64) -> anyhow::Result<(String, bool)> {
    let manifest = env.node.helm(&["get", "manifest", RELEASE, "-n", NS, "--revision", &rev.to_string()])?;
    let ds = manifest
        .split("\n---")
        .find(|d| d.contains("kind: DaemonSet") && d.contains("name: aether-proxy\n"))
        .context("no aether-proxy DaemonSet in the manifest")?;
    let mode = ds
        .lines()
        .find_map(|l| l.trim().strip_prefix("aether.io/proxy-hand-over:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .context("no hand-over annotation")?;
    Ok((mode, ds.contains("maxSurge: 1")))
}

/// Under the field load through Service `rback` (a UDS-only pod), from the current revision (the
/// hand-over on, a surge roll: asserted from its stored manifest), each over the Envoy the
/// previous one left:
/// - `helm upgrade --set proxy.handOver.enabled=false`: a revision without it (delete-first: the
///   old launcher serves through its successor wait, then its pod goes and the new one starts
///   cold);
/// - `helm rollback` to the surge revision, over that Envoy outside the hand-over (the new pod
///   stands by until the old one is gone);
/// - `helm rollback` to the revision without it (delete-first again);
/// - a GitOps apply of the chart's defaults (`helm template | kubectl apply`: a surge, since the
///   template's `lookup` sees nothing) over that Envoy outside the hand-over again.
///
/// Each: requests fail in at most one gap of one cold start (3 s), the pod's inbound listener is
/// active again, and nothing fails in the 60 s after (`the_minute_after`). Then a `helm upgrade` to the defaults (a
/// hand-over) puts the release back under Helm.
pub(crate) fn a_rollback_either_way_across_the_hand_over_costs_one_cold_start_and_nothing_after(
    env: &Env,
) -> anyhow::Result<()> {
    let (target, expect) = served_echo_app(env, "rback", "tcp")?;
    let expect = expect.as_str();
    let surge = current_revision(env)?;
    ensure!(
        proxy_strategy(env, surge)? == ("hot-restart".to_owned(), true),
        "revision {surge} is not a surge with the hand-over: {:?}",
        proxy_strategy(env, surge)?
    );
    // Helm numbers revisions one by one: the upgrade below makes the next.
    let off = surge + 1;
    let turn_off = || -> anyhow::Result<()> {
        env.helm_aether("upgrade", &["proxy.handOver.enabled=false"])?;
        ensure!(current_revision(env)? == off, "the upgrade made revision {}, not {off}", current_revision(env)?);
        ensure!(
            proxy_strategy(env, off)? == ("off".to_owned(), false),
            "revision {off}: {:?}",
            proxy_strategy(env, off)?
        );
        Ok(())
    };
    let rollback = |rev: u64| -> anyhow::Result<()> {
        env.node.helm(&["rollback", RELEASE, &rev.to_string(), "-n", NS, "--wait", "--timeout", "300s"]).map(|_| ())
    };
    let events: [Event<'_>; 4] = [
        ("helm upgrade turning the hand-over off (delete-first)", &turn_off, false),
        ("helm rollback to the surge revision with the hand-over", &|| rollback(surge), true),
        ("helm rollback to the delete-first revision without it", &|| rollback(off), false),
        ("a GitOps apply of the chart's defaults over it (helm template | kubectl apply)", &|| gitops_apply(env), true),
    ];
    for (way, event, stands_by) in events {
        let old = env.proxy_pod()?;
        let roll = under_load(target, expect, || {
            event()?;
            proxy_rollout_done(env)?;
            eventually("the old proxy pod gone", Duration::from_secs(180), || {
                Ok(env.release_pods()?.iter().all(|p| uid(p).ok() != uid(&old).ok()))
            })
        })?;
        println!("{way}: {}", roll.summary());
        if stands_by {
            let said = launcher_lines(env, &env.proxy_pod()?)?;
            ensure!(
                said.iter().any(|l| l.contains("standing by instead of starting beside it")),
                "{way}: the new launcher did not stand by beside the old Envoy; it said:\n{}",
                said.join("\n")
            );
        }
        ensure!(
            roll.longest_gap() <= Duration::from_secs(3),
            "{way}: more than one cold start's gap (at most 3 s): {}",
            roll.summary()
        );
        eventually("the pod's inbound listener active", WAIT, || {
            Ok(active_listener_netns("inbound_default_rback_8080")?.is_some())
        })?;
        the_minute_after(target, expect, way, "rback")?;
    }
    env.helm_aether("upgrade", &[])?;
    proxy_rollout_done(env)?;
    check_release_settled(env)?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "rback", "--wait=true"])?;
    Ok(())
}

/// The second release of [`a_second_release_on_the_node_changes_nothing_of_the_first`].
const SECOND: &str = "second";
/// Its namespace (both its DaemonSets run there).
const SECOND_NS: &str = "aether-second";

/// Removes the second release and its namespace on every exit path.
struct SecondRelease<'a>(&'a Env);

impl Drop for SecondRelease<'_> {
    fn drop(&mut self) {
        let _ = self.0.node.helm(&["uninstall", SECOND, "-n", SECOND_NS, "--wait", "--timeout", "180s"]);
        let _ = self.0.kube().ok(&["delete", "namespace", SECOND_NS, "--wait=true", "--ignore-not-found"]);
    }
}

/// The logs of the second release's `component` pods (`node` or `proxy`), the previous
/// container's too (the refused agent exits and is restarted).
fn second_logs(env: &Env, component: &str) -> String {
    let selector = format!("app.kubernetes.io/instance={SECOND},app.kubernetes.io/component={component}");
    let mut all = String::new();
    for previous in ["--previous=false", "--previous=true"] {
        if let Ok(out) =
            env.kube().ok(&["logs", "-n", SECOND_NS, "-l", &selector, "--all-containers", "--tail=-1", previous])
        {
            all.push_str(&out);
        }
    }
    all
}

/// A second release on the node, installed as a GitOps tool would (its values skip the chart's
/// install check, `daemonset.allowOtherReleases=true`: `helm template` cannot run it; its agent on
/// another admin port, so that the scheduler places it beside the first's), under the
/// field load through Service `second` (a UDS-only pod of the first release):
/// - its agent exits at once, naming the first release's agent as the pin dir's owner, before it
///   has changed anything on the node (the kubelet restarts it in back-off);
/// - its proxy launcher stands by, naming the first release's proxy DaemonSet, and never takes
///   the first release's Envoy over;
/// - `helm uninstall` of it removes none of the first release's pins (before, either uninstall
///   removed the other's).
///
/// No request fails while it is there, nor in the 60 s after its uninstall, and the pins and the
/// pin dir's owner are the first release's throughout.
pub(crate) fn a_second_release_on_the_node_changes_nothing_of_the_first(env: &Env) -> anyhow::Result<()> {
    let (target, expect) = served_echo_app(env, SECOND, "tcp")?;
    let expect = expect.as_str();
    let owner_file = std::path::Path::new(PINS).join(".owner");
    let first_owner = format!("{NS}/aether-node");
    let read_owner = || std::fs::read_to_string(&owner_file).unwrap_or_default();
    ensure!(read_owner() == first_owner, "the pin dir's owner is {:?}, not {first_owner}", read_owner());
    let pins_before = pins()?;
    let _cleanup = SecondRelease(env);
    let there = under_load(target, expect, || {
        // Another agent port: with the first's, the scheduler would not place its agent on the
        // node at all (no free host port), and the pin dir's claim is what this case proves.
        let sets = env.chart_sets(&[
            "daemonset.allowOtherReleases=true",
            "verifyInstall.enabled=false",
            "agent.adminPort=9191",
        ]);
        let mut args = aether_tests::node::aether_chart_args("install", SECOND, SECOND_NS, &sets)?;
        // Its agent is never Ready: no --wait (hook Jobs are waited for all the same).
        args.retain(|a| a != "--wait" && a != "--wait-for-jobs");
        // As the suite's own release: one namespace, labelled for the node pods' Pod Security level.
        env.kube().ok(&aether_tests::node::release_namespace_command(SECOND_NS))?;
        env.kube().ok(&aether_tests::node::privileged_label_command(SECOND_NS))?;
        env.node.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let state = || env.kube().ok(&["get", "ds,pods,events", "-n", SECOND_NS, "-o", "wide"]).unwrap_or_default();
        eventually("the second release's agent refused, naming the first's", WAIT, || {
            Ok(second_logs(env, "node").contains(&format!("belongs to the agent of {first_owner}")))
        })
        .with_context(|| format!("{}\n{}", second_logs(env, "node"), state()))?;
        eventually("the second release's launcher standing by, naming the first's", WAIT, || {
            Ok(second_logs(env, "proxy").contains(&format!("belongs to another proxy DaemonSet ({NS}/aether-proxy)")))
        })
        .with_context(|| format!("{}\n{}", second_logs(env, "proxy"), state()))?;
        // A while longer: the agent's back-off restarts, the launcher's polling.
        std::thread::sleep(Duration::from_secs(20));
        Ok(())
    })?;
    println!("a second release on the node: {}", there.summary());
    let agent_said: Vec<String> =
        second_logs(env, "node").lines().filter(|l| l.contains("pin dir")).take(2).map(str::to_owned).collect();
    println!("its agent said: {agent_said:#?}");
    ensure!(there.failed() == 0, "requests failed while the second release was there: {}", there.summary());
    ensure!(read_owner() == first_owner, "the pin dir's owner changed to {:?}", read_owner());
    ensure!(pins()? == pins_before, "the pins changed: {:?} -> {:?}", pins_before, pins()?);
    let gone = under_load(target, expect, || {
        env.node.helm(&["uninstall", SECOND, "-n", SECOND_NS, "--wait", "--timeout", "180s"]).map(|_| ())
    })?;
    println!("helm uninstall of the second release: {}", gone.summary());
    ensure!(gone.failed() == 0, "requests failed during the second release's uninstall: {}", gone.summary());
    ensure!(pins()? == pins_before, "the second release's uninstall changed the pins: {:?}", pins()?);
    ensure!(read_owner() == first_owner, "the pin dir's owner changed to {:?}", read_owner());
    the_minute_after(target, expect, "the second release's uninstall", SECOND)?;
    check_release_settled(env)?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", SECOND, "--wait=true"])?;
    Ok(())
}
