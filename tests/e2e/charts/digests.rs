//! The per-version content digests: `chart_content_changes_bump_the_version` holds each chart's
//! files (but Chart.yaml) to the digest `charts/<chart>/.chart-digests` records for its version, so
//! a change to templates or values bumps the version.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::template::chart;

/// sha256 over every file of the chart except Chart.yaml and the digest file, as
/// `<relative path>\0<bytes>\0` in path order.
fn chart_digest(dir: &Path) -> String {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).expect("readable chart dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                let rel = p.strip_prefix(base).expect("under base").to_string_lossy().replace('\\', "/");
                if rel != "Chart.yaml" && rel != ".chart-digests" {
                    out.insert(rel, std::fs::read(&p).expect("readable file"));
                }
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    let mut h = Sha256::new();
    for (rel, bytes) in &files {
        h.update(rel.as_bytes());
        h.update([0]);
        h.update(bytes);
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn chart_version(dir: &Path) -> String {
    let y: Value =
        yaml_serde::from_str(&std::fs::read_to_string(dir.join("Chart.yaml")).expect("Chart.yaml")).expect("YAML");
    y["version"].as_str().expect("a version").to_owned()
}

pub(crate) fn chart_content_changes_bump_the_version() {
    for name in ["aether", "aether-crds"] {
        let dir = chart(name);
        let (version, digest) = (chart_version(&dir), chart_digest(&dir));
        let file = dir.join(".chart-digests");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut recorded = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
            let (v, d) = line.split_once(' ').unwrap_or_else(|| panic!("{}: bad line {line:?}", file.display()));
            assert!(
                recorded.insert(v.to_owned(), d.trim().to_owned()).is_none(),
                "{}: version {v} listed twice",
                file.display()
            );
        }
        let line = format!("{version} sha256:{digest}");
        match recorded.get(&version) {
            Some(d) if *d == format!("sha256:{digest}") => {}
            Some(d) => panic!(
                "charts/{name}: templates or values changed but Chart.yaml still says version {version} (recorded {d}, now \
                 sha256:{digest}). Bump `version` in charts/{name}/Chart.yaml and append `<new version> sha256:<digest>` to \
                 charts/{name}/.chart-digests (this test prints the digest for the new version)."
            ),
            None => panic!("charts/{name}/.chart-digests has no line for version {version}: append `{line}`"),
        }
    }
}
