//! The chart's copy of the CRD: the generated CRD plus chart metadata only, with the length rule
//! of `spec.udsSocket` following the chart value `socketLimit`.
//!
//! The CRD chart takes the same `socketLimit` as the main chart (`sunPath` by default): the
//! schema's static length rule ([`socket_length_rule`], a CEL rule so that a long value does not
//! hide the other errors, see [`crate::policy`]) admits the longest value the limit can ever admit
//! ([`SocketLimit::longest_value`]: 36 bytes under `sunPath`, 319 under `filesystem`), and the
//! webhook enforces the pods dir's budget within it. [`crd_for_chart`] writes that choice as a
//! Helm `if` inside YAML comments, so the file stays a valid CRD for the default (`kubectl apply -f`
//! of the unrendered file gives exactly what `helm template` renders with default values).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSONSchemaProps};
use kube::CustomResourceExt;

use crate::EndpointPolicy;
use crate::policy::socket_length_rule;
use crate::udspath::SocketLimit;

/// Labels the chart copy carries (Kubernetes' recommended `app.kubernetes.io/*` labels): the
/// chart's name, the project it belongs to, and the release (`workspace.package.version` of the
/// root `Cargo.toml`, which is also the charts' `appVersion`), so `kubectl get crd -L
/// app.kubernetes.io/version` tells which release's schema a cluster serves.
pub const CHART_LABELS: &[(&str, &str)] = &[
    ("app.kubernetes.io/name", "aether-crds"),
    ("app.kubernetes.io/part-of", "aether"),
    ("app.kubernetes.io/version", env!("CARGO_PKG_VERSION")),
];

/// Helm's annotation that keeps the CRD (and so every EndpointPolicy) on `helm uninstall`.
pub const KEEP_ANNOTATION: (&str, &str) = ("helm.sh/resource-policy", "keep");

/// The chart value (`values.yaml` of both charts) that selects the socket limit, and its two
/// settings as written there: `sunPath` ([`SocketLimit::SunPath`], the default) and `filesystem`.
pub const SOCKET_LIMIT_VALUE: &str = "socketLimit";

/// `socketLimit` as the charts' values spell `limit`.
pub const fn chart_value(limit: SocketLimit) -> &'static str {
    match limit {
        SocketLimit::SunPath => "sunPath",
        SocketLimit::Filesystem => "filesystem",
    }
}

/// The generated CRD with [`CHART_LABELS`] and [`KEEP_ANNOTATION`] added: what the chart renders
/// with default values (`socketLimit: sunPath`).
pub fn crd_with_chart_metadata() -> CustomResourceDefinition {
    let mut crd = EndpointPolicy::crd();
    let labels = crd.metadata.labels.get_or_insert_default();
    for (k, v) in CHART_LABELS {
        labels.insert((*k).to_owned(), (*v).to_owned());
    }
    crd.metadata.annotations.get_or_insert_default().insert(KEEP_ANNOTATION.0.to_owned(), KEEP_ANNOTATION.1.to_owned());
    crd
}

/// What the chart renders with `socketLimit` set to `limit`: [`crd_with_chart_metadata`] with
/// `spec.udsSocket`'s length rule replaced by [`socket_length_rule`]`(limit)` (at most 36 or 319
/// bytes).
///
/// # Panics
/// Never in practice: the generated CRD has `spec.udsSocket` with the `sunPath` length rule.
pub fn crd_with_chart_metadata_for(limit: SocketLimit) -> CustomResourceDefinition {
    let mut crd = crd_with_chart_metadata();
    let default_rule = socket_length_rule(SocketLimit::SunPath).rule;
    let rule = serde_json::to_value(socket_length_rule(limit)).expect("a CEL rule serializes");
    let rule = serde_json::from_value(rule).expect("a kube-core Rule is a ValidationRule");
    let rules = socket_schema(&mut crd).x_kubernetes_validations.as_mut().expect("spec.udsSocket has CEL rules");
    let slot =
        rules.iter_mut().find(|r| r.rule == default_rule).expect("the generated CRD has the sunPath length rule");
    *slot = rule;
    crd
}

/// The `spec.udsSocket` schema of the (single) served version.
fn socket_schema(crd: &mut CustomResourceDefinition) -> &mut JSONSchemaProps {
    crd.spec
        .versions
        .first_mut()
        .and_then(|v| v.schema.as_mut())
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|root| root.properties.as_mut())
        .and_then(|p| p.get_mut("spec"))
        .and_then(|spec| spec.properties.as_mut())
        .and_then(|p| p.get_mut("udsSocket"))
        .expect("the generated CRD has spec.udsSocket")
}

/// The lines that replace one line that differs between the two limits, at its indent: a Helm
/// `if` on `.Values.socketLimit` whose actions all sit in YAML comments, and between them the
/// `sunPath` line as plain YAML. Rendered, the comments say which limit was chosen and the one
/// line is that limit's; unrendered, it is the default's.
fn switched_lines(sun_line: &str, fs_line: &str) -> String {
    let (sun, fs) = (SocketLimit::SunPath, SocketLimit::Filesystem);
    let indent = &sun_line[..sun_line.len() - sun_line.trim_start().len()];
    format!(
        "{indent}# spec.udsSocket's length rule follows the chart value {SOCKET_LIMIT_VALUE}:{{{{ if eq .Values.{SOCKET_LIMIT_VALUE} \"{fs_value}\" }}}} {fs_value}, {fs_max} bytes.{{{{ \"\\n\" }}}}{fs_line}{{{{ \"\\n\" }}}}{indent}#{{{{ else }}}} {sun_value}, {sun_max} bytes.\n\
         {sun_line}\n\
         {indent}#{{{{ end }}}} (Written by crdgen --chart; unrendered, this file is the {sun_value} CRD.)\n",
        fs_value = chart_value(fs),
        fs_max = fs.longest_value(),
        sun_value = chart_value(sun),
        sun_max = sun.longest_value(),
    )
}

/// The chart's CRD template: a header saying where it comes from, then [`crd_with_chart_metadata`]
/// as YAML, each line that differs under `socketLimit: filesystem` (the length rule of
/// `spec.udsSocket`: its `rule` and `message`) following `socketLimit` (see the module doc).
/// `helm template` with default values renders exactly [`crd_with_chart_metadata`]; with
/// `socketLimit=filesystem`, [`crd_with_chart_metadata_for`] [`SocketLimit::Filesystem`].
///
/// # Panics
/// Never in practice: the CRD always serializes, and the two limits' YAML differ only within
/// lines (the same line count, two lines apart).
pub fn crd_for_chart() -> String {
    let sun = yaml_serde::to_string(&crd_with_chart_metadata()).expect("a CRD always serializes to YAML");
    let fs = yaml_serde::to_string(&crd_with_chart_metadata_for(SocketLimit::Filesystem))
        .expect("a CRD always serializes to YAML");
    assert_eq!(sun.lines().count(), fs.lines().count(), "the limits' CRDs differ only within lines");
    let mut out = String::from(
        "# Generated by `make crds` (crdgen --chart) from crds/src/policy.rs. Do not edit: a test fails on drift.\n",
    );
    let mut switched = 0;
    for (sun_line, fs_line) in sun.lines().zip(fs.lines()) {
        if sun_line == fs_line {
            out.push_str(sun_line);
            out.push('\n');
        } else {
            switched += 1;
            out.push_str(&switched_lines(sun_line, fs_line));
        }
    }
    assert_eq!(switched, 2, "the socket length rule's rule and message lines differ between the limits");
    out
}

/// The limit of `spec.udsSocket`'s length rule in `crd` (a CRD as JSON, e.g. what `helm template`
/// renders), in bytes: the `n` of its rule `size(bytes(self)) <= n` ([`socket_length_rule`]).
/// `None` when the CRD has no such rule.
pub fn socket_max_bytes(crd: &serde_json::Value) -> Option<u64> {
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["udsSocket"]
        ["x-kubernetes-validations"]
        .as_array()?
        .iter()
        .find_map(|r| r["rule"].as_str()?.strip_prefix("size(bytes(self)) <= ")?.parse().ok())
}
