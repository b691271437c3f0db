//! The chart's PrometheusRule (`metrics.prometheusRule`, docs/alerts.md) with the real helm and
//! the real promtool (Debian's `prometheus` package, `scripts/install-deps.sh test`): the chart is
//! rendered as installed (release `aether` in `aether-system`, node side in `aether-node`), its
//! `spec.groups` written to a rules file, `promtool check rules` run on it and `promtool test
//! rules` on every `tests/fixtures/alerts/*.test.yaml` (their `rule_files` pointed at that file,
//! `@DOCS_URL@` replaced by the chart's docs URL). Every alert must have a test case where it
//! fires and one where it stays quiet, read only metrics the binaries serve, and link a section of
//! docs/alerts.md. No control plane needed.

#[path = "served_metrics.rs"]
mod served_metrics;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use aether_chart_readme::github_anchor;
use aether_tests::{helm_bin, repo_root};
use serde_json::Value;

const RELEASE: &str = "aether";
const NS: &str = "aether-system";
const NODE_NS: &str = "aether-node";
/// The promtool unit tests, relative to the repository.
const TESTS_DIR: &str = "tests/fixtures/alerts";
/// What the test files say instead of the chart's docs URL (it carries the appVersion).
const DOCS_PLACEHOLDER: &str = "@DOCS_URL@";

/// promtool on PATH (Debian's `prometheus` installs /usr/bin/promtool).
fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("promtool")).find(|p| p.is_file()))
        .unwrap_or_else(|| {
            panic!("promtool is not on PATH: run scripts/install-deps.sh test (Debian package prometheus)")
        })
}

/// `helm template` of charts/aether as installed, the PrometheusRule only; Err carries helm's stderr.
fn render_rule(sets: &[&str]) -> Result<Value, String> {
    let mut cmd = Command::new(helm_bin());
    cmd.args(["template", RELEASE]).arg(repo_root().join("charts/aether")).args([
        "--namespace",
        NS,
        "--set",
        &format!("daemonset.namespace={NODE_NS}"),
    ]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("running helm: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rules = Vec::new();
    for de in yaml_serde::Deserializer::from_str(&text) {
        let doc: Value =
            serde::Deserialize::deserialize(de).map_err(|e| format!("rendered YAML does not parse: {e}"))?;
        if doc["kind"] == "PrometheusRule" {
            rules.push(doc);
        }
    }
    match rules.len() {
        0 => Ok(Value::Null),
        1 => Ok(rules.remove(0)),
        n => Err(format!("{n} PrometheusRules rendered")),
    }
}

fn enabled_rule() -> Value {
    let rule = render_rule(&["metrics.prometheusRule.enabled=true"]).unwrap_or_else(|e| panic!("helm template: {e}"));
    assert!(!rule.is_null(), "metrics.prometheusRule.enabled=true rendered no PrometheusRule");
    rule
}

/// Every alerting rule of the rendered PrometheusRule, in order.
fn alerts(rule: &Value) -> Vec<&Value> {
    let groups = rule["spec"]["groups"].as_array().expect("spec.groups is a list");
    groups.iter().flat_map(|g| g["rules"].as_array().expect("a group's rules is a list")).collect()
}

fn name(alert: &Value) -> &str {
    alert["alert"].as_str().unwrap_or_else(|| panic!("a rule without `alert`: {alert}"))
}

/// The chart's `aether.docsURL`: the workspace's repository at the tag of the chart's appVersion.
fn docs_url() -> String {
    let chart: Value = yaml_serde::from_str(&read(&repo_root().join("charts/aether/Chart.yaml"))).expect("Chart.yaml");
    let version = chart["appVersion"].as_str().expect("appVersion");
    format!("{}/blob/v{version}", env!("CARGO_PKG_REPOSITORY"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The anchors of a docs page's headings.
fn anchors(page: &Path) -> BTreeSet<String> {
    read(page).lines().filter(|l| l.starts_with('#')).map(|l| github_anchor(l.trim_start_matches('#'))).collect()
}

/// The test files: (path, parsed), the docs URL put in.
fn test_files() -> Vec<(PathBuf, Value)> {
    let dir = repo_root().join(TESTS_DIR);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a readable dir entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.test.yaml in {TESTS_DIR}");
    let url = docs_url();
    files
        .into_iter()
        .map(|p| {
            let text = read(&p).replace(DOCS_PLACEHOLDER, &url);
            let parsed = yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, parsed)
        })
        .collect()
}

/// Runs a command; Err carries its exit status and output.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(text) } else { Err(format!("{cmd:?} exited with {}:\n{text}", out.status)) }
}

#[test]
fn the_rule_is_off_by_default_and_its_values_reach_the_expressions() {
    assert!(render_rule(&[]).expect("helm template").is_null(), "a PrometheusRule rendered by default");
    let rule = render_rule(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=prom",
        "metrics.prometheusRule.certificateExpiryWarningDays=30",
        "metrics.prometheusRule.certificateExpiryCriticalDays=7",
        "metrics.prometheusRule.tcpFallbackIncrease=5",
    ])
    .expect("helm template");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], NS);
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    let expr = |alert: &str| -> String {
        let a = alerts(&rule).into_iter().find(|a| name(a) == alert).unwrap_or_else(|| panic!("no {alert}"));
        a["expr"].as_str().expect("expr").to_owned()
    };
    assert!(expr("AetherWebhookCertificateExpiresSoon").ends_with("< 30 * 86400"));
    assert!(expr("AetherWebhookCertificateExpiresVerySoon").ends_with("< 7 * 86400"));
    assert!(expr("AetherTcpFallbacksRising").ends_with(">= 5"));
    assert_eq!(
        expr("AetherScrapeTargetDown"),
        format!(r#"up{{job=~"aether-controller|{NODE_NS}/aether-node|{NODE_NS}/aether-proxy"}} == 0"#)
    );

    // Bad thresholds are refused, naming the value and the rule.
    let err =
        render_rule(&["metrics.prometheusRule.enabled=true", "metrics.prometheusRule.certificateExpiryWarningDays=3"])
            .expect_err("a critical threshold equal to the warning's was accepted");
    assert!(
        err.contains("metrics.prometheusRule.certificateExpiryCriticalDays (3) must be less than metrics.prometheusRule.certificateExpiryWarningDays (3)"),
        "{err}"
    );
    let err = render_rule(&["metrics.prometheusRule.enabled=true", "metrics.prometheusRule.tcpFallbackIncrease=0"])
        .expect_err("tcpFallbackIncrease=0 was accepted");
    assert!(err.contains("tcpFallbackIncrease") && err.contains("minimum"), "{err}");
}

#[test]
fn every_alert_reads_served_metrics_and_has_severity_summary_description_and_a_runbook_section() {
    let rule = enabled_rule();
    let served = served_metrics::code_metrics();
    let alerts_md = repo_root().join("docs/alerts.md");
    let sections = anchors(&alerts_md);
    let runbook_prefix = format!("{}/docs/alerts.md#", docs_url());
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for alert in alerts(&rule) {
        let name = name(alert);
        if !names.insert(name) {
            problems.push(format!("{name}: defined twice"));
        }
        let expr = alert["expr"].as_str().unwrap_or_default();
        let metrics: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .filter(|t| t.starts_with("aether_") || *t == "up")
            .collect();
        if metrics.is_empty() {
            problems.push(format!("{name}: its expr reads no aether metric (nor up): {expr}"));
        }
        for m in metrics.iter().filter(|m| **m != "up") {
            if !served.contains(*m) {
                problems.push(format!("{name}: {m} is served by neither binary"));
            }
        }
        if !matches!(alert["labels"]["severity"].as_str(), Some("warning" | "critical")) {
            problems.push(format!("{name}: labels.severity must be warning or critical"));
        }
        for a in ["summary", "description"] {
            let text = alert["annotations"][a].as_str().unwrap_or_default();
            if !text.contains("{{ $labels.") {
                problems.push(format!("{name}: annotation {a} names no label of the alert: {text:?}"));
            }
        }
        match alert["annotations"]["runbook_url"].as_str().and_then(|u| u.strip_prefix(&runbook_prefix)) {
            Some(anchor) if anchor == name.to_lowercase() && sections.contains(anchor) => {}
            _ => problems.push(format!(
                "{name}: runbook_url must be {runbook_prefix}{}, a section of docs/alerts.md: {}",
                name.to_lowercase(),
                alert["annotations"]["runbook_url"]
            )),
        }
    }
    // docs/alerts.md has a section for each alert and for no other.
    let doc = read(&alerts_md);
    for heading in doc.lines().filter_map(|l| l.strip_prefix("### `")) {
        let documented = heading.trim_end_matches('`');
        if !names.contains(documented) {
            problems.push(format!("docs/alerts.md documents `{documented}`, which the chart does not define"));
        }
    }
    // Its links to other docs pages land on a heading.
    for target in doc.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
        if target.starts_with("http") {
            continue;
        }
        let (page, anchor) = target.split_once('#').unwrap_or((target, ""));
        let page = if page.is_empty() { alerts_md.clone() } else { repo_root().join("docs").join(page) };
        if !page.is_file() {
            problems.push(format!("docs/alerts.md links {target}: no such page"));
        } else if !anchor.is_empty() && !anchors(&page).contains(anchor) {
            problems.push(format!("docs/alerts.md links {target}: no such heading"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `promtool check rules` on the rendered rules, then `promtool test rules` on each test file;
/// and every alert has a case where it fires (non-empty `exp_alerts`) and a case where it stays
/// quiet (empty), and no case names an alert the rules do not define.
#[test]
fn promtool_accepts_the_rules_and_every_alert_fires_and_stays_quiet_in_its_tests() {
    let promtool = promtool();
    let rule = enabled_rule();
    let dir = tempfile::tempdir().expect("a temp dir");
    let rules = dir.path().join("aether-rules.yaml");
    let groups = serde_json::json!({"groups": rule["spec"]["groups"]});
    std::fs::write(&rules, yaml_serde::to_string(&groups).expect("rules to YAML")).expect("writing the rules");
    if let Err(e) = run(Command::new(&promtool).arg("check").arg("rules").arg(&rules)) {
        panic!("promtool check rules failed on the chart's rules:\n{e}");
    }

    let defined: BTreeSet<String> = alerts(&rule).into_iter().map(|a| name(a).to_owned()).collect();
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    for (path, mut tests) in test_files() {
        let file = path.file_name().expect("a file name").to_string_lossy().into_owned();
        for case in tests["tests"].as_array().unwrap_or_else(|| panic!("{file}: no `tests` list")) {
            for t in case["alert_rule_test"].as_array().map(Vec::as_slice).unwrap_or_default() {
                let alert = t["alertname"].as_str().unwrap_or_else(|| panic!("{file}: a case without alertname"));
                assert!(defined.contains(alert), "{file}: a case tests {alert}, which the chart does not define");
                let fires = t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
                let entry = cases.entry(alert.to_owned()).or_default();
                if fires { entry.0 += 1 } else { entry.1 += 1 }
            }
        }
        tests["rule_files"] = serde_json::json!([rules]);
        let written = dir.path().join(&file);
        std::fs::write(&written, yaml_serde::to_string(&tests).expect("tests to YAML")).expect("writing the tests");
        if let Err(e) = run(Command::new(&promtool).args(["test", "rules"]).arg(&written).current_dir(dir.path())) {
            failures.push(format!("{TESTS_DIR}/{file}: {e}"));
        }
    }
    assert!(failures.is_empty(), "promtool test rules failed:\n{}", failures.join("\n"));
    let mut missing = Vec::new();
    for alert in &defined {
        let (fires, quiet) = cases.get(alert).copied().unwrap_or_default();
        if fires == 0 {
            missing.push(format!("{alert}: no case where it fires (non-empty exp_alerts)"));
        }
        if quiet == 0 {
            missing.push(format!("{alert}: no case where it stays quiet (empty exp_alerts)"));
        }
    }
    assert!(missing.is_empty(), "{TESTS_DIR}:\n{}", missing.join("\n"));
}

#[test]
fn slugs_are_github_s() {
    assert_eq!(github_anchor(" `AetherEnvoyNacks`"), "aetherenvoynacks");
    assert_eq!(github_anchor(" The agent's `/readyz`"), "the-agents-readyz");
    assert_eq!(github_anchor(" Troubleshooting: a watch that fails"), "troubleshooting-a-watch-that-fails");
    assert_eq!(github_anchor(" `aether_xds_nacks_total`"), "aether_xds_nacks_total");
}
