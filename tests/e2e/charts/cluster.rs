//! Against a real kube-apiserver: `notes_show_the_budget_the_contract_crate_computes`,
//! `notes_show_the_replica_count` and
//! `rendered_chart_is_accepted_by_a_real_api_server_and_rbac_is_least_privilege` (the rendered
//! chart applied to a real kube-apiserver with `kubectl auth can-i` checks per ServiceAccount).
//!
//! The tests that need an API server share one ([`ControlPlane::shared`]): the NOTES tests only
//! render (`helm install --dry-run=client`), so the chart the RBAC test applies cannot disturb
//! them.

use std::path::Path;
use std::process::{Command, Stdio};

use aether_crds::udspath::{Budget, DEFAULT_PODS_DIR, FIXED_BYTES, MAX_PODS_DIR_BYTES, SUN_PATH_MAX, SocketError};
use aether_tests::ControlPlane;

use crate::schema::mount_path_of;
use crate::template::{NS, RELEASE, chart, helm, try_render_text, try_render_text_with};

/// NOTES.txt repeats the budget arithmetic: for several mount paths, the numbers it prints (and
/// its over-budget sample value) are the ones `aether_crds::udspath::Budget` computes. NOTES are
/// rendered by `helm install --dry-run` only, which needs an API server to talk to.
pub(crate) fn notes_show_the_budget_the_contract_crate_computes() {
    let cp = ControlPlane::shared().expect("control plane");
    let longest = mount_path_of(MAX_PODS_DIR_BYTES);
    for mount in [DEFAULT_PODS_DIR, "/k", "/var/lib/k0s/kubelet/pods", longest.as_str()] {
        let out = Command::new(helm())
            .args(["install", RELEASE])
            .arg(chart("aether"))
            .args(["--namespace", NS, "--dry-run=client", "--kubeconfig"])
            .arg(cp.kubeconfig())
            .args(["--set", &format!("proxy.udsWorkloads.mountPath={mount}")])
            .stdin(Stdio::null())
            .output()
            .expect("running helm");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "helm install --dry-run {mount}: {}", String::from_utf8_lossy(&out.stderr));
        let notes =
            text.split_once("\nNOTES:\n").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES for {mount}: {text}"));
        let budget = Budget::new(mount).unwrap_or_else(|e| panic!("{mount}: {e}"));
        let line = format!(
            "Pods dir as the proxy sees it: {mount} -> socket value budget {} bytes ({SUN_PATH_MAX} - {} - {FIXED_BYTES}).",
            budget.bytes(),
            mount.len()
        );
        assert!(notes.contains(&line), "NOTES for {mount} lack {line:?}:\n{notes}");
        let expect = format!("... the budget is {} bytes.", budget.bytes());
        assert!(notes.contains(&expect), "NOTES for {mount} lack {expect:?}:\n{notes}");
        // The dry-run sample is exactly one byte over the budget, so the webhook denies it.
        let sample = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("udsSocket: "))
            .unwrap_or_else(|| panic!("no sample udsSocket in the NOTES for {mount}"));
        assert_eq!(sample.len(), budget.bytes() + 1, "{mount}: sample {sample:?}");
        assert!(matches!(budget.check(sample), Err(SocketError::TooLong { .. })), "{mount}: sample {sample:?}");
    }
}

/// NOTES.txt says how many controller replicas to expect (the value, not a fixed "2"), and with
/// one replica that no PodDisruptionBudget protects it.
pub(crate) fn notes_show_the_replica_count() {
    let cp = ControlPlane::shared().expect("control plane");
    for (replicas, count) in [(1, "1 replica)"), (2, "2 replicas)"), (3, "3 replicas)")] {
        let out = Command::new(helm())
            .args(["install", RELEASE])
            .arg(chart("aether"))
            .args(["--namespace", NS, "--dry-run=client", "--kubeconfig"])
            .arg(cp.kubeconfig())
            .args(["--set", &format!("controller.replicas={replicas}")])
            .stdin(Stdio::null())
            .output()
            .expect("running helm");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "helm install --dry-run {replicas}: {}", String::from_utf8_lossy(&out.stderr));
        let notes =
            text.split_once("\nNOTES:\n").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES for {replicas}: {text}"));
        let line = format!("2. The controller is ready ({count} and answers /readyz");
        assert!(notes.contains(&line), "NOTES for {replicas} replicas lack {line:?}:\n{notes}");
        let no_pdb = "With 1 replica no PodDisruptionBudget is rendered";
        assert_eq!(notes.contains(no_pdb), replicas == 1, "{replicas} replicas:\n{notes}");
    }
}

fn can_i(cp: &ControlPlane, sa: &str, args: &[&str]) -> bool {
    let who = format!("--as=system:serviceaccount:{NS}:{sa}");
    let mut all = vec!["auth", "can-i", who.as_str()];
    all.extend_from_slice(args);
    let out = cp.kubectl(&all).expect("kubectl runs");
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match said.as_str() {
        "yes" => true,
        "no" => false,
        _ => panic!("kubectl auth can-i {args:?}: {said} {}", String::from_utf8_lossy(&out.stderr)),
    }
}

fn apply_rendered(cp: &ControlPlane, dir: &Path, file: &str, text: &str, dry_run: bool) {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("writing rendered chart");
    let p = path.to_string_lossy().into_owned();
    let mut a = vec!["apply", "--server-side", "--field-manager=helm-test", "-f", p.as_str()];
    if dry_run {
        a.push("--dry-run=server");
    }
    cp.kubectl_ok(&a).unwrap_or_else(|e| panic!("server-side apply of {file} (dry run {dry_run}): {e:#}"));
}

pub(crate) fn rendered_chart_is_accepted_by_a_real_api_server_and_rbac_is_least_privilege() {
    let cp = ControlPlane::shared().expect("control plane");
    let tmp = tempfile::tempdir().expect("tempdir");
    let crds = try_render_text("aether-crds", &[]).expect("render aether-crds");
    apply_rendered(cp, tmp.path(), "crds.yaml", &crds, false);
    cp.kubectl_ok(&["create", "namespace", NS]).expect("namespace");
    cp.kubectl_ok(&["wait", "--for=condition=Established", "crd/endpointpolicies.config.aether.io", "--timeout=60s"])
        .expect("CRD established");

    for (file, sets) in [
        ("uds-off.yaml", &["proxy.udsWorkloads.enabled=false"][..]),
        ("short.yaml", &["proxy.udsWorkloads.mountPath=/k", "rbac.aggregateToDefaultRoles=false"][..]),
        // The NetworkPolicy is schema-checked here only: the real node's bridge CNI enforces none.
        (
            "netpol.yaml",
            &[
                "controller.networkPolicy.enabled=true",
                "controller.networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/8",
                "controller.networkPolicy.adminFrom[0].podSelector.matchLabels.app=prometheus",
            ][..],
        ),
        ("host-network.yaml", &["controller.hostNetwork=true", "controller.webhookPort=10260"][..]),
        (
            "provided.yaml",
            &[
                "webhook.certs.mode=provided",
                "webhook.certs.provided.secretName=t",
                "webhook.certs.provided.caBundle=Y2E=",
            ][..],
        ),
    ] {
        // --skip-tests: a dry run creates no ServiceAccount, and the test Pod's admission needs
        // its account to exist (the startup check Job is admitted without one).
        let text = try_render_text_with("aether", sets, &["--skip-tests"]).expect("render");
        apply_rendered(cp, tmp.path(), file, &text, true);
    }
    let skipped = try_render_text_with("aether", &[], &["--skip-tests"]).expect("render");
    apply_rendered(cp, tmp.path(), "defaults-skip-tests.yaml", &skipped, true);
    // Applied for real, in order: the test Pod's ServiceAccount exists before the Pod.
    let defaults = try_render_text("aether", &[]).expect("render");
    apply_rendered(cp, tmp.path(), "defaults.yaml", &defaults, false);

    let controller = "aether-controller";
    let yes: &[(&str, &[&str])] = &[
        (controller, &["list", "endpointpolicies.config.aether.io", "--all-namespaces"]),
        (controller, &["watch", "endpointpolicies.config.aether.io", "-n", "shop"]),
        (controller, &["patch", "endpointpolicies.config.aether.io", "--subresource=status", "-n", "shop"]),
        (controller, &["list", "services", "--all-namespaces"]),
        (controller, &["create", "events.events.k8s.io", "-n", "shop"]),
        (controller, &["create", "leases.coordination.k8s.io", "-n", NS]),
        (controller, &["update", "leases.coordination.k8s.io/aether-controller-status-writer", "-n", NS]),
        ("aether-node", &["list", "pods", "--all-namespaces"]),
        ("aether-node", &["watch", "pods", "--all-namespaces"]),
        ("aether-node", &["watch", "endpointpolicies.config.aether.io", "--all-namespaces"]),
        ("aether-node", &["create", "events.events.k8s.io", "-n", "shop"]),
        ("aether-node", &["get", "daemonsets.apps/aether-node", "-n", NS]),
        ("aether-node", &["watch", "daemonsets.apps/aether-node", "-n", NS]),
        ("aether-webhook-certs", &["create", "secrets", "-n", NS]),
        ("aether-webhook-certs", &["get", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs", &["update", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs", &["get", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        ("aether-webhook-certs", &["patch", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        ("aether-webhook-certs", &["update", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        ("aether-webhook-certs-cleanup", &["get", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["delete", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-verify-install", &["create", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["list", "pods", "-n", NS]),
        ("aether-verify-install-test", &["create", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install-test", &["list", "pods", "-n", NS]),
    ];
    let no: &[(&str, &[&str])] = &[
        (controller, &["update", "endpointpolicies.config.aether.io", "-n", "shop"]),
        (controller, &["delete", "endpointpolicies.config.aether.io", "-n", "shop"]),
        (controller, &["get", "secrets", "-n", NS]),
        (controller, &["list", "pods", "--all-namespaces"]),
        (controller, &["create", "leases.coordination.k8s.io", "-n", "default"]),
        (controller, &["update", "leases.coordination.k8s.io/kube-scheduler", "-n", NS]),
        (controller, &["patch", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        (controller, &["get", "services", "-n", "shop"]),
        (controller, &["patch", "leases.coordination.k8s.io/aether-controller-status-writer", "-n", NS]),
        (controller, &["create", "events", "-n", "shop"]),
        (controller, &["delete", "events.events.k8s.io", "-n", "shop"]),
        (controller, &["patch", "events.events.k8s.io", "-n", "shop"]),
        ("aether-node", &["get", "daemonsets.apps/aether-proxy", "-n", NS]),
        ("aether-node", &["list", "daemonsets.apps", "-n", NS]),
        ("aether-node", &["update", "daemonsets.apps/aether-node", "-n", NS]),
        ("aether-node", &["patch", "events.events.k8s.io", "-n", "shop"]),
        ("aether-node", &["create", "pods", "-n", "shop"]),
        ("aether-node", &["update", "pods", "-n", "shop"]),
        ("aether-node", &["delete", "pods", "-n", "shop"]),
        ("aether-node", &["create", "pods/exec", "-n", "shop"]),
        ("aether-node", &["get", "secrets", "--all-namespaces"]),
        ("aether-node", &["get", "secrets", "-n", NS]),
        ("aether-node", &["patch", "endpointpolicies.config.aether.io", "-n", "shop"]),
        ("aether-node", &["list", "services", "--all-namespaces"]),
        ("aether-node", &["create", "events", "-n", "shop"]),
        ("aether-node", &["list", "events.events.k8s.io", "-n", "shop"]),
        ("aether-webhook-certs", &["get", "secrets", "-n", "default"]),
        ("aether-webhook-certs", &["list", "secrets", "-n", NS]),
        ("aether-webhook-certs", &["get", "secrets/other", "-n", NS]),
        ("aether-webhook-certs", &["delete", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs", &["patch", "validatingwebhookconfigurations/someone-elses"]),
        ("aether-webhook-certs", &["update", "validatingwebhookconfigurations/someone-elses"]),
        ("aether-webhook-certs", &["create", "validatingwebhookconfigurations"]),
        ("aether-webhook-certs", &["list", "pods", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["delete", "secrets/other", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["list", "secrets", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["create", "secrets", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["update", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-verify-install", &["create", "endpointpolicies.config.aether.io", "-n", "shop"]),
        ("aether-verify-install", &["get", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["update", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["delete", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["list", "pods", "-n", "shop"]),
        ("aether-verify-install", &["get", "pods/proxy", "-n", NS]),
        ("aether-verify-install", &["create", "pods", "-n", NS]),
        ("aether-verify-install", &["get", "secrets", "-n", NS]),
        ("aether-verify-install-test", &["create", "endpointpolicies.config.aether.io", "-n", "shop"]),
        ("aether-verify-install-test", &["get", "pods/proxy", "-n", NS]),
        ("aether-verify-install-test", &["list", "pods", "-n", "shop"]),
    ];
    let mut wrong = Vec::new();
    for (sa, a) in yes {
        if !can_i(cp, sa, a) {
            wrong.push(format!("{sa} cannot {a:?}"));
        }
    }
    for (sa, a) in no {
        if can_i(cp, sa, a) {
            wrong.push(format!("{sa} can {a:?}"));
        }
    }
    assert!(wrong.is_empty(), "RBAC differs from what the chart promises:\n{}", wrong.join("\n"));

    // Turning UDS workloads off takes the agent's policy access away on upgrade.
    let off = try_render_text("aether", &["proxy.udsWorkloads.enabled=false"]).expect("render");
    apply_rendered(cp, tmp.path(), "uds-off.yaml", &off, false);
    assert!(!can_i(cp, "aether-node", &["list", "endpointpolicies.config.aether.io", "--all-namespaces"]));
    assert!(can_i(cp, "aether-node", &["list", "pods", "--all-namespaces"]));
}

/// One release per node (docs/install.md, "One release per cluster"): against a real
/// kube-apiserver of its own (so no other test's objects are seen), `helm install
/// --dry-run=server` (which runs the chart's `lookup`) of a second release fails naming the first
/// release's proxy DaemonSet and the value that skips the check, and passes with
/// `daemonset.allowOtherReleases=true`; the first release itself upgrades past its own
/// DaemonSet, also from another namespace (a `daemonset.namespace` move).
pub(crate) fn a_second_release_fails_naming_the_first() {
    let cp = ControlPlane::start().expect("a control plane of its own");
    let first = "aether-first";
    cp.kubectl_ok(&["create", "namespace", first]).expect("namespace");
    cp.kubectl_ok(&["create", "namespace", "aether-node-first"]).expect("namespace");
    // The proxy DaemonSet as `helm install first -n aether-first --set daemonset.namespace=aether-node-first` made it.
    let ds = format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: first-aether-proxy\n  namespace: aether-node-first\n  \
         labels: {{app.kubernetes.io/part-of: aether, app.kubernetes.io/component: proxy, app.kubernetes.io/instance: first}}\n  \
         annotations: {{meta.helm.sh/release-name: first, meta.helm.sh/release-namespace: {first}}}\n\
         spec:\n  selector: {{matchLabels: {{app: p}}}}\n  template:\n    metadata: {{labels: {{app: p}}}}\n    \
         spec: {{containers: [{{name: envoy, image: envoy}}]}}\n"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("ds.yaml"), ds).expect("writing the DaemonSet");
    cp.kubectl_ok(&["apply", "-f", &tmp.path().join("ds.yaml").to_string_lossy()])
        .expect("the first release's DaemonSet");

    let install = |release: &str, ns: &str, sets: &[&str]| {
        let mut cmd = Command::new(helm());
        cmd.args(["install", release]).arg(chart("aether"));
        cmd.args(["--namespace", ns, "--dry-run=server", "--kubeconfig"]).arg(cp.kubeconfig());
        for set in sets {
            cmd.args(["--set", set]);
        }
        let out = cmd.stdin(Stdio::null()).output().expect("running helm");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    let (ok, said) = install("second", "aether-second", &[]);
    println!("helm install second -n aether-second --dry-run=server: {said}");
    assert!(!ok, "a second release was not refused");
    for part in [
        "another aether release already runs node pods",
        "DaemonSet aether-node-first/first-aether-proxy belongs to release aether-first/first",
        "this is release aether-second/second",
        "daemonset.allowOtherReleases=true",
    ] {
        assert!(said.contains(part), "the refusal lacks {part:?}: {said}");
    }
    // The same release name in another namespace is another Helm release too.
    let (ok, said) = install("first", "aether-second", &[]);
    assert!(!ok && said.contains("this is release aether-second/first"), "release first in another namespace: {said}");

    let (ok, said) = install("second", "aether-second", &["daemonset.allowOtherReleases=true"]);
    assert!(ok, "daemonset.allowOtherReleases=true still refused: {said}");
    // The first release itself (a dry-run install stands for its upgrade: the same lookup), also
    // with its node side moving to another namespace.
    for sets in [&[][..], &["daemonset.namespace=aether-node-moved"][..]] {
        let (ok, said) = install("first", first, sets);
        assert!(ok, "the first release refused by its own DaemonSet ({sets:?}): {said}");
    }
}
