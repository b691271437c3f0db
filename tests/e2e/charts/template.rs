//! `helm template` of the charts and readers of what it renders (no tests): the release's name and
//! namespace, the chart directories, the render of the main chart with `--set` values as objects
//! (or helm's error), and an object, a container, its args and flags found in a render.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use aether_tests::{helm_bin, repo_root};
use serde::Deserialize;
use serde_json::Value;

pub(crate) const RELEASE: &str = "aether";
pub(crate) const NS: &str = "aether-system";

pub(crate) fn helm() -> PathBuf {
    helm_bin()
}

pub(crate) fn chart(name: &str) -> PathBuf {
    repo_root().join("charts").join(name)
}

/// `helm template` of the main chart with `--set` values; Err carries helm's stderr.
pub(crate) fn try_render(sets: &[&str]) -> Result<Vec<Value>, String> {
    let text = try_render_text("aether", sets)?;
    let mut docs = Vec::new();
    for de in yaml_serde::Deserializer::from_str(&text) {
        let v = Value::deserialize(de).map_err(|e| format!("rendered YAML does not parse: {e}"))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

pub(crate) fn try_render_text(chart_name: &str, sets: &[&str]) -> Result<String, String> {
    try_render_text_with(chart_name, sets, &[])
}

/// [`try_render_text`] with extra `helm template` flags (e.g. `--skip-tests`).
pub(crate) fn try_render_text_with(chart_name: &str, sets: &[&str], flags: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE]).arg(chart(chart_name)).args(["--namespace", NS]).args(flags);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("running {}: {e}", helm().display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn render(sets: &[&str]) -> Vec<Value> {
    try_render(sets).unwrap_or_else(|e| panic!("helm template {sets:?} failed: {e}"))
}

pub(crate) fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

pub(crate) fn has(docs: &[Value], kind: &str) -> bool {
    docs.iter().any(|d| d["kind"] == kind)
}

pub(crate) fn container<'a>(pod_spec: &'a Value, name: &str) -> &'a Value {
    pod_spec["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

pub(crate) fn args(c: &Value) -> Vec<String> {
    c["args"].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

pub(crate) fn flag(c: &Value, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args(c).iter().find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
}
