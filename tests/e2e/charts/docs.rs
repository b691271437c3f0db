//! The docs that quote the chart: `rbac_doc_equals_the_report` (docs/rbac.md is what
//! `tests/harness/rbac-report.py` prints for the chart) and
//! `readme_installs_the_node_side_in_its_own_namespace_as_the_two_node_suite_does` (the README's
//! Quickstart installs the charts `make charts` packages as the two-node suite does).

use std::process::Command;

use aether_tests::repo_root;
use serde_json::Value;

use crate::template::helm;

pub(crate) fn rbac_doc_equals_the_report() {
    let out = Command::new("python3")
        .arg(repo_root().join("tests/harness/rbac-report.py"))
        .arg(helm())
        .output()
        .expect("running python3");
    assert!(out.status.success(), "rbac-report failed: {}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(repo_root().join("docs/rbac.md")).expect("docs/rbac.md");
    assert_eq!(
        committed,
        String::from_utf8_lossy(&out.stdout),
        "docs/rbac.md drifted from the chart: run `make rbac-report > docs/rbac.md`"
    );
}

/// The README's Quickstart installs as the two-node suite does (on an API server that enforces
/// Pod Security `restricted` by default): the release namespace made by `release_namespace_command`,
/// the node side in `README_NODE_NAMESPACE`, which the chart creates labelled `privileged`. It
/// installs the charts `make charts` packages (`helm package`: `.cache/charts/<name>-<version>.tgz`),
/// so the README names each chart's current version.
pub(crate) fn readme_installs_the_node_side_in_its_own_namespace_as_the_two_node_suite_does() {
    use aether_tests::node::{README_NODE_NAMESPACE, release_namespace_command};
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let create = format!("kubectl {}", release_namespace_command("aether-system").join(" "));
    assert!(readme.lines().any(|l| l.trim() == create), "README.md lacks the line `{create}`");
    let package = |name: &str| -> String {
        let meta: Value = yaml_serde::from_str(
            &std::fs::read_to_string(repo_root().join("charts").join(name).join("Chart.yaml")).expect("Chart.yaml"),
        )
        .expect("Chart.yaml parses");
        format!(".cache/charts/{name}-{}.tgz", meta["version"].as_str().expect("Chart.yaml version"))
    };
    let crds = format!("helm install aether-crds {}", package("aether-crds"));
    assert!(readme.lines().any(|l| l.trim() == crds), "README.md lacks the line `{crds}`");
    let install = format!("helm install aether {} -n aether-system", package("aether"));
    let set = format!("--set daemonset.namespace={README_NODE_NAMESPACE}");
    assert!(
        readme.lines().any(|l| l.starts_with(&install) && l.contains(&set)),
        "README.md lacks a line starting `{install}` with `{set}`"
    );
    assert!(!readme.contains("--create-namespace"), "an unlabelled namespace fails on restricted clusters");
}
