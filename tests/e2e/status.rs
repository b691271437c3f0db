//! The status writer and the admission warnings against a real kube-apiserver.
//!
//! One control plane and one controller (status writer on, KUBECONFIG of that control plane,
//! registered as the webhook) serve every trial; each trial works in its own namespace. Trials
//! run one at a time in the order listed: the last ones start a second replica, hand the Lease
//! over, and finally delete the webhook configuration.

mod suite;

use std::sync::Mutex;
use std::time::Duration;

use aether_fixtures::policy;
use aether_tests::{ControlPlane, Controller, Scrape, eventually};
use anyhow::{Context, ensure};
use serde_json::Value;

const LEASE: &str = "aether-status-writer";
const WAIT: Duration = Duration::from_secs(30);
/// The reasons of `status: "True"`: the policy is in effect.
const IN_EFFECT: [&str; 2] = ["Accepted", "AcceptedWithoutService"];

struct Env {
    cp: ControlPlane,
    /// The replica registered as the webhook (and, at first, the Lease holder).
    controller: Mutex<Controller>,
    /// A second replica, started by `a_second_replica_follows_and_takes_over_when_the_leader_stops`.
    second: Mutex<Option<Controller>>,
}

fn start_controller(cp: &ControlPlane, holder: &str) -> anyhow::Result<Controller> {
    let kubeconfig = cp.kubeconfig();
    Controller::start(&[
        "--kubeconfig",
        kubeconfig.to_str().context("kubeconfig path is UTF-8")?,
        "--lease-name",
        LEASE,
        "--lease-namespace",
        "default",
        "--lease-holder",
        holder,
    ])
}

fn admin_port(c: &Controller) -> anyhow::Result<u16> {
    Ok(c.admin.rsplit(':').next().context("admin port")?.parse()?)
}

/// `kubectl apply` of one policy: (success, stderr).
fn apply_policy(env: &Env, ns: &str, name: &str, target: &str, socket: &str) -> anyhow::Result<(bool, String)> {
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("policy.yaml");
    std::fs::write(&f, policy(ns, name).target(target).socket(socket).manifest())?;
    let out = env.cp.kubectl(&["apply".as_ref(), "-f".as_ref(), f.as_os_str()])?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

fn apply_ok(env: &Env, ns: &str, name: &str, target: &str, socket: &str) -> anyhow::Result<String> {
    let (ok, stderr) = apply_policy(env, ns, name, target, socket)?;
    ensure!(ok, "kubectl apply of {ns}/{name} failed: {stderr}");
    Ok(stderr)
}

fn namespace(env: &Env, ns: &str) -> anyhow::Result<()> {
    env.cp.kubectl_ok(&["create", "namespace", ns])?;
    Ok(())
}

fn service(env: &Env, ns: &str, name: &str) -> anyhow::Result<()> {
    env.cp.kubectl_ok(&["create", "service", "clusterip", name, "--tcp=80:8080", "-n", ns])?;
    Ok(())
}

/// The `Accepted` condition of a policy as stored, plus `metadata.generation` and
/// `status.observedGeneration`.
#[derive(Debug)]
struct Accepted {
    status: String,
    reason: String,
    message: String,
    /// `lastTransitionTime`.
    since: String,
    generation: i64,
    observed: Option<i64>,
    condition_observed: Option<i64>,
}

fn accepted(env: &Env, ns: &str, name: &str) -> anyhow::Result<Option<Accepted>> {
    let json: Value = serde_json::from_str(&env.cp.kubectl_ok(&["get", "epol", name, "-n", ns, "-o", "json"])?)?;
    let generation = json["metadata"]["generation"].as_i64().context("generation")?;
    let Some(c) = json["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Accepted"))
    else {
        return Ok(None);
    };
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Ok(Some(Accepted {
        status: text("status"),
        reason: text("reason"),
        message: text("message"),
        since: text("lastTransitionTime"),
        generation,
        observed: json["status"]["observedGeneration"].as_i64(),
        condition_observed: c["observedGeneration"].as_i64(),
    }))
}

/// Waits until the policy's condition has `reason` and a message containing every one of
/// `message_has`, computed from the current generation; returns it.
fn wait_reason(env: &Env, ns: &str, name: &str, reason: &str, message_has: &[&str]) -> anyhow::Result<Accepted> {
    let mut last = None;
    let waited = eventually(&format!("{ns}/{name} to be {reason}"), WAIT, || {
        let a = accepted(env, ns, name)?;
        let ok = a.as_ref().is_some_and(|a| {
            a.reason == reason
                && message_has.iter().all(|m| a.message.contains(m))
                && a.observed == Some(a.generation)
                && a.condition_observed == Some(a.generation)
        });
        last = a;
        Ok(ok)
    });
    if let Err(e) = waited {
        let log = env.controller.lock().map(|c| c.log()).unwrap_or_default();
        anyhow::bail!("{e:#}; last seen {last:?}\ncontroller log:\n{log}");
    }
    let a = last.context("condition")?;
    let want_status = if IN_EFFECT.contains(&reason) { "True" } else { "False" };
    ensure!(a.status == want_status, "{ns}/{name}: reason {reason} with status {}", a.status);
    Ok(a)
}

/// `kubectl get epol -n ns`: the ACCEPTED column per policy name.
fn accepted_column(env: &Env, ns: &str) -> anyhow::Result<Vec<(String, String)>> {
    let out = env.cp.kubectl_ok(&["get", "epol", "-n", ns])?;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    let col = header.iter().position(|h| *h == "ACCEPTED").with_context(|| format!("no ACCEPTED column: {out}"))?;
    Ok(lines
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[0].to_owned(), cells.get(col).copied().unwrap_or_default().to_owned())
        })
        .collect())
}

fn the_smallest_name_wins_in_both_orders_and_deleting_the_winner_promotes_the_next(env: &Env) -> anyhow::Result<()> {
    for (ns, first, second) in [("order-ab", "a-pol", "b-pol"), ("order-ba", "b-pol", "a-pol")] {
        namespace(env, ns)?;
        service(env, ns, "echo")?;
        apply_ok(env, ns, first, "echo", "s/app.sock")?;
        wait_reason(env, ns, first, "Accepted", &["Service \"echo\""])?;
        apply_ok(env, ns, second, "echo", "s/app.sock")?;
        wait_reason(env, ns, "a-pol", "Accepted", &[])?;
        let b = wait_reason(
            env,
            ns,
            "b-pol",
            "Conflicted",
            &["EndpointPolicy \"a-pol\" is in effect for Service \"echo\""],
        )?;
        ensure!(b.message.contains("smallest name wins"), "{ns}: {b:?}");
        let column = accepted_column(env, ns)?;
        ensure!(
            column == [("a-pol".to_owned(), "True".to_owned()), ("b-pol".to_owned(), "False".to_owned())],
            "{ns}: kubectl get epol shows {column:?}"
        );
        // The change of reason is also recorded once as an Event on the policy.
        eventually(&format!("a Conflicted Event for {ns}/b-pol"), WAIT, || {
            let events: Value =
                serde_json::from_str(&env.cp.kubectl_ok(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"])?)?;
            let conflicted: Vec<&Value> = events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["regarding"]["name"] == "b-pol" && e["reason"] == "Conflicted")
                .collect();
            ensure!(conflicted.len() <= 1, "{ns}: more than one Conflicted Event for b-pol: {conflicted:?}");
            Ok(conflicted.first().is_some_and(|e| {
                e["type"] == "Warning"
                    && e["reportingController"] == "aether-controller"
                    && e["note"].as_str().unwrap_or_default().contains("\"a-pol\"")
            }))
        })?;
        env.cp.kubectl_ok(&["delete", "epol", "a-pol", "-n", ns, "--wait=true"])?;
        wait_reason(env, ns, "b-pol", "Accepted", &[])?;
        let column = accepted_column(env, ns)?;
        ensure!(
            column == [("b-pol".to_owned(), "True".to_owned())],
            "{ns}: after the delete, kubectl get epol shows {column:?}"
        );
    }
    Ok(())
}

/// The Events the status writer recorded for policy `name` with `reason`: (type, note).
fn policy_events(env: &Env, ns: &str, name: &str, reason: &str) -> anyhow::Result<Vec<(String, String)>> {
    let events: Value =
        serde_json::from_str(&env.cp.kubectl_ok(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"])?)?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["regarding"]["name"] == name && e["reason"] == reason && e["reportingController"] == "aether-controller"
        })
        .map(|e| (e["type"].as_str().unwrap_or_default().to_owned(), e["note"].as_str().unwrap_or_default().to_owned()))
        .collect())
}

/// The agents match pods by ServiceAccount and never look at Services, so a policy for a missing
/// Service is in effect: `True`/`AcceptedWithoutService`, `True`/`Accepted` once the Service is
/// created, and back when it is deleted, `True` all along (`lastTransitionTime` stays).
fn a_policy_created_before_its_service_is_in_effect_without_it_and_with_it(env: &Env) -> anyhow::Result<()> {
    let ns = "missing";
    namespace(env, ns)?;
    apply_ok(env, ns, "later-uds", "later", "s/app.sock")?;
    let without = wait_reason(
        env,
        ns,
        "later-uds",
        "AcceptedWithoutService",
        &[
            "Service \"later\" does not exist in namespace \"missing\"; the policy is in effect for pods running as ServiceAccount \"later\" (aether matches pods by ServiceAccount) and stays so when the Service is created",
        ],
    )?;
    ensure!(accepted_column(env, ns)? == [("later-uds".to_owned(), "True".to_owned())]);
    eventually("a Normal AcceptedWithoutService Event for missing/later-uds", WAIT, || {
        let events = policy_events(env, ns, "later-uds", "AcceptedWithoutService")?;
        Ok(events.iter().any(|(type_, note)| type_ == "Normal" && note.contains("ServiceAccount \"later\"")))
    })?;

    service(env, ns, "later")?;
    let with = wait_reason(env, ns, "later-uds", "Accepted", &["the policy is in effect for Service \"later\""])?;
    ensure!(accepted_column(env, ns)? == [("later-uds".to_owned(), "True".to_owned())]);
    ensure!(with.since == without.since, "True all along, yet lastTransitionTime moved: {without:?} -> {with:?}");

    env.cp.kubectl_ok(&["delete", "service", "later", "-n", ns])?;
    let again = wait_reason(env, ns, "later-uds", "AcceptedWithoutService", &["ServiceAccount \"later\""])?;
    ensure!(accepted_column(env, ns)? == [("later-uds".to_owned(), "True".to_owned())]);
    ensure!(again.since == without.since, "True all along, yet lastTransitionTime moved: {without:?} -> {again:?}");
    Ok(())
}

/// The agent resolves the tie per service key (ServiceAccount), never looking at Services, so
/// two policies for a missing Service conflict as for an existing one: the winner is
/// `AcceptedWithoutService`, the loser `Conflicted`, before and after the Service exists.
fn a_conflict_for_a_missing_service_is_conflicted_for_the_loser(env: &Env) -> anyhow::Result<()> {
    let ns = "ghost";
    namespace(env, ns)?;
    let stderr = apply_ok(env, ns, "a-pol", "ghost", "s/app.sock")?;
    ensure!(
        stderr.contains(
            "Warning: spec.targetRef.name: Service \"ghost\" does not exist in namespace \"ghost\" yet; the policy is in effect now for pods running as ServiceAccount \"ghost\""
        ),
        "kubectl apply of a-pol printed: {stderr}"
    );
    wait_reason(env, ns, "a-pol", "AcceptedWithoutService", &[])?;
    // The loser is told it is Conflicted, and not that it is in effect without the Service.
    let stderr = apply_ok(env, ns, "b-pol", "ghost", "s/app.sock")?;
    ensure!(
        stderr.contains("\"a-pol\" wins (the smallest name wins), so this policy \"b-pol\" will be Conflicted")
            && !stderr.contains("does not exist"),
        "kubectl apply of b-pol printed: {stderr}"
    );
    let b = wait_reason(
        env,
        ns,
        "b-pol",
        "Conflicted",
        &[
            "EndpointPolicy \"a-pol\" is in effect for pods running as ServiceAccount \"ghost\" (the smallest name wins; Service \"ghost\" does not exist in namespace \"ghost\"",
        ],
    )?;
    ensure!(b.message.ends_with("this policy is not applied"), "{b:?}");
    wait_reason(env, ns, "a-pol", "AcceptedWithoutService", &[])?;
    let column = accepted_column(env, ns)?;
    ensure!(
        column == [("a-pol".to_owned(), "True".to_owned()), ("b-pol".to_owned(), "False".to_owned())],
        "kubectl get epol shows {column:?}"
    );

    service(env, ns, "ghost")?;
    wait_reason(env, ns, "a-pol", "Accepted", &[])?;
    wait_reason(env, ns, "b-pol", "Conflicted", &["EndpointPolicy \"a-pol\" is in effect for Service \"ghost\""])?;
    env.cp.kubectl_ok(&["delete", "service", "ghost", "-n", ns])?;
    wait_reason(env, ns, "a-pol", "AcceptedWithoutService", &[])?;
    wait_reason(env, ns, "b-pol", "Conflicted", &["ServiceAccount \"ghost\""])?;
    // Deleting the winner promotes the loser, without the Service as with it.
    env.cp.kubectl_ok(&["delete", "epol", "a-pol", "-n", ns, "--wait=true"])?;
    wait_reason(env, ns, "b-pol", "AcceptedWithoutService", &["ServiceAccount \"ghost\""])?;
    Ok(())
}

fn a_spec_change_is_observed_with_its_generation(env: &Env) -> anyhow::Result<()> {
    let ns = "generation";
    namespace(env, ns)?;
    service(env, ns, "echo")?;
    service(env, ns, "cart")?;
    apply_ok(env, ns, "a-pol", "echo", "s/app.sock")?;
    apply_ok(env, ns, "b-pol", "echo", "s/app.sock")?;
    wait_reason(env, ns, "b-pol", "Conflicted", &["\"a-pol\""])?;
    // Moving the winner to another Service leaves b-pol alone on "echo": it is promoted.
    apply_ok(env, ns, "a-pol", "cart", "s/app.sock")?;
    let a = wait_reason(env, ns, "a-pol", "Accepted", &["Service \"cart\""])?;
    ensure!(a.generation == 2, "a-pol generation {}", a.generation);
    wait_reason(env, ns, "b-pol", "Accepted", &["Service \"echo\""])?;
    Ok(())
}

fn kubectl_apply_prints_the_warnings(env: &Env) -> anyhow::Result<()> {
    let ns = "dup";
    namespace(env, ns)?;
    service(env, ns, "echo")?;
    let stderr = apply_ok(env, ns, "a-pol", "echo", "s/app.sock")?;
    ensure!(!stderr.contains("Warning:"), "a lone policy with its Service got a warning: {stderr}");
    // The status write proves the controller's cache holds a-pol, which the webhook reads too.
    wait_reason(env, ns, "a-pol", "Accepted", &[])?;
    let stderr = apply_ok(env, ns, "b-pol", "echo", "s/app.sock")?;
    let want = "Warning: spec.targetRef.name: Service \"echo\" is already targeted by EndpointPolicy \"a-pol\"; only one policy applies per Service and \"a-pol\" wins (the smallest name wins), so this policy \"b-pol\" will be Conflicted and not applied";
    ensure!(stderr.contains(want), "kubectl apply of the duplicate printed: {stderr}");
    // The winner's side says it wins.
    let stderr = apply_ok(env, ns, "a-pol", "echo", "s/ap.sock")?;
    ensure!(stderr.contains("this policy \"a-pol\" wins") && stderr.contains("\"b-pol\""), "{stderr}");
    // A metadata-only update (kubectl label) decides nothing new: no warnings repeated.
    let out = env.cp.kubectl(&["label", "epol", "-n", ns, "b-pol", "team=shop"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success() && !stderr.contains("Warning:"), "kubectl label of b-pol printed: {stderr}");

    let stderr = apply_ok(env, ns, "nowhere-uds", "nowhere", "s/app.sock")?;
    let want = "Warning: spec.targetRef.name: Service \"nowhere\" does not exist in namespace \"dup\" yet; the policy is in effect now for pods running as ServiceAccount \"nowhere\" (aether matches pods by ServiceAccount) and stays so when the Service is created (status AcceptedWithoutService)";
    ensure!(stderr.contains(want), "{stderr}");
    let stderr = apply_ok(env, ns, "tight-uds", "tight", "sockets/app.so")?;
    ensure!(
        stderr
            .contains("Warning: spec.udsSocket: \"sockets/app.so\" is 14 bytes, within 2 bytes of the 16-byte budget"),
        "{stderr}"
    );
    Ok(())
}

fn controller_metrics_parse_and_count_as_the_scenario_runs(env: &Env) -> anyhow::Result<()> {
    let port = admin_port(&env.controller.lock().expect("lock"))?;
    let before = Scrape::get(port)?;
    ensure!(before.value("aether_status_leader", &[]) == 1.0, "the only replica is not leading");
    let ns = "metrics";
    namespace(env, ns)?;
    apply_ok(env, ns, "m-pol", "echo", "s/app.sock")?;
    wait_reason(env, ns, "m-pol", "AcceptedWithoutService", &[])?;
    service(env, ns, "echo")?;
    wait_reason(env, ns, "m-pol", "Accepted", &[])?;
    apply_ok(env, ns, "n-pol", "echo", "s/app.sock")?;
    wait_reason(env, ns, "n-pol", "Conflicted", &[])?;
    let (denied, _) = apply_policy(env, ns, "o-pol", "echo", "sockets/app1.sock")?;
    ensure!(!denied, "an over-budget policy was admitted");

    let after = Scrape::get(port)?;
    let moved = |name: &str, labels: &[(&str, &str)]| after.value(name, labels) - before.value(name, labels);
    let checks: &[Check<'_>] = &[
        ("aether_status_patches_total", &[("result", "applied"), ("reason", "accepted-without-service")], 1.0),
        ("aether_status_patches_total", &[("result", "applied"), ("reason", "accepted")], 1.0),
        ("aether_status_patches_total", &[("result", "applied"), ("reason", "conflicted")], 1.0),
        ("aether_admission_requests_total", &[("kind", "EndpointPolicy"), ("result", "allowed")], 2.0),
        ("aether_admission_requests_total", &[("kind", "EndpointPolicy"), ("result", "denied")], 1.0),
        ("aether_admission_warnings_total", &[("warning", "accepted-without-service")], 1.0),
        ("aether_admission_warnings_total", &[("warning", "conflict")], 1.0),
        ("aether_admission_duration_seconds_count", &[], 3.0),
    ];
    let mut wrong = Vec::new();
    for (name, labels, at_least) in checks {
        if moved(name, labels) < *at_least {
            wrong.push(format!("{name}{labels:?} moved by {} (want >= {at_least})", moved(name, labels)));
        }
    }
    ensure!(after.value("aether_status_patches_total", &[("result", "failed")]) == 0.0, "failed status writes");
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Writes only on change: with nothing changing, the applied count stays put. The marker
    // that the status writer got past everything before it: a policy in a namespace of its own
    // (no Service there), created after, whose one write is in the later count.
    let settled = Scrape::get(port)?.value("aether_status_patches_total", &[("result", "applied")]);
    let marker = "metrics-marker";
    namespace(env, marker)?;
    apply_ok(env, marker, "marker", "nowhere", "s/app.sock")?;
    wait_reason(env, marker, "marker", "AcceptedWithoutService", &[])?;
    let later = Scrape::get(port)?.value("aether_status_patches_total", &[("result", "applied")]) - 1.0;
    ensure!(
        later == settled,
        "status was rewritten without a change: {settled} -> {later} (the marker's write left out)"
    );
    Ok(())
}

fn a_second_replica_follows_and_takes_over_when_the_leader_stops(env: &Env) -> anyhow::Result<()> {
    let holder =
        env.cp.kubectl_ok(&["get", "lease", LEASE, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}"])?;
    ensure!(holder == "e2e-first", "Lease held by {holder:?}");
    let second = start_controller(&env.cp, "e2e-second")?;
    let port = admin_port(&second)?;
    eventually("the second replica's caches to sync", WAIT, || {
        Ok(aether_tests::http_get(port, "/readyz", &[])?.1.contains("services synced"))
    })?;
    let (_, readyz) = aether_tests::http_get(port, "/readyz", &[])?;
    ensure!(readyz.contains("following"), "/readyz of the second replica: {readyz}");
    ensure!(Scrape::get(port)?.value("aether_status_leader", &[]) == 0.0, "two leaders");

    // The API server now calls the second replica; the first stops gracefully and releases the Lease.
    env.cp.register_webhook(&second.url, &second.ca_file)?;
    let stopped = env.controller.lock().expect("lock").terminate(Duration::from_secs(15))?;
    ensure!(stopped, "the first replica did not stop on SIGTERM");
    eventually(
        "the second replica to lead",
        WAIT,
        || Ok(Scrape::get(port)?.value("aether_status_leader", &[]) == 1.0),
    )?;
    let holder =
        env.cp.kubectl_ok(&["get", "lease", LEASE, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}"])?;
    ensure!(holder == "e2e-second", "Lease held by {holder:?}");
    *env.second.lock().expect("lock") = Some(second);

    let ns = "takeover";
    namespace(env, ns)?;
    service(env, ns, "echo")?;
    apply_ok(env, ns, "t-pol", "echo", "s/app.sock")?;
    wait_reason(env, ns, "t-pol", "Accepted", &[])?;
    Ok(())
}

/// Runs last: without the webhook, a policy over the budget is stored; the status says Invalid
/// and it never wins over a valid one. Invalid comes first: with or without its Service, and
/// whatever its rivals.
fn a_policy_admitted_without_the_webhook_is_invalid_and_never_wins(env: &Env) -> anyhow::Result<()> {
    env.cp.delete_webhook()?;
    let ns = "invalid";
    namespace(env, ns)?;
    service(env, ns, "echo")?;
    apply_ok(env, ns, "a-pol", "echo", "sockets/app1.sock")?;
    apply_ok(env, ns, "b-pol", "echo", "s/app.sock")?;
    wait_reason(env, ns, "a-pol", "Invalid", &["spec.udsSocket", "17 bytes", "the budget is 16 bytes"])?;
    wait_reason(env, ns, "b-pol", "Accepted", &[])?;

    // No Service "void": the invalid a-pol stays Invalid (not in effect), never wins, and the
    // valid ones compete as ever: b-pol in effect without the Service, c-pol Conflicted.
    let ns = "invalid-void";
    namespace(env, ns)?;
    apply_ok(env, ns, "a-pol", "void", "sockets/app1.sock")?;
    let a = wait_reason(env, ns, "a-pol", "Invalid", &["17 bytes"])?;
    ensure!(a.status == "False", "{a:?}");
    apply_ok(env, ns, "b-pol", "void", "s/app.sock")?;
    apply_ok(env, ns, "c-pol", "void", "s/app.sock")?;
    wait_reason(env, ns, "b-pol", "AcceptedWithoutService", &["ServiceAccount \"void\""])?;
    wait_reason(
        env,
        ns,
        "c-pol",
        "Conflicted",
        &["EndpointPolicy \"b-pol\" is in effect for pods running as ServiceAccount \"void\""],
    )?;
    wait_reason(env, ns, "a-pol", "Invalid", &[])?;
    let column = accepted_column(env, ns)?;
    ensure!(
        column
            == [
                ("a-pol".to_owned(), "False".to_owned()),
                ("b-pol".to_owned(), "True".to_owned()),
                ("c-pol".to_owned(), "False".to_owned())
            ],
        "kubectl get epol shows {column:?}"
    );
    service(env, ns, "void")?;
    wait_reason(env, ns, "b-pol", "Accepted", &[])?;
    wait_reason(env, ns, "c-pol", "Conflicted", &["EndpointPolicy \"b-pol\" is in effect for Service \"void\""])?;
    wait_reason(env, ns, "a-pol", "Invalid", &[])?;
    Ok(())
}

/// The page that shows `kubectl get epol` samples (docs/endpointpolicy.md, "Status").
const SAMPLES_PAGE: &str = "docs/endpointpolicy.md";

/// The `kubectl get epol` samples of [`SAMPLES_PAGE`] (blocks opening with
/// `$ kubectl get epol -n shop`, up to the closing fence): (command arguments, the printed lines).
fn doc_samples() -> anyhow::Result<Vec<(Vec<String>, Vec<String>)>> {
    let page = std::fs::read_to_string(aether_tests::repo_root().join(SAMPLES_PAGE))?;
    let mut samples = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if let Some(args) = line.strip_prefix("$ kubectl get epol -n shop") {
            let mut argv: Vec<String> = ["get", "epol", "-n", "shop"].map(String::from).to_vec();
            argv.extend(args.split_whitespace().map(String::from));
            let out = lines.by_ref().take_while(|l| !l.starts_with("```")).map(String::from).collect();
            samples.push((argv, out));
        }
    }
    ensure!(samples.len() == 2, "{SAMPLES_PAGE} has {} `$ kubectl get epol -n shop` samples, want 2", samples.len());
    Ok(samples)
}

/// kubectl's table as cells (columns are separated by at least two spaces), with each row's AGE
/// cell replaced by `<age>`.
fn table_cells(lines: &[String]) -> Vec<Vec<String>> {
    let cells =
        |l: &str| -> Vec<String> { l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect() };
    let header = lines.first().map(|l| cells(l)).unwrap_or_default();
    let age = header.iter().position(|h| h == "AGE");
    let mut rows: Vec<Vec<String>> = lines.iter().map(|l| cells(l)).collect();
    for row in rows.iter_mut().skip(1) {
        if let Some(cell) = age.and_then(|i| row.get_mut(i)) {
            *cell = "<age>".to_owned();
        }
    }
    rows
}

/// Runs after the webhook is gone (an over-budget policy is stored, so the sample shows every
/// reason): the `kubectl get epol` and `-o wide` samples of [`SAMPLES_PAGE`] are what kubectl prints for
/// them, up to AGE.
fn get_epol_samples_in_the_docs_are_what_kubectl_prints(env: &Env) -> anyhow::Result<()> {
    let ns = "shop";
    namespace(env, ns)?;
    service(env, ns, "echo")?;
    apply_ok(env, ns, "echo-uds", "echo", "uds/app.sock")?;
    apply_ok(env, ns, "echo-uds-v2", "echo", "sock/app.sock")?;
    apply_ok(env, ns, "echo-long", "echo", "sockets/app1.sock")?;
    apply_ok(env, ns, "grpc-api-uds", "grpc-api", "grpc/api.sock")?;
    wait_reason(env, ns, "echo-uds", "Accepted", &[])?;
    wait_reason(env, ns, "echo-uds-v2", "Conflicted", &[])?;
    wait_reason(env, ns, "echo-long", "Invalid", &[])?;
    wait_reason(env, ns, "grpc-api-uds", "AcceptedWithoutService", &[])?;
    for (argv, want) in doc_samples()? {
        let got: Vec<String> = env.cp.kubectl_ok(&argv)?.lines().map(String::from).collect();
        ensure!(
            table_cells(&got) == table_cells(&want),
            "{SAMPLES_PAGE}'s `kubectl {}` sample differs; kubectl printed:\n{}",
            argv.join(" "),
            got.join("\n")
        );
    }
    Ok(())
}

/// A metric, its labels, and how much it must at least have grown.
type Check<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

fn main() {
    suite::run(
        suite::cases![
            the_smallest_name_wins_in_both_orders_and_deleting_the_winner_promotes_the_next,
            a_policy_created_before_its_service_is_in_effect_without_it_and_with_it,
            a_conflict_for_a_missing_service_is_conflicted_for_the_loser,
            a_spec_change_is_observed_with_its_generation,
            kubectl_apply_prints_the_warnings,
            controller_metrics_parse_and_count_as_the_scenario_runs,
            a_second_replica_follows_and_takes_over_when_the_leader_stops,
            a_policy_admitted_without_the_webhook_is_invalid_and_never_wins,
            get_epol_samples_in_the_docs_are_what_kubectl_prints,
        ],
        setup,
        |_| String::new(),
    )
}

fn setup() -> anyhow::Result<Env> {
    let cp = ControlPlane::start()?;
    cp.install_crd()?;
    let controller = start_controller(&cp, "e2e-first")?;
    cp.register_webhook(&controller.url, &controller.ca_file)?;
    let port = admin_port(&controller)?;
    eventually("the controller to lead with synced caches", WAIT, || {
        let (_, body) = aether_tests::http_get(port, "/readyz", &[])?;
        Ok(body.contains("leading") && body.contains("endpointpolicies synced") && body.contains("services synced"))
    })
    .with_context(|| controller.log())?;
    Ok(Env { cp, controller: Mutex::new(controller), second: Mutex::new(None) })
}
