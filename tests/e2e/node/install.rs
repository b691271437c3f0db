//! The install: `install_brings_every_release_pod_ready`,
//! `installed_webhook_denies_an_over_budget_policy_with_the_arithmetic`,
//! `helm_test_passes_and_fails_naming_the_webhook_when_its_service_is_broken` and
//! `release_containers_have_no_restarts_two_minutes_after_install`.
//!
//! What they prove: the chart's containers run as configured (command lines, paths, probes) with
//! no restarts; the installed webhook is reached through its Service; `helm install --wait
//! --wait-for-jobs` runs the startup check (`aether-controller verify-install`) and `helm test`
//! passes, while `helm test` fails, naming the webhook check, when the webhook is broken.

use std::time::{Duration, Instant};

use aether_tests::{eventually, http_get, repo_root};
use anyhow::{Context, ensure};

use crate::env::{Env, NS, RELEASE, WAIT, check_release_settled, is_ready, pod_name, restarts, verify_install_objects};

pub(crate) fn install_brings_every_release_pod_ready(env: &Env) -> anyhow::Result<()> {
    let pods = env.release_pods()?;
    let mut kinds: Vec<&str> =
        pods.iter().filter_map(|p| p["metadata"]["labels"]["app.kubernetes.io/component"].as_str()).collect();
    kinds.sort();
    ensure!(kinds == ["controller", "controller", "node", "proxy"], "release pods by component: {kinds:?}");
    // helm --wait is not enough for the DaemonSet: with maxUnavailable 1 on a one-node cluster it
    // accepts 0 Ready node pods. So wait (bounded) until every release pod is Ready.
    let mut not_ready = Vec::new();
    eventually("every release pod Ready", WAIT, || {
        not_ready = env.release_pods()?.iter().filter(|p| !is_ready(p)).map(|p| pod_name(p).to_owned()).collect();
        Ok(not_ready.is_empty())
    })
    .with_context(|| format!("not Ready: {not_ready:?}"))?;
    println!(
        "kubectl get pods -A -o wide after helm install:\n{}",
        env.kube().ok(&["get", "pods", "-A", "-o", "wide"])?
    );
    // The node pod really is on the host network and Envoy's readiness listener answers.
    let (code, _) = http_get(9902, "/ready", &[])?;
    ensure!(code == 200, "Envoy /ready on the readiness listener: {code}");
    Ok(())
}

pub(crate) fn installed_webhook_denies_an_over_budget_policy_with_the_arithmetic(env: &Env) -> anyhow::Result<()> {
    let example = repo_root().join("crds/examples/deny-over-budget.yaml");
    let out = env.kube().run(&["apply", "-n", "default", "-f", example.to_str().context("path")?])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "over-budget policy was admitted: {}", String::from_utf8_lossy(&out.stdout));
    for want in ["denied the request", "17 bytes", "the budget is 16 bytes", "/var/lib/kubelet/pods"] {
        ensure!(stderr.contains(want), "denial lacks {want:?}: {stderr}");
    }
    // And a valid one is admitted through the same Service.
    let ok = repo_root().join("crds/examples/ok-echo-uds.yaml");
    env.kube().ok(&["apply", "-n", "default", "--dry-run=server", "-f", ok.to_str().context("path")?])?;
    Ok(())
}

/// `helm test` of the release: (passed, helm's output, the test Pod's log). The Pod is deleted
/// when it passes (hook-delete-policy hook-succeeded), so its log is read while it runs.
fn helm_test(env: &Env) -> anyhow::Result<(bool, String, String)> {
    let mut log = String::new();
    let result = std::thread::scope(|scope| {
        let test = scope.spawn(|| env.node.helm(&["test", RELEASE, "-n", NS, "--timeout", "120s"]));
        // `kubectl logs -f` ends with the container; the Pod may not exist yet at first.
        let started = Instant::now();
        while started.elapsed() < WAIT && !test.is_finished() {
            if let Ok(out) = env.kube().run(&["logs", "-n", NS, "-f", "pod/aether-verify-install-test"]) {
                let text = String::from_utf8_lossy(&out.stdout);
                if out.status.success() && text.contains("checks passed") {
                    log = text.into_owned();
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        test.join().map_err(|_| anyhow::anyhow!("helm test thread panicked"))
    })?;
    Ok(match result {
        Ok(out) => (true, out, log),
        Err(e) => {
            if log.is_empty() {
                log = env.kube().ok(&["logs", "-n", NS, "pod/aether-verify-install-test"]).unwrap_or_default();
            }
            (false, format!("{e:#}"), log)
        }
    })
}

/// Only the PASS/FAIL lines and the summary of a verify-install log (its JSON log lines, the
/// retries, are left out).
pub(crate) fn verdict_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL ") || l.starts_with("verify-install:"))
        .collect()
}

/// The install passed its startup check (setup's `helm install --wait
/// --wait-for-jobs` would have failed otherwise, and the Job is gone: it passed); `helm test`
/// passes, with a PASS line for both webhook checks and for the node's agent; with the webhook's
/// Service pointed at no pod, `helm test` fails and its log names the webhook check and the
/// webhook; restored, it passes again and leaves no hook object behind.
pub(crate) fn helm_test_passes_and_fails_naming_the_webhook_when_its_service_is_broken(
    env: &Env,
) -> anyhow::Result<()> {
    let left = verify_install_objects(env, "jobs,pods")?;
    ensure!(left.is_empty(), "the startup check passed, so its Job is deleted: {left}");
    let (ok, out, log) = helm_test(env)?;
    println!("helm test (installed):\n{out}\n--- verify-install log\n{}", verdict_lines(&log).join("\n"));
    ensure!(ok, "helm test failed on a good install: {out}\n{log}");
    let lines = verdict_lines(&log);
    ensure!(lines.len() == 6, "2 webhook checks, 2 DaemonSets, 1 agent and the summary: {lines:#?}");
    ensure!(
        lines[0].starts_with("PASS webhook denies an over-budget policy")
            && lines[0].contains("admission webhook \"endpointpolicies.config.aether.io\" denied the request"),
        "{lines:#?}"
    );
    ensure!(lines[1].starts_with("PASS webhook admits a valid policy"), "{lines:#?}");
    for (line, ds) in [(&lines[2], "aether-node"), (&lines[3], "aether-proxy")] {
        ensure!(*line == format!("PASS DaemonSet {ds} has a pod on each of its nodes: 1 of 1"), "{lines:#?}");
    }
    ensure!(lines[4].starts_with("PASS agent aether-node-") && lines[4].contains(":9091/readyz: 200 OK"), "{lines:#?}");
    ensure!(lines[5] == "verify-install: 5 of 5 checks passed", "{lines:#?}");

    // Break the webhook: its Service selects no pod.
    let patch = |component: &str| {
        let p = format!(r#"{{"spec":{{"selector":{{"app.kubernetes.io/component":"{component}"}}}}}}"#);
        env.kube().ok(&["patch", "service", "-n", NS, "aether-controller", "-p", &p])
    };
    patch("broken-on-purpose")?;
    // The API server keeps its HTTP/2 connection to a webhook pod, which conntrack keeps routing
    // whatever the Service selects: replace the controller pods so that only new connections,
    // which meet the Service with no endpoints, are left.
    let broken = env
        .kube()
        .ok(&["delete", "pods", "-n", NS, "-l", "app.kubernetes.io/component=controller", "--wait=true"])
        .and_then(|_| {
            let example = repo_root().join("crds/examples/deny-over-budget.yaml");
            let example = example.to_str().context("path")?;
            eventually("the API server cannot call the webhook", WAIT, || {
                let out = env.kube().run(&["apply", "-n", "default", "--dry-run=server", "-f", example])?;
                Ok(String::from_utf8_lossy(&out.stderr).contains("failed calling webhook"))
            })
        })
        .and_then(|_| helm_test(env));
    patch("controller")?;
    let (ok, out, log) = broken?;
    println!("helm test (webhook Service broken):\n{out}\n--- verify-install log\n{}", verdict_lines(&log).join("\n"));
    ensure!(!ok, "helm test passed with the webhook's Service selecting no pod: {out}");
    ensure!(out.contains("pod aether-verify-install-test failed"), "helm names the failed test: {out}");
    let fail = verdict_lines(&log).into_iter().find(|l| l.starts_with("FAIL ")).unwrap_or_default().to_owned();
    ensure!(
        fail.starts_with("FAIL webhook denies an over-budget policy")
            && fail.contains("failed calling webhook \"endpointpolicies.config.aether.io\""),
        "the first failure names the webhook check and the webhook: {log}"
    );
    ensure!(log.contains("PASS agent aether-node-"), "the agents are still checked: {log}");

    check_release_settled(env)?;
    let mut last = String::new();
    eventually("helm test passes again with the Service restored", WAIT, || {
        let (ok, out, log) = helm_test(env)?;
        last = format!("{out}\n{log}");
        Ok(ok)
    })
    .with_context(|| format!("last: {last}"))?;
    let left = verify_install_objects(env, "pods,serviceaccounts,roles,rolebindings")?;
    ensure!(left.is_empty(), "a passed helm test leaves no hook object: {left}");
    Ok(())
}

pub(crate) fn release_containers_have_no_restarts_two_minutes_after_install(env: &Env) -> anyhow::Result<()> {
    let settle = Duration::from_secs(120).saturating_sub(env.installed_at.elapsed());
    std::thread::sleep(settle);
    let pods = env.release_pods()?;
    for p in &pods {
        for (c, r) in restarts(p) {
            ensure!(r == 0, "{}/{c} restarted {r} times: {}", pod_name(p), p["status"]["containerStatuses"]);
        }
    }
    println!(
        "{} s after install, restart counts: {:?}",
        env.installed_at.elapsed().as_secs(),
        pods.iter().map(|p| (pod_name(p).to_owned(), restarts(p))).collect::<Vec<_>>()
    );
    Ok(())
}
