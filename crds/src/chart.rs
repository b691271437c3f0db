//! The chart's copy of the CRD: the generated CRD plus chart metadata only, with the `maxLength`
//! of `spec.udsSocket` following the chart value `socketLimit`.
//!
//! The CRD chart takes the same `socketLimit` as the main chart (`sunPath` by default): the
//! schema's static `maxLength` is the longest value the limit can ever admit
//! ([`SocketLimit::longest_value`]: 36 bytes under `sunPath`, 319 under `filesystem`), and the
//! webhook enforces the pods dir's budget within it. [`crd_for_chart`] writes that choice as a
//! Helm `if` inside YAML comments, so the file stays a valid CRD for the default (`kubectl apply -f`
//! of the unrendered file gives exactly what `helm template` renders with default values).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSONSchemaProps};
use kube::CustomResourceExt;

use crate::EndpointPolicy;
use crate::udspath::SocketLimit;

/// Labels the chart copy carries.
pub const CHART_LABELS: &[(&str, &str)] =
    &[("app.kubernetes.io/name", "aether-crds"), ("app.kubernetes.io/part-of", "aether")];

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
/// `spec.udsSocket`'s `maxLength` set to [`SocketLimit::longest_value`] (36 or 319 bytes).
pub fn crd_with_chart_metadata_for(limit: SocketLimit) -> CustomResourceDefinition {
    let mut crd = crd_with_chart_metadata();
    socket_schema(&mut crd).max_length = Some(limit.longest_value() as i64);
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

/// A `maxLength` no real schema uses, written in place of the socket's so that its one line can
/// be found in the YAML text and replaced by [`max_length_lines`].
const MARKER_MAX_LENGTH: i64 = 3_190_036_001;

/// The lines that replace `maxLength: <n>` of `spec.udsSocket`, at `indent`: a Helm `if` on
/// `.Values.socketLimit` whose actions all sit in YAML comments, and between them the
/// `maxLength` of the default limit as plain YAML. Rendered, the comments say which limit was
/// chosen and the one `maxLength` line is that limit's; unrendered, it is the default's.
fn max_length_lines(indent: &str) -> String {
    let (sun, fs) = (SocketLimit::SunPath, SocketLimit::Filesystem);
    format!(
        "{indent}# spec.udsSocket maxLength follows the chart value {SOCKET_LIMIT_VALUE}:{{{{ if eq .Values.{SOCKET_LIMIT_VALUE} \"{fs_value}\" }}}} {fs_value}, {fs_max} bytes.{{{{ \"\\n\" }}}}{indent}maxLength: {fs_max}{{{{ \"\\n\" }}}}{indent}#{{{{ else }}}} {sun_value}, {sun_max} bytes.\n\
         {indent}maxLength: {sun_max}\n\
         {indent}#{{{{ end }}}} (Written by crdgen --chart; unrendered, this file is the {sun_value} CRD.)\n",
        fs_value = chart_value(fs),
        fs_max = fs.longest_value(),
        sun_value = chart_value(sun),
        sun_max = sun.longest_value(),
    )
}

/// The chart's CRD template: a header saying where it comes from, then [`crd_with_chart_metadata`]
/// as YAML with `spec.udsSocket`'s `maxLength` line following `socketLimit` (see the module doc).
/// `helm template` with default values renders exactly [`crd_with_chart_metadata`]; with
/// `socketLimit=filesystem`, [`crd_with_chart_metadata_for`] [`SocketLimit::Filesystem`].
///
/// # Panics
/// Never in practice: the CRD always serializes, with exactly one socket `maxLength` line.
pub fn crd_for_chart() -> String {
    let mut crd = crd_with_chart_metadata();
    socket_schema(&mut crd).max_length = Some(MARKER_MAX_LENGTH);
    let yaml = yaml_serde::to_string(&crd).expect("a CRD always serializes to YAML");
    let marker = format!("maxLength: {MARKER_MAX_LENGTH}");
    let mut out = String::from(
        "# Generated by `make crds` (crdgen --chart) from crds/src/policy.rs. Do not edit: a test fails on drift.\n",
    );
    let mut found = 0;
    for line in yaml.lines() {
        match line.strip_suffix(marker.as_str()) {
            Some(indent) if indent.trim().is_empty() => {
                found += 1;
                out.push_str(&max_length_lines(indent));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    assert_eq!(found, 1, "exactly one spec.udsSocket maxLength line in the generated CRD");
    out
}
