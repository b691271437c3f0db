//! Upgrades: `helm_upgrade_runs_every_chart_variant`,
//! `upgrade_with_a_broken_webhook_fails_through_the_startup_check`,
//! `socket_limit_filesystem_serves_a_path_past_sun_path_through_its_pin` and
//! `chart_values_at_their_edges_run_on_the_real_node`.
//!
//! What they prove: `helm upgrade` with other values runs (among them `socketLimit=filesystem` and
//! every bounded value at its schema edges), each time with every release pod Ready and no
//! restarts; and an upgrade that breaks the webhook fails through the startup check, naming the
//! webhook check, while the next good upgrade passes.

use std::time::Instant;

use aether_fixtures::{echo_app, policy};
use aether_tests::{eventually, http_get, repo_root};
use anyhow::{Context, bail, ensure};

use crate::env::{Env, NS, WAIT, check_release_settled, check_release_settled_with, uid, verify_install_objects};
use crate::install::verdict_lines;

/// An upgrade that breaks the webhook (a caBundle that did not sign its serving
/// certificate: the API server's TLS check fails) fails through the startup check Job, whose log
/// names the webhook check; the next good upgrade (its check reaching the agent through the API
/// server's pod proxy) passes and removes the failed Job.
pub(crate) fn upgrade_with_a_broken_webhook_fails_through_the_startup_check(env: &Env) -> anyhow::Result<()> {
    // The cluster's CA (base64 PEM, as a caBundle is given): a real CA, but not the one that
    // signed the webhook's certificate.
    let wrong = env.kube().ok(&[
        "config",
        "view",
        "--raw",
        "--flatten",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority-data}",
    ])?;
    ensure!(wrong.starts_with("LS0tLS1CRUdJTi"), "the kubeconfig's CA is base64 PEM: {wrong}");
    let bundle = format!("webhook.certs.provided.caBundle={wrong}");
    let started = Instant::now();
    let failed = env.helm_aether(
        "upgrade",
        &[
            "webhook.certs.mode=provided",
            "webhook.certs.provided.secretName=aether-webhook-tls",
            &bundle,
            "verifyInstall.timeoutSeconds=30",
        ],
    );
    let took = started.elapsed().as_secs();
    let err = match failed {
        Ok(out) => bail!("helm upgrade with a wrong caBundle passed: {out}"),
        Err(e) => format!("{e:#}"),
    };
    let log = env.kube().ok(&["logs", "-n", NS, "job/aether-verify-install"]).unwrap_or_default();
    println!(
        "helm upgrade with a wrong caBundle ({took} s):\n{err}\n--- startup check log\n{}",
        verdict_lines(&log).join("\n")
    );
    ensure!(err.contains("post-upgrade hooks failed") && err.contains("aether-verify-install"), "{err}");
    let fail = verdict_lines(&log).into_iter().find(|l| l.starts_with("FAIL ")).unwrap_or_default().to_owned();
    ensure!(
        fail.starts_with("FAIL webhook denies an over-budget policy")
            && fail.contains("endpointpolicies.config.aether.io"),
        "the startup check names the webhook check: {log}"
    );

    // The good upgrade's startup check reaches the agent through the API server's pod proxy this
    // time (verifyInstall.agentAccess=apiServerProxy): the upgrade passes only if that check does.
    env.helm_aether("upgrade", &["verifyInstall.agentAccess=apiServerProxy"])?;
    check_release_settled(env)?;
    let left = verify_install_objects(env, "jobs,pods")?;
    ensure!(left.is_empty(), "the good upgrade's startup check passed and took the failed Job away: {left}");
    Ok(())
}

/// Every other command line and path the chart can give a container, run on the node: a short
/// pods-dir mount path (both binaries' --kubelet-pods-dir), a host state dir, a CNI records dir,
/// plain logs; then UDS delivery disabled; then back to the defaults. Each is a `helm upgrade`.
pub(crate) fn helm_upgrade_runs_every_chart_variant(env: &Env) -> anyhow::Result<()> {
    let pod = env.pod_json("default", "web")?;
    let web_uid = uid(&pod)?;
    env.helm_aether(
        "upgrade",
        &[
            "proxy.udsWorkloads.mountPath=/k",
            "agent.stateDir=/var/lib/aether/agent",
            "agent.cniRecordsDir=/run/aether-cni",
            "agent.criSocket=",
            "logFormat=plain",
            "proxy.logLevel=debug",
        ],
    )?;
    check_release_settled(env)?;
    // The agent reads the pods dir at /k; Envoy still dials the pin.
    env.wait_pinned("app_default_web_8080", &web_uid, &env.socket_path(&web_uid, "s", "app.sock"))?;

    env.helm_aether("upgrade", &["proxy.udsWorkloads.enabled=false"])?;
    check_release_settled(env)?;
    eventually("web delivered over TCP (in its netns) with UDS disabled", WAIT, || {
        Ok(env.endpoint("app_default_web_8080")?.is_some_and(|(a, _)| a == "127.0.0.1:8080"))
    })?;

    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    env.wait_pinned("app_default_web_8080", &web_uid, &env.socket_path(&web_uid, "s", "app.sock"))?;
    Ok(())
}

/// `socketLimit=filesystem` in both charts (off by default): a pod whose kubelet
/// socket path is past sun_path (a 50-byte volume name: 150 bytes) is served through its pin,
/// the webhook admits a policy value the default CRD refuses, and the defaults come back.
pub(crate) fn socket_limit_filesystem_serves_a_path_past_sun_path_through_its_pin(env: &Env) -> anyhow::Result<()> {
    let crds = aether_tests::node::packaged_chart("aether-crds")?;
    let crds = crds.to_str().context("path")?;
    let volume = format!("v{}", "x".repeat(49));
    let long_policy =
        policy("default", "long-socket").target("longsock").socket(&format!("{volume}/app.sock")).manifest();
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), &long_policy)?;
    let dry_run = || -> anyhow::Result<(bool, String)> {
        let out =
            env.kube().run(&["apply".as_ref(), "--dry-run=server".as_ref(), "-f".as_ref(), file.path().as_os_str()])?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), text))
    };
    let (ok, text) = dry_run()?;
    ensure!(!ok && text.contains("udsSocket"), "the default CRD refuses a 59-byte value: {text}");

    env.node.helm(&["upgrade", "aether-crds", crds, "--set", "socketLimit=filesystem", "--wait"])?;
    env.helm_aether("upgrade", &["socketLimit=filesystem"])?;
    check_release_settled(env)?;
    let (ok, text) = dry_run()?;
    ensure!(ok, "with socketLimit=filesystem the webhook admits a 59-byte value: {text}");

    env.kube().apply(&echo_app("longsock").socket_volume(&volume).annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "longsock")?;
    let path = env.socket_path(&uid(&pod)?, &volume, "app.sock");
    let bytes = path.as_os_str().len();
    ensure!(bytes > 107, "the kubelet's socket path is past sun_path: {bytes} bytes");
    env.wait_pinned("app_default_longsock_8080", &uid(&pod)?, &path)?;
    println!("socketLimit=filesystem: a {bytes}-byte socket path served through its pin");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "longsock", "--wait"])?;

    env.node.helm(&["upgrade", "aether-crds", crds, "--reset-values", "--wait"])?;
    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    let (ok, _) = dry_run()?;
    ensure!(!ok, "back on the defaults the 59-byte value is refused again");
    Ok(())
}

/// The chart runs with every bounded integer value at an edge of its schema bounds
/// (tests/e2e/charts/schema.rs checks each renders there and is refused one past it): one upgrade with
/// the minimums, one with the defaults, one with the maximums (two ports that must differ take
/// opposite edges, so the minimums' Envoy port becomes the maximums' agent port: the defaults in
/// between let the old Envoy go first), then the defaults again. Each time every release pod is Ready with no restarts, the webhook answers through
/// its Service, and the agent's metrics show the cap it was given. A changed
/// `proxy.handOver.baseId` is a cold replacement of Envoy (the launcher logs why). Rendered only:
/// `proxy.adminPort` (only the launcher's look for a release-0.10.0 Envoy reads it) and the maximum
/// `proxy.handOver.parentShutdownSeconds` and `successorWaitSeconds` (the replaced pod would
/// stay Terminating for up to 70 minutes).
pub(crate) fn chart_values_at_their_edges_run_on_the_real_node(env: &Env) -> anyhow::Result<()> {
    let denied_through_the_service = || -> anyhow::Result<()> {
        let example = repo_root().join("crds/examples/deny-over-budget.yaml");
        let out =
            env.kube().run(&["apply", "-n", "default", "--dry-run=server", "-f", example.to_str().context("path")?])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && stderr.contains("the budget is 16 bytes"), "webhook answer: {stderr}");
        Ok(())
    };
    let clusters_max = |port: u16, want: &str| -> anyhow::Result<()> {
        eventually(&format!("aether_agent_clusters_max {want} on the agent's admin port {port}"), WAIT, || {
            Ok(http_get(port, "/metrics", &[])
                .is_ok_and(|(_, m)| m.lines().any(|l| l == format!("aether_agent_clusters_max {want}"))))
        })
    };
    let min = [
        "controller.replicas=1",
        "controller.webhookPort=1024",
        "controller.adminPort=65535",
        "controller.maxBodyBytes=65536",
        "controller.listeners.webhook.maxConnections=1",
        "controller.listeners.webhook.handshakeTimeoutSeconds=1",
        "controller.listeners.webhook.idleTimeoutSeconds=1",
        "controller.listeners.admin.maxConnections=4",
        "controller.listeners.admin.firstByteTimeoutSeconds=1",
        "controller.listeners.admin.idleTimeoutSeconds=1",
        "webhook.timeoutSeconds=1",
        "webhook.certs.job.backoffLimit=0",
        "webhook.certs.job.activeDeadlineSeconds=30",
        "agent.adminPort=1024",
        "agent.recheckSeconds=1",
        "agent.maxClusters=2",
        "agent.inbound.maxConnections=1",
        "agent.inbound.idleTimeoutSeconds=1",
        "agent.listeners.admin.maxConnections=4",
        "agent.listeners.admin.firstByteTimeoutSeconds=1",
        "agent.listeners.admin.idleTimeoutSeconds=1",
        "agent.listeners.xds.maxConnections=2",
        "agent.listeners.xds.firstByteTimeoutSeconds=1",
        "agent.listeners.xds.keepaliveIntervalSeconds=1",
        "agent.listeners.xds.keepaliveTimeoutSeconds=1",
        "agent.watchGraceSeconds=0",
        "proxy.readinessPort=65535",
        "proxy.stats.port=0",
        "proxy.concurrency=1",
        "proxy.handOver.baseId=1",
        "proxy.handOver.parentShutdownSeconds=1",
        "proxy.handOver.successorWaitSeconds=0",
        "verifyInstall.timeoutSeconds=30",
        "daemonset.minReadySeconds=0",
    ];
    env.helm_aether("upgrade", &min)?;
    check_release_settled_with(env, 3)?;
    denied_through_the_service()?;
    clusters_max(1024, "2")?;
    // Through the defaults: the maximums put the agent's admin on 65535, where the minimums' Envoy
    // keeps its readiness listener until the next Envoy has taken over.
    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;

    let max = [
        "controller.webhookPort=65535",
        "controller.adminPort=1024",
        "controller.listeners.webhook.maxConnections=65536",
        "controller.listeners.webhook.handshakeTimeoutSeconds=3600",
        "controller.listeners.webhook.idleTimeoutSeconds=3600",
        "controller.listeners.admin.maxConnections=65536",
        "controller.listeners.admin.firstByteTimeoutSeconds=3600",
        "controller.listeners.admin.idleTimeoutSeconds=3600",
        "webhook.timeoutSeconds=10",
        "agent.adminPort=65535",
        "agent.maxClusters=200000",
        "agent.inbound.maxConnections=1000000",
        "agent.inbound.idleTimeoutSeconds=86400",
        "proxy.overload.maxConnections=10000000",
        "agent.listeners.admin.maxConnections=65536",
        "agent.listeners.admin.firstByteTimeoutSeconds=3600",
        "agent.listeners.admin.idleTimeoutSeconds=3600",
        "agent.listeners.xds.maxConnections=65536",
        "agent.listeners.xds.firstByteTimeoutSeconds=3600",
        "agent.listeners.xds.keepaliveIntervalSeconds=3600",
        "agent.listeners.xds.keepaliveTimeoutSeconds=3600",
        "agent.watchGraceSeconds=86400",
        "proxy.readinessPort=1024",
        "proxy.stats.port=65534",
        "proxy.stats.maxScrapesPerMinute=1200",
        "proxy.concurrency=64",
        "proxy.handOver.baseId=400000000",
        "verifyInstall.timeoutSeconds=1800",
    ];
    env.helm_aether("upgrade", &max)?;
    check_release_settled(env)?;
    denied_through_the_service()?;
    clusters_max(65535, "200000")?;
    let node_ip = env.node.facts().node_ip.clone();
    eventually("Envoy's stats listener answers on port 65534", WAIT, || {
        Ok(reqwest::blocking::get(format!("http://{node_ip}:65534/stats/prometheus")).is_ok_and(|r| r.status() == 200))
    })?;
    let web = uid(&env.pod_json("default", "web")?)?;
    env.wait_pinned("app_default_web_8080", &web, &env.socket_path(&web, "s", "app.sock"))?;

    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    denied_through_the_service()?;
    env.wait_pinned("app_default_web_8080", &web, &env.socket_path(&web, "s", "app.sock"))?;
    Ok(())
}
