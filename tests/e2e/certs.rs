//! `aether-webhook-certs bootstrap` (the chart's cert hook Job) against a real kube-apiserver:
//! it creates the Secret once, reuses it on the next run (an upgrade), keeps `caBundle` equal
//! to the Secret's `ca.crt` after every run (also after a re-render blanked it), and succeeds
//! with a message when the webhook configuration does not exist yet (pre-install).
//! `aether-webhook-certs cleanup` (the post-delete Job) deletes the Secret bootstrap created,
//! with no more RBAC than `get` + `delete` on it, and leaves a Secret of that name it did not.
//!
//! The tests share one control plane ([`ControlPlane::shared`]) and run side by side: each has
//! its own namespace and its own webhook configuration ([`Case`]).

use std::process::Command;

use aether_tests::{ControlPlane, workspace_bin};
use anyhow::{Context, ensure};

const SECRET: &str = "aether-webhook-tls";

/// One test's objects on the shared control plane: its namespace (the Secret, the cleanup
/// Role) and its webhook configuration (cluster-scoped), named after the test, so tests running
/// side by side never touch each other's.
struct Case {
    cp: &'static ControlPlane,
    /// The namespace, `certs-<tag>` (created).
    ns: String,
    /// The ValidatingWebhookConfiguration's name, `aether-certs-e2e-<tag>` (not created).
    vwc: String,
}

impl Case {
    fn new(tag: &str) -> anyhow::Result<Case> {
        let case =
            Case { cp: ControlPlane::shared()?, ns: format!("certs-{tag}"), vwc: format!("aether-certs-e2e-{tag}") };
        case.cp.kubectl_ok(&["create", "namespace", &case.ns])?;
        Ok(case)
    }
}

fn bootstrap(c: &Case) -> anyhow::Result<String> {
    let out = Command::new(workspace_bin("aether-webhook-certs")?)
        .args(["bootstrap", "--namespace", &c.ns, "--secret-name", SECRET, "--service-name", "aether-webhook"])
        .args(["--webhook-config-name", &c.vwc, "--validity-days", "365"])
        .env("KUBECONFIG", c.cp.kubeconfig())
        .output()
        .context("running aether-webhook-certs")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "bootstrap failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    Ok(stdout)
}

/// (resourceVersion, tls.crt, ca.crt) of the Secret, base64 as stored.
fn secret(c: &Case) -> anyhow::Result<(String, String, String)> {
    let get =
        |path: &str| c.cp.kubectl_ok(&["get", "secret", "-n", &c.ns, SECRET, "-o", &format!("jsonpath={{{path}}}")]);
    Ok((get(".metadata.resourceVersion")?, get(".data.tls\\.crt")?, get(".data.ca\\.crt")?))
}

/// `caBundle` of each webhook of the configuration (base64).
fn ca_bundles(c: &Case) -> anyhow::Result<Vec<String>> {
    let out = c.cp.kubectl_ok(&[
        "get",
        "validatingwebhookconfiguration",
        &c.vwc,
        "-o",
        "jsonpath={range .webhooks[*]}{.clientConfig.caBundle}{\"\\n\"}{end}",
    ])?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// `kubectl replace` (a full re-render, as an upgrade writes the object from its template).
fn replace(c: &Case, yaml: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("vwc.yaml");
    std::fs::write(&f, yaml)?;
    c.cp.kubectl_ok(&["replace".as_ref(), "-f".as_ref(), f.as_os_str()])?;
    Ok(())
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn webhook_config(c: &Case, ca_bundle: &str) -> String {
    // Two webhooks on a group nothing uses, so the configuration never sits in anyone's way.
    let hook = |name: &str| {
        format!(
            "- name: {name}\n  admissionReviewVersions: [v1]\n  sideEffects: None\n  failurePolicy: Ignore\n  clientConfig:\n    url: https://127.0.0.1:1/validate\n    caBundle: \"{ca_bundle}\"\n  rules:\n  - apiGroups: [example.invalid]\n    apiVersions: [v1]\n    operations: [CREATE]\n    resources: [widgets]\n"
        )
    };
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: {}\nwebhooks:\n{}{}",
        c.vwc,
        hook("one.certs.aether.io"),
        hook("two.certs.aether.io")
    )
}

fn assert_bundles_match(c: &Case, ca: &str) -> anyhow::Result<()> {
    let bundles = ca_bundles(c)?;
    ensure!(bundles.len() == 2, "expected two webhooks, got {bundles:?}");
    ensure!(bundles.iter().all(|b| b == ca), "caBundle {bundles:?} != the Secret's ca.crt {ca}");
    Ok(())
}

#[test]
fn bootstrap_twice_creates_the_secret_once_and_keeps_ca_bundle_matching() -> anyhow::Result<()> {
    let c = Case::new("twice")?;
    let (cp, ns) = (c.cp, c.ns.as_str());
    cp.apply(&webhook_config(&c, ""))?;
    ensure!(ca_bundles(&c)?.iter().all(String::is_empty), "starts with an empty caBundle");

    let first = bootstrap(&c)?;
    ensure!(first.contains("created"), "first run: {first}");
    ensure!(first.contains("caBundle set on 2 webhook(s)"), "first run: {first}");
    let (rv1, crt1, ca1) = secret(&c)?;
    ensure!(!ca1.is_empty() && !crt1.is_empty());
    assert_bundles_match(&c, &ca1)?;
    let ty = cp.kubectl_ok(&["get", "secret", "-n", ns, SECRET, "-o", "jsonpath={.type}"])?;
    ensure!(ty == "kubernetes.io/tls", "Secret type {ty}");

    // The upgrade: the Job runs again and finds everything in place.
    let second = bootstrap(&c)?;
    ensure!(second.contains("reused"), "second run: {second}");
    ensure!(second.contains("already equals"), "second run: {second}");
    let (rv2, crt2, ca2) = secret(&c)?;
    ensure!(rv1 == rv2 && crt1 == crt2 && ca1 == ca2, "the second run must not rewrite the Secret");
    assert_bundles_match(&c, &ca2)?;

    // An upgrade re-renders the configuration from its template (here: a stale CA); the
    // post-upgrade run puts the Secret's CA back without touching the Secret.
    let stale = aether_webhook_certs::mint(&["stale.example".to_owned()])?;
    replace(&c, &webhook_config(&c, &base64(stale.ca_pem.as_bytes())))?;
    ensure!(ca_bundles(&c)?.iter().all(|b| *b != ca1), "the re-render replaced caBundle");
    let third = bootstrap(&c)?;
    ensure!(third.contains("reused") && third.contains("caBundle set on 2"), "third run: {third}");
    ensure!(secret(&c)?.0 == rv1, "the Secret is still the first one");
    assert_bundles_match(&c, &ca1)?;

    // A pre-install run: no configuration yet. It succeeds and says so.
    cp.kubectl_ok(&["delete", "validatingwebhookconfiguration", &c.vwc])?;
    let pre = bootstrap(&c)?;
    ensure!(pre.contains("does not exist yet"), "pre-install run: {pre}");
    ensure!(secret(&c)?.0 == rv1);
    Ok(())
}

#[test]
fn bootstrap_re_mints_a_secret_that_lacks_a_service_name() -> anyhow::Result<()> {
    let c = Case::new("remint")?;
    let (cp, ns) = (c.cp, c.ns.as_str());
    let dir = tempfile::tempdir()?;
    // A certificate for another Service's names only.
    let stale = aether_webhook_certs::mint(&["other.aether-system.svc".to_owned()])?;
    aether_webhook_certs::write_dir(&stale, dir.path())?;
    let p = |f: &str| dir.path().join(f).display().to_string();
    cp.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        SECRET,
        "-n",
        ns,
        "--type=kubernetes.io/tls",
        &format!("--from-file=tls.crt={}", p("tls.crt")),
        &format!("--from-file=tls.key={}", p("tls.key")),
        &format!("--from-file=ca.crt={}", p("ca.crt")),
    ])?;
    cp.apply(&webhook_config(&c, ""))?;
    let out = bootstrap(&c)?;
    ensure!(out.contains("re-minted") && out.contains(&format!("aether-webhook.{ns}.svc")), "run: {out}");
    let (_, _, ca) = secret(&c)?;
    assert_bundles_match(&c, &ca)?;
    ensure!(bootstrap(&c)?.contains("reused"));
    Ok(())
}

/// Runs `cleanup` in namespace `ns` with `kubeconfig`, whatever its exit code.
fn cleanup_with(ns: &str, kubeconfig: &std::path::Path) -> anyhow::Result<std::process::Output> {
    Command::new(workspace_bin("aether-webhook-certs")?)
        .args(["cleanup", "--namespace", ns, "--secret-name", SECRET])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .context("running aether-webhook-certs cleanup")
}

/// `cleanup` as admin; must succeed; its stdout.
fn cleanup(c: &Case) -> anyhow::Result<String> {
    let out = cleanup_with(&c.ns, &c.cp.kubeconfig())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "cleanup failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    Ok(stdout)
}

fn secret_exists(c: &Case) -> anyhow::Result<bool> {
    let out = c.cp.kubectl(&["get", "secret", "-n", &c.ns, SECRET, "--ignore-not-found", "-o", "name"])?;
    ensure!(out.status.success(), "kubectl get secret: {}", String::from_utf8_lossy(&out.stderr));
    Ok(!String::from_utf8_lossy(&out.stdout).trim().is_empty())
}

#[test]
fn cleanup_deletes_the_secret_bootstrap_created_with_get_and_delete_only() -> anyhow::Result<()> {
    let c = Case::new("cleanup")?;
    let (cp, ns) = (c.cp, c.ns.as_str());
    bootstrap(&c)?;
    let label = cp.kubectl_ok(&[
        "get",
        "secret",
        "-n",
        ns,
        SECRET,
        "-o",
        "jsonpath={.metadata.labels.app\\.kubernetes\\.io/managed-by}",
    ])?;
    ensure!(label == "aether-webhook-certs", "bootstrap's label: {label:?}");

    // The post-delete Job's ServiceAccount (impersonated), first with get only: the delete is
    // refused, the Job fails naming the Secret and the cause, and the Secret stays.
    let sa = "certs-cleanup";
    cp.kubectl_ok(&["create", "serviceaccount", "-n", ns, sa])?;
    let role = |verbs: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {sa}, namespace: {ns}}}\nrules:\n- apiGroups: [\"\"]\n  resources: [secrets]\n  resourceNames: [{SECRET}]\n  verbs: [{verbs}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {sa}, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {sa}}}\nsubjects:\n- {{kind: ServiceAccount, name: {sa}, namespace: {ns}}}\n"
        )
    };
    cp.apply(&role("get"))?;
    let dir = tempfile::tempdir()?;
    let as_sa = dir.path().join("kubeconfig");
    let admin = std::fs::read_to_string(cp.kubeconfig())?;
    ensure!(admin.contains("\n  user:\n"), "unexpected kubeconfig layout:\n{admin}");
    std::fs::write(
        &as_sa,
        admin.replace("\n  user:\n", &format!("\n  user:\n    as: system:serviceaccount:{ns}:{sa}\n")),
    )?;
    aether_tests::eventually("cleanup to fail on the delete", std::time::Duration::from_secs(30), || {
        let out = cleanup_with(ns, &as_sa)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "cleanup with get only succeeded: {}", String::from_utf8_lossy(&out.stdout));
        Ok(stderr.contains(&format!("deleting Secret {ns}/{SECRET}")) && stderr.contains("forbidden"))
    })?;
    ensure!(secret_exists(&c)?, "a failed cleanup keeps the Secret");

    // get + delete by resourceNames (the RBAC the module documents) is enough.
    cp.apply(&role("get, delete"))?;
    aether_tests::eventually("cleanup to delete the Secret", std::time::Duration::from_secs(30), || {
        let out = cleanup_with(ns, &as_sa)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        Ok(out.status.success() && stdout.contains("deleted"))
    })?;
    ensure!(!secret_exists(&c)?, "cleanup deleted the Secret");

    // The Job's retry (or a second uninstall) finds nothing to do.
    let again = cleanup_with(ns, &as_sa)?;
    let stdout = String::from_utf8_lossy(&again.stdout);
    ensure!(again.status.success() && stdout.contains("nothing to do"), "second cleanup: {stdout}");
    Ok(())
}

#[test]
fn cleanup_leaves_a_foreign_secret_of_the_same_name() -> anyhow::Result<()> {
    let c = Case::new("foreign")?;
    let (cp, ns) = (c.cp, c.ns.as_str());
    // The user's own Secret under the name (no label), with a certificate for other names.
    let dir = tempfile::tempdir()?;
    let theirs = aether_webhook_certs::mint(&["other.aether-system.svc".to_owned()])?;
    aether_webhook_certs::write_dir(&theirs, dir.path())?;
    let p = |f: &str| dir.path().join(f).display().to_string();
    cp.kubectl_ok(&[
        "create",
        "secret",
        "tls",
        SECRET,
        "-n",
        ns,
        &format!("--cert={}", p("tls.crt")),
        &format!("--key={}", p("tls.key")),
    ])?;
    let rv = secret(&c)?.0;
    let out = cleanup(&c)?;
    ensure!(out.contains("not ours, left in place"), "cleanup: {out}");
    ensure!(secret(&c)?.0 == rv, "cleanup left the foreign Secret untouched");

    // Bootstrap re-mints it (it lacks the Service names) but does not claim it: still left.
    ensure!(bootstrap(&c)?.contains("re-minted"));
    let out = cleanup(&c)?;
    ensure!(out.contains("not ours, left in place"), "cleanup after bootstrap: {out}");
    ensure!(secret_exists(&c)?, "the re-minted foreign Secret survives cleanup");
    Ok(())
}
