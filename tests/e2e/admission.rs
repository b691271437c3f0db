//! Admission against a real kube-apiserver: `kubectl apply` of EndpointPolicies through our TLS
//! webhook, registered by URL with `failurePolicy: Fail`, and the CRD schema on its own.
//!
//! One control plane and one controller serve every trial (the `socketLimit: filesystem` trial
//! also runs a second controller and the CRD rendered for that value, and restores both); trials
//! run one at a time in the order listed (the last one deletes the webhook configuration).

mod suite;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aether_fixtures::{PolicyBuilder, policy};
use aether_tests::{ControlPlane, Controller, eventually, helm_bin, repo_root};
use anyhow::{Context, bail, ensure};
use serde_json::Value;

struct Env {
    cp: ControlPlane,
    controller: Controller,
}

/// What an example's first line promises: `# expect: allowed` or
/// `# expect: denied: <substring> | <substring> ...`.
enum Expect {
    Allowed,
    Denied(Vec<String>),
}

fn expectation(path: &Path) -> anyhow::Result<Expect> {
    let text = std::fs::read_to_string(path)?;
    let first = text.lines().next().unwrap_or_default();
    let rest = first
        .strip_prefix("# expect: ")
        .with_context(|| format!("{} lacks a '# expect:' first line", path.display()))?;
    if rest == "allowed" {
        return Ok(Expect::Allowed);
    }
    let subs =
        rest.strip_prefix("denied: ").with_context(|| format!("{}: bad expectation {rest:?}", path.display()))?;
    Ok(Expect::Denied(subs.split(" | ").map(str::to_owned).collect()))
}

fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("crds/examples"))
        .expect("crds/examples exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// What `kubectl apply -f` prints for each denied example, in full (`{file}` stands for the
/// example's path). The API server lists several field errors in no fixed order, so
/// [`same_kubectl_text`] compares their lines as a set. No line may be the API server's
/// "some validation rules were not checked" note: every shape rule is a CEL rule.
const EXAMPLE_DENIALS: &[(&str, &str)] = &[
    (
        "deny-bad-group.yaml",
        r#"The EndpointPolicy "echo-bad-group" is invalid: spec.targetRef.group: Invalid value: "networking.k8s.io": must be "" or "core": the core API group, where Services live"#,
    ),
    (
        "deny-non-service-target.yaml",
        r#"The EndpointPolicy "echo-deployment" is invalid: 
* spec.targetRef.group: Invalid value: "apps": must be "" or "core": the core API group, where Services live
* spec.targetRef.kind: Invalid value: "Deployment": must be "Service": a policy attaches to a Service of the core group only"#,
    ),
    (
        "deny-over-budget.yaml",
        r#"Error from server: error when creating "{file}": admission webhook "endpointpolicies.config.aether.io" denied the request: spec.udsSocket "sockets/app1.sock" is 17 bytes; the budget is 16 bytes with pods dir /var/lib/kubelet/pods (sun_path holds 107)"#,
    ),
    (
        "deny-traversal.yaml",
        r#"The EndpointPolicy "echo-traversal" is invalid: spec.udsSocket: Invalid value: "../app.sock": must be <volume>/<file> with exactly one '/': <volume> a DNS-1123 label (lowercase a-z, 0-9, '-'; the name of one of the pod's emptyDir volumes), <file> 1 or more of A-Z a-z 0-9 . _ - and not '.' or '..', e.g. sockets/app.sock"#,
    ),
];

/// The API server's note when an OpenAPI check (enum, maxLength, required, type) stopped the CEL
/// rules (apiextensions-apiserver `hasBlockingErr`).
const RULES_NOT_CHECKED: &str = "some validation rules were not checked";

/// Whether kubectl printed `want`: the same first line and the same `* field: ...` lines in any
/// order (trailing whitespace ignored).
fn same_kubectl_text(got: &str, want: &str) -> bool {
    let lines = |text: &str| -> (String, Vec<String>) {
        let mut lines = text.trim_end().lines().map(|l| l.trim_end().to_owned());
        let first = lines.next().unwrap_or_default();
        let mut rest: Vec<String> = lines.collect();
        rest.sort();
        (first, rest)
    };
    lines(got) == lines(want)
}

fn apply_example(env: &Env, path: &Path) -> anyhow::Result<()> {
    let out = env.cp.kubectl(&["apply".as_ref(), "-f".as_ref(), path.as_os_str()])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match expectation(path)? {
        Expect::Allowed => {
            ensure!(out.status.success(), "expected {} to be created, kubectl said: {stderr}", path.display())
        }
        Expect::Denied(subs) => {
            ensure!(!out.status.success(), "expected {} to be denied, but it was created", path.display());
            for s in subs {
                ensure!(stderr.contains(&s), "denial of {} lacks {s:?}; kubectl said: {stderr}", path.display());
            }
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            let (_, want) = EXAMPLE_DENIALS
                .iter()
                .find(|(f, _)| *f == file)
                .with_context(|| format!("EXAMPLE_DENIALS pins no text for {file}; kubectl said:\n{stderr}"))?;
            let want = want.replace("{file}", &path.display().to_string());
            ensure!(!stderr.contains(RULES_NOT_CHECKED), "kubectl said: {stderr}");
            ensure!(same_kubectl_text(&stderr, &want), "kubectl said:\n{stderr}\nwanted:\n{want}");
        }
    }
    Ok(())
}

/// `kubectl apply -f` of one manifest, whatever kubectl answers.
fn apply_manifest(env: &Env, manifest: &str) -> anyhow::Result<std::process::Output> {
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("policy.yaml");
    std::fs::write(&f, manifest)?;
    env.cp.kubectl(&["apply".as_ref(), "-f".as_ref(), f.as_os_str()])
}

/// Policy `name` in the kubeconfig's namespace (`default`) on Service `target` over `socket`.
fn echo_policy(name: &str, target: &str, socket: &str) -> PolicyBuilder {
    policy("default", name).target(target).socket(socket)
}

fn over_budget_denial_comes_from_our_webhook_with_the_arithmetic(env: &Env) -> anyhow::Result<()> {
    let out = apply_manifest(env, &echo_policy("arith", "echo", "sockets/app1.sock").manifest())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "17-byte value was admitted");
    let want = r#"admission webhook "endpointpolicies.config.aether.io" denied the request: spec.udsSocket "sockets/app1.sock" is 17 bytes; the budget is 16 bytes with pods dir /var/lib/kubelet/pods (sun_path holds 107)"#;
    ensure!(stderr.contains(want), "kubectl said: {stderr}");
    Ok(())
}

fn update_is_validated_too(env: &Env) -> anyhow::Result<()> {
    let out = apply_manifest(env, &echo_policy("upd", "upd", "s/app.sock").manifest())?;
    ensure!(out.status.success(), "create failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = apply_manifest(env, &echo_policy("upd", "upd", "sockets/app1.sock").manifest())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "an over-budget UPDATE was admitted");
    ensure!(stderr.contains("denied the request") && stderr.contains("spec.udsSocket"), "kubectl said: {stderr}");
    let stored = env.cp.kubectl_ok(&["get", "epol", "upd", "-o", "jsonpath={.spec.udsSocket}"])?;
    ensure!(stored == "s/app.sock", "stored socket changed to {stored:?}");
    Ok(())
}

fn kubectl_explain_shows_our_field_docs(env: &Env) -> anyhow::Result<()> {
    let out = env.cp.kubectl_ok(&["explain", "endpointpolicy.spec.udsSocket"])?;
    for s in ["<volume>/<file>", "sun_path", "emptyDir"] {
        ensure!(out.contains(s), "kubectl explain lacks {s:?}: {out}");
    }
    let out = env.cp.kubectl_ok(&["explain", "epol.spec.targetRef.group"])?;
    ensure!(out.contains("core"), "kubectl explain targetRef.group lacks 'core': {out}");
    Ok(())
}

fn get_epol_prints_target_socket_accepted_reason_age_and_wide_message(env: &Env) -> anyhow::Result<()> {
    let out = env.cp.kubectl_ok(&["get", "epol"])?;
    let header = out.lines().next().unwrap_or_default();
    let columns: Vec<&str> = header.split_whitespace().collect();
    ensure!(columns == ["NAME", "TARGET", "SOCKET", "ACCEPTED", "REASON", "AGE"], "header: {out}");
    let wide = env.cp.kubectl_ok(&["get", "epol", "-o", "wide"])?;
    let columns: Vec<&str> = wide.lines().next().unwrap_or_default().split_whitespace().collect();
    ensure!(columns == ["NAME", "TARGET", "SOCKET", "ACCEPTED", "REASON", "AGE", "MESSAGE"], "-o wide header: {wide}");
    ensure!(out.contains("echo-uds") && out.contains("uds/app.sock"), "echo-uds row missing: {out}");
    let cats = env.cp.kubectl_ok(&["get", "aether"])?;
    ensure!(cats.contains("echo-uds"), "category 'aether' does not list policies: {cats}");
    Ok(())
}

fn controller_metrics_count_the_decisions(env: &Env) -> anyhow::Result<()> {
    let port: u16 = env.controller.admin.rsplit(':').next().context("admin port")?.parse()?;
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut b = String::new();
        s.read_to_string(&mut b)?;
        b
    };
    for want in [r#"result="denied""#, r#"result="allowed""#, "aether_admission_requests_total"] {
        ensure!(body.contains(want), "/metrics lacks {want}: {body}");
    }
    // The serving certificate's notAfter: the leaf in the tls.crt the harness minted (valid
    // DEFAULT_VALIDITY_DAYS from its start), as the webhook loaded it.
    let served: i64 = body
        .lines()
        .find_map(|l| l.strip_prefix("aether_webhook_certificate_expiry_timestamp_seconds "))
        .context("/metrics lacks aether_webhook_certificate_expiry_timestamp_seconds")?
        .trim()
        .parse()?;
    let tls_crt = env.controller.ca_file.with_file_name(aether_webhook_certs::CERT_FILE);
    let leaf = aether_webhook_certs::expiry::leaf_not_after_file(&tls_crt)?;
    ensure!(served == leaf, "the gauge says {served}, {} says {leaf}", tls_crt.display());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let validity = i64::from(aether_webhook_certs::DEFAULT_VALIDITY_DAYS) * 86_400;
    ensure!(
        (now + validity - 3600..=now + validity).contains(&served),
        "notAfter {served} is not {validity} s after the start"
    );
    Ok(())
}

/// `socketLimit: filesystem` end to end: the CRD as the chart renders it under
/// that value (`maxLength` 319) and a controller run with `--socket-limit filesystem` admit a
/// 40-byte value and deny a 256-byte file naming the rule; back on the default CRD and
/// controller, a 40-byte value is refused as before.
fn socket_limit_filesystem_admits_what_the_file_system_holds(env: &Env) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let rendered = Command::new(helm_bin())
        .args(["template", "aether-crds"])
        .arg(repo_root().join("charts/aether-crds"))
        .args(["--set", "socketLimit=filesystem"])
        .output()?;
    ensure!(rendered.status.success(), "helm template: {}", String::from_utf8_lossy(&rendered.stderr));
    let crd = dir.path().join("crd-filesystem.yaml");
    std::fs::write(&crd, &rendered.stdout)?;
    env.cp.kubectl_ok(&["apply".as_ref(), "--server-side".as_ref(), "-f".as_ref(), crd.as_os_str()])?;
    let kubeconfig = env.cp.kubeconfig();
    let filesystem = Controller::start(&[
        "--socket-limit",
        "filesystem",
        "--status-writer=false",
        "--kubeconfig",
        kubeconfig.to_str().context("kubeconfig path is UTF-8")?,
    ])?;
    env.cp.register_webhook(&filesystem.url, &filesystem.ca_file)?;

    let forty = format!("sockets/{}.sock", "a".repeat(27));
    ensure!(forty.len() == 40);
    // The API server picks up the new schema and webhook configuration asynchronously.
    let mut last = String::new();
    let admitted = eventually("the 40-byte value to be admitted", Duration::from_secs(30), || {
        let out = apply_manifest(env, &echo_policy("fs-forty", "fs", &forty).manifest())?;
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        Ok(out.status.success())
    });
    admitted.with_context(|| format!("kubectl said: {last}"))?;
    let stored = env.cp.kubectl_ok(&["get", "epol", "fs-forty", "-o", "jsonpath={.spec.udsSocket}"])?;
    ensure!(stored == forty, "stored {stored:?}");

    let file256 = format!("s/{}", "f".repeat(256));
    let out = apply_manifest(env, &echo_policy("fs-file256", "fs", &file256).manifest())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a 256-byte file name was admitted");
    let want = format!(
        "admission webhook \"endpointpolicies.config.aether.io\" denied the request: spec.udsSocket {:?}... (258 \
         bytes) names a file of 256 bytes, over the 255-byte limit of a file name (NAME_MAX, the file system's name \
         limit; --socket-limit filesystem)",
        &file256[..64]
    );
    ensure!(stderr.contains(&want), "kubectl said: {stderr}\nwanted: {want}");

    // Back to the default CRD (the chart file unrendered) and the default controller.
    env.cp.install_crd()?;
    env.cp.register_webhook(&env.controller.url, &env.controller.ca_file)?;
    drop(filesystem);
    let refused = |stderr: &str| stderr.contains("spec.udsSocket") && stderr.contains("36");
    let mut last = String::new();
    let schema_back = eventually("a 40-byte value to be refused again", Duration::from_secs(30), || {
        let out = apply_manifest(env, &echo_policy("fs-forty-again", "fs", &forty).manifest())?;
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(!out.status.success() || !refused(&last), "admitted while refused: {last}");
        Ok(!out.status.success() && refused(&last))
    });
    schema_back.with_context(|| format!("kubectl said: {last}"))?;
    env.cp.kubectl_ok(&["delete", "epol", "fs-forty", "--ignore-not-found"])?;
    env.cp.kubectl_ok(&["delete", "epol", "fs-forty-again", "--ignore-not-found"])?;
    Ok(())
}

/// Turns a valid policy into the manifest of a bad one.
type MakeBad = fn(PolicyBuilder) -> Value;

/// Runs last: removes the webhook configuration, then checks what the CRD schema alone refuses.
fn without_the_webhook_the_schema_still_rejects_bad_shapes(env: &Env) -> anyhow::Result<()> {
    env.cp.delete_webhook()?;
    let cross_namespace = |p: PolicyBuilder| {
        let mut v = p.json();
        v["spec"]["targetRef"]["namespace"] = "other".into();
        v
    };
    // (name, the policy on Service echo over s/app.sock made bad, the field the schema names)
    let bad: [(&str, MakeBad, &str); 11] = [
        ("traversal", |p| p.socket("../app.sock").json(), "spec.udsSocket"),
        ("dot-file", |p| p.socket("sockets/..").json(), "spec.udsSocket"),
        ("double-slash", |p| p.socket("sockets//app.sock").json(), "spec.udsSocket"),
        ("upper-volume", |p| p.socket("Sockets/app.sock").json(), "spec.udsSocket"),
        ("newline", |p| p.socket("sockets/app.sock\n").json(), "spec.udsSocket"),
        ("fullwidth", |p| p.socket("sockets\u{ff0f}app.sock").json(), "spec.udsSocket"),
        ("too-long-anywhere", |p| p.socket("sockets/abcdefghijklmnopqrstuvwxyz123").json(), "spec.udsSocket"),
        ("lower-kind", |p| p.target_kind("service").json(), "spec.targetRef.kind"),
        ("deployment", |p| p.target_group("apps").target_kind("Deployment").json(), "spec.targetRef"),
        ("digit-name", |p| p.target("1cart").json(), "spec.targetRef.name"),
        ("cross-ns", cross_namespace, "namespace"),
    ];
    let mut failures = Vec::new();
    for (name, make_bad, field) in bad {
        let manifest = make_bad(echo_policy(&format!("schema-{name}"), "echo", "s/app.sock"));
        let out = apply_manifest(env, &manifest.to_string())?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            failures.push(format!("{name}: admitted without the webhook"));
        } else if stderr.contains(RULES_NOT_CHECKED) {
            failures.push(format!("{name}: the API server skipped rules: {stderr}"));
        } else if !stderr.contains(field) || stderr.contains("denied the request") {
            failures.push(format!("{name}: rejection does not come from the schema naming {field}: {stderr}"));
        }
    }
    every_broken_field_is_listed_once_with_its_value(env)?;
    // The budget depends on the configured pods dir, so only the webhook can enforce it.
    let out = apply_manifest(env, &echo_policy("schema-budget", "echo", "sockets/app1.sock").manifest())?;
    ensure!(out.status.success(), "the schema alone refused a 17-byte value: {}", String::from_utf8_lossy(&out.stderr));
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// One policy with every field wrong: each field's error, with its value and what to fix, and
/// nothing else. (With OpenAPI `enum`s and `maxLength`s, kube-apiserver printed only those
/// fields, then the "some validation rules were not checked" note, and never the grammar error
/// of the socket or the Service name.)
fn every_broken_field_is_listed_once_with_its_value(env: &Env) -> anyhow::Result<()> {
    let name = format!("Echo-{}", "x".repeat(60));
    let socket = format!("../{}/app.sock", "s".repeat(30));
    let manifest = echo_policy("schema-all-wrong", &name, &socket).target_group("apps").target_kind("Deployment");
    let out = apply_manifest(env, &manifest.manifest())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "admitted: {stderr}");
    let want = format!(
        r#"The EndpointPolicy "schema-all-wrong" is invalid: 
* spec.targetRef.group: Invalid value: "apps": must be "" or "core": the core API group, where Services live
* spec.targetRef.kind: Invalid value: "Deployment": must be "Service": a policy attaches to a Service of the core group only
* spec.targetRef.name: Invalid value: "{name}": must be a Service name, a DNS-1035 label: 1-63 of lowercase a-z, 0-9 and '-', starting with a letter and ending with a letter or digit
* spec.udsSocket: Invalid value: "{socket}": must be at most 36 bytes: no pods dir leaves room for a longer <volume>/<file> in sun_path (107 bytes); the admission webhook enforces the configured pods dir's budget (16 bytes with /var/lib/kubelet/pods)
* spec.udsSocket: Invalid value: "{socket}": must be <volume>/<file> with exactly one '/': <volume> a DNS-1123 label (lowercase a-z, 0-9, '-'; the name of one of the pod's emptyDir volumes), <file> 1 or more of A-Z a-z 0-9 . _ - and not '.' or '..', e.g. sockets/app.sock"#
    );
    ensure!(same_kubectl_text(&stderr, &want), "kubectl said:\n{stderr}\nwanted:\n{want}");
    Ok(())
}

fn main() {
    let mut cases: Vec<suite::Case<Env>> = examples()
        .into_iter()
        .map(|p| {
            let name = format!("example_{}", p.file_stem().unwrap_or_default().to_string_lossy());
            suite::case(name, move |env: &Env| apply_example(env, &p))
        })
        .collect();
    cases.extend(suite::cases![
        over_budget_denial_comes_from_our_webhook_with_the_arithmetic,
        update_is_validated_too,
        kubectl_explain_shows_our_field_docs,
        get_epol_prints_target_socket_accepted_reason_age_and_wide_message,
        controller_metrics_count_the_decisions,
        socket_limit_filesystem_admits_what_the_file_system_holds,
        without_the_webhook_the_schema_still_rejects_bad_shapes,
    ]);
    suite::run(cases, setup, |_| String::new())
}

fn setup() -> anyhow::Result<Env> {
    let cp = ControlPlane::start()?;
    cp.install_crd()?;
    // The status writer runs too (it reads this control plane through --kubeconfig).
    let kubeconfig = cp.kubeconfig();
    let controller = Controller::start(&[
        "--kubeconfig",
        kubeconfig.to_str().context("kubeconfig path is UTF-8")?,
        "--lease-namespace",
        "default",
    ])?;
    cp.register_webhook(&controller.url, &controller.ca_file)?;
    Ok(Env { cp, controller })
}
