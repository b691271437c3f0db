//! `aether-agent plan`: the offline answer to "what would each managed pod get, and why".

use assert_cmd::Command;
use serde_json::Value;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn plan_json(extra: &[&str]) -> Vec<Value> {
    let out = Command::cargo_bin("aether-agent")
        .unwrap()
        .args([
            "plan",
            "--pods",
            &fixture("plan-pods.yaml"),
            "--policies",
            &fixture("plan-policies.yaml"),
            "-o",
            "json",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

fn by_name<'a>(plans: &'a [Value], name: &str) -> &'a Value {
    plans.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} missing: {plans:?}"))
}

#[test]
fn plan_reports_every_managed_pod_with_source_path_reason_and_clusters() {
    let plans = plan_json(&[]);
    assert_eq!(plans.len(), 3, "unmanaged pods and other kinds are left out: {plans:?}");
    for p in &plans {
        for key in ["namespace", "name", "uid", "source", "socket", "path", "reason", "clusters", "healthCheck"] {
            assert!(p.get(key).is_some(), "{key} missing in {p}");
        }
    }
    let echo = by_name(&plans, "echo-1");
    assert_eq!(echo["source"], "annotation");
    assert!(echo["path"].as_str().unwrap().ends_with("/volumes/kubernetes.io~empty-dir/s/app.sock"), "{echo}");
    assert!(echo["reason"].as_str().unwrap().contains("placeholder UID"), "{echo}");
    assert_eq!(echo["clusters"], serde_json::json!(["app_shop_echo-1_8080", "health_shop_echo-1"]));
    assert_eq!(echo["healthCheck"], "HTTP GET / over HTTP/1.1");
    let cart = by_name(&plans, "cart-1");
    assert_eq!(cart["source"], "policy");
    assert!(cart["reason"].as_str().unwrap().contains("shop/cart-uds"), "{cart}");
    let bad = by_name(&plans, "bad-1");
    assert_eq!(bad["source"], "tcp");
    assert!(bad["path"].is_null());
    assert!(bad["reason"].as_str().unwrap().starts_with("invalid-annotation:"), "{bad}");
    assert_ne!(echo["uid"], cart["uid"], "pods without UIDs get distinct placeholders");
}

#[test]
fn plan_with_uds_workloads_false_is_all_tcp() {
    let plans = plan_json(&["--uds-workloads=false"]);
    assert!(
        plans.iter().all(|p| p["source"] == "tcp" && p["reason"].as_str().unwrap().starts_with("uds-disabled")),
        "{plans:?}"
    );
}

#[test]
fn plan_with_a_pods_dir_that_leaves_no_budget_is_all_tcp() {
    let plans = plan_json(&["--kubelet-pods-dir", "/var/snap/microk8s/common/var/lib/kubelet/pods"]);
    assert!(plans.iter().all(|p| p["source"] == "tcp"), "{plans:?}");
}

#[test]
fn plan_of_a_missing_file_exits_2_naming_it() {
    let out = Command::cargo_bin("aether-agent")
        .unwrap()
        .args(["plan", "--pods", "/nonexistent/pods.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/pods.yaml"));
}

#[test]
fn pods_can_come_from_standard_input() {
    let pods = std::fs::read_to_string(fixture("plan-pods.yaml")).expect("fixture");
    let out = Command::cargo_bin("aether-agent")
        .unwrap()
        .args(["plan", "--pods", "-", "-o", "json"])
        .write_stdin(pods)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plans: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(plans.as_array().is_some_and(|a| !a.is_empty()), "{plans}");
}

#[test]
fn pods_and_policies_cannot_both_be_standard_input() {
    let out =
        Command::cargo_bin("aether-agent").unwrap().args(["plan", "--pods", "-", "--policies", "-"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot both read standard input"));
}

#[test]
fn a_pod_over_the_port_cap_is_planned_with_no_clusters_at_all() {
    let ports: Vec<String> = (0..65).map(|i| (10_000 + i).to_string()).collect();
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: many\n  namespace: shop\n  labels: {{aether.io/managed: \"true\"}}\n  \
         annotations: {{endpoint.aether.io/ports: \"{}\"}}\nspec:\n  serviceAccountName: many\n  nodeName: n1\n  \
         containers: [{{name: app, image: app}}]\n",
        ports.join(",")
    );
    let run = |format: &str| {
        let out = Command::cargo_bin("aether-agent")
            .unwrap()
            .args(["plan", "--pods", "-", "-o", format])
            .write_stdin(pod.clone())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let plans: Value = serde_json::from_str(&run("json")).unwrap();
    let many = by_name(plans.as_array().unwrap(), "many");
    assert_eq!(many["clusters"], serde_json::json!([]), "{many}");
    assert!(many["reason"].as_str().unwrap().starts_with("too-many-ports"), "{many}");
    let text = run("text");
    assert!(text.contains("shop/many: no clusters (refused)"), "{text}");
}
