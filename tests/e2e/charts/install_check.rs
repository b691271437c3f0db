//! verify-install, the startup check Job and the `helm test` Pod:
//! `verify_install_hooks_run_after_the_cert_job_with_the_controllers_budget_and_the_agents_selector`,
//! `verify_install_rbac_is_minimal_and_each_runner_can_be_turned_off` and
//! `schema_refuses_bad_verify_install_values`.
//!
//! What they prove: both run `aether-controller verify-install` from the controller image after
//! the certificate Job, with the controller's budget flags and the agents' selector, under their
//! own least-privilege accounts; each can be turned off; the schema refuses bad `verifyInstall`
//! values.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::template::{NS, args, container, find, flag, render, try_render, try_render_text_with};

/// The startup check's objects' name (Job, ServiceAccount, Role, RoleBinding).
pub(crate) const VERIFY: &str = "aether-verify-install";
/// The `helm test` runner's objects' name (Pod, ServiceAccount, Role, RoleBinding).
const VERIFY_TEST: &str = "aether-verify-install-test";

/// The verify-install objects of a render: (kind, name, namespace) → the object.
pub(crate) fn verify_objects(docs: &[Value]) -> BTreeMap<(String, String, String), Value> {
    docs.iter()
        .filter(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(VERIFY)))
        .map(|d| {
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            ((text(&d["kind"]), text(&d["metadata"]["name"]), text(&d["metadata"]["namespace"])), d.clone())
        })
        .collect()
}

pub(crate) fn key(kind: &str, name: &str, ns: &str) -> (String, String, String) {
    (kind.to_owned(), name.to_owned(), ns.to_owned())
}

fn annotation<'a>(d: &'a Value, key: &str) -> &'a str {
    d["metadata"]["annotations"][key].as_str().unwrap_or_else(|| panic!("{} lacks annotation {key}", d["kind"]))
}

/// `[(apiGroup, resource, verbs)]` of a Role, sorted.
pub(crate) fn role_rules(role: &Value) -> Vec<(String, String, Vec<String>)> {
    let strs = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
    };
    let mut out = Vec::new();
    for r in role["rules"].as_array().into_iter().flatten() {
        assert!(r.get("resourceNames").is_none(), "no resourceNames expected: {r}");
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                out.push((g.clone(), res, strs(&r["verbs"])));
            }
        }
    }
    out.sort();
    out
}

pub(crate) fn rule(group: &str, resource: &str, verbs: &[&str]) -> (String, String, Vec<String>) {
    (group.to_owned(), resource.to_owned(), verbs.iter().map(|v| v.to_string()).collect())
}

/// The startup check Job runs after every install and upgrade, after the
/// certificate Job has set the webhook's caBundle (hook weight 10 > 0), retries for
/// `verifyInstall.timeoutSeconds` and fails the release (backoffLimit 0: the binary retries); the
/// `helm test` Pod checks once; each runs `aether-controller verify-install` from the controller
/// image under its own ServiceAccount (hook RBAC first, weight 5), with the controller's own
/// budget flags, the DaemonSet's selector and the agent's admin port, as the other Jobs'
/// restricted non-root user; every object goes away once a run passed.
pub(crate) fn verify_install_hooks_run_after_the_cert_job_with_the_controllers_budget_and_the_agents_selector() {
    let custom = ["proxy.udsWorkloads.mountPath=/k", "agent.adminPort=9555", "verifyInstall.timeoutSeconds=30"];
    for (sets, timeout) in [(&[][..], 120), (&custom[..], 30)] {
        let docs = render(sets);
        let objects = verify_objects(&docs);
        let mut want: Vec<_> = ["ServiceAccount", "Role", "RoleBinding"]
            .iter()
            .flat_map(|k| [key(k, VERIFY, NS), key(k, VERIFY_TEST, NS)])
            .chain([key("Job", VERIFY, NS), key("Pod", VERIFY_TEST, NS)])
            .collect();
        want.sort();
        assert_eq!(objects.keys().cloned().collect::<Vec<_>>(), want, "{sets:?}");
        let cert_weight: i64 =
            annotation(find(&docs, "Job", "aether-webhook-certs"), "helm.sh/hook-weight").parse().unwrap();
        for ((kind, name, _), d) in &objects {
            assert_eq!(annotation(d, "helm.sh/hook-delete-policy"), "before-hook-creation,hook-succeeded", "{kind}");
            let weight: i64 = annotation(d, "helm.sh/hook-weight").parse().unwrap();
            assert!(weight > cert_weight, "{kind} {name} runs before the cert Job sets the caBundle");
            let runner = matches!(kind.as_str(), "Job" | "Pod");
            assert_eq!(weight, if runner { 10 } else { 5 }, "{kind} {name}: RBAC before its runner");
            let hook = if name == VERIFY_TEST { "test" } else { "post-install,post-upgrade" };
            assert_eq!(annotation(d, "helm.sh/hook"), hook, "{kind} {name}");
        }

        let controller =
            container(&find(&docs, "Deployment", "aether-controller")["spec"]["template"]["spec"], "aether-controller");
        let ds = find(&docs, "DaemonSet", "aether-node");
        let agent = container(&ds["spec"]["template"]["spec"], "aether-agent");
        let selector: Vec<String> = ds["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
            .collect();
        let job = &objects[&key("Job", VERIFY, NS)];
        assert_eq!(job["spec"]["backoffLimit"], 0);
        assert_eq!(job["spec"]["activeDeadlineSeconds"].as_i64(), Some(timeout + 60));
        let pod = &objects[&key("Pod", VERIFY_TEST, NS)];
        for (spec, account, retry) in
            [(&job["spec"]["template"]["spec"], VERIFY, timeout), (&pod["spec"], VERIFY_TEST, 0)]
        {
            assert_eq!(spec["serviceAccountName"], account);
            assert_eq!(spec["restartPolicy"], "Never");
            let c = container(spec, "verify-install");
            assert_eq!(c["image"], controller["image"]);
            assert_eq!(c["command"], serde_json::json!(["aether-controller"]));
            assert_eq!(args(c)[0], "verify-install");
            for f in ["--kubelet-pods-dir", "--socket-limit", "--log-format", "--log-level"] {
                assert_eq!(flag(c, f), flag(controller, f), "{f} differs from the controller's");
            }
            let admin = flag(agent, "--admin-addr").unwrap();
            assert_eq!(Some(admin.rsplit(':').next().unwrap().to_owned()), flag(c, "--agent-admin-port"));
            let mut theirs: Vec<String> = flag(c, "--agent-selector").unwrap().split(',').map(str::to_owned).collect();
            theirs.sort();
            assert_eq!(theirs, selector);
            assert_eq!(flag(c, "--agent-namespace").as_deref(), Some(NS));
            assert_eq!(flag(c, "--namespace").as_deref(), Some(NS));
            assert_eq!(flag(c, "--agent-access").as_deref(), Some("pod-ip"));
            assert_eq!(flag(c, "--retry-for-seconds"), Some(retry.to_string()));
            let sc = &c["securityContext"];
            assert_eq!((sc["runAsNonRoot"].as_bool(), sc["runAsUser"].as_i64()), (Some(true), Some(65532)));
            assert_eq!(
                (sc["readOnlyRootFilesystem"].as_bool(), sc["allowPrivilegeEscalation"].as_bool()),
                (Some(true), Some(false))
            );
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
            assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        }
    }
}

/// Each verify-install account gets exactly what its checks use: `create` on EndpointPolicies in
/// the dry-run namespace (a dry run is authorized as the create) and `list` pods in the release
/// namespace; `get pods/proxy` only with `agentAccess=apiServerProxy`. Each runner can be turned
/// off, and `helm template --skip-tests` (GitOps renders) keeps the startup check whole.
pub(crate) fn verify_install_rbac_is_minimal_and_each_runner_can_be_turned_off() {
    let policies = rule("config.aether.io", "endpointpolicies", &["create"]);
    let pods = rule("", "pods", &["list"]);
    let events = rule("", "events", &["list"]);
    let daemonsets = rule("apps", "daemonsets", &["list"]);
    let objects = verify_objects(&render(&[]));
    for name in [VERIFY, VERIFY_TEST] {
        assert_eq!(
            role_rules(&objects[&key("Role", name, NS)]),
            vec![events.clone(), pods.clone(), daemonsets.clone(), policies.clone()],
            "{name}"
        );
        let binding = &objects[&key("RoleBinding", name, NS)];
        assert_eq!(binding["roleRef"]["name"], name);
        assert_eq!(binding["subjects"], serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": NS}]));
    }

    let objects = verify_objects(&render(&["verifyInstall.namespace=team-a"]));
    for name in [VERIFY, VERIFY_TEST] {
        assert_eq!(
            role_rules(&objects[&key("Role", name, NS)]),
            vec![events.clone(), pods.clone(), daemonsets.clone()],
            "{name}"
        );
        assert_eq!(role_rules(&objects[&key("Role", name, "team-a")]), vec![policies.clone()], "{name}");
        let binding = &objects[&key("RoleBinding", name, "team-a")];
        assert_eq!(binding["subjects"][0]["namespace"], NS);
    }
    let job = &objects[&key("Job", VERIFY, NS)];
    let c = container(&job["spec"]["template"]["spec"], "verify-install");
    assert_eq!(flag(c, "--namespace").as_deref(), Some("team-a"));

    let objects = verify_objects(&render(&["verifyInstall.agentAccess=apiServerProxy"]));
    let proxy = rule("", "pods/proxy", &["get"]);
    for name in [VERIFY, VERIFY_TEST] {
        let rules = role_rules(&objects[&key("Role", name, NS)]);
        assert_eq!(
            rules,
            vec![events.clone(), pods.clone(), proxy.clone(), daemonsets.clone(), policies.clone()],
            "{name}"
        );
    }
    let pod = &objects[&key("Pod", VERIFY_TEST, NS)];
    assert_eq!(flag(container(&pod["spec"], "verify-install"), "--agent-access").as_deref(), Some("api-server-proxy"));

    let names = |sets: &[&str]| -> Vec<String> {
        let mut n: Vec<String> = verify_objects(&render(sets)).into_keys().map(|(_, name, _)| name).collect();
        n.dedup();
        n
    };
    assert_eq!(names(&["verifyInstall.enabled=false"]), [VERIFY_TEST]);
    assert_eq!(names(&["verifyInstall.helmTest=false"]), [VERIFY]);
    assert!(names(&["verifyInstall.enabled=false", "verifyInstall.helmTest=false"]).is_empty());

    let text = try_render_text_with("aether", &[], &["--skip-tests"]).expect("helm template --skip-tests");
    let skipped: Vec<Value> = yaml_serde::Deserializer::from_str(&text)
        .map(|de| Value::deserialize(de).expect("YAML"))
        .filter(|v| !v.is_null())
        .collect();
    let kept: Vec<_> = verify_objects(&skipped).into_keys().collect();
    let want: Vec<_> = ["Job", "Role", "RoleBinding", "ServiceAccount"].iter().map(|k| key(k, VERIFY, NS)).collect();
    assert_eq!(kept, want, "--skip-tests keeps the startup check and its account, drops the test's");
}

pub(crate) fn schema_refuses_bad_verify_install_values() {
    for (sets, needle) in [
        (&["verifyInstall.timeoutSeconds=29"][..], "timeoutSeconds"),
        (&["verifyInstall.timeoutSeconds=1801"][..], "timeoutSeconds"),
        (&["verifyInstall.agentAccess=direct"][..], "agentAccess"),
        (&["verifyInstall.namespace=Team_A"][..], "namespace"),
        (&["verifyInstall.enabled=yes"][..], "enabled"),
        (&["verifyInstall.retryForSeconds=5"][..], "retryForSeconds"),
    ] {
        match try_render(sets) {
            Ok(_) => panic!("{sets:?} rendered; the schema should refuse it"),
            Err(e) => assert!(e.contains(needle), "{sets:?}: error lacks {needle:?}: {e}"),
        }
    }
    for ok in ["verifyInstall.timeoutSeconds=30", "verifyInstall.timeoutSeconds=1800", "verifyInstall.namespace=team-a"]
    {
        try_render(&[ok]).unwrap_or_else(|e| panic!("{ok} refused: {e}"));
    }
}
